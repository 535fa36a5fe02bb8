"""Metric names and labels against kube-proxy v1.36 (pkg/proxy/metrics/metrics.go): ip_family on
the per-proxier metrics, none on the node-wide ones."""
from __future__ import annotations

from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from kproxy_ebpf.serve.metrics import Metrics

# kube-proxy's metric (without its kubeproxy_ prefix; the parser names a counter's family
# without _total) -> whether it has ip_family.
KUBE_PROXY_LABELS = {
    "sync_proxy_rules_duration_seconds": True,
    "sync_full_proxy_rules_duration_seconds": True,
    "sync_partial_proxy_rules_duration_seconds": True,
    "sync_proxy_rules_last_timestamp_seconds": True,
    "sync_proxy_rules_last_queued_timestamp_seconds": True,
    "network_programming_duration_seconds": True,
    "proxy_healthz": False,
    "proxy_livez": False,
}


def scrape(m: Metrics) -> dict[str, list]:
    out: dict[str, list] = {}
    for fam in text_string_to_metric_families(generate_latest(m.registry).decode()):
        out.setdefault(fam.name.removeprefix("kproxy_"), []).extend(fam.samples)
    return out


def test_ip_family_where_kube_proxy_has_it():
    m = Metrics()
    m.observe_sync(True, 0.01)
    m.observe_sync(False, 0.002)
    m.observe_programming("IPv4", 1.2)
    m.observe_programming("IPv6", 0.4)
    m.observe_programming("FQDN", 9.0)       # no proxier of that family: not counted
    m.sync_last.set(1.0)
    m.sync_queued.set(1.0)
    m.sync_failures.inc()
    m.health_response("/healthz", 503)
    m.health_response("/livez", 200)
    m.pending.set(3)
    got = scrape(m)
    for name, family in KUBE_PROXY_LABELS.items():
        samples = got[name]
        assert samples, name
        assert all(("ip_family" in s.labels) is family for s in samples), name
        if family:
            assert {s.labels["ip_family"] for s in samples} == {"IPv4", "IPv6"}, name
    assert all("ip_family" not in s.labels for s in got["service_changes_pending"])
    assert {s.labels["ip_family"]: s.value for s in got["sync_proxy_rules_failures"]} == \
        {"IPv4": 1, "IPv6": 1}, "one sync serves both families: each proxier records it"
    counts = {s.labels["ip_family"]: s.value for s in got["network_programming_duration_seconds"]
              if s.name.endswith("_count")}
    assert counts == {"IPv4": 1, "IPv6": 1}, "latency goes to the changed slice's family"


def test_full_and_partial_syncs_are_told_apart_and_both_counted_in_the_total():
    m = Metrics()
    m.observe_sync(True, 0.01)
    m.observe_sync(False, 0.002)
    m.observe_sync(False, 0.003)
    got = scrape(m)

    def count(name):
        return next(s.value for s in got[name] if s.name.endswith("_count"))
    assert count("sync_proxy_rules_duration_seconds") == 3
    assert count("sync_full_proxy_rules_duration_seconds") == 1
    assert count("sync_partial_proxy_rules_duration_seconds") == 2


def test_health_answers_by_code():
    m = Metrics()
    for code in (200, 200, 503):
        m.health_response("/healthz", code)
    got = {s.labels["code"]: s.value for s in scrape(m)["proxy_healthz"]
           if s.name.endswith("_total")}
    assert got == {"200": 2.0, "503": 1.0}
