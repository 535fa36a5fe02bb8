"""bpf/lib/lb.h run directly with BPF_PROG_TEST_RUN (bpf/tests/lb_run.c), no sockets.

The maps are real (pinned in a kproxy-prefixed bpffs directory, programmed by the real
MapWriter), the verifier is the kernel's, and the test chooses the random numbers and the
clock, so the lookup, the slot-0 race retry, affinity and a backend miss are each hit on
purpose rather than hoped for under load. Every test runs for an IPv4 and an IPv6 frontend:
one lookup path serves both (struct kp_ip, bpf/lib/ip.h).
"""
from __future__ import annotations

import ctypes
import time
from pathlib import Path

import pytest

from kproxy_ebpf.datapath.load import libbpf
from kproxy_ebpf.datapath.load.bpffs import open_pinned_maps, remove_pins
from kproxy_ebpf.datapath.load.compile_child import compile_program
from kproxy_ebpf.datapath.load.paths import bpf_dir
from kproxy_ebpf.datapath.maps import layout as L
from kproxy_ebpf.datapath.write.writer import MapWriter
from kproxy_ebpf.model.desired import Action, Frontend, ServicePortName
from kproxy_ebpf.model.objects import IPFamily, Protocol

from ..builders import fe

pytestmark = pytest.mark.root

BPFFS = Path("/sys/fs/bpf/kproxy-lbrun")
TCP = Protocol.TCP
OFF = 14
NONE, FORWARD, REJECT, DROP, MISS = (L.const(f"KP_LB_{v}") for v in
                                     ("NONE", "FORWARD", "REJECT", "DROP", "MISS"))


class Family:
    """The addresses of one family's test: a frontend and its pods."""

    def __init__(self, family: IPFamily):
        self.family = family
        self.vip = "10.96.7.1" if family is IPFamily.IPV4 else "fd00:96::7:1"

    def pod(self, i: int) -> str:
        return f"10.244.1.{i}" if self.family is IPFamily.IPV4 else f"fd00:244:1::{i:x}"


@pytest.fixture(params=list(IPFamily), ids=lambda f: f.value.lower())
def fam(request) -> Family:
    return Family(request.param)


@pytest.fixture(scope="module")
def harness():
    remove_pins(BPFFS)
    bpf = compile_program(bpf_dir() / "tests" / "lb_run.c", BPFFS)
    try:
        from bcc import BPF

        fn = bpf.load_func(b"kp_lb_run", BPF.SCHED_CLS)
        maps = open_pinned_maps(BPFFS)
        yield fn.fd, maps
    finally:
        for m in locals().get("maps", {}).values():
            m.close()
        bpf.cleanup()
        remove_pins(BPFFS)


def run(fd: int, fam: Family, port: int, rnd=(0, 0), client=0, flow=0, now=None, proto=TCP):
    req = L.LbReq(key=L.svc_key(fam.vip, port, proto), client=client, flow=flow,
                  now=time.clock_gettime_ns(time.CLOCK_MONOTONIC) if now is None else now)
    req.rnd[0], req.rnd[1] = rnd
    data = bytes(OFF) + L.raw(req) + bytes(ctypes.sizeof(L.LbRes))
    ret, out = libbpf.prog_test_run(fd, data)
    assert ret == 0, "TC_ACT_OK"
    return L.LbRes.from_buffer_copy(out, OFF + ctypes.sizeof(L.LbReq))


def frontend(fam: Family, port: int, ips=(), action=Action.FORWARD, affinity=0) -> Frontend:
    return fe(fam.vip, port, ips, action, service=ServicePortName("t", f"svc{port}", "", TCP),
              affinity=affinity)


@pytest.fixture
def program(harness):
    """Programs a set of frontends through the real writer; removes them after the test."""
    fd, maps = harness
    writer = MapWriter(maps)
    writer.restore()

    def apply(*fes: Frontend) -> MapWriter:
        assert writer.apply({f.key: f for f in fes}).ok
        return writer

    yield fd, maps, apply
    writer.apply({})


def backend_of(res) -> tuple[str, int]:
    return L.ip_str(res.be.addr), L.port_host(res.be.port)


def test_not_a_service_and_the_verdicts(program, fam):
    fd, _, apply = program
    apply(frontend(fam, 81, action=Action.REJECT), frontend(fam, 82, action=Action.DROP),
          frontend(fam, 83, [fam.pod(10)]))
    assert run(fd, fam, 80).verdict == NONE
    assert run(fd, fam, 81).verdict == REJECT
    assert run(fd, fam, 82).verdict == DROP
    res = run(fd, fam, 83)
    assert (res.verdict, res.attempts, backend_of(res)) == (FORWARD, 1, (fam.pod(10), 8080))
    assert run(fd, fam, 83, proto=Protocol.UDP).verdict == NONE, "the protocol is part of the key"


def test_every_slot_is_reachable_and_the_copy_matches_its_slot(program, fam):
    fd, maps, apply = program
    ips = [fam.pod(i) for i in range(10, 15)]
    apply(frontend(fam, 84, ips))
    seen = {}
    for r in range(len(ips)):
        res = run(fd, fam, 84, rnd=(r, 0))
        assert res.verdict == FORWARD and res.slot == r + 1
        slot_row = maps["svc"].get(L.svc_key(fam.vip, 84, TCP, slot=res.slot))
        assert slot_row.backend_id == res.backend_id
        seen[res.slot] = backend_of(res)
    assert sorted(seen.values()) == sorted((ip, 8080) for ip in ips)


def test_a_slot_that_vanished_reads_slot_0_again(program, fam):
    """The count says 3 but slot 3 is gone (a shrink racing the lookup): the first pick
    misses, slot 0 is read again and the second pick lands."""
    fd, maps, apply = program
    apply(frontend(fam, 85, [fam.pod(10), fam.pod(11), fam.pod(12)]))
    maps["svc"].delete(L.svc_key(fam.vip, 85, TCP, slot=3))
    before = _retries(maps)
    res = run(fd, fam, 85, rnd=(2, 0))           # 2 % 3 + 1 = slot 3, then slot 1
    assert (res.verdict, res.attempts, res.slot) == (FORWARD, 2, 1)
    assert _retries(maps) == before + 1


def test_a_backend_missing_twice_is_a_miss_not_a_leak(program, fam):
    fd, maps, apply = program
    w = apply(frontend(fam, 86, [fam.pod(10), fam.pod(11)]))
    bid = w.backend_ids.get((fam.pod(11), 8080, TCP))
    slot = next(s for s in (1, 2) if maps["svc"].get(L.svc_key(fam.vip, 86, TCP, slot=s)).backend_id == bid)
    maps["backend"].delete(L.U32(bid))
    res = run(fd, fam, 86, rnd=(slot - 1, slot - 1))
    assert (res.verdict, res.attempts) == (MISS, 2)
    maps["backend"].put(L.U32(bid), L.backend_val(fam.pod(11), 8080, TCP))


def test_client_affinity_sticks_expires_and_never_names_a_departed_backend(program, fam):
    fd, _, apply = program
    ips = [fam.pod(i) for i in range(10, 14)]
    apply(frontend(fam, 87, ips, affinity=10))
    now = time.clock_gettime_ns(time.CLOCK_MONOTONIC)
    first = run(fd, fam, 87, rnd=(1, 0), client=42, now=now)
    again = run(fd, fam, 87, rnd=(3, 3), client=42, now=now + 5 * 10**9)
    assert again.affinity_hit and backend_of(again) == backend_of(first)
    other = run(fd, fam, 87, rnd=(3, 3), client=43, now=now)
    assert not other.affinity_hit, "affinity is per client"
    later = run(fd, fam, 87, rnd=(3, 3), client=42, now=now + 16 * 10**9)
    assert not later.affinity_hit, "10 s without use expires it"
    # The backend it names leaves the service: the row must not be used, whatever its age.
    stay = [ip for ip in ips if (ip, 8080) != backend_of(later)]
    apply(frontend(fam, 87, stay, affinity=10))
    res = run(fd, fam, 87, rnd=(0, 0), client=42, now=now + 17 * 10**9)
    assert not res.affinity_hit and backend_of(res) in {(ip, 8080) for ip in stay}


def test_an_unconnected_udp_flow_sticks_to_its_backend(program, fam):
    fd, _, apply = program
    apply(frontend(fam, 88, [fam.pod(i) for i in range(10, 14)]))
    first = run(fd, fam, 88, rnd=(0, 0), flow=7)
    assert {backend_of(run(fd, fam, 88, rnd=(r, r), flow=7)) for r in range(4)} == {backend_of(first)}
    assert {backend_of(run(fd, fam, 88, rnd=(r, r))) for r in range(4)} != {backend_of(first)}, \
        "without a flow cookie every pick is fresh"


def _retries(maps) -> int:
    return sum(maps["stats"].get(L.U32(L.const("KP_STAT_RETRY"))))


def test_a_backend_of_the_other_family_is_never_given_out(program, fam):
    """A slot naming a backend of the other family (no agent writes one) is a miss: an IPv6
    socket must not be handed an IPv4-mapped address, nor an IPv4 socket an IPv6 one."""
    fd, maps, apply = program
    w = apply(frontend(fam, 89, [fam.pod(10)]))
    bid = w.backend_ids.get((fam.pod(10), 8080, TCP))
    other = "10.244.1.99" if fam.family is IPFamily.IPV6 else "fd00:244:1::99"
    maps["backend"].put(L.U32(bid), L.backend_val(other, 8080, TCP))
    try:
        assert run(fd, fam, 89).verdict == MISS
    finally:
        maps["backend"].put(L.U32(bid), L.backend_val(fam.pod(10), 8080, TCP))
