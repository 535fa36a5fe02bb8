"""Per-Service counters (kp_svcstat, datapath/svc_counters.py): summed over CPUs, named from
kp_meta, deleted when their service id is freed, exported under a bounded number of series."""
from __future__ import annotations

from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from kproxy_ebpf.datapath.maps import layout as L
from kproxy_ebpf.datapath.maps import svc_counters
from kproxy_ebpf.datapath.write.writer import MapWriter
from kproxy_ebpf.model.desired import Scope
from kproxy_ebpf.serve.metrics import Metrics

from ...builders import fe, table
from ...fakemaps import PerCpuMap, checked_maps


def programmed():
    maps = checked_maps(("svc", "backend", "meta"))
    maps["svcstat"] = PerCpuMap()
    writer = MapWriter(maps)
    assert writer.apply(table(fe(backends=["10.244.1.10"], name="web"),
                              fe(ip="10.96.0.11", backends=["10.244.1.11"], name="api"))).ok
    ids = {svc_counters.port_id(meta).name: key.value for key, meta in maps["meta"].items()}
    return maps, writer, ids


def test_rows_are_summed_over_cpus_and_named_by_their_service_port():
    maps, _, ids = programmed()
    maps["svcstat"].count(ids["web"], 0, conns=2, packets=5, bytes=500)
    maps["svcstat"].count(ids["web"], 1, L.SCOPE_EXT, conns=1, reply_packets=4, reply_bytes=4000,
                          refused=1)
    maps["svcstat"].count(999, 0, conns=7)           # an id no service holds: left out
    rows = {who.text: c for who, c in svc_counters.by_service(maps)}
    assert rows == {
        "default/api:http": svc_counters.ServiceCounters(),     # no traffic yet: zero
        "default/web:http": svc_counters.ServiceCounters(conns=3, packets=5, bytes=500,
                                                         reply_packets=4, reply_bytes=4000,
                                                         refused=1)}
    who = next(w for w, _ in svc_counters.by_service(maps) if w.name == "web")
    assert (who.namespace, who.port, who.protocol) == ("default", "http", "TCP")
    # The CLI reads them per scope: the node's own sockets apart from packets from outside.
    scoped = svc_counters.read(maps["svcstat"])
    assert scoped[svc_counters.CounterKey(ids["web"], Scope.SOCK)].conns == 2
    assert scoped[svc_counters.CounterKey(ids["web"], Scope.EXT)].reply_packets == 4


def test_a_freed_id_loses_its_row_so_the_next_holder_starts_from_zero():
    maps, writer, ids = programmed()
    maps["svcstat"].count(ids["web"], 0, conns=5)
    maps["svcstat"].count(ids["web"], 0, L.SCOPE_EXT, conns=2)
    maps["svcstat"].count(ids["api"], 0, conns=1)
    assert writer.apply(table(fe(ip="10.96.0.11", backends=["10.244.1.11"], name="api"))).ok
    freed = writer.take_freed_svc_ids()
    assert freed == [ids["web"]] and writer.take_freed_svc_ids() == []
    svc_counters.forget(maps["svcstat"], freed)
    assert maps["svcstat"].ids() == {ids["api"]}
    # A row created for an id a moment before it was freed: the drift check's sweep.
    maps["svcstat"].count(ids["web"], 1, conns=1)
    assert svc_counters.sweep(maps["svcstat"], writer.held.svc_ids_held()) == 1
    assert maps["svcstat"].ids() == {ids["api"]}


def scrape(m: Metrics) -> dict[str, list]:
    text = generate_latest(m.registry).decode()
    return {fam.name: fam.samples for fam in text_string_to_metric_families(text)}


def test_metrics_carry_the_service_port_labels_and_stop_at_the_limit():
    maps, _, ids = programmed()
    maps["svcstat"].count(ids["api"], 0, conns=4, packets=10, bytes=1000, denied=2)
    m = Metrics()
    m.watch_services(lambda: svc_counters.by_service(maps), limit=1)
    got = scrape(m)
    conns = got["kproxy_service_connections"]
    assert [(s.labels, s.value) for s in conns] == [
        ({"namespace": "default", "name": "api", "port": "http", "protocol": "TCP"}, 4.0)]
    by_direction = {s.labels["direction"]: s.value for s in got["kproxy_service_bytes"]}
    assert by_direction == {"to_backend": 1000.0, "reply": 0.0}
    refusals = {s.labels["reason"]: s.value for s in got["kproxy_service_refusals"]}
    assert refusals == {"no_endpoints": 0.0, "no_local_endpoints": 0.0, "source_range": 2.0}
    assert got["kproxy_service_metrics_omitted"][0].value == 1.0     # web: past the limit


def test_a_limit_of_zero_exports_no_service_series():
    maps, _, _ = programmed()
    m = Metrics()
    m.watch_services(lambda: svc_counters.by_service(maps), limit=0)
    ours = {f"kproxy_service_{n}" for n in ("connections", "packets", "bytes", "refusals",
                                            "metrics_omitted")}
    assert not ours & set(scrape(m))
