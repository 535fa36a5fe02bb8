"""Round robin and least connection with real sockets in the dp lab (dplab.py): clients in a
pod of node1, echo servers in pods of both nodes, node1 programmed in-process.

Round robin on both ClusterIP paths (the socket hooks and, with `socketLB: false`, the TC
programs on the pod veths: one lib/sched.h for both). Least connection counts what the socket
hooks see from connect to close (kp_conns): the tests hold connections in a client process and
check the choice and the counts, down to zero after every way a connection ends: close, a RST,
the process killed.
"""
from __future__ import annotations

import json
import subprocess
import sys
from collections import Counter
from dataclasses import replace

import pytest
from click.testing import CliRunner

from kproxy_ebpf.cli.main import main
from kproxy_ebpf.datapath.flows import flow_fix
from kproxy_ebpf.datapath.maps import conn_load
from kproxy_ebpf.dev.lab import procs
from kproxy_ebpf.model.objects import LBAlgorithm

from ..support import wait_until
from .dplab import LB_PATHS, pod_of, service
from .holder import Holder

pytestmark = pytest.mark.root
HTTP, HTTP_EP = ("http", "TCP", 80), ("http", "TCP", 8080)
DNS, DNS_EP = ("dns", "UDP", 53), ("dns", "UDP", 5353)
BACKENDS = ["a1", "a2", "b1", "b2"]


def counts(node1, lab, fam) -> Counter:
    """Connections kp_conns holds per backend pod."""
    ids = {bid: b for b, bid in node1.writer.backend_ids}
    pod_by_ip = {fam.ip(lab, p): p for p in BACKENDS}
    out: Counter = Counter()
    maps = node1.datapath.maps
    for bid, ix, row in flow_fix.counters(maps):
        b, n = ids.get(bid), flow_fix.sockets(flow_fix.load_at(maps, ix), row)
        if b is not None and n:
            out[pod_by_ip[b[0]]] += n
    return out


@pytest.mark.parametrize("lb_path", LB_PATHS, indirect=True)
def test_round_robin_gives_every_backend_its_turn(lab, node1, fam, lb_path):
    svc = replace(service("web", fam.vip(30), HTTP), lb_algorithm=LBAlgorithm.ROUND_ROBIN)
    node1.program(svc, fam.endpoints(lab, "web", BACKENDS, HTTP_EP))
    got = [pod_of(x) for x in lab.probe("client", fam.vip(30), 80, count=40)]
    assert Counter(got) == dict.fromkeys(BACKENDS, 10), got
    assert all(got[i] == got[i % 4] for i in range(40)), f"one rotation, repeated: {got}"


def test_least_conn_follows_the_connections_held(lab, node1, fam):
    svc = replace(service("web", fam.vip(31), HTTP, DNS), lb_algorithm=LBAlgorithm.LEAST_CONN)
    node1.program(svc, fam.endpoints(lab, "web", BACKENDS, HTTP_EP, DNS_EP))
    h = Holder(lab, "client", fam.vip(31))
    try:
        first = [h.do("tcp") for _ in range(3)]
        assert len(set(first)) == 3, first
        (rest,) = set(BACKENDS) - set(first)
        assert h.do("tcp") == rest, "the one backend without a connection"
        assert counts(node1, lab, fam) == dict.fromkeys(BACKENDS, 1)
        out = CliRunner().invoke(main, ["services", "--bpffs-dir", str(node1.bpffs), "-o", "json"])
        (row,) = [r for r in json.loads(out.output) if r["address"] == fam.vip(31) and r["port"] == 80]
        assert row["algorithm"] == "least-conn"
        assert [(b["active"], b["inactive"]) for b in row["backends"]] == [(1, 0)] * 4
        assert h.do("close 0") == "closed"
        assert h.do("tcp") == first[0], "the backend whose connection closed"
        # A connected UDP socket is a connection while it lives; a RST ends one as a close does.
        udp = h.do("udp")
        before = counts(node1, lab, fam)
        assert before[udp] == 2 and sum(before.values()) == 5
        assert h.do("rst 1") == "reset"
        before[first[1]] -= 1
        assert counts(node1, lab, fam) == +before
    finally:
        h.kill()
    # The process killed with its sockets open: their release still takes each back.
    wait_until(lambda: not counts(node1, lab, fam), 10, "every count back to zero")


def test_a_socket_connected_again_moves_its_count(lab, node1, fam):
    """A UDP socket connected to the Service five times (the agent's reconnect of a stale one
    does the same) is counted once, on its latest backend; connected then to a Service that
    is not least-conn, it is counted nowhere (only least-conn frontends' sockets count)."""
    svc = replace(service("dns", fam.vip(32), DNS), lb_algorithm=LBAlgorithm.LEAST_CONN)
    plain = service("plain", fam.vip(34), DNS)
    node1.program(svc, fam.endpoints(lab, "dns", ["a1", "b1"], DNS_EP),
                  plain, fam.endpoints(lab, "plain", ["a2"], DNS_EP))
    script = (
        "import socket\n"
        f"u = socket.socket({fam.af}, socket.SOCK_DGRAM); u.settimeout(3)\n"
        "for _ in range(5):\n"
        f"    u.connect(('{fam.vip(32)}', 53)); u.send(b'x'); print(u.recv(100).decode().split()[0])\n"
        "input()\n"
        f"u.connect(('{fam.vip(34)}', 53)); u.send(b'x'); print(u.recv(100).decode().split()[0])\n"
        "input()\n")
    t = lab.target("client")
    p = subprocess.Popen(procs.trampoline(t.netns, t.cgroup, [sys.executable, "-c", script]),
                         stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert p.stdout is not None and p.stdin is not None
        seen = [p.stdout.readline().strip() for _ in range(5)]
        assert set(seen) <= {"a1", "b1"}, seen
        assert sum(counts(node1, lab, fam).values()) == 1
        p.stdin.write("\n")
        p.stdin.flush()
        assert p.stdout.readline().strip() == "a2"
        assert not counts(node1, lab, fam), "moved to a Service that does not count"
    finally:
        p.kill()
        p.wait(10)
    wait_until(lambda: not counts(node1, lab, fam), 10, "the count back to zero")


def test_counts_of_a_removed_backend_go_with_its_id(lab, node1, fam):
    svc = replace(service("web", fam.vip(33), HTTP), lb_algorithm=LBAlgorithm.LEAST_CONN)
    node1.program(svc, fam.endpoints(lab, "web", ["a1", "b1"], HTTP_EP))
    h = Holder(lab, "client", fam.vip(33))
    try:
        got = {h.do("tcp"), h.do("tcp")}
        assert got == {"a1", "b1"}
        node1.program(svc, fam.endpoints(lab, "web", ["a1"], HTTP_EP))
        assert set(counts(node1, lab, fam)) == {"a1"}, "b1's id freed, its counter with it"
        rows = len(node1.datapath.maps["connix"].keys())
        assert rows == 1, rows
    finally:
        h.kill()
    wait_until(lambda: not counts(node1, lab, fam), 10, "the count back to zero")
    assert all(conn_load.count(v.value) == 0 for _, v in node1.datapath.maps["connload"].items()), \
        "b1's socket, closed after its counter was freed, took nothing from anyone"
