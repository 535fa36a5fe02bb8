"""MapWriter against in-memory maps keyed by the encoded bytes, as the kernel keys them.

The central check runs after EVERY single map operation: what a BPF program could read at that
instant must be consistent (make-before-break): a frontend's count never covers a missing slot,
and no slot names a missing backend.
"""
import random

import pytest

from kproxy_ebpf.datapath.maps import layout as L
from kproxy_ebpf.datapath.write.plan import stable_slots
from kproxy_ebpf.datapath.write.writer import MapWriter
from kproxy_ebpf.model.desired import Action, Backend, Frontend
from kproxy_ebpf.model.objects import Protocol

from ...builders import fe, table
from ...fakemaps import FakeMap, checked_maps

TCP = Protocol.TCP


@pytest.fixture
def maps():
    return checked_maps()


def slots_of(maps, ip="10.96.0.10", port=80):
    out = {}
    bes = {k.value: L.ip_str(v.addr) for k, v in maps["backend"].items()}
    for k, v in maps["svc"].items():
        if L.key_tuple(k) == (ip, port, TCP):
            out[k.slot] = v.count if k.slot == 0 else bes[v.backend_id]
    return out


def test_new_frontend_is_written_slots_first(maps):
    w = MapWriter(maps)
    res = w.apply(table(fe(backends=["10.244.1.10", "10.244.2.10"])))
    assert res.ok and res.updated == 1
    s = slots_of(maps)
    assert s[0] == 2 and sorted([s[1], s[2]]) == ["10.244.1.10", "10.244.2.10"]
    puts = [k for op, k in maps["svc"].ops if op == "put"]
    assert L.raw(L.svc_key("10.96.0.10", 80, TCP)) == puts[-1], "slot 0 must be written last"


def test_restart_adopts_and_rewrites_nothing(maps):
    desired = table(fe(backends=["10.244.1.10", "10.244.2.10"]),
                    fe(ip="10.96.0.11", action=Action.REJECT, name="empty"),
                    fe(ip="10.96.0.12", backends=["10.244.1.10"], name="other", affinity=60))
    MapWriter(maps).apply(desired)
    for m in maps.values():
        m.ops.clear()
    fresh = MapWriter(maps)
    assert fresh.restore() == 3
    res = fresh.apply(desired)
    assert res.ok and res.writes == 0 and not any(m.ops for m in maps.values())


def test_scale_keeps_survivors_in_their_slots(maps):
    w = MapWriter(maps)
    ips = [f"10.244.1.{i}" for i in range(10, 15)]
    w.apply(table(fe(backends=ips)))
    before = slots_of(maps)
    w.apply(table(fe(backends=ips[:1] + ips[2:])))          # remove the second backend
    after = slots_of(maps)
    assert after[0] == 4
    moved = {s for s in range(1, 5) if before[s] != after[s]}
    assert moved == {2}, "only the hole is refilled (from the tail)"
    assert after[2] == before[5]
    w.apply(table(fe(backends=ips + ["10.244.1.99"])))       # scale up: append
    again = slots_of(maps)
    assert again[0] == 6 and {again[5], again[6]} == {ips[1], "10.244.1.99"}


def test_writes_are_proportional_to_the_change(maps):
    w = MapWriter(maps)
    desired = table(*(fe(ip=f"10.96.1.{i}", name=f"s{i}", backends=[f"10.244.{i % 3}.{10 + i % 50}"])
                      for i in range(200)))
    w.apply(desired)
    changed = fe(ip="10.96.1.7", name="s7", backends=["10.244.9.9"])
    desired[changed.key] = changed
    res = w.apply(desired, candidates=[changed.key])
    # one backend row, one slot, slot 0, and the old backend freed (still used? no: unique)
    assert res.updated == 1 and res.writes <= 4


def test_delete_removes_frontend_first_and_frees_backends(maps):
    w = MapWriter(maps)
    w.apply(table(fe(backends=["10.244.1.10"]), fe(ip="10.96.0.20", name="b", backends=["10.244.1.10"])))
    maps["svc"].ops.clear()
    w.apply(table(fe(ip="10.96.0.20", name="b", backends=["10.244.1.10"])))
    first = maps["svc"].ops[0]
    assert first == ("delete", L.raw(L.svc_key("10.96.0.10", 80, TCP)))
    assert len(list(maps["backend"].items())) == 1, "shared backend stays"
    w.apply({})
    assert not maps["svc"].rows and not maps["backend"].rows and not maps["meta"].rows


def test_map_full_keeps_old_state_and_other_frontends(maps):
    maps["backend"].max_entries = 3
    w = MapWriter(maps)
    w.apply(table(fe(backends=["10.244.1.10"])))
    big = fe(backends=[f"10.244.1.{i}" for i in range(10, 16)])
    other = fe(ip="10.96.0.30", name="c", action=Action.REJECT)
    res = w.apply(table(big, other))
    assert not res.ok and res.full_maps == {L.MAPS["backend"].name}
    assert big.key in res.failed
    assert slots_of(maps)[0] == 1, "the old count stays: nothing half-programmed is visible"
    assert slots_of(maps, "10.96.0.30")[0] == 0, "the other frontend is still programmed"
    maps["backend"].max_entries = 100
    res = w.apply(table(big, other), candidates=res.failed)
    assert res.ok and slots_of(maps)[0] == 6


def test_freed_ids_are_not_reused_at_once(maps):
    w = MapWriter(maps)
    w.apply(table(fe(backends=["10.244.1.10"])))
    first_id = w.backend_ids.get(("10.244.1.10", 8080, TCP))
    w.apply(table(fe(backends=["10.244.1.11"])))
    assert w.backend_ids.get(("10.244.1.11", 8080, TCP)) != first_id


@pytest.mark.parametrize("seed", range(5))
def test_random_churn_stays_consistent(maps, seed):
    """Random scale/flip/delete sequences; `consistent` runs after every map operation."""
    rnd = random.Random(seed)
    w = MapWriter(maps)
    pool = [f"10.244.{n}.{i}" for n in (1, 2) for i in range(10, 20)]
    for _ in range(60):
        desired = {}
        for s in range(rnd.randint(0, 6)):
            action = rnd.choice([Action.FORWARD] * 4 + [Action.REJECT, Action.DROP])
            bs = rnd.sample(pool, rnd.randint(1, 8)) if action is Action.FORWARD else []
            f = fe(ip=f"10.96.0.{s}", name=f"s{s}", backends=bs, action=action)
            desired[f.key] = f
        assert w.apply(desired).ok
        # The running row counts (the batch path's capacity check) match the maps.
        assert w.row_counts() == {name: len(maps[name].rows) for name in ("svc", "backend", "meta")}
        for key, f in desired.items():
            s = slots_of(maps, key.ip, key.port)
            assert s[0] == len(f.backends)
            assert sorted(s[i] for i in range(1, s[0] + 1)) == sorted(b.ip for b in f.backends)
    fresh = MapWriter(maps)
    fresh.restore()
    assert fresh.row_counts() == w.row_counts()
    assert fresh.apply(desired).writes == 0


@pytest.mark.parametrize("old,wanted,expect", [
    ([], ["a", "b"], ["a", "b"]),
    (["a", "b", "c"], ["a", "c"], ["a", "c"]),
    (["a", "b", "c"], ["b", "c"], ["c", "b"]),
    (["a", "b", "c"], ["a", "b", "c", "d"], ["a", "b", "c", "d"]),
    (["a", "b", "c"], ["a", "d", "c"], ["a", "d", "c"]),
    (["a", "b", "c"], [], []),
])
def test_stable_slots(old, wanted, expect):
    assert stable_slots(old, wanted) == expect


def test_restore_drops_slots_above_the_count(maps):
    """An agent killed between writing slot 0 of a shrink and deleting the surplus slots."""
    w = MapWriter(maps)
    w.apply(table(fe(backends=["10.244.1.10", "10.244.1.11", "10.244.1.12"])))
    key = L.svc_key("10.96.0.10", 80, TCP)
    val = maps["svc"].get(key)
    val.count = 1
    maps["svc"].put(key, val)                 # as if the process died right here
    fresh = MapWriter(maps)
    fresh.restore()
    assert sorted(slots_of(maps)) == [0, 1]
    assert len(list(maps["backend"].items())) == 1, "their backends are collected too"


def test_a_backend_shared_with_different_states_is_not_rewritten_forever(maps):
    shared = "10.244.1.10"
    a = fe(backends=[Backend.of(shared, 8080, TCP, ready=True)], name="a")
    b = fe("10.96.0.11", backends=[Backend.of(shared, 8080, TCP, ready=False, terminating=True)], name="b")
    w = MapWriter(maps)
    w.apply(table(a, b))
    assert w.apply(table(a, b)).writes == 0
    assert w.apply(table(a, b), candidates=[b.key]).writes == 0


def test_readiness_changes_rewrite_only_that_frontends_slot(maps):
    """Endpoint state lives in the frontend's slot row; the shared backend row never changes."""
    ready = Backend.of("10.244.1.10", 8080, TCP, ready=True)
    terminating = Backend.of("10.244.1.10", 8080, TCP, ready=False, terminating=True)
    a = fe(backends=[ready])
    b = fe(ip="10.96.0.11", name="b", backends=[ready])
    w = MapWriter(maps)
    w.apply(table(a, b))
    for m in maps.values():
        m.ops.clear()
    b2 = fe(ip="10.96.0.11", name="b", backends=[terminating])
    res = w.apply(table(a, b2), candidates=[b2.key])
    assert res.ok and res.writes == 2          # b's slot 1 (new flags), b's slot 0
    assert not maps["backend"].ops
    flags = {L.key_tuple(k)[0]: v.be_flags for k, v in maps["svc"].items() if k.slot == 1}
    assert flags == {"10.96.0.10": 0, "10.96.0.11": L.F_TERMINATING | L.F_NOT_READY}


def test_a_moved_backend_gets_a_new_id_and_the_old_one_is_freed_after(maps):
    w = MapWriter(maps)
    w.apply(table(fe(backends=["10.244.1.10"])))
    old = w.backend_ids.get(("10.244.1.10", 8080, TCP))
    maps["svc"].ops.clear()
    maps["backend"].ops.clear()
    w.apply(table(fe(backends=["10.244.1.20"])))
    new = w.backend_ids.get(("10.244.1.20", 8080, TCP))
    assert new != old and maps["backend"].ops == [("put", L.raw(L.U32(new))),
                                                  ("delete", L.raw(L.U32(old)))]


def test_a_large_apply_goes_in_batches_and_stays_consistent(maps):
    """Cold start: a few syscalls per phase instead of one per row; `consistent` still runs
    after every element the kernel would apply."""
    w = MapWriter(maps)
    desired = table(*(fe(ip=f"10.96.2.{i}", name=f"b{i}", backends=[f"10.244.3.{10 + (i + j) % 40}" for j in range(5)])
                      for i in range(30)))
    res = w.apply(desired)
    assert res.ok and maps["svc"].batches and maps["backend"].batches
    assert maps["svc"].batches <= 2, "one batch for the slots, one for the heads"
    smaller = dict(list(desired.items())[:12])
    assert w.apply(smaller).ok and maps["svc"].batches > 2
    fresh = MapWriter(maps)
    fresh.restore()
    assert fresh.apply(smaller).writes == 0


def test_near_a_full_map_the_writer_goes_one_by_one(maps):
    maps["backend"].max_entries = 100
    w = MapWriter(maps)
    desired = table(*(fe(ip=f"10.96.2.{i}", name=f"b{i}", backends=[f"10.244.3.{10 + i * 5 + j}" for j in range(5)])
                      for i in range(30)))
    res = w.apply(desired)
    assert not maps["backend"].batches and not res.ok and res.full_maps
    assert len(res.failed) == 10, "20 frontends fit (100 backends), the others are retried"


def test_a_policy_change_rewrites_the_meta_row_for_the_cli(maps):
    from kproxy_ebpf.model.desired import ServiceInfo
    w = MapWriter(maps)
    base = fe(backends=["10.244.1.10"])
    w.apply(table(base))
    for m in maps.values():
        m.ops.clear()
    changed = Frontend(*[getattr(base, f) for f in ("ip", "port", "protocol", "kind", "service",
                                                   "action", "backends", "affinity_timeout")],
                       info=ServiceInfo(external_local=True, health_check_node_port=32000))
    res = w.apply(table(changed))
    assert res.ok and [op for op, _ in maps["meta"].ops] == ["put"]
    assert not maps["backend"].ops
    meta = next(v for _, v in maps["meta"].items())
    assert (meta.health_check_node_port, meta.flags) == (32000, L.const("KP_META_F_ETP_LOCAL"))
    fresh = MapWriter(maps)
    fresh.restore()
    assert fresh.apply(table(changed)).writes == 0


def _mixed_table():
    """Frontends sharing some backends, in every endpoint state, with odd ports."""
    desired = {}
    for i in range(40):
        bs = [Backend.of(f"10.244.{i % 3}.{(i * 7 + j) % 50}", 8080 + (j % 2), TCP,
                      local=bool(j & 1), terminating=bool(j & 2), ready=not j & 4)
              for j in range(i % 9)]
        f = fe(ip=f"10.96.4.{i}", port=80 + i, name=f"m{i}", backends=bs, affinity=i % 3,
               action=Action.FORWARD if bs else Action.REJECT)
        desired[f.key] = f
    return desired


def test_bulk_filled_rows_equal_the_per_row_encoding(monkeypatch):
    """A cold apply fills whole frontends at once (bulk-packed rows, no ctypes object per
    row): the maps end up byte for byte as the one-by-one path writes them, ids included,
    and every row is what layout.py's ctypes types encode."""
    from kproxy_ebpf.datapath.write import batch

    desired = _mixed_table()
    bulk = {n: FakeMap(L.MAPS[n]) for n in ("svc", "backend", "meta")}
    assert MapWriter(bulk).apply(desired).ok and bulk["svc"].batches
    monkeypatch.setattr(batch, "BATCH_MIN", 10**9)
    single = {n: FakeMap(L.MAPS[n]) for n in ("svc", "backend", "meta")}
    w = MapWriter(single)
    assert w.apply(desired).ok and not single["svc"].batches
    for name in ("svc", "backend", "meta"):
        assert bulk[name].rows == single[name].rows, name
    for f in desired.values():
        for slot, b in enumerate(f.backends, start=1):
            bid = w.backend_ids.get(b.key)
            assert single["backend"].rows[L.raw(L.U32(bid))] == L.raw(L.backend_val(*b.key))
            key = L.raw(L.svc_key(f.ip, f.port, TCP, slot=slot))
            assert single["svc"].rows[key] == L.raw(L.SvcVal(backend_id=bid,
                                                             be_flags=L.backend_flags(b)))


def test_a_failure_half_way_through_a_bulk_fill_keeps_the_ids_it_took(maps):
    """A bad backend address in the middle of a cold fill: the frontend is reported, the slots
    before it stay accounted for, no id is left without a row naming it."""
    desired = table(*(fe(ip=f"10.96.5.{i}", name=f"f{i}", backends=[f"10.244.5.{i * 4 + j}" for j in range(4)])
                      for i in range(20)))
    bad = fe(ip="10.96.5.99", name="bad", backends=["10.244.6.1", "10.244.6.3", "not-an-ip"])
    desired[bad.key] = bad
    w = MapWriter(maps)
    res = w.apply(desired)
    assert list(res.failed) == [bad.key]
    # the two good backends of `bad` (slots 1, 2; no slot 0 yet) stay, as one by one
    assert len(w.backend_ids) == 80 + 2 and w.row_counts()["svc"] == 20 * 5 + 1 + 2
    fresh = MapWriter(maps)
    fresh.restore()
    assert fresh.row_counts() == w.row_counts()


def test_a_name_cut_inside_a_character_is_restored(maps):
    """kp_meta holds 15 bytes of a port name: a manifest's multi-byte name is cut between
    characters, and a row cut inside one (an older agent's) still restores (the fuzz tests
    found a restart that raised UnicodeDecodeError on it)."""
    from kproxy_ebpf.model.desired import ServicePortName

    spn = ServicePortName("default", "web", "000\x80\x80\x80ࠀ𐀀", Protocol.UDP)
    w = MapWriter(maps)
    assert w.apply(table(fe(service=spn, backends=("10.244.1.5",)))).ok
    (row,) = [v for _, v in maps["meta"].items()]
    assert row.port_name.decode() == "000\x80\x80\x80ࠀ"
    key = next(k for k, _ in maps["meta"].items())
    maps["meta"].put(key, L.SvcMeta(namespace=b"default", name=b"web",
                                    port_name="000\x80\x80\x80ࠀ𐀀".encode()[:15]))
    assert MapWriter(maps).restore() == 1


def test_a_reread_keeps_the_key_objects_it_already_held(maps):
    """A periodic re-read records rows the maps still hold with the replaced Ledger's own
    objects (at 50,000 Services the copies were ~60 MiB of the agent's RSS)."""
    spn_fe = fe(backends=["10.244.1.10", "10.244.2.10"])
    w = MapWriter(maps)
    assert w.apply(table(spn_fe)).ok
    before_keys = {k: k for k in w.backend_ids.keys()}
    (before_fkey,) = w.programmed
    (before_spn,) = w.held.named
    w.restore()
    for key in w.backend_ids.keys():
        assert key is before_keys[key]
    (fkey,) = w.programmed
    assert fkey is before_fkey
    assert next(iter(w.held.named)) is before_spn
    assert w.apply(table(spn_fe)).writes == 0


def test_a_reread_trusts_the_maps_over_the_replaced_ledger(maps):
    """A backend row that no longer says what the Ledger thought (drift) is read as the map
    holds it, under its own key."""
    w = MapWriter(maps)
    assert w.apply(table(fe(backends=["10.244.1.10"]))).ok
    ((old, bid),) = list(w.backend_ids)
    maps["backend"].rows[L.raw(L.U32(bid))] = L.raw(L.backend_val("10.244.9.9", old[1], TCP))
    w.restore()
    assert set(w.backend_ids.keys()) == {("10.244.9.9", old[1], TCP)}
    res = w.apply(table(fe(backends=["10.244.1.10"])))
    assert res.ok and res.writes > 0
    assert set(slots_of(maps).values()) >= {"10.244.1.10"}


def _named(w: MapWriter) -> dict:
    """Rows naming each backend, counted from the bookkeeping's slots and drain holds."""
    from collections import Counter
    n: Counter = Counter()
    for prog in w.programmed.values():
        n.update(prog.order())
        n.update(prog.drain)
    return n


@pytest.mark.parametrize("batched", [True, False])
def test_reference_counts_follow_the_slots_through_changes_and_a_restore(maps, monkeypatch, batched):
    """RefCounts stores only the counts other than 1: through fills (bulk and one by one),
    shrinking, sharing and deletes, every backend with an id counts exactly the slots that
    name it, and those named by none are freed with their rows."""
    from kproxy_ebpf.datapath.write import batch

    if not batched:
        monkeypatch.setattr(batch, "BATCH_MIN", 10**9)
    rnd = random.Random(7)
    w = MapWriter(maps)
    desired = _mixed_table()
    for step in range(12):
        assert w.apply(desired).ok
        named = _named(w)
        assert {k: w.held.refs.count(k) for k in w.backend_ids.keys()} == dict(named)
        assert set(w.backend_ids.keys()) == set(named), "no id without a row naming it"
        assert len(maps["backend"].rows) == len(named)
        if step == 6:
            w.restore()
            assert {k: w.held.refs.count(k) for k in w.backend_ids.keys()} == dict(_named(w))
        for key in rnd.sample(sorted(desired), 8):
            f = desired.pop(key)
            if rnd.random() < 0.7:
                bs = sorted(set(f.backends[: rnd.randrange(len(f.backends) + 1)])
                            | {Backend.of(f"10.244.9.{rnd.randrange(6)}", 8080, TCP)})
                f = fe(ip=f.ip, port=f.port, name=f.service.name, backends=bs)
                desired[f.key] = f
