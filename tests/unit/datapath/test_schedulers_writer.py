"""The writer's side of the schedulers (rr_cursors.py, the slot-0 flags, lc_ids.py's rows and
counter indexes, conn_counts.py) on fake maps."""
from __future__ import annotations

from dataclasses import replace

from kproxy_ebpf.datapath.flows import conn_counts
from kproxy_ebpf.datapath.maps import conn_load, reader
from kproxy_ebpf.datapath.maps import layout as L
from kproxy_ebpf.datapath.write.rr_cursors import resume_at
from kproxy_ebpf.datapath.write.writer import MapWriter
from kproxy_ebpf.model.objects import LBAlgorithm

from ...builders import TCP, fe, table
from ...fakemaps import fake_maps

RR, LC = LBAlgorithm.ROUND_ROBIN, LBAlgorithm.LEAST_CONN
A, B, C, D, E = "a", "b", "c", "d", "e"
MAPS = ("svc", "backend", "meta", "rr", "conns", "connix", "connload", "lcids", "ct")


def test_resume_at_goes_on_after_the_last_pick_still_there():
    assert resume_at(0, [A, B, C], [A, B, C]) == 0, "no pick yet: from the start"
    assert resume_at(2, [A, B, C, D], [A, B, E, D]) == 3, "after B: C left, so D (now 4th)"
    assert resume_at(4, [A, B, C, D], [A, B, C, D, E]) == 0, "after D: A again"
    assert resume_at(7, [A, B], [B]) == 0
    assert resume_at(1, [A, B], [C]) == 0, "none of the old ones is left: from the start"


def cursor(maps, f) -> int | None:
    row = maps["rr"].get(L.frontend_svc_key(f.key))
    return None if row is None else row.next


def test_a_round_robin_frontend_gets_its_flag_and_cursor_and_loses_both():
    maps = fake_maps(MAPS)
    w = MapWriter(maps)
    f = replace(fe(backends=["10.0.0.1", "10.0.0.2"]), algorithm=RR)
    assert w.apply(table(f)).ok
    head = maps["svc"].get(L.frontend_svc_key(f.key))
    assert L.scheduler_of(head.fe_flags) is RR and head.backend_id == 0
    assert cursor(maps, f) == 0
    maps["rr"].put(L.frontend_svc_key(f.key), L.STRUCTS["kp_rr_val"](next=5))   # 5 picks
    same = replace(f, affinity_timeout=30)
    assert w.apply(table(same)).ok and cursor(maps, f) == 5, "slots unchanged: kept"
    grown = replace(same, backends=fe(backends=["10.0.0.1", "10.0.0.2", "10.0.0.3"]).backends)
    assert w.apply(table(grown)).ok
    # Picks 1..5 took slots 1 2 1 2 1: next is 10.0.0.2, slot 2 of the new order too.
    assert cursor(maps, f) == 1
    assert w.apply(table(replace(grown, algorithm=LC))).ok
    assert cursor(maps, f) is None
    head = maps["svc"].get(L.frontend_svc_key(f.key))
    assert L.scheduler_of(head.fe_flags) is LC
    assert [r["algorithm"] for r in reader.services(maps)] == ["least-conn"]
    assert w.apply(table(replace(grown, algorithm=RR))).ok and cursor(maps, f) == 0
    assert w.apply({}).ok and cursor(maps, f) is None, "deleted with its frontend"


def test_restore_adopts_the_flags_and_sweeps_cursors_nobody_uses():
    maps = fake_maps(MAPS)
    f = replace(fe(backends=["10.0.0.1"]), algorithm=RR)
    assert MapWriter(maps).apply(table(f)).ok
    stray = fe(ip="10.96.0.99")
    maps["rr"].put(L.frontend_svc_key(stray.key), L.STRUCTS["kp_rr_val"](next=3))
    w = MapWriter(maps)
    w.restore()
    assert w.programmed[f.key].algorithm is RR
    assert cursor(maps, f) == 0 and cursor(maps, stray) is None
    assert w.plan.to_write(w.held, f.key, f) is None, "nothing to write after a restart"


def lc_row(maps, f) -> list[int] | None:
    """The backend ids kp_lcids names for f, through each index's kp_conns row."""
    row = maps["lcids"].get(L.frontend_svc_key(f.key))
    if row is None:
        return None
    return [maps["conns"].get(L.U32(ix)).backend_id for ix in row.conn[:row.count]]


def bids(w, *ips) -> list[int]:
    return [w.backend_ids.get((ip, 8080, TCP)) for ip in ips]


def counter(maps, bid):
    """(index, kp_conns row, kp_connload word) of backend id bid's counter, None without."""
    ix = maps["connix"].get(L.U32(bid))
    return None if ix is None else (ix.value, maps["conns"].get(ix), maps["connload"].get(ix).value)


def tags(maps, bid) -> tuple[int, int, int] | None:
    c = counter(maps, bid)
    return None if c is None else (c[0], conn_load.gen(c[2]), c[1].backend_id)


def test_a_least_conn_frontend_names_a_counter_per_slot_in_slot_order():
    maps = fake_maps(MAPS)
    w = MapWriter(maps)
    f = replace(fe(backends=["10.0.0.1", "10.0.0.2"]), algorithm=LC)
    assert w.apply(table(f)).ok
    assert lc_row(maps, f) == bids(w, "10.0.0.1", "10.0.0.2")
    gens = {conn_load.gen(counter(maps, b)[2]) for b in bids(w, "10.0.0.1", "10.0.0.2")}
    assert 0 not in gens and len(gens) == 2
    f2 = replace(f, backends=fe(backends=["10.0.0.2", "10.0.0.3"]).backends)
    assert w.apply(table(f2)).ok
    assert lc_row(maps, f) == bids(w, *(k[0] for k in w.programmed[f.key].order()))
    assert w.apply(table(replace(f2, algorithm=LBAlgorithm.RANDOM))).ok
    assert lc_row(maps, f) is None, "no row once it stops asking for least-conn"


def test_a_restart_rewrites_a_row_the_previous_agent_did_not_finish():
    maps = fake_maps(MAPS)
    f = replace(fe(backends=["10.0.0.1", "10.0.0.2"]), algorithm=LC)
    w = MapWriter(maps)
    assert w.apply(table(f)).ok
    before = {b: tags(maps, b) for b in bids(w, "10.0.0.1", "10.0.0.2")}
    maps["lcids"].delete(L.frontend_svc_key(f.key))
    stray = fe(ip="10.96.0.99")
    maps["lcids"].put(L.frontend_svc_key(stray.key), L.STRUCTS["kp_lc_ids"](count=0))
    w = MapWriter(maps)
    w.restore()
    assert lc_row(maps, f) == bids(w, "10.0.0.1", "10.0.0.2")
    assert {b: tags(maps, b) for b in before} == before, "counters adopted, not renewed"
    assert maps["lcids"].get(L.frontend_svc_key(stray.key)) is None


def test_a_freed_backend_frees_its_counter_and_the_next_holder_gets_another_gen():
    maps = fake_maps(MAPS)
    w = MapWriter(maps)
    f = replace(fe(backends=["10.0.0.1", "10.0.0.2"]), algorithm=LC)
    assert w.apply(table(f)).ok
    gone = w.backend_ids.get(("10.0.0.2", 8080, TCP))
    for bid in bids(w, "10.0.0.1", "10.0.0.2"):
        ix, _, word = counter(maps, bid)
        maps["connload"].put(L.U32(ix), L.MAPS["connload"].value(word + 2))
    ix_gone, _, word_gone = counter(maps, gone)
    assert w.apply(table(replace(f, backends=fe(backends=["10.0.0.1"]).backends))).ok
    assert counter(maps, gone) is None
    assert [c for _, c in conn_counts.per_backend(maps).items()] == [conn_counts.Conns(2, 0)]
    assert conn_counts.counts_by_backend(maps) == [("10.0.0.1:8080", "TCP", 2)]
    w.lc_ids.ix.max_id = 2      # no fresh index left: the freed one comes back
    assert w.apply(table(replace(f, backends=fe(backends=["10.0.0.1", "10.0.0.9"]).backends))).ok
    ix, _, word = counter(maps, w.backend_ids.get(("10.0.0.9", 8080, TCP)))
    assert ix == ix_gone and conn_load.gen(word) != conn_load.gen(word_gone)
    assert conn_load.count(word) == 0, "the previous holder's count not inherited"


def test_a_batch_with_more_scheduled_frontends_than_their_map_holds_goes_one_by_one():
    maps = fake_maps(MAPS)
    maps["rr"].max_entries = 3
    w = MapWriter(maps)
    fes = [replace(fe(ip=f"10.96.0.{i}", backends=[f"10.0.{i}.{b}" for b in range(1, 9)]),
                   algorithm=RR) for i in range(1, 11)]
    assert sum(1 + len(f.backends) for f in fes) >= 64, "enough rows for a batch"
    res = w.apply(table(*fes))
    assert maps["rr"].batches == 0, "the capacity check sent it one by one"
    assert len(maps["rr"].rows) == 3 and res.full_maps == {"kp_rr_v1"}, res
    with_cursor = {f.key for f in fes if cursor(maps, f) is not None}
    assert len(with_cursor) == 3 and set(res.failed) == {f.key for f in fes} - with_cursor, \
        "the others are retried, each with its own error"
    assert all("kp_rr_v1 is full" in e for e in res.errors) and len(res.errors) == 7
