"""bpf/lib/sched.h under BPF_PROG_TEST_RUN (bpf/tests/lb_run.c): round robin's rotation and
least connection's choice, on real maps programmed by the real MapWriter, with the test
choosing the random numbers and the connection counts. Both families (test_lb_run's `fam`)."""
from __future__ import annotations

from collections import Counter
from dataclasses import replace

import pytest

from kproxy_ebpf.datapath.maps import conn_load
from kproxy_ebpf.datapath.maps import layout as L
from kproxy_ebpf.datapath.write import lc_ids
from kproxy_ebpf.model.objects import LBAlgorithm, Protocol, hostport

from . import test_lb_run as lb
from .test_lb_run import FORWARD, backend_of, frontend, run

harness, program, fam = lb.harness, lb.program, lb.fam     # the same fixtures

pytestmark = pytest.mark.root
RR, LC = LBAlgorithm.ROUND_ROBIN, LBAlgorithm.LEAST_CONN
TCP = Protocol.TCP
Conns = L.STRUCTS["kp_conns"]


def picks(fd, fam, port: int, n: int, rnd=lambda i: (i * 7919, i * 104729)) -> list[tuple[str, int]]:
    out = []
    for i in range(n):
        res = run(fd, fam, port, rnd=rnd(i))
        assert res.verdict == FORWARD
        out.append(backend_of(res))
    return out


def test_round_robin_gives_each_backend_its_turn_whatever_the_random_numbers(program, fam):
    fd, _, apply = program
    ips = [fam.pod(i) for i in range(10, 14)]
    apply(replace(frontend(fam, 90, ips), algorithm=RR))
    got = picks(fd, fam, 90, 12)
    assert Counter(got) == {(ip, 8080): 3 for ip in ips}
    assert got[:4] == got[4:8] == got[8:], "one rotation, in slot order, repeated"


def test_round_robin_goes_on_after_a_change_without_skipping_or_doubling(program, fam):
    """Slots A B C D; two picks (A, B); C leaves and E comes (into C's slot). The rotation
    goes on at D, the first after B still there; then A, B, E, D in turn."""
    fd, _, apply = program
    a, b, c, d, e = (fam.pod(i) for i in range(10, 15))
    w = apply(replace(frontend(fam, 91, [a, b, c, d]), algorithm=RR))
    order = [k[0] for k in w.programmed[frontend(fam, 91).key].order()]
    assert order == [a, b, c, d]
    assert [ip for ip, _ in picks(fd, fam, 91, 2)] == [a, b]
    w = apply(replace(frontend(fam, 91, [a, b, d, e]), algorithm=RR))
    assert [k[0] for k in w.programmed[frontend(fam, 91).key].order()] == [a, b, e, d]
    assert [ip for ip, _ in picks(fd, fam, 91, 5)] == [d, a, b, e, d]


def test_round_robin_without_its_cursor_picks_at_random_and_counts_it(program, fam):
    fd, maps, apply = program
    apply(replace(frontend(fam, 92, [fam.pod(10), fam.pod(11)]), algorithm=RR))
    maps["rr"].delete(L.svc_key(fam.vip, 92, TCP))
    stat = L.U32(L.const("KP_STAT_RR_NO_CURSOR"))
    before = sum(maps["stats"].get(stat))
    assert {ip for ip, _ in picks(fd, fam, 92, 2, rnd=lambda i: (i, i))} == {fam.pod(10), fam.pod(11)}
    assert sum(maps["stats"].get(stat)) == before + 2


def _set_conns(maps, w, fam, counts: dict[str, int]) -> None:
    for ip, n in counts.items():
        bid = w.backend_ids.get((ip, 8080, TCP))
        ix = maps["connix"].get(L.U32(bid))
        word = maps["connload"].get(ix).value
        maps["connload"].put(ix, L.MAPS["connload"].value(conn_load.word(conn_load.gen(word), n)))


def _head(maps, fam, port: int):
    return maps["svc"].get(L.svc_key(fam.vip, port, TCP))


def _ix(maps, w, ip: str) -> int:
    return maps["connix"].get(L.U32(w.backend_ids.get((ip, 8080, TCP)))).value


def test_least_conn_takes_the_backend_with_the_fewest_connections(program, fam):
    """At most KP_LC_ROW backends: the kp_lcrow row slot 0 names (an array lookup)."""
    fd, maps, apply = program
    a, b, c = (fam.pod(i) for i in range(10, 13))
    w = apply(replace(frontend(fam, 93, [a, b, c]), algorithm=LC))
    at = _head(maps, fam, 93).backend_id
    assert at, "slot 0 names its kp_lcrow row"
    _set_conns(maps, w, fam, {a: 5, b: 2, c: 7})
    assert {ip for ip, _ in picks(fd, fam, 93, 6)} == {b}
    res = run(fd, fam, 93, rnd=(1, 1))
    assert res.conn_ix == _ix(maps, w, b), "the counter the row names for the chosen slot"
    _set_conns(maps, w, fam, {b: 9})
    assert {ip for ip, _ in picks(fd, fam, 93, 6)} == {a}
    # Ties spread (the scan starts at a random slot); a count below zero reads as zero.
    _set_conns(maps, w, fam, {a: 0, b: -3, c: 1})
    assert {ip for ip, _ in picks(fd, fam, 93, 12, rnd=lambda i: (i, i))} == {a, b}
    # A row that does not cover the count (never so as the agent writes it): at random,
    # counted.
    maps["lcrow"].put(L.U32(at), L.STRUCTS["kp_lc_row"](count=2))
    stat = L.U32(L.const("KP_STAT_LC_NO_IDS"))
    before = sum(maps["stats"].get(stat))
    assert {ip for ip, _ in picks(fd, fam, 93, 12, rnd=lambda i: (i, i))} == {a, b, c}
    assert sum(maps["stats"].get(stat)) == before + 12


def test_least_conn_past_the_array_row_reads_the_hashed_row(program, fam):
    """More than KP_LC_ROW backends: slot 0 names no row, the kp_lcids row is read."""
    fd, maps, apply = program
    n = L.const("KP_LC_ROW") + 5
    ips = [fam.pod(i) for i in range(10, 10 + n)]
    w = apply(replace(frontend(fam, 97, ips), algorithm=LC))
    assert _head(maps, fam, 97).backend_id == 0
    assert maps["lcids"].get(L.svc_key(fam.vip, 97, TCP)).count == n
    few = ips[7]
    _set_conns(maps, w, fam, dict.fromkeys(ips, 3) | {few: 1})
    for i in range(4):
        res = run(fd, fam, 97, rnd=(i * 5, i * 5))
        assert backend_of(res) == (few, 8080) and res.conn_ix == _ix(maps, w, few)
    # Back to KP_LC_ROW: an array row again, the hashed row gone after the slot 0.
    w = apply(replace(frontend(fam, 97, ips[:3]), algorithm=LC))
    assert _head(maps, fam, 97).backend_id
    assert maps["lcids"].get(L.svc_key(fam.vip, 97, TCP)) is None
    _set_conns(maps, w, fam, {ips[0]: 4, ips[1]: 4, ips[2]: 0})
    assert {ip for ip, _ in picks(fd, fam, 97, 4)} == {ips[2]}


def test_least_conn_with_no_array_row_named_reads_the_hashed_row(program, fam):
    """Slot 0 of a least-conn frontend with backend_id 0 (an older agent's, or no row was
    free): the kp_lcids row, and without one a pick at random, counted; never a Maglev
    table."""
    fd, maps, apply = program
    a, b, c = (fam.pod(i) for i in range(10, 13))
    w = apply(replace(frontend(fam, 98, [a, b, c]), algorithm=LC))
    key = L.svc_key(fam.vip, 98, TCP)
    head = maps["svc"].get(key)
    head.backend_id = 0
    maps["svc"].put(key, head)
    stat = L.U32(L.const("KP_STAT_LC_NO_IDS"))
    before = sum(maps["stats"].get(stat))
    assert {ip for ip, _ in picks(fd, fam, 98, 12, rnd=lambda i: (i, i))} == {a, b, c}
    assert sum(maps["stats"].get(stat)) == before + 12
    order = w.programmed[frontend(fam, 98).key].order()
    maps["lcids"].put(key, lc_ids.row([_ix(maps, w, ip) for ip, _, _ in order]))
    _set_conns(maps, w, fam, {a: 2, b: 2, c: 1})
    res = run(fd, fam, 98, rnd=(0, 0))
    assert backend_of(res) == (c, 8080) and res.conn_ix == _ix(maps, w, c)
    assert sum(maps["stats"].get(stat)) == before + 12
    maps["lcids"].delete(key)


def test_least_conn_scans_a_bounded_window_of_a_large_service(program, fam):
    """KP_LC_SCAN slots from a random one: with 40 backends, the 8 outside the window the
    random number opens are never read, however few connections they have."""
    fd, maps, apply = program
    scan = L.const("KP_LC_SCAN")
    ips = [fam.pod(i) for i in range(10, 10 + scan + 8)]
    w = apply(replace(frontend(fam, 94, ips), algorithm=LC))
    order = [k[0] for k in w.programmed[frontend(fam, 94).key].order()]
    _set_conns(maps, w, fam, dict.fromkeys(order[:scan], 1) | dict.fromkeys(order[scan:], 0))
    res = run(fd, fam, 94, rnd=(0, 0))          # window: slots 1..scan, all with 1
    assert res.slot == 1
    res = run(fd, fam, 94, rnd=(scan, scan))    # window: slots scan+1.., 8 of them with 0
    assert order[res.slot - 1] in order[scan:]


def test_trace_names_the_backend_the_c_gives_next(program, fam):
    """inspect/trace_sched.py restates the rules: the same rows, the same answer."""
    from kproxy_ebpf.inspect.trace import trace
    from kproxy_ebpf.model.desired import Scope

    fd, maps, apply = program
    a, b, c = (fam.pod(i) for i in range(10, 13))
    w = apply(replace(frontend(fam, 95, [a, b, c]), algorithm=RR),
              replace(frontend(fam, 96, [a, b, c]), algorithm=LC))
    for _ in range(4):
        t = trace(maps, fam.vip, 95, TCP, Scope.SOCK)
        assert any(s.step == "round-robin" for s in t.steps)
        assert t.chosen == hostport(*picks(fd, fam, 95, 1)[0])
    for counts in ({a: 3, b: 1, c: 2}, {a: 0, b: 4, c: 4}, {a: 2, b: 2, c: 1}):
        _set_conns(maps, w, fam, counts)
        t = trace(maps, fam.vip, 96, TCP, Scope.SOCK)
        assert [t.chosen] == [hostport(*p) for p in set(picks(fd, fam, 96, 4))]


def test_an_unconnected_udp_flow_counts_once_for_least_conn(program, fam):
    """The socket path's unconnected UDP (req.flow: the socket's cookie): its first datagram
    makes a kp_flow row marked counted and adds a flow to its backend; the next ones reuse the
    row and count nothing. The agent's repair takes it out once it expires (flow_fix.py)."""
    fd, maps, apply = program
    a, b = fam.pod(10), fam.pod(11)
    w = apply(replace(frontend(fam, 95, [a, b]), algorithm=LC))   # (lb.h reads no protocol)

    def flows(ip):
        bid = w.backend_ids.get((ip, 8080, TCP))
        ix = maps["connix"].get(L.U32(bid))
        row = maps["conns"].get(ix)
        return row.flows_open

    before = {ip: flows(ip) for ip in (a, b)}
    got = {backend_of(run(fd, fam, 95, rnd=(i, i), flow=777)) for i in range(3)}
    assert len(got) == 1, "one flow, one backend"
    after = {ip: flows(ip) for ip in (a, b)}
    assert sum(after.values()) - sum(before.values()) == 1
    family = 6 if ":" in fam.vip else 4       # (an earlier test's rows may name these ids)
    rows = [v for k, v in maps["flow"].items()
            if v.flags & L.const("KP_AFF_F_COUNTED") and k.family == family and k.client == 777]
    assert len(rows) == 1
    # Another socket's flow goes to the other backend: it has fewer open.
    res = run(fd, fam, 95, rnd=(0, 0), flow=778)
    (one,) = [ip for ip in (a, b) if after[ip] > before[ip]]
    assert L.ip_str(res.be.addr) != one
