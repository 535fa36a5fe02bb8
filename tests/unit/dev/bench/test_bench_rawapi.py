"""The benchmark's API client retries what an overloaded lab API server answers, and nothing
else."""
from __future__ import annotations

import pytest

from kproxy_ebpf.dev.bench import rawapi


class Reply:
    def __init__(self, status: int, data: bytes = b"{}"):
        self.status, self.data = status, data


class Pool:
    def __init__(self, replies):
        self.replies, self.calls = list(replies), 0

    def request(self, *a, **k):
        self.calls += 1
        return self.replies.pop(0)


def api(replies) -> rawapi.RawApi:
    a = rawapi.RawApi.__new__(rawapi.RawApi)
    a.pool, a.host = Pool(replies), "https://x"
    return a


def test_an_etcd_timeout_reported_as_invalid_is_retried(monkeypatch):
    monkeypatch.setattr(rawapi.time, "sleep", lambda s: None)
    timeout = Reply(422, b'{"message":"spec.clusterIPs: failed to allocate IP: '
                         b'etcdserver: request timed out"}')
    a = api([timeout, Reply(503), Reply(201, b'{"ok":1}')])
    assert a.create("/api/v1/x", {}) == {"ok": 1} and a.pool.calls == 3


def test_a_real_refusal_is_not_retried(monkeypatch):
    monkeypatch.setattr(rawapi.time, "sleep", lambda s: None)
    a = api([Reply(422, b'{"message":"spec.ports: Required value"}')])
    with pytest.raises(rawapi.ApiError):
        a.create("/api/v1/x", {})
    assert a.pool.calls == 1
