"""Least connection from outside, with real packets (lab "tcns" of test_tc_lab.py): a NodePort
of a least-conn Service counts the external client's TCP connections held through node1's
TC path (flows, lib/flowcount.h), picks by them, and every count is back to zero once the
connections are closed, reset, or their process is killed; the agent's repair
(datapath/flows/flow_fix.py) then finds nothing to fix.
"""
from __future__ import annotations

from dataclasses import replace

import pytest

from kproxy_ebpf.datapath.flows import flow_fix
from kproxy_ebpf.model.objects import LBAlgorithm

from ..support import wait_until
from . import test_tc_lab as tcl
from .holder import Holder

lab, nodes, fam = tcl.lab, tcl.nodes, tcl.fam      # the same fixtures (one lab per module)

pytestmark = pytest.mark.root



def open_flows(node, lab, fam) -> dict[str, int]:
    """Pod -> the flows least-conn counts open to it on `node` (nonzero ones)."""
    pods = {fam.ip(lab, p): p for p in tcl.PODS}
    out = {}
    rows = {b: (ix, r) for b, ix, r in flow_fix.counters(node.maps)}
    for (ip, _port, _proto), bid in node.writer.backend_ids:
        ix, row = rows.get(bid, (0, None))
        n = 0 if row is None else row.flows_open - row.flows_done - flow_fix.fix_at(node.maps, ix)
        if n:
            out[pods.get(ip, ip)] = n
    return out


def test_least_conn_from_outside_counts_the_flows_held_until_they_end(lab, nodes, fam):
    svc = replace(tcl.nodeport(fam, "np-lc"), lb_algorithm=LBAlgorithm.LEAST_CONN)
    tcl.program(nodes, lab, fam, svc, ["a1", "b1"])
    node1 = nodes[0]
    h = Holder(lab, "ext", fam.node_ip(lab, "node1"), 30080)
    try:
        first = h.do("tcp")
        second = h.do("tcp")
        assert {first, second} == {"a1", "b1"}, "the backend without a flow"
        assert open_flows(node1, lab, fam) == {"a1": 1, "b1": 1}
        assert h.do("close 0") == "closed"
        wait_until(lambda: open_flows(node1, lab, fam) == {second: 1}, 5,
                   lambda: f"the closed flow done: {open_flows(node1, lab, fam)}")
        assert h.do("tcp") == first, "the backend whose flow closed"
        assert h.do("rst 1") == "reset"
        wait_until(lambda: open_flows(node1, lab, fam) == {first: 1}, 5,
                   lambda: f"the reset flow done: {open_flows(node1, lab, fam)}")
        h.do("tcp")
        assert sum(open_flows(node1, lab, fam).values()) == 2
    finally:
        h.kill()
    # The process killed: its kernel closes the sockets, their FINs end the flows.
    wait_until(lambda: not open_flows(node1, lab, fam), 10,
               lambda: f"every count back to zero: {open_flows(node1, lab, fam)}")
    assert flow_fix.repair(node1.maps).written == 0, "the counters agree with the table"
