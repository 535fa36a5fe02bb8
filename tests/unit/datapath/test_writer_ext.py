"""MapWriter with scope-EXT frontends (traffic from outside the node) next to socket-scope ones.

The two scopes share the backend and meta maps (one id per backend address, one per service
port) but are separate rows of the svc map: the same ip:port/proto in both scopes is two
frontends with their own slots, verdicts and make-before-break order.
"""
import dataclasses
import functools

import pytest

from kproxy_ebpf.datapath.maps import layout as L
from kproxy_ebpf.datapath.write.writer import MapWriter
from kproxy_ebpf.model.desired import Action, Backend, FrontendKind, Scope, ServicePortName
from kproxy_ebpf.model.objects import Protocol

from ... import builders
from ...builders import table
from ...fakemaps import checked_maps

TCP = Protocol.TCP
SPN = ServicePortName("default", "web", "http", TCP)
NP = ("10.250.0.11", 30080)


# fe(backends, action, scope=...): node1's NodePort 30080
fe = functools.partial(builders.fe, *NP, kind=FrontendKind.NODE_PORT, service=SPN)


@pytest.fixture
def maps():
    return checked_maps()


def rows(maps, scope):
    bes = {k.value: L.ip_str(v.addr) for k, v in maps["backend"].items()}
    return {k.slot: (v.count, v.action) if k.slot == 0 else bes[v.backend_id]
            for k, v in maps["svc"].items() if k.scope == scope}


def test_both_scopes_are_separate_rows_sharing_backends(maps):
    w = MapWriter(maps)
    res = w.apply(table(fe(["10.244.1.10", "10.244.2.10"]),
                        fe(["10.244.1.10"], scope=Scope.EXT)))
    assert res.ok and res.updated == 2
    assert rows(maps, L.SCOPE_SOCK) == {0: (2, L.ACTION_NUM[Action.FORWARD]),
                                        1: "10.244.1.10", 2: "10.244.2.10"}
    assert rows(maps, L.SCOPE_EXT) == {0: (1, L.ACTION_NUM[Action.FORWARD]), 1: "10.244.1.10"}
    assert len(maps["backend"].rows) == 2 and len(maps["meta"].rows) == 1


def test_ext_slot_zero_is_written_last_and_deleted_first(maps):
    w = MapWriter(maps)
    ext = fe(["10.244.1.10", "10.244.2.10"], scope=Scope.EXT)
    w.apply(table(ext))
    head = L.raw(L.svc_key(*NP, TCP, scope=L.SCOPE_EXT))
    assert [k for op, k in maps["svc"].ops if op == "put"][-1] == head
    maps["svc"].ops.clear()
    w.apply({})
    assert maps["svc"].ops[0] == ("delete", head)
    assert not maps["svc"].rows and not maps["backend"].rows and not maps["meta"].rows


def test_changing_one_scope_leaves_the_other_alone(maps):
    w = MapWriter(maps)
    sock, ext = fe(["10.244.1.10"]), fe(["10.244.1.10"], scope=Scope.EXT)
    w.apply(table(sock, ext))
    maps["svc"].ops.clear()
    dropped = dataclasses.replace(ext, action=Action.DROP, backends=())
    res = w.apply(table(sock, dropped), candidates=[dropped.key])
    assert res.ok and res.updated == 1
    assert all(L.SvcKey.from_buffer_copy(k).scope == L.SCOPE_EXT for _, k in maps["svc"].ops)
    assert rows(maps, L.SCOPE_EXT) == {0: (0, L.ACTION_NUM[Action.DROP])}
    assert rows(maps, L.SCOPE_SOCK)[1] == "10.244.1.10", "the shared backend stays"


def test_restart_adopts_both_scopes_and_rewrites_nothing(maps):
    desired = table(fe(["10.244.1.10"]), fe(["10.244.1.10", "10.244.2.10"], scope=Scope.EXT))
    MapWriter(maps).apply(desired)
    for m in maps.values():
        m.ops.clear()
    fresh = MapWriter(maps)
    assert fresh.restore() == 2
    assert set(fresh.programmed) == set(desired)
    res = fresh.apply(desired)
    assert res.ok and res.writes == 0


# -- kp_extaddr: the addresses tc_lb.c lets through to its lookups ----------------------------
def ext_maps(extaddr_entries=1000):
    return checked_maps(("svc", "backend", "meta", "extaddr", "extbe"), max_entries=100000,
                        extaddr=extaddr_entries)


def ext_fe(ip, port, backends=("10.244.2.10",), local=()):
    return builders.fe(ip, port, [Backend.of(b, 8080, TCP, local=b in local) for b in backends],
                       kind=FrontendKind.NODE_PORT, service=SPN, scope=Scope.EXT)


def addrs(maps, name="extaddr"):
    return sorted(L.ip_text(k) for k in maps[name].keys())


@pytest.mark.parametrize("n", [2, 40])     # 40 frontends: enough rows for the batched path
def test_an_address_row_outlives_every_ext_frontend_on_it_and_no_other(n):
    # consistent() runs after every single map operation, batched or not: an EXT slot 0 is
    # never without its address row.
    maps = ext_maps()
    w = MapWriter(maps)
    node = [ext_fe("10.250.0.11", 30000 + i) for i in range(n)]
    lb = ext_fe("192.0.2.7", 80)
    sock = fe(["10.244.2.10"])                     # socket scope: no address row
    res = w.apply(table(*node, lb, sock))
    assert res.ok and addrs(maps) == ["10.250.0.11", "192.0.2.7"]
    assert [op for op, _ in maps["extaddr"].ops] == ["put", "put"]
    res = w.apply(table(*node[1:], sock))
    assert res.ok and addrs(maps) == ["10.250.0.11"]
    res = w.apply(table(sock))
    assert res.ok and addrs(maps) == []
    assert w.row_counts()["extaddr"] == 0


def test_restore_writes_missing_address_rows_and_drops_stale_ones():
    # The maps of an agent that kept no address rows (an upgrade): the rows appear in
    # restore(), before the agent attaches programs that would otherwise pass every packet.
    maps = ext_maps()
    MapWriter(maps).apply(table(ext_fe("10.250.0.11", 30080), ext_fe("192.0.2.7", 80)))
    for m in maps.values():
        m.on_op = None            # the state restore() starts from is not consistent()
    maps["extaddr"].rows = {L.ip_bytes("198.51.100.1"): L.raw(L.U32(1))}
    w = MapWriter(maps)
    assert w.restore() == 2
    assert addrs(maps) == ["10.250.0.11", "192.0.2.7"]
    assert w.apply(table(ext_fe("10.250.0.11", 30080))).ok
    assert addrs(maps) == ["10.250.0.11"]


def test_a_full_address_map_fails_the_frontend_before_its_slot_zero():
    maps = ext_maps(extaddr_entries=1)
    w = MapWriter(maps)
    res = w.apply(table(ext_fe("10.250.0.11", 30080), ext_fe("192.0.2.7", 80)))
    assert res.full_maps == {L.MAPS["extaddr"].name}
    assert addrs(maps) == ["10.250.0.11"]
    heads = [L.ip_str(k.addr) for k in maps["svc"].keys() if k.slot == 0]
    assert heads == ["10.250.0.11"]


def test_an_address_row_restore_cannot_write_is_retried_by_the_next_apply():
    maps = ext_maps()
    MapWriter(maps).apply(table(ext_fe("10.250.0.11", 30080), ext_fe("192.0.2.7", 80)))
    for m in maps.values():
        m.on_op = None
    maps["extaddr"].rows.clear()
    maps["extaddr"].max_entries = 1
    w = MapWriter(maps)
    assert w.restore() == 2                     # logged, not raised
    assert addrs(maps) == ["10.250.0.11"]
    maps["extaddr"].max_entries = 2
    res = w.apply(table(ext_fe("10.250.0.11", 30080), ext_fe("192.0.2.7", 80)))
    assert res.ok and res.updated == 1
    assert addrs(maps) == ["10.250.0.11", "192.0.2.7"]


def test_local_backends_of_ext_frontends_hold_their_rows_and_remote_ones_none():
    # consistent() checks after every operation that each local backend an EXT slot names
    # has its kp_extbe row (kp_to_outside looks for reply flows only from those).
    maps = ext_maps()
    w = MapWriter(maps)
    a = ext_fe("10.250.0.11", 30080, ["10.244.1.10", "10.244.1.11", "10.244.2.10"],
               local=("10.244.1.10", "10.244.1.11"))
    b = ext_fe("10.250.0.11", 30081, ["10.244.1.10"], local=("10.244.1.10",))
    sock = dataclasses.replace(fe(["10.244.1.12"]), backends=(Backend.of("10.244.1.12", 8080, TCP,
                                                                      local=True),))
    assert w.apply(table(a, b, sock)).ok
    assert addrs(maps, "extbe") == ["10.244.1.10", "10.244.1.11"]
    a2 = ext_fe("10.250.0.11", 30080, ["10.244.1.10", "10.244.2.10"], local=("10.244.1.10",))
    assert w.apply(table(a2, b, sock)).ok
    assert addrs(maps, "extbe") == ["10.244.1.10"]
    rejecting = dataclasses.replace(b, action=Action.REJECT, backends=())
    assert w.apply(table(a2, rejecting)).ok
    assert addrs(maps, "extbe") == ["10.244.1.10"]
    assert w.apply(table(rejecting)).ok
    assert addrs(maps, "extbe") == [] and addrs(maps) == ["10.250.0.11"]
    assert w.row_counts()["extbe"] == 0


def test_restore_rebuilds_the_local_backend_rows():
    maps = ext_maps()
    a = ext_fe("10.250.0.11", 30080, ["10.244.1.10", "10.244.2.10"], local=("10.244.1.10",))
    MapWriter(maps).apply(table(a))
    for m in maps.values():
        m.on_op = None
    maps["extbe"].rows = {L.ip_bytes("10.244.9.9"): L.raw(L.U32(1))}
    w = MapWriter(maps)
    assert w.restore() == 1
    assert addrs(maps, "extbe") == ["10.244.1.10"]
    assert w.apply(table(a)).updated == 0           # nothing left to rewrite
    assert w.apply({}).ok and addrs(maps, "extbe") == []


def test_the_cli_dump_shows_the_filter_rows_as_addresses():
    from kproxy_ebpf.datapath.maps import reader

    maps = ext_maps()
    MapWriter(maps).apply(table(ext_fe("10.250.0.11", 30080, ["10.244.1.10"],
                                       local=("10.244.1.10",))))
    assert reader.dump(maps["extaddr"]) == [{"key": "10.250.0.11", "value": 1}]
    assert reader.dump(maps["extbe"]) == [{"key": "10.244.1.10", "value": 1}]


def test_draining_backends_keep_their_rows_until_they_stop_serving(maps):
    """Frontend.draining: the backend row (and id) of a serving endpoint that left the slots
    stays, so tc_lb.c keeps the flows to it; it goes when the endpoint is no longer listed."""
    w = MapWriter(maps)
    a, b = Backend.of("10.244.1.5", 8080, TCP), Backend.of("10.244.2.6", 8080, TCP)
    both = fe((a, b), scope=Scope.EXT)
    assert w.apply(table(both)).ok
    bid = {L.ip_str(v.addr): k.value for k, v in maps["backend"].items()}
    assert w.apply(table(dataclasses.replace(both, backends=(a,), draining=(b,)))).ok
    assert rows(maps, L.SCOPE_EXT) == {0: (1, L.ACTION_NUM[Action.FORWARD]), 1: "10.244.1.5"}
    kept = {L.ip_str(v.addr): k.value for k, v in maps["backend"].items()}
    assert kept == bid, "the draining backend keeps its row and id"
    assert w.apply(table(dataclasses.replace(both, backends=(a,)))).ok
    assert {L.ip_str(v.addr) for _, v in maps["backend"].items()} == {"10.244.1.5"}
