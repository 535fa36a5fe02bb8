"""ApiSource: listed objects are converted page by page, bad ones keep their last good version;
its wiring (selectors, ServiceCIDRs) with reflectors built but never started."""
from __future__ import annotations

import functools
import json
from typing import Any

from kubernetes import client

from kproxy_ebpf.kube.reflector import Event, EventType
from kproxy_ebpf.kube.sources import ApiSource, decoder
from kproxy_ebpf.model.objects import Kind

from ...builders import ListPage, api_list, api_service


class Sink:
    def __init__(self) -> None:
        self.calls: list[tuple] = []

    def replace(self, kind: str, objs: list[Any], keep: set = frozenset()) -> None:
        self.calls.append(("replace", kind, [o.name for o in objs], set(keep)))

    def upsert(self, kind: str, obj: Any) -> None:
        self.calls.append(("upsert", kind, obj.name))

    def delete(self, kind: str, namespace: str, name: str) -> None:
        self.calls.append(("delete", kind, namespace, name))

    def rejected(self, rejections: list) -> None:
        self.calls.append(("rejected", [(r.name, r.reason) for r in rejections]))


def page(items: list[dict], cont: str = "") -> ListPage:
    return ListPage(api_list(items, "9", cont))


service = functools.partial(api_service, clusterIP="10.96.0.1")      # ns/<name>, port 80


def test_list_is_converted_and_bad_objects_are_kept_not_deleted():
    sink = Sink()
    source = ApiSource(object(), "node-a", sink)       # no request is made: lists are faked
    refl = source.reflectors["services"]
    pages = iter([page([service("a"), service("bad", type="Bogus")], cont="2"),
                  page([service("c"), {"metadata": {"namespace": "ns"}}])])
    refl._list_fn = lambda **kw: next(pages)
    refl._list()
    assert sink.calls == [
        ("rejected", [("bad", "InvalidServiceType"), ("", "InvalidMetadata")]),
        ("replace", "Service", ["a", "c"], {("ns", "bad"), ("ns", "")}),
    ]
    assert refl.synced.is_set()


def source() -> ApiSource:
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
    listed = [{"metadata": {"name": "kubernetes"}, "spec": {"cidrs": ["10.96.0.0/16"]}},
              {"metadata": {"name": "bad"}, "spec": {"cidrs": ["nope"]}}]
    decode = decoder(Kind.SERVICE_CIDR)
    handler(Event(EventType.SYNC, [decode(EventType.SYNC, raw) for raw in listed]))   # as the LIST delivers
    handler(Event(EventType.DELETED, [decode(EventType.DELETED, {"metadata": {"name": "kubernetes"}})]))
    calls = s.sink.calls
    assert calls[0] == ("rejected", [("bad", "InvalidCIDR")])
    assert calls[1] == ("replace", "ServiceCIDR", ["kubernetes", "bad"], set())
    assert calls[2] == ("delete", "ServiceCIDR", "", "kubernetes")


def test_watched_objects_are_converted_as_listed_ones_are():
    """One conversion for both paths: a watch event's object goes through the same from_api()
    on the reflector's thread, before the handler; a deleted one is known by its key."""
    sink = Sink()
    refl = ApiSource(object(), "node-a", sink).reflectors["services"]
    for etype, raw in (("ADDED", service("a")), ("MODIFIED", service("bad", type="Bogus")),
                       ("DELETED", service("a")), ("DELETED", {"metadata": "not an object"})):
        refl._handle_line(json.dumps({"type": etype, "object": raw}).encode())
    assert sink.calls == [
        ("upsert", "Service", "a"),
        ("rejected", [("bad", "InvalidServiceType")]),
        ("delete", "Service", "ns", "a"),
    ]
    # A DELETED whose metadata is no object fails in the handler, counted, as it always did.
    assert refl.handler_errors == 1 and refl.events == 4
