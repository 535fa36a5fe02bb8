"""The agent's HTTP servers bind without a reverse DNS lookup and serve /metrics."""
from __future__ import annotations

import socket
import urllib.request

from prometheus_client import CollectorRegistry, Counter

from kproxy_ebpf.serve import httpserve


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


def test_a_name_query_collects_only_the_families_asked_for():
    """`?name[]=` (prometheus_client's own filter): the agent's probes of one gauge do not
    pay for the per-Service families, and a per-Service family can be asked for by name."""
    from kproxy_ebpf.datapath.maps.svc_counters import ServiceCounters, ServicePortId
    from kproxy_ebpf.serve.metrics import Metrics

    metrics = Metrics()
    reads = []

    def read():
        reads.append(1)
        return [(ServicePortId("default", "web", "http", "TCP"), ServiceCounters(conns=7))]

    metrics.watch_services(read, limit=100)
    metrics.backends.set(42)
    server = httpserve.serve(("127.0.0.1", 0), httpserve.metrics_handler(metrics.registry),
                             "metrics")
    try:
        base = f"http://127.0.0.1:{server.server_address[1]}/metrics"
        with urllib.request.urlopen(base + "?name[]=kproxy_backends", timeout=5) as r:
            body = r.read().decode()
        assert "kproxy_backends 42.0" in body and "kproxy_service_" not in body
        assert reads == []
        with urllib.request.urlopen(base + "?name[]=kproxy_service_connections_total",
                                    timeout=5) as r:
            body = r.read().decode()
        assert 'kproxy_service_connections_total{name="web"' in body and reads == [1]
        assert "kproxy_backends" not in body
    finally:
        server.shutdown()
        server.server_close()
