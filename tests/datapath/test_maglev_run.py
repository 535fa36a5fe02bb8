"""Maglev tables in the kernel: bpf/lib/lb.h's pick for a flow from outside, run with
BPF_PROG_TEST_RUN (bpf/tests/lb_run.c kp_lb_run_flow hashes a real tuple as tc_lb.c does),
on maps the real MapWriter programmed.

What it shows: the BPF flow hash is kproxy_ebpf/model/maglev.py's; two "nodes" (two pinned map sets)
whose slots hold the same backends in another order send every flow to the same backend; over
a sample of tuples each backend's share is within 1 % of uniform (the table itself is, within
one entry: tests/unit/model/test_maglev.py) and chi-square does not tell it from uniform; removing one of E backends
moves at most 1/E + 1 % of the flows (and only those of the backend that left get moved more
than the table's disruption); the same frontend without a table picks at random.
"""
from __future__ import annotations

import ctypes
import dataclasses
import random
import socket
from collections import Counter
from pathlib import Path

import pytest

from kproxy_ebpf.datapath.load import libbpf
from kproxy_ebpf.datapath.load.bpffs import open_pinned_maps, remove_pins
from kproxy_ebpf.datapath.load.compile_child import compile_program
from kproxy_ebpf.datapath.load.paths import bpf_dir
from kproxy_ebpf.datapath.maps import layout as L
from kproxy_ebpf.datapath.write.writer import MapWriter
from kproxy_ebpf.dev.bench.stats import spread
from kproxy_ebpf.model import maglev
from kproxy_ebpf.model.desired import Frontend, FrontendKind, Scope, ServicePortName
from kproxy_ebpf.model.objects import Protocol

from ..builders import fe

pytestmark = pytest.mark.root

NODES = (Path("/sys/fs/bpf/kproxy-maglev-a"), Path("/sys/fs/bpf/kproxy-maglev-b"))
TCP = Protocol.TCP
OFF = 14
FORWARD = L.const("KP_LB_FORWARD")
NODE_PORT = ("192.168.0.1", 30080)
SAMPLE = 20_000


@dataclasses.dataclass
class Node:
    fd: int
    maps: dict
    writer: MapWriter


@pytest.fixture(scope="module")
def nodes():
    from bcc import BPF

    out, progs = [], []
    try:
        for d in NODES:
            remove_pins(d)
            bpf = compile_program(bpf_dir() / "tests" / "lb_run.c", d)
            progs.append(bpf)
            maps = open_pinned_maps(d)
            writer = MapWriter(maps)
            writer.restore()
            out.append(Node(bpf.load_func(b"kp_lb_run_flow", BPF.SCHED_CLS).fd, maps, writer))
        yield out
    finally:
        for n in out:
            n.writer.apply({})
            for m in n.maps.values():
                m.close()
        for bpf in progs:
            bpf.cleanup()
        for d in NODES:
            remove_pins(d)


def frontend(ips, size: int) -> Frontend:
    return fe(*NODE_PORT, ips, kind=FrontendKind.NODE_PORT,
              service=ServicePortName("t", "np", "", TCP), scope=Scope.EXT, maglev=size)


def run(node: Node, client: str, sport: int, rnd=(0, 0)) -> tuple[str, int]:
    """(the backend picked for client:sport -> the NodePort, the BPF flow hash)."""
    tup = L.ct_key(client, sport, NODE_PORT[0], NODE_PORT[1], socket.IPPROTO_TCP)
    req = L.LbReq(key=L.svc_key(*NODE_PORT, TCP, scope=L.SCOPE_EXT),
                  client=1 << 63 | 0x1234, now=1)
    req.rnd[0], req.rnd[1] = rnd
    data = (bytes(OFF) + L.raw(tup) + L.raw(req) + bytes(ctypes.sizeof(L.LbRes)) + bytes(4))
    ret, out = libbpf.prog_test_run(node.fd, data)
    assert ret == 0
    at = OFF + ctypes.sizeof(L.CtKey) + ctypes.sizeof(L.LbReq)
    res = L.LbRes.from_buffer_copy(out, at)
    assert res.verdict == FORWARD
    return L.ip_str(res.be.addr), int.from_bytes(out[at + ctypes.sizeof(L.LbRes):][:4], "little")


def clients(n: int, seed: int = 7) -> list[tuple[str, int]]:
    rng = random.Random(seed)
    return [(f"198.51.{rng.randrange(100, 116)}.{rng.randrange(1, 255)}",
             rng.randrange(1024, 65536)) for _ in range(n)]


def pods(n: int) -> list[str]:
    return [f"10.244.{1 + i % 2}.{10 + i}" for i in range(n)]


def test_the_flow_hash_is_the_agents(nodes):
    node = nodes[0]
    assert node.writer.apply({(f := frontend(pods(3), 251)).key: f}).ok
    rng = random.Random(3)
    for client, sport in clients(100) + [("2001:db8::7", 40000)]:
        _, h = run(node, client, sport, rnd=(rng.getrandbits(32), 0))
        assert h == maglev.flow_hash(client, sport, NODE_PORT[1], socket.IPPROTO_TCP)


def test_two_nodes_with_other_slot_orders_pick_the_same_backend_per_flow(nodes):
    a, b = nodes
    size = maglev.table_size(maglev.DEFAULT_SIZE, 5)
    # node a met the backends in order; node b met p0..p4, then p0 left and p5 came: its slot
    # of p0 went to p5 (stable slots), so the same five backends sit in other slots
    ps = pods(6)
    fa, fb = frontend(ps[1:], size), frontend(ps[:5], size)
    assert a.writer.apply({fa.key: fa}).ok
    assert b.writer.apply({fb.key: fb}).ok and b.writer.apply({fa.key: fa}).ok
    slots_a = {s: k[0] for s, (k, _) in ((s, a.writer.held.frontends[fa.key].rows[s])
                                         for s in range(1, 6))}
    slots_b = {s: k[0] for s, (k, _) in ((s, b.writer.held.frontends[fa.key].rows[s])
                                         for s in range(1, 6))}
    assert slots_a != slots_b and set(slots_a.values()) == set(slots_b.values())
    rng = random.Random(5)
    for client, sport in clients(2000):
        rnd = (rng.getrandbits(32), rng.getrandbits(32))   # the random numbers play no part
        assert run(a, client, sport, rnd)[0] == run(b, client, sport, rnd)[0]


def test_spread_and_one_backend_removed(nodes):
    node = nodes[0]
    ps = pods(10)
    size = maglev.table_size(maglev.DEFAULT_SIZE, len(ps))
    assert node.writer.apply({(f := frontend(ps, size)).key: f}).ok
    flows = clients(SAMPLE, seed=11)
    before = [run(node, c, p)[0] for c, p in flows]
    share = Counter(before)
    assert set(share) == set(ps)
    assert max(abs(n / SAMPLE - 1 / len(ps)) for n in share.values()) <= 0.01
    assert spread(share)["p_value"] >= 0.001
    gone = ps[4]
    assert node.writer.apply({(f := frontend([p for p in ps if p != gone], size)).key: f}).ok
    after = [run(node, c, p)[0] for c, p in flows]
    moved = sum(x != y for x, y in zip(before, after, strict=True)) / SAMPLE
    assert moved <= 1 / len(ps) + 0.01
    assert gone not in after
    # the flows that moved are those of the backend that left, and the table's few others
    assert sum(x != y and x != gone for x, y in zip(before, after, strict=True)) / SAMPLE <= 0.01


def test_without_a_table_the_pick_is_random(nodes):
    node = nodes[0]
    ps = pods(4)
    assert node.writer.apply({(f := frontend(ps, 0)).key: f}).ok
    picked = {run(node, "198.51.100.9", 40000, rnd=(r, 0))[0] for r in range(8)}
    assert picked == set(ps)          # rnd % 4 + 1 walks every slot
    assert not node.maps["maglev"].keys()
