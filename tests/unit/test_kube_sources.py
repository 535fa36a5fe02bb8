"""ApiSource wiring (no API server is contacted: reflectors are only built, never started)."""
from __future__ import annotations

from kubernetes import client

from kproxy_ebpf.kube.sources import ApiSource


class Sink:
    def __init__(self):
        self.calls = []

    def replace(self, kind, objs, keep=frozenset()):
        self.calls.append(("replace", kind, objs, set(keep)))

    def upsert(self, kind, obj):
        self.calls.append(("upsert", kind, obj))

    def delete(self, kind, namespace, name):
        self.calls.append(("delete", kind, namespace, name))

    def rejected(self, rejections):
        self.calls.append(("rejected", [r.reason for r in rejections]))


def source():
    return ApiSource(client.ApiClient(), "node1", Sink())


def test_selectors_are_kube_proxys_where_we_can():
    """kube-proxy v1.36: slices without the headless label; Services without the proxy-name
    label, which we list anyway (proxy/ skips them) to know the ClusterIPs other proxies own."""
    r = source().reflectors
    assert r["endpointslices"]._list_fn.keywords == {"label_selector": "!service.kubernetes.io/headless"}
    assert not getattr(r["services"]._list_fn, "keywords", None)
    assert r["node"]._list_fn.keywords == {"field_selector": "metadata.name=node1"}
    assert r["servicecidrs"]._list_fn.__name__ == "list_service_cidr"


def test_service_cidrs_do_not_hold_back_the_first_sync():
    s = source()
    assert not s.synced
    for name in ("services", "endpointslices", "node"):
        s.reflectors[name].synced.set()
    assert s.synced and s.wait_synced(timeout=0)
    assert not s.reflectors["servicecidrs"].synced.is_set()


def test_service_cidr_events_reach_the_sink_converted():
    s = source()
    handler = s.reflectors["servicecidrs"]._on_event
    handler("SYNC", [{"metadata": {"name": "kubernetes"}, "spec": {"cidrs": ["10.96.0.0/16"]}},
                     {"metadata": {"name": "bad"}, "spec": {"cidrs": ["nope"]}}])
    handler("DELETED", {"metadata": {"name": "kubernetes"}})
    calls = s.sink.calls
    assert calls[0] == ("rejected", ["InvalidCIDR"])
    kind, objs = calls[1][1], calls[1][2]
    assert kind == "ServiceCIDR" and [(o.name, o.cidrs) for o in objs] == [
        ("kubernetes", ("10.96.0.0/16",)), ("bad", ())]
    assert calls[2] == ("delete", "ServiceCIDR", "", "kubernetes")
