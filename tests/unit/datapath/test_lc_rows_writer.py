"""Least-conn's array rows (lc_rows.py, kp_lcrow) on fake maps: a frontend of at most
KP_LC_ROW backends has its counters in a row its slot 0 names, written before that slot 0
into the row of its pair the current slot 0 does not name; the others stay on kp_lcids."""
from __future__ import annotations

from dataclasses import replace

import pytest

from kproxy_ebpf.datapath.maps import encode as E
from kproxy_ebpf.datapath.maps import layout as L
from kproxy_ebpf.datapath.write.batch import DirectWrites
from kproxy_ebpf.datapath.write.writer import MapWriter
from kproxy_ebpf.model.objects import LBAlgorithm

from ...builders import fe, table
from ...fakemaps import fake_maps

LC = LBAlgorithm.LEAST_CONN
ROW = L.const("KP_LC_ROW")
MAPS = ("svc", "backend", "meta", "rr", "conns", "connix", "connload", "lcids", "lcrow", "ct")


def ips(n: int, base: int = 1) -> list[str]:
    return [f"10.0.{(base + i) // 250}.{(base + i) % 250 + 1}" for i in range(n)]


def lcfe(n: int, ip: str = "10.96.0.10", base: int = 1):
    return replace(fe(ip=ip, backends=ips(n, base)), algorithm=LC)


def head(maps, f):
    return maps["svc"].get(L.frontend_svc_key(f.key))


def named(maps, f) -> list[int] | None:
    """The backend ids the row slot 0 reads names (kp_lcrow or kp_lcids, as the C picks)."""
    h = head(maps, f)
    if h.backend_id:
        row = maps["lcrow"].get(L.U32(h.backend_id))
    else:
        row = maps["lcids"].get(L.frontend_svc_key(f.key))
    if row is None:
        return None
    return [maps["conns"].get(L.U32(ix)).backend_id for ix in row.conn[:row.count]]


def slot_bids(maps, f) -> list[int]:
    key_of = E.svc_keys(f.key)
    return [maps["svc"].get(key_of(s)).backend_id for s in range(1, head(maps, f).count + 1)]


class Watch:
    """After every map operation: each least-conn slot 0 that names a kp_lcrow row finds it
    complete for its slots (so a row is written before the slot 0 naming it, and never
    rewritten while one names it)."""

    def __init__(self, fes) -> None:
        self.fes, self.maps, self.checks = fes, None, 0

    def __call__(self) -> None:
        if self.maps is None:
            return
        for f in self.fes:
            h = head(self.maps, f)
            if h is None or not h.backend_id or not h.fe_flags & L.const("KP_FE_F_LEAST_CONN"):
                continue
            row = self.maps["lcrow"].get(L.U32(h.backend_id))
            assert row is not None and row.count >= h.count, "slot 0 names a row not written"
            self.checks += 1


def watched(*fes):
    w = Watch(fes)
    maps = fake_maps(MAPS, on_op=w)
    w.maps = maps
    return maps, w


def test_a_small_frontend_reads_an_array_row_written_before_its_slot_0():
    f = lcfe(3)
    maps, watch = watched(f)
    w = MapWriter(maps)
    assert w.apply(table(f)).ok
    h = head(maps, f)
    assert h.backend_id >= 2 and h.maglev_size == 0, "row 0 (and 1) never named"
    assert named(maps, f) == slot_bids(maps, f)
    assert maps["lcids"].get(L.frontend_svc_key(f.key)) is None, "no hashed row"
    assert watch.checks > 0


def test_each_change_goes_to_the_other_row_of_the_pair():
    f = lcfe(3)
    maps, _ = watched(f)
    w = MapWriter(maps)
    assert w.apply(table(f)).ok
    first = head(maps, f).backend_id
    rows = [first]
    for n in (4, 2, 5):
        assert w.apply(table(lcfe(n))).ok
        rows.append(head(maps, f).backend_id)
        assert named(maps, f) == slot_bids(maps, f)
    pair = first & ~1
    assert rows == [pair, pair + 1, pair, pair + 1], rows
    assert w.apply(table(replace(lcfe(5), affinity_timeout=30))).ok
    assert head(maps, f).backend_id == pair + 1, "slots unchanged: the row kept"
    assert w.apply({}).ok and len(w.lc_ids.rows.pairs) == 0, "deleted: its pair given back"


def test_a_frontend_past_the_row_or_no_longer_least_conn_gives_its_pair_back():
    f, g = lcfe(3), lcfe(2, ip="10.96.0.11", base=100)
    maps, watch = watched(f, g)
    w = MapWriter(maps)
    assert w.apply(table(f)).ok
    assert w.apply(table(lcfe(ROW + 1))).ok
    assert head(maps, f).backend_id == 0, "past KP_LC_ROW: kp_lcids"
    assert named(maps, f) == slot_bids(maps, f)
    assert f.key not in w.lc_ids.rows.pairs
    assert w.apply(table(lcfe(ROW))).ok
    assert head(maps, f).backend_id and named(maps, f) == slot_bids(maps, f)
    assert maps["lcids"].get(L.frontend_svc_key(f.key)) is None, "kp_lcids row gone after"
    assert w.apply(table(replace(lcfe(ROW), algorithm=LBAlgorithm.RANDOM), g)).ok
    assert head(maps, f).backend_id == 0 and f.key not in w.lc_ids.rows.pairs
    assert w.apply(table(g)).ok
    assert g.key in w.lc_ids.rows.pairs and not w.lc_ids.rows._freeing
    assert watch.checks > 0


def test_with_every_pair_taken_a_frontend_uses_its_hashed_row():
    maps, _ = watched()
    maps["lcrow"].max_entries = 6      # pairs 1 and 2
    fes = [lcfe(2, ip=f"10.96.0.{i}", base=10 * i) for i in range(1, 4)]
    w = MapWriter(maps)
    assert w.apply(table(*fes)).ok
    on_rows = [f for f in fes if head(maps, f).backend_id]
    assert len(on_rows) == 2 and w.row_counts()["lcrow"] == 4
    for f in fes:
        assert named(maps, f) == slot_bids(maps, f)


def test_a_batch_writes_rows_before_the_slot_0s_naming_them():
    fes = [lcfe(4, ip=f"10.96.1.{i}", base=5 * i) for i in range(1, 21)]
    maps, watch = watched(*fes)
    w = MapWriter(maps)
    assert w.apply(table(*fes)).ok
    assert maps["svc"].batches > 0, "batched"
    again = [lcfe(5, ip=f"10.96.1.{i}", base=5 * i) for i in range(1, 21)]
    assert w.apply(table(*again)).ok
    for f in again:
        assert named(maps, f) == slot_bids(maps, f)
    assert watch.checks > 0


@pytest.mark.parametrize("damage", ["none", "row", "stray", "hashed"])
def test_a_restart_adopts_the_rows_and_repairs_what_does_not_match(damage):
    f, g = lcfe(3), lcfe(ROW + 2, ip="10.96.0.11", base=100)
    maps, watch = watched(f, g)
    w = MapWriter(maps)
    assert w.apply(table(f, g)).ok
    at = head(maps, f).backend_id
    watch.maps = None           # the damage itself breaks what Watch checks
    if damage == "row":     # an agent stopped after the row, before slot 0: another count
        maps["lcrow"].put(L.U32(at), L.STRUCTS["kp_lc_row"](count=1))
    elif damage == "stray":    # a row no slot 0 names any more
        maps["lcrow"].put(L.U32(at ^ 1), L.STRUCTS["kp_lc_row"](count=7))
    elif damage == "hashed":   # an older agent's frontend: kp_lcids only
        h = head(maps, f)
        h.backend_id = 0
        maps["svc"].put(L.frontend_svc_key(f.key), h)
        bids = [w.backend_ids.get(b) for b in w.programmed[f.key].order()]
        w.lc_ids.put(f.key, bids, DirectWrites(maps["svc"]))
    watch.maps = maps if damage != "row" else None
    w2 = MapWriter(maps)
    w2.restore()
    watch.maps = maps
    now = head(maps, f).backend_id
    assert named(maps, f) == slot_bids(maps, f) and named(maps, g) == slot_bids(maps, g)
    assert w2.programmed[f.key].lc_row == now and now
    assert head(maps, g).backend_id == 0
    if damage in ("none", "stray"):
        assert now == at, "adopted, not rewritten"
    elif damage == "row":
        assert now == at ^ 1, "written into the other row, then slot 0 moved"
    assert maps["lcids"].get(L.frontend_svc_key(f.key)) is None
    assert w2.lc_ids.rows.pairs.get(f.key) == now // 2
    assert w2.plan.to_write(w2.held, f.key, f) is None, "nothing to write after a restart"
    # The next change alternates as before.
    assert w2.apply(table(lcfe(4), g)).ok
    assert head(maps, f).backend_id == now ^ 1
    assert named(maps, f) == slot_bids(maps, f)
    assert watch.checks > 0
