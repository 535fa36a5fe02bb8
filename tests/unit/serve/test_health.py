"""kube-proxy v1.36's health semantics and JSON (pkg/proxy/healthcheck/proxy_health.go), with a
fake clock; one test through the real HTTP server on loopback."""
import json
import urllib.error
import urllib.request

import pytest

from kproxy_ebpf.serve.health import ProxyHealth, go_time, serve

T0 = 1795964400.0            # 2026-11-29T15:00:00Z


class Clock:
    def __init__(self):
        self.now = T0

    def __call__(self):
        return self.now


def eligible(timeout=60, clock=None):
    h = ProxyHealth(timeout=timeout, clock=clock or Clock())
    h.node_eligible = True
    return h


def test_healthy_until_a_change_waits_longer_than_the_timeout():
    clock = Clock()
    h = eligible(60, clock)
    assert h.status(with_node=True)[0] == 200
    h.queued_update()
    clock.now += 59
    assert h.status(with_node=True)[0] == 200
    clock.now += 2
    code, body = h.status(with_node=True)
    assert code == 503 and body["nodeEligible"] is True and body["healthy"] is False
    h.updated(started=clock.now)
    assert h.status(with_node=True)[0] == 200


def test_a_sync_that_started_before_the_change_does_not_clear_it():
    clock = Clock()
    h = eligible(10, clock)
    started = clock.now
    clock.now += 1
    h.queued_update()
    h.updated(started)
    clock.now += 20
    assert h.status(with_node=False)[0] == 503


@pytest.mark.parametrize("node_eligible", [
    pytest.param(False, id="deleting-or-tainted-ToBeDeletedByClusterAutoscaler"),
    pytest.param(None, id="node-not-seen-yet"),
])
def test_an_ineligible_node_fails_healthz_but_not_livez(node_eligible):
    h = ProxyHealth(timeout=10, clock=Clock())
    h.node_eligible = node_eligible
    code, body = h.status(with_node=True)
    assert code == 503 and body["nodeEligible"] is False and body["healthy"] is True
    code, body = h.status(with_node=False)
    assert code == 200 and "nodeEligible" not in body


def test_json_is_kube_proxys_field_for_field():
    clock = Clock()
    h = eligible(10, clock)
    # Before the first sync: no per-family status (Go omits the empty map), zero lastUpdated
    # only when unhealthy; a healthy answer says "now".
    assert h.status(with_node=True) == (200, {
        "lastUpdated": "2026-11-29T15:00:00Z", "currentTime": "2026-11-29T15:00:00Z",
        "nodeEligible": True, "healthy": True})
    h.updated(started=clock.now)
    clock.now += 1.5
    code, body = h.status(with_node=True)
    assert list(body) == ["lastUpdated", "currentTime", "nodeEligible", "healthy", "status"]
    assert body["lastUpdated"] == body["currentTime"] == "2026-11-29T15:00:01.5Z"
    assert body["status"] == {f: {"lastUpdated": "2026-11-29T15:00:00Z", "healthy": True}
                              for f in ("IPv4", "IPv6")}
    # Unhealthy: lastUpdated is the real last sync, and the family says so too.
    h.queued_update()
    clock.now += 11
    code, body = h.status(with_node=False)
    assert code == 503 and body == {
        "lastUpdated": "2026-11-29T15:00:00Z", "currentTime": "2026-11-29T15:00:12.5Z",
        "healthy": False,
        "status": {f: {"lastUpdated": "2026-11-29T15:00:00Z", "healthy": False}
                   for f in ("IPv4", "IPv6")}}


def test_go_time_format():
    assert go_time(None) == "0001-01-01T00:00:00Z"
    assert go_time(T0 + 0.000123) == "2026-11-29T15:00:00.000123Z"


def test_http_server_codes_headers_and_response_hook():
    seen = []
    h = ProxyHealth(timeout=10)
    h.on_response = lambda path, code: seen.append((path, code))
    server = serve(h, "127.0.0.1:0")
    base = f"http://127.0.0.1:{server.server_address[1]}"
    try:
        with pytest.raises(urllib.error.HTTPError) as err:
            urllib.request.urlopen(base + "/healthz", timeout=5)
        assert err.value.code == 503
        assert err.value.headers["Content-Type"] == "application/json"
        assert err.value.headers["X-Content-Type-Options"] == "nosniff"
        assert json.loads(err.value.read())["nodeEligible"] is False
        with urllib.request.urlopen(base + "/livez", timeout=5) as r:
            assert r.status == 200 and json.loads(r.read())["healthy"] is True
        h.node_eligible = True
        with urllib.request.urlopen(base + "/healthz", timeout=5) as r:
            assert r.status == 200
    finally:
        server.shutdown()
        server.server_close()
    assert seen == [("/healthz", 503), ("/livez", 200), ("/healthz", 200)]


def test_frontends_waiting_for_room_are_in_the_body_only_while_there_are_some():
    h = ProxyHealth(timeout=60, clock=lambda: 1000.0)
    h.updated(999.0)
    assert "unprogrammed" not in h.status(with_node=False)[1]
    h.set_unprogrammed(3, ["kp_svc_v3"])
    code, body = h.status(with_node=False)
    assert code == 200 and body["unprogrammed"] == {"frontends": 3, "fullMaps": ["kp_svc_v3"]}
    h.set_unprogrammed(0, [])
    assert "unprogrammed" not in h.status(with_node=False)[1]
