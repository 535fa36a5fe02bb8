"""datapath/flows/flow_fix.py: least-conn's repair of the TC path's flow counts, on fake maps
(the arithmetic, and that a close missed is wrong for one period, never for longer)."""
from __future__ import annotations

import random
import threading
import time

from kproxy_ebpf.agent.flow_repair import FlowRepair
from kproxy_ebpf.datapath.flows import conn_counts, flow_fix
from kproxy_ebpf.datapath.maps import conn_load
from kproxy_ebpf.datapath.maps import layout as L
from kproxy_ebpf.serve.metrics import Metrics

from ...fakemaps import fake_maps

Conns = L.STRUCTS["kp_conns"]
Load = L.MAPS["connload"].value
COUNTED = flow_fix.COUNTED
AFF = flow_fix.AFF_COUNTED
NEW, EST, CLOSING, CLOSED = (L.const(f"KP_CT_{s}") for s in ("NEW", "ESTABLISHED", "CLOSING",
                                                             "CLOSED"))
NOW = 10**15
LATER = NOW + 10**12


def ct_row(maps, n: int, bid: int, state=EST, flags=COUNTED, expires=LATER) -> L.CtKey:
    key = L.ct_key("10.0.0.9", 30000 + n, "10.0.0.1", 80, 6)
    maps["ct"].put(key, L.CtVal(state=state, flags=flags, expires=expires, backend_id=bid))
    return key


def counters(maps, bid: int, opened: int, done: int, sock: int = 0) -> None:
    """Backend id bid's counter, at index 10 * bid (the writer's lc_ids.py gives them)."""
    ix = L.U32(10 * bid)
    maps["connix"].put(L.U32(bid), ix)
    maps["conns"].put(ix, Conns(backend_id=bid, flows_open=opened, flows_done=done))
    maps["connload"].put(ix, Load(conn_load.word(7, sock + opened - done)))


def fix_of(maps) -> dict[int, int]:
    """backend id -> its fix now, for the backends with a counter."""
    return {bid: flow_fix.fix_at(maps, ix) for bid, ix, _ in flow_fix.counters(maps)}


def active(maps, bid: int) -> int:
    row = maps["conns"].get(maps["connix"].get(L.U32(bid)))
    return row.flows_open - row.flows_done - fix_of(maps).get(bid, 0)


def test_the_fix_is_what_the_counters_say_beyond_the_live_rows():
    assert flow_fix.fixes({1: (10, 4), 2: (3, 3), 3: (5, 0)}, {1: 2, 3: 5}) == {1: 4, 2: 0, 3: 0}
    assert flow_fix.fixes({1: (2, 3)}, {}) == {1: -1}, "a done counted on a row never opened"


def test_a_live_flow_is_counted_not_ended_and_not_expired():
    life = L.CtVal(state=EST, flags=COUNTED, expires=LATER).life
    assert flow_fix.counted_live(life, NOW)
    assert not flow_fix.counted_live(life, LATER + 2**16), "expired"
    for state in (CLOSING, CLOSED):
        assert not flow_fix.counted_live(L.CtVal(state=state, flags=COUNTED,
                                                 expires=LATER).life, NOW)
    assert not flow_fix.counted_live(L.CtVal(state=NEW, expires=LATER).life, NOW), "unmarked"
    assert flow_fix.counted_live(L.CtVal(state=NEW, flags=COUNTED, expires=LATER).life, NOW)


def test_load_is_sockets_plus_open_flows_never_below_zero():
    assert flow_fix.load(2 + 7 - 3, 1) == 5
    assert flow_fix.load(0 + 1 - 3, 0) == 0
    assert flow_fix.sockets(2 + 7 - 3, Conns(flows_open=7, flows_done=3)) == 2
    assert flow_fix.sockets(1 - 3, Conns(flows_open=1, flows_done=3)) == 0


def test_a_repair_writes_nonzero_fixes_only_and_drops_the_rest():
    maps = fake_maps(("conns", "connix", "connload", "ct", "flowfix"))
    counters(maps, 1, 5, 1)          # 4 open by the counters, 2 live in the table
    counters(maps, 2, 3, 1)          # 2 open, 2 live
    for n, bid in enumerate((1, 1, 2, 2)):
        ct_row(maps, n, bid)
    ct_row(maps, 10, 1, state=CLOSING)            # ended: not live
    ct_row(maps, 11, 1, expires=NOW - 10**9)      # expired: not live
    ct_row(maps, 12, 2, flags=0)                  # not a least-conn flow
    maps["flowfix"].put(L.U32(20), L.MAPS["flowfix"].value(3))    # a previous holder's
    res = flow_fix.repair(maps, NOW)
    assert (res.walked, res.written) == (7, 2)
    assert fix_of(maps) == {1: 2, 2: 0}
    assert (active(maps, 1), active(maps, 2)) == (2, 2)
    assert flow_fix.repair(maps, NOW).written == 0


def test_needed_only_while_some_backend_reads_open_flows():
    maps = fake_maps(("conns", "connix", "connload", "ct", "flowfix"))
    assert not flow_fix.needed(maps)
    counters(maps, 1, 4, 4, sock=3)
    assert not flow_fix.needed(maps), "sockets are no flows"
    counters(maps, 1, 5, 4)
    assert flow_fix.needed(maps)
    flow_fix.repair(maps, NOW)                     # no live row: fixed to zero
    assert not flow_fix.needed(maps)


def test_missed_closes_never_accumulate():
    """A model of the datapath: flows open and close by packets (counted), or vanish (LRU
    eviction, expiry: not counted); after every repair each backend's active count is the
    table's truth, however many closes were missed in all the periods before."""
    rnd = random.Random(46)
    maps = fake_maps(("conns", "connix", "connload", "ct", "flowfix"))
    opened, done = {1: 0, 2: 0}, {1: 0, 2: 0}
    live: dict[int, int] = {}        # flow n -> backend
    n = 0
    for _ in range(30):
        for _ in range(rnd.randrange(20)):
            bid = rnd.choice((1, 2))
            n += 1
            live[n] = bid
            opened[bid] += 1
            ct_row(maps, n, bid)
        for f in rnd.sample(sorted(live), len(live) // 3):
            bid = live.pop(f)
            key = L.ct_key("10.0.0.9", 30000 + f, "10.0.0.1", 80, 6)
            if rnd.random() < 0.5:
                done[bid] += 1                     # FIN/RST: the row stays, ended
                maps["ct"].put(key, L.CtVal(state=CLOSING, flags=COUNTED, expires=LATER,
                                            backend_id=bid))
            else:
                maps["ct"].delete(key)             # vanished without a close
        for bid in (1, 2):
            counters(maps, bid, opened[bid], done[bid])
        flow_fix.repair(maps, NOW)
        for bid in (1, 2):
            assert active(maps, bid) == sum(1 for b in live.values() if b == bid)


def test_the_metric_counts_open_flows_beside_sockets():
    maps = fake_maps(("conns", "connix", "connload", "ct", "flowfix", "backend"))
    maps["backend"].put(L.U32(1), L.STRUCTS["kp_backend"](addr=L.ip16("10.0.0.1"),
                                                          port=L.port_be(8080), proto=6))
    counters(maps, 1, 5, 1, sock=2)
    ct_row(maps, 0, 1)
    flow_fix.repair(maps, NOW)
    assert conn_counts.counts_by_backend(maps) == [("10.0.0.1:8080", "TCP", 3)]


def test_the_agent_walks_only_with_a_least_conn_frontend_or_open_counts():
    maps = fake_maps(("conns", "connix", "connload", "ct", "flowfix"))
    lc = threading.Event()
    repair = FlowRepair(lambda: maps, Metrics(), lc.is_set)
    assert repair.run_once() is None
    lc.set()
    assert repair.run_once() is not None
    lc.clear()
    counters(maps, 1, 2, 0)
    res = repair.run_once()
    assert res is not None and res.written == 1
    assert repair.run_once() is None, "nothing open any more"
    assert FlowRepair(lambda: {}, Metrics(), lc.is_set).run_once() is None, "older maps"


def test_unconnected_udp_flows_of_the_socket_path_are_live_until_their_timeout():
    maps = fake_maps(("conns", "connix", "connload", "ct", "flowfix", "flow"))
    counters(maps, 1, 3, 0)                        # three kp_flow rows made, none ended
    aff = L.STRUCTS["kp_aff_val"]
    for n, (age, flags) in enumerate(((0, AFF), (flow_fix.UDP_FLOW_NS, AFF),
                                      (flow_fix.UDP_FLOW_NS + 1, AFF), (0, 0))):
        key = L.STRUCTS["kp_aff_key"](client=n + 1, svc_id=5, type=1, family=4)
        maps["flow"].put(key, aff(last_used=NOW - age, backend_id=1, slot=1, flags=flags))
    res = flow_fix.repair(maps, NOW)
    assert res.walked == 4
    assert active(maps, 1) == 2, "the fresh and the one at its timeout; not the expired"


def test_services_wide_counts_unconnected_udp_flows_as_active():
    maps = fake_maps(("conns", "connix", "connload", "flowfix", "flow"))
    counters(maps, 1, 2, 0, sock=1)                # one socket, two kp_flow rows
    aff = L.STRUCTS["kp_aff_val"]
    now = time.clock_gettime_ns(time.CLOCK_MONOTONIC)
    for n, age in enumerate((0, flow_fix.UDP_FLOW_NS + 10**9)):
        key = L.STRUCTS["kp_aff_key"](client=n + 1, svc_id=5, type=1, family=4)
        maps["flow"].put(key, aff(last_used=now - age, backend_id=1, slot=1, flags=AFF))
    assert conn_counts.per_backend(maps) == {1: conn_counts.Conns(active=2)}, \
        "the socket and the fresh flow; not the flow past its timeout"
