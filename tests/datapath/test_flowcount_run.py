"""bpf/lib/flowcount.h under BPF_PROG_TEST_RUN (tc_lb.c's kp_from_outside, harness tcrun.py):
least-conn counts the TC path's flows from first packet to FIN/RST, a flow's end once, only
for least-conn frontends, picks by them, and the agent's repair (datapath/flows/flow_fix.py)
brings the counts back to the conntrack table's truth after a flow vanished without a close.
Both families."""
from __future__ import annotations

from dataclasses import replace

import pytest

from kproxy_ebpf.datapath.flows import flow_fix
from kproxy_ebpf.datapath.maps import conn_load
from kproxy_ebpf.datapath.maps import layout as L
from kproxy_ebpf.model.desired import FrontendKind
from kproxy_ebpf.model.objects import LBAlgorithm

from .tcrun import ACK, FAMILIES, FIN, ISN, RST, SYN, TC_ACT_OK, TCP, UDP, Addrs, TcRun, frontend, packet, parse

pytestmark = pytest.mark.root

LC_TCP, PLAIN, LC_UDP = 30090, 30091, 30092
COUNTED = L.const("KP_CT_F_COUNTED")


@pytest.fixture(params=sorted(FAMILIES))
def fam(request) -> Addrs:
    return FAMILIES[request.param]


def np(a: Addrs, port: int, algorithm: LBAlgorithm, proto=TCP):
    f = frontend(a.node, port, FrontendKind.NODE_PORT, f"np{port}",
                 [(a.local_be, True), (a.local_be2, True)], proto=proto)
    return replace(f, algorithm=algorithm)


class FlowRun(TcRun):
    def __init__(self, harness, a: Addrs):
        super().__init__(harness, [np(a, LC_TCP, LBAlgorithm.LEAST_CONN),
                                   np(a, PLAIN, LBAlgorithm.RANDOM),
                                   np(a, LC_UDP, LBAlgorithm.LEAST_CONN, UDP)])
        self.a = a
        for _, ix, row in flow_fix.counters(self.maps):     # arrays: zeroed, not deleted
            row.flows_open = row.flows_done = 0
            self.maps["conns"].put(L.U32(ix), row)
            word = conn_load.word(conn_load.gen(self.maps["connload"].get(L.U32(ix)).value))
            self.maps["connload"].put(L.U32(ix), L.MAPS["connload"].value(word))
            self.maps["flowfix"].put(L.U32(ix), L.MAPS["flowfix"].value(0))

    def send(self, sport: int, port: int = LC_TCP, flags: int = SYN, proto=TCP,
             seq: int = ISN) -> str:
        """A client's packet; returns the backend address it went to."""
        ret, out = self.run("kp_from_outside", packet(self.a.client, sport, self.a.node, port,
                                                      proto, flags, seq=seq))
        assert ret == TC_ACT_OK
        return parse(out)["dst"]

    def bid(self, ip: str, proto=TCP) -> int:
        return self.writer.backend_ids.get((ip, 8080, proto))

    def row(self, ip: str, proto=TCP):
        """The backend's kp_conns row (through kp_connix), None without a counter."""
        bid = self.bid(ip, proto)
        return next((r for b, _, r in flow_fix.counters(self.maps) if b == bid), None)

    def counters(self, ip: str, proto=TCP) -> tuple[int, int]:
        row = self.row(ip, proto)
        return (row.flows_open, row.flows_done) if row is not None else (0, 0)

    def active(self, ip: str, proto=TCP) -> int:
        """What least-conn compares for the backend: its kp_connload less its fix, which
        with no socket counted must be what the flow counters say."""
        bid = self.bid(ip, proto)
        found = next(((ix, r) for b, ix, r in flow_fix.counters(self.maps) if b == bid), None)
        if found is None:
            return 0
        ix, row = found
        load = flow_fix.load_at(self.maps, ix)
        assert load == row.flows_open - row.flows_done, (load, row)
        return load - flow_fix.fix_at(self.maps, ix)

    def other(self, ip: str) -> str:
        return self.a.local_be2 if ip == self.a.local_be else self.a.local_be


@pytest.fixture
def fr(harness, fam):
    run = FlowRun(harness, fam)
    try:
        yield run
    finally:
        run.close()


def test_a_syn_to_a_least_conn_nodeport_counts_a_flow_open(fr):
    be = fr.send(41000)
    assert fr.counters(be) == (1, 0)
    assert fr.counters(fr.other(be)) == (0, 0)
    _, ct = fr.ct(fr.a.client, 41000, fr.a.node, LC_TCP)
    assert ct.flags & COUNTED
    fr.send(41000, flags=ACK)                      # more packets of the flow: no new count
    assert fr.counters(be) == (1, 0)


def test_a_frontend_that_is_not_least_conn_counts_nothing(fr):
    """Its backends are the least-conn NodePort's too (one counter each): untouched."""
    be = fr.send(41001, PLAIN)
    _, ct = fr.ct(fr.a.client, 41001, fr.a.node, PLAIN)
    assert not ct.flags & COUNTED
    fr.send(41001, PLAIN, flags=FIN | ACK)
    assert fr.counters(be) == (0, 0)


@pytest.mark.parametrize("end", [FIN | ACK, RST])
def test_a_close_counts_the_flow_done_once(fr, end):
    be = fr.send(41002)
    fr.send(41002, flags=end)
    assert fr.counters(be) == (1, 1)
    fr.send(41002, flags=end)                      # a retransmission, or the other FIN
    fr.send(41002, flags=FIN | ACK)
    assert fr.counters(be) == (1, 1)
    assert fr.active(be) == 0


def test_the_backends_reply_fin_counts_the_end_too(fr):
    be = fr.send(41003)
    fr.run("kp_to_outside", packet(be, 8080, fr.a.client, 41003, flags=SYN | ACK))
    fr.run("kp_to_outside", packet(be, 8080, fr.a.client, 41003, flags=FIN | ACK))
    assert fr.counters(be) == (1, 1)
    fr.send(41003, flags=FIN | ACK)
    assert fr.counters(be) == (1, 1)


def test_a_new_flow_goes_to_the_backend_with_fewer_open_flows(fr):
    first = fr.send(41010)
    second = fr.send(41011)
    assert second == fr.other(first)
    fr.send(41011, flags=RST)                      # second's only flow ends
    assert fr.send(41012) == second
    fr.send(41010, flags=FIN | ACK)                # first's ends
    assert fr.send(41013) == first


def test_a_live_flow_reopened_on_its_tuple_counts_its_end(fr):
    """A SYN with another ISN on a flow never answered: the client gave that attempt up, the
    flow is load-balanced anew; the old flow's end and the new flow's open are both counted."""
    be = fr.send(41020)
    be2 = fr.send(41020, seq=ISN + 5000)
    assert fr.active(be) + (0 if be2 == be else fr.active(be2)) == 1
    opened = sum(fr.counters(ip)[0] for ip in {be, be2})
    assert opened == 2


def test_the_repair_brings_active_back_to_the_table_after_a_row_vanished(fr):
    """A flow evicted from the LRU (or expired and never seen again) gets no close: its
    count stays open until the agent's repair takes it out; then new flows count as usual."""
    be = fr.send(41030)
    fr.send(41031)
    key, _ = fr.ct(fr.a.client, 41030, fr.a.node, LC_TCP)
    fr.maps["ct"].delete(key)
    assert fr.active(be) == 1
    res = flow_fix.repair(fr.maps)
    assert res.written == 1 and res.walked >= 1
    assert fr.active(be) == 0 and fr.active(fr.other(be)) == 1
    assert flow_fix.repair(fr.maps).written == 0, "recomputed, not added to"
    assert fr.send(41032) == be, "the repaired count is what least-conn compares"
    assert fr.active(be) == 1
    fr.send(41032, flags=RST)
    assert fr.active(be) == 0


def test_an_expired_row_overwritten_is_left_to_the_repair(fr):
    be = fr.send(41040)
    key, ct = fr.ct(fr.a.client, 41040, fr.a.node, LC_TCP)
    ct.expires = 1                                  # long past
    fr.maps["ct"].put(key, ct)
    flow_fix.repair(fr.maps)                        # the expired flow is not live: fixed out
    assert fr.active(be) == 0
    be2 = fr.send(41040)                            # a new flow on the tuple
    assert fr.active(be2) == 1 and fr.active(fr.other(be2)) == 0, "not taken out twice"
    flow_fix.repair(fr.maps)
    assert fr.active(be2) == 1 and fr.active(fr.other(be2)) == 0


def test_unconnected_udp_counts_as_a_flow_until_it_expires(fr):
    be = fr.send(41050, LC_UDP, flags=0, proto=UDP)
    fr.send(41050, LC_UDP, flags=0, proto=UDP)
    assert fr.counters(be, UDP) == (1, 0)
    assert fr.send(41051, LC_UDP, flags=0, proto=UDP) == fr.other(be)
    key, ct = fr.ct(fr.a.client, 41050, fr.a.node, LC_UDP, UDP)
    ct.expires = 1
    fr.maps["ct"].put(key, ct)
    flow_fix.repair(fr.maps)
    assert fr.active(be, UDP) == 0 and fr.active(fr.other(be), UDP) == 1
