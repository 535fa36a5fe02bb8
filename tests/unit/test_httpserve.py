"""The agent's HTTP servers bind without a reverse DNS lookup and serve /metrics."""
from __future__ import annotations

import socket
import urllib.request

from prometheus_client import CollectorRegistry, Counter

from kproxy_ebpf import httpserve


def test_bind_does_no_reverse_lookup_and_metrics_are_served(monkeypatch):
    def no_dns(*_a, **_k):
        raise AssertionError("reverse DNS lookup at bind (stalls 5 s without a resolver)")

    monkeypatch.setattr(socket, "getfqdn", no_dns)
    registry = CollectorRegistry()
    Counter("kproxy_test_things", "Things.", registry=registry).inc(3)
    server = httpserve.serve(("127.0.0.1", 0), httpserve.metrics_handler(registry), "metrics")
    try:
        port = server.server_address[1]
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as r:
            body = r.read().decode()
            assert r.headers["Content-Type"].startswith("text/plain")
        assert "kproxy_test_things_total 3.0" in body
    finally:
        server.shutdown()
        server.server_close()
