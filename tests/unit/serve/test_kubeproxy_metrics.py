"""kube-proxy's metric names beside ours (kubeproxy_names.py), the change counters they read
(ProxyState) and the no-local-endpoints count (proxy/no_local.py): what a dashboard written for
kube-proxy v1.36 scrapes, with its labels and buckets."""
from __future__ import annotations

from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from kproxy_ebpf.model.objects import EndpointPort, IPFamily, Node, ServicePort, ServiceType
from kproxy_ebpf.proxy.no_local import EXTERNAL, INTERNAL, NoLocalEndpoints
from kproxy_ebpf.proxy.state import ProxyState
from kproxy_ebpf.serve.metrics import Metrics

from ...builders import TCP, ep, sl, svc

# kube-proxy v1.36, pkg/proxy/metrics/metrics.go: name -> label names
KUBE_PROXY = {
    "kubeproxy_sync_proxy_rules_duration_seconds": {"ip_family"},
    "kubeproxy_sync_full_proxy_rules_duration_seconds": {"ip_family"},
    "kubeproxy_sync_partial_proxy_rules_duration_seconds": {"ip_family"},
    "kubeproxy_network_programming_duration_seconds": {"ip_family"},
    "kubeproxy_sync_proxy_rules_last_timestamp_seconds": {"ip_family"},
    "kubeproxy_sync_proxy_rules_last_queued_timestamp_seconds": {"ip_family"},
    "kubeproxy_sync_proxy_rules_nftables_sync_failures": {"ip_family"},
    "kubeproxy_proxy_healthz": {"code"},
    "kubeproxy_proxy_livez": {"code"},
    "kubeproxy_sync_proxy_rules_service_changes_pending": set(),
    "kubeproxy_sync_proxy_rules_endpoint_changes_pending": set(),
    "kubeproxy_sync_proxy_rules_service_changes": set(),
    "kubeproxy_sync_proxy_rules_endpoint_changes": set(),
    "kubeproxy_sync_proxy_rules_no_local_endpoints_total": {"traffic_policy", "ip_family"},
}
NODE = Node("node-a", addresses=("192.168.0.1",))


def scrape(m: Metrics) -> dict:
    return {f.name: f for f in text_string_to_metric_families(generate_latest(m.registry).decode())}


def value(fams: dict, name: str, **labels) -> float:
    """The value of sample `name` (a family's, or its _total, _count, ... series)."""
    for fam in fams.values():
        for s in fam.samples:
            if s.name == name and all(s.labels.get(k) == v for k, v in labels.items()):
                return s.value
    raise KeyError((name, labels))


def test_every_kube_proxy_metric_is_exported_with_its_labels():
    m = Metrics()
    m.watch_changes(lambda: (3, 5))
    m.observe_sync(True, 0.02)
    m.observe_programming("IPv6", 1.5)
    m.sync_last.set_to_current_time()
    m.sync_queued.set_to_current_time()
    m.sync_failures.inc()
    m.health_response("/healthz", 200)
    m.health_response("/livez", 200)
    m.set_pending(1, 2, 3)
    m.set_no_local_endpoints(NoLocalEndpoints().counts())
    fams = scrape(m)
    for name, labels in KUBE_PROXY.items():
        assert name in fams, name
        got = {k for s in fams[name].samples for k in s.labels if k != "le"}
        assert got == labels, name
    assert value(fams, "kubeproxy_sync_proxy_rules_service_changes_total") == 3
    assert value(fams, "kubeproxy_sync_proxy_rules_endpoint_changes_total") == 5
    assert value(fams, "kubeproxy_sync_proxy_rules_endpoint_changes_pending") == 2
    assert value(fams, "kubeproxy_network_programming_duration_seconds_count",
                 ip_family="IPv6") == 1
    assert value(fams, "kubeproxy_proxy_healthz_total", code="200") == 1


def test_a_kube_proxy_series_is_ours_renamed_with_kube_proxys_buckets():
    m = Metrics()
    m.observe_sync(False, 0.003)
    fams = scrape(m)
    ours = {(s.name.replace("kproxy_", "kubeproxy_", 1), tuple(sorted(s.labels.items())), s.value)
            for s in fams["kproxy_sync_partial_proxy_rules_duration_seconds"].samples}
    theirs = {(s.name, tuple(sorted(s.labels.items())), s.value)
              for s in fams["kubeproxy_sync_partial_proxy_rules_duration_seconds"].samples}
    assert ours == theirs
    les = sorted({float(s.labels["le"]) for s in
                  fams["kubeproxy_sync_proxy_rules_duration_seconds"].samples if "le" in s.labels})
    assert les[:-1] == [0.001 * 2 ** i for i in range(15)], "ExponentialBuckets(0.001, 2, 15)"


def test_changes_are_counted_per_kind_and_pending_until_the_next_compute():
    state = ProxyState(NODE)
    state.upsert_service(svc())
    state.upsert_service(svc())                       # the same: no change
    state.upsert_slice(sl(ep("10.0.1.5", "node-a")))
    state.upsert_slice(sl(ep("10.0.1.6", "node-a")))  # an update: one change, not two
    assert (state.service_changes_total, state.endpoint_changes_total) == (1, 2)
    assert (state.service_changes_pending, state.endpoint_changes_pending) == (1, 1)
    state.compute()
    assert (state.service_changes_pending, state.endpoint_changes_pending) == (0, 0)
    state.delete_slice("ns", "s1")
    state.delete_service("ns", "svc")
    assert (state.service_changes_total, state.endpoint_changes_total) == (2, 3)


def counts(state: ProxyState, tracker: NoLocalEndpoints, full: bool = False) -> dict:
    changes = state.compute(full=full)
    tracker.update(changes.frontends, None if full else changes.changed_keys)
    return {k: v for k, v in tracker.counts().items() if v}


def test_local_policies_with_endpoints_only_elsewhere_are_counted_per_service_port():
    """As kube-proxy: a Local policy whose endpoints are all on other nodes counts once per
    service port and family (not per frontend address); a port with no endpoint at all is
    rejected, not counted; a local endpoint takes it out at the next partial sync."""
    state, tracker = ProxyState(NODE, node_port_addresses=()), NoLocalEndpoints()
    ports = (ServicePort("a", TCP, 80, node_port=30080), ServicePort("b", TCP, 81, node_port=30081))
    state.upsert_service(svc("itp", ip="172.30.0.11", internal_traffic_local=True))
    state.upsert_service(svc("etp", ip="172.30.0.12", ports=ports, type=ServiceType.NODE_PORT,
                             external_traffic_local=True, external_ips=("192.0.2.1",)))
    state.upsert_service(svc("empty", ip="172.30.0.13", internal_traffic_local=True))
    state.upsert_slice(sl(ep("10.0.2.5", "node-b"), name="itp-1", svc="itp"))
    state.upsert_slice(sl(ep("10.0.2.6", "node-b"), name="etp-1", svc="etp",
                          ports=(EndpointPort("a", TCP, 8080), EndpointPort("b", TCP, 8081))))
    assert counts(state, tracker) == {(INTERNAL, IPFamily.IPV4): 1, (EXTERNAL, IPFamily.IPV4): 2}
    state.upsert_slice(sl(ep("10.0.2.5", "node-b"), ep("10.0.1.5", "node-a"), name="itp-1",
                          svc="itp"))
    assert counts(state, tracker) == {(EXTERNAL, IPFamily.IPV4): 2}
    assert counts(state, NoLocalEndpoints(), full=True) == {(EXTERNAL, IPFamily.IPV4): 2}
