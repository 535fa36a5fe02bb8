"""MapWriter with Maglev tables (kp_maglev): written whole before the slot 0 that names them,
deleted after the slot 0 that let go, never rewritten in place, adopted by a new agent without
a write, left-overs collected, a full map reported. fakemaps.consistent_tables runs after every
single map operation: no slot 0 ever names a table that is not all there, nor an entry beyond
its count."""
import dataclasses
import functools

import pytest

from kproxy_ebpf.datapath.maps import layout as L
from kproxy_ebpf.datapath.write.maglev_tables import ROW, row_count
from kproxy_ebpf.datapath.write.writer import MapWriter
from kproxy_ebpf.model import maglev
from kproxy_ebpf.model.desired import Action, BackendState, FrontendKind, Scope, ServicePortName
from kproxy_ebpf.model.objects import Protocol

from ... import builders
from ...builders import table
from ...fakemaps import checked_maps, maglev_tables

TCP = Protocol.TCP
SPN = ServicePortName("default", "web", "http", TCP)
SIZE = 1009          # a prime over 100 x 10 backends: three kp_maglev rows (the writer takes
                     # the size it is given; proxy/external.py chooses it)
fe = functools.partial(builders.fe, "10.250.0.11", 30080, kind=FrontendKind.NODE_PORT,
                       service=SPN, scope=Scope.EXT)
NAMES = ("svc", "backend", "meta", "maglev")


def mfe(backends, size=SIZE, **kw):
    return dataclasses.replace(fe(backends, **kw), maglev=size)


def ips(n, base=10):
    return [f"10.244.1.{base + i}" for i in range(n)]


@pytest.fixture
def maps():
    return checked_maps(NAMES, max_entries=200)


def head(maps):
    return next(v for k, v in maps["svc"].items() if k.slot == 0)


def picks(maps) -> list[str]:
    """The backend address each entry of the frontend's table sends a flow to."""
    h = head(maps)
    bes = {k.value: L.ip_str(v.addr) for k, v in maps["backend"].items()}
    slots = {k.slot: bes[v.backend_id] for k, v in maps["svc"].items() if k.slot}
    return [slots[s] for s in maglev_tables(maps)[h.backend_id][:h.maglev_size]]


def test_a_table_is_written_whole_before_the_slot_0_that_names_it(maps):
    w = MapWriter(maps)
    res = w.apply(table(mfe(ips(10))))
    assert res.ok
    h = head(maps)
    assert h.backend_id and h.maglev_size == SIZE
    assert len(maps["maglev"].rows) == row_count(SIZE) == 3
    # the entries are maglev.build's, through the slots
    got = picks(maps)
    want = [ips(10)[i] for i in maglev.build([(ip, 8080) for ip in ips(10)], SIZE)]
    assert got == want
    ops = list(maps["maglev"].ops)
    assert all(op == "put" for op, _ in ops)


def test_a_new_backend_set_is_a_new_table_and_the_old_goes_after(maps):
    w = MapWriter(maps)
    w.apply(table(mfe(ips(10))))
    first = head(maps).backend_id
    before = picks(maps)
    for m in maps.values():
        m.ops.clear()
    res = w.apply(table(mfe(ips(10)[:9])))             # one backend leaves
    assert res.ok
    second = head(maps).backend_id
    assert second != first
    assert set(maglev_tables(maps)) == {second}        # the old table's rows are gone
    after = picks(maps)
    gone = ips(10)[9]
    assert [a for a, b in zip(before, after, strict=True) if a != b].count(gone) == \
        before.count(gone)            # every entry of the backend that left moved
    assert gone not in after
    # the new rows went in before slot 0 changed, the old rows went after
    svc_head = L.raw(L.svc_key("10.250.0.11", 30080, TCP, scope=L.SCOPE_EXT))
    order = [(name, op, k) for name in ("svc", "maglev") for op, k in maps[name].ops]
    assert [op for name, op, k in order if name == "maglev"] == ["put"] * 3 + ["delete"] * 3
    assert (("svc", "put", svc_head)) in order


def test_a_readiness_flip_keeps_the_table(maps):
    w = MapWriter(maps)
    fes = mfe(ips(4), size=401)
    w.apply(table(fes))
    tid = head(maps).backend_id
    flipped = dataclasses.replace(fes, backends=tuple(
        b._replace(state=b.state | BackendState.TERMINATING) if i == 0 else b for i, b in enumerate(fes.backends)))
    maps["maglev"].ops.clear()
    assert w.apply(table(flipped)).ok
    assert head(maps).backend_id == tid and not maps["maglev"].ops


def test_unchanged_frontends_write_nothing_and_a_new_agent_adopts_the_table(maps):
    desired = table(mfe(ips(10)), builders.fe("10.96.0.10", 80, ips(3), service=SPN))
    MapWriter(maps).apply(desired)
    for m in maps.values():
        m.ops.clear()
    again = MapWriter(maps)
    assert again.restore() == 2
    res = again.apply(desired)
    assert res.ok and res.writes == 0 and not any(m.ops for m in maps.values())
    # and it goes on from there: a change writes a new table and drops the adopted one
    res = again.apply(table(mfe(ips(8)), *[f for k, f in desired.items()
                                           if k.scope is Scope.SOCK]))
    assert res.ok and len(maglev_tables(maps)) == 1


def test_maglev_off_and_on_again(maps):
    w = MapWriter(maps)
    w.apply(table(mfe(ips(3), size=401)))
    assert w.apply(table(mfe(ips(3), size=0))).ok         # the Service dropped its annotation
    assert head(maps).backend_id == 0 and not maps["maglev"].rows
    assert w.apply(table(mfe(ips(3), size=401))).ok
    assert head(maps).backend_id and len(maps["maglev"].rows) == 1


def test_a_size_change_is_a_new_table(maps):
    w = MapWriter(maps)
    w.apply(table(mfe(ips(3), size=401)))
    assert w.apply(table(mfe(ips(3), size=1009))).ok
    assert head(maps).maglev_size == 1009 and len(maps["maglev"].rows) == 3


def test_no_backend_no_table(maps):
    w = MapWriter(maps)
    w.apply(table(mfe(ips(3))))
    assert w.apply(table(mfe([], action=Action.REJECT))).ok
    assert head(maps).backend_id == 0 and not maps["maglev"].rows


def test_a_deleted_frontend_takes_its_table_along(maps):
    w = MapWriter(maps)
    w.apply(table(mfe(ips(3))))
    assert w.apply({}).ok
    assert not maps["maglev"].rows and not maps["svc"].rows


def test_a_table_no_slot_0_names_is_collected_at_restore(maps):
    w = MapWriter(maps)
    w.apply(table(mfe(ips(3))))
    # an agent killed after writing a table but before its slot 0
    stray = L.MAPS["maglev"]
    maps["maglev"].put(L.STRUCTS["kp_maglev_key"](table=999, row=0),
                       stray.value(table=999))
    fresh = MapWriter(maps)
    fresh.restore()
    assert set(maglev_tables(maps)) == {head(maps).backend_id}


def test_a_table_that_does_not_match_its_slots_is_written_anew(maps):
    w = MapWriter(maps)
    desired = table(mfe(ips(3)))
    w.apply(desired)
    tid = head(maps).backend_id
    # an agent killed between rewriting a slot and switching to the new table: the slots
    # now name other backends than the table was built for
    key = next(k for k in list(maps["maglev"].rows))
    value = bytearray(maps["maglev"].rows[key])
    value[4:6] = (3 if value[4] != 3 else 2).to_bytes(2, "little")
    maps["maglev"].immutable = False
    maps["maglev"].rows[key] = bytes(value)
    maps["maglev"].immutable = True
    fresh = MapWriter(maps)
    fresh.restore()
    assert fresh.apply(desired).ok
    assert head(maps).backend_id != tid and len(maglev_tables(maps)) == 1


def test_a_full_table_map_leaves_the_frontend_as_it_was_and_reports_it():
    maps = checked_maps(NAMES, max_entries=200, maglev=4)
    w = MapWriter(maps)
    assert w.apply(table(mfe(ips(3), size=1009))).ok         # 3 rows of 4
    res = w.apply(table(mfe(ips(4), size=1009)))               # 3 more do not fit beside
    assert not res.ok and res.full_maps == {"kp_maglev_v1"}
    assert len(maps["maglev"].rows) == 3                       # the partial table is gone
    assert head(maps).count == 3                               # slot 0 as it was
    # room returns: the same apply goes through
    maps["maglev"].max_entries = 6
    assert w.apply(table(mfe(ips(4), size=1009))).ok
    assert head(maps).count == 4 and len(maps["maglev"].rows) == 3


def test_rows_hold_the_slots_of_one_table(maps):
    w = MapWriter(maps)
    w.apply(table(mfe(ips(2), size=ROW + 1)))                  # two rows, the second mostly 0
    rows = maglev_tables(maps)[head(maps).backend_id]
    assert len(rows) == 2 * ROW and set(rows[:ROW + 1]) == {1, 2} and set(rows[ROW + 1:]) == {0}
