"""The rules the Python restates from bpf/, run against the C on the same inputs (issue 43: no
rule of the datapath is copied by hand without a test that runs both).

tc_lb.c is loaded as for test_tc_run.py (tcrun.py's harness: real maps, real MapWriter, packets
under BPF_PROG_TEST_RUN), and lib/lb.h alone as for test_lb_run.py (bpf/tests/lb_run.c). For
each rule a table of cases, one per branch of the C, is given to both:

- inspect/trace.py tc_client: tc_lb.c kp_tc_client (the affinity row the C writes for a
  packet from a source names the client trace computes for it);
- inspect/trace.py trace(): the lookups of tc_lb.c kp_ingress and lib/lb.h (no frontend,
  kp_extaddr, ServiceCIDR verdicts, source ranges, action, empty slots, ClientIP affinity,
  Maglev entry) for a packet from outside and a pod's packet: trace runs on the maps first,
  then the packet, and what the C did is what trace said it would do;
- trace() for the socket path's ClientIP affinity (the netns cookie as the client), with
  lib/lb.h run directly (kp_lb_run);
- datapath/maps/layout.py ct_keeps_backend: lib/ct_pkt.h kp_ct_usable for a flow whose backend id
  names another address now (the C keeps or re-balances a mid-stream packet); and ct_scope,
  the scope the C marks a flow with (KP_CT_F_POD);
- datapath/flows/conntrack.py purge's reply tuple: lib/ct.h kp_ct_reply_key (the kp_rnat row the
  C wrote for each kind of flow is the one purge deletes).

The Maglev hash itself (model/maglev.py flow_hash) is test_maglev_run.py's; MAX_SIZE and SEED
are compared with kproxy.h by tests/unit/model/test_maglev.py and at import by maglev_tables.py.
"""
from __future__ import annotations

import contextlib
import ctypes
import time
from pathlib import Path

import pytest

from kproxy_ebpf.datapath.flows import conntrack
from kproxy_ebpf.datapath.load import libbpf
from kproxy_ebpf.datapath.load.bpffs import open_pinned_maps, remove_pins
from kproxy_ebpf.datapath.load.compile_child import compile_program
from kproxy_ebpf.datapath.load.paths import bpf_dir
from kproxy_ebpf.datapath.maps import layout as L
from kproxy_ebpf.datapath.write.writer import MapWriter
from kproxy_ebpf.dev.lab import nsutil
from kproxy_ebpf.inspect.trace import Verdict, tc_client, trace
from kproxy_ebpf.model.desired import Action, Frontend, FrontendKind, Scope
from kproxy_ebpf.model.objects import hostport

from . import tcrun
from .tcrun import ACK, FAMILIES, NETNS, TC_ACT_OK, TC_ACT_SHOT, TCP, UDP, V4, Addrs, TcRun, packet, parse

pytestmark = pytest.mark.root

AFF_CLIENT = L.const("KP_AFF_CLIENT")
NP_ONE, NP_TWO, NP_REJECT, NP_DROP, NP_EMPTY, NP_AFF, NP_MAGLEV, NP_FAMILY, NP_NOSLOT = \
    range(30100, 30109)
MAGLEV_SIZE = 251


def now_ns() -> int:
    return time.clock_gettime_ns(time.CLOCK_MONOTONIC)


def ext(a: Addrs, port: int, ips=(), action=Action.FORWARD, affinity=0, maglev=0,
        proto=TCP) -> Frontend:
    """A NodePort whose backends are pods of this node (no SNAT: the C's answer is the
    packet itself, DNATed, with no route lookup)."""
    return tcrun.frontend(a.node, port, FrontendKind.NODE_PORT, f"np{port}",
                          [(ip, True) for ip in ips], action, proto, affinity, maglev=maglev)


def lb(a: Addrs, ranges, action=Action.FORWARD) -> Frontend:
    bs = [(a.local_be, True)] if action is Action.FORWARD else []
    return tcrun.frontend(a.lb_ip, 80, FrontendKind.LOAD_BALANCER, "lb", bs, action, ranges=ranges)


def pods(a: Addrs, n: int) -> list[str]:
    """n pods of this node (local backends)."""
    more = [f"10.244.1.{20 + i}" if a is V4 else f"fd00:244:1::{0x20 + i:x}" for i in range(n)]
    return ([a.local_be, a.local_be2] + more)[:n]


def outcome(a: Addrs, frame: bytes, ret: int, out: bytes) -> tuple[str, str | None]:
    """What the C did with a packet: untouched, dropped, an ICMP error (port or host
    unreachable) or forwarded to a backend."""
    if ret == TC_ACT_SHOT:
        return "dropped", None
    if ret == TC_ACT_OK and out[:len(frame)] == frame:
        return "untouched", None
    p = parse(out)
    if p["proto"] == a.icmp:
        if (p["type"], p["code"]) == a.port_unreach:
            return "port-unreachable", None
        return f"icmp {p['type']}/{p['code']}", None
    return "forward", hostport(p["dst"], p["dport"])


HOST_UNREACH = {"ipv4": "icmp 3/1", "ipv6": "icmp 1/3"}


def expected(a: Addrs, t, scope: Scope) -> str:
    """What trace's verdict says the C does with the packet."""
    if t.verdict is Verdict.UNREACHABLE:
        return "dropped" if scope is Scope.EXT else HOST_UNREACH[a.family]
    return {Verdict.FORWARD: "forward", Verdict.UNTOUCHED: "untouched",
            Verdict.REFUSED: "port-unreachable", Verdict.DENIED: "dropped"}[t.verdict]


def agree(a: Addrs, run: TcRun, prog: str, src: str, sport: int, dst: str, dport: int,
          scope: Scope, proto=TCP) -> tuple:
    """trace() for the packet, then the packet through `prog`: their verdicts agree, and the
    backend the C forwarded to is trace's choice (or one of its candidates). Returns
    (trace, what the C did)."""
    t = trace(run.maps, dst, dport, proto, scope, src, now_ns=now_ns(), source_port=sport)
    frame = packet(src, sport, dst, dport, proto)
    did = outcome(a, frame, *run.run(prog, frame))
    steps = [(s.step, s.found) for s in t.steps]
    assert did[0] == expected(a, t, scope), (did, t.verdict, steps)
    if did[0] == "forward":
        if t.chosen is not None:
            assert did[1] == t.chosen, (did, steps)
        else:
            assert did[1] in t.candidates, (did, t.candidates)
    return t, did


@pytest.fixture(params=sorted(FAMILIES))
def fam(request) -> Addrs:
    return FAMILIES[request.param]


@contextlib.contextmanager
def running(harness, frontends):
    run = TcRun(harness, frontends)
    try:
        yield run
    finally:
        run.close()


@contextlib.contextmanager
def restored(run: TcRun):
    """put(map, key, value or None to delete): rows changed behind the writer's back, put
    back as they were after the test."""
    saved = []

    def put(name, key, value):
        m = run.maps[name]
        saved.append((m, key, m.get(key)))
        if value is None:
            m.delete(key)
        else:
            m.put(key, value)

    try:
        yield put
    finally:
        for m, key, old in reversed(saved):
            if old is None:
                m.delete(key)
            else:
                m.put(key, old)


def forget_flows(run: TcRun) -> None:
    for name in ("ct", "rnat", "affinity"):
        for k in run.maps[name].keys():
            run.maps[name].delete(k)


# -- tc_client ------------------------------------------------------------------------------------

TC_CLIENTS = {
    "ipv4": ["10.250.0.250", "192.0.2.7", "255.255.255.255", "0.0.0.1"],
    "ipv6": ["fd00:250::250", "fd00:250::251",               # one /64: the fold tells them apart
             "2001:db8:0:0:8000::1",                           # bit 63 of the fold set: masked
             "fe80::1", "ffff:ffff:ffff:ffff:ffff:ffff:ffff:fffe",
             "::ffff:192.0.2.7"],                              # IPv4-mapped, in an IPv6 packet
}


def test_tc_client_is_kp_tc_client(harness, fam):
    """The affinity row tc_lb.c writes for a packet from `source` is keyed by trace's
    tc_client(source)."""
    f = ext(fam, NP_AFF, [fam.local_be], affinity=60)
    with running(harness, [f]) as run:
        for source in TC_CLIENTS[fam.family]:
            forget_flows(run)
            ret, _ = run.run("kp_from_outside", packet(source, 40000, fam.node, NP_AFF))
            assert ret == TC_ACT_OK, source
            keys = run.maps["affinity"].keys()
            assert [(k.client, k.type) for k in keys] == [(tc_client(source), AFF_CLIENT)], \
                (source, [hex(k.client) for k in keys], hex(tc_client(source)))


# -- trace's walk, from outside -------------------------------------------------------------------

def test_trace_walks_the_lookups_of_a_packet_from_outside(harness, fam):
    a = fam
    ps = pods(a, 3)
    fes = [ext(a, NP_ONE, ps[:1]), ext(a, NP_TWO, ps[:2]),
           ext(a, NP_REJECT, action=Action.REJECT), ext(a, NP_DROP, action=Action.DROP),
           ext(a, NP_EMPTY, ps[:1]), ext(a, NP_ONE, ps[:1], proto=UDP),
           ext(a, NP_FAMILY, ps[2:3]), ext(a, NP_NOSLOT, ps[1:2]), lb(a, [a.client_net])]
    with running(harness, fes) as run, restored(run) as put:
        # A forwarding frontend whose slot 0 counts no slot: the C rejects it as REJECT.
        key = L.svc_key(a.node, NP_EMPTY, TCP, scope=L.SCOPE_EXT)
        head = L.SvcVal.from_buffer_copy(run.maps["svc"].get(key))
        head.count = 0
        put("svc", key, head)
        # A slot whose backend is of the other family (no agent writes one), and a slot row
        # gone: each pick misses twice, the C refuses.
        bid = run.writer.backend_ids.get((ps[2], 8080, TCP))
        other = "fd00:244:1::99" if a is V4 else "10.244.1.99"
        put("backend", L.U32(bid), L.backend_val(other, 8080, TCP))
        put("svc", L.svc_key(a.node, NP_NOSLOT, TCP, slot=1, scope=L.SCOPE_EXT), None)
        cases = [
            (a.client, a.node, 22, TCP, Verdict.UNTOUCHED),       # a node address, no such port
            (a.client, a.elsewhere, 80, TCP, Verdict.UNTOUCHED),  # no frontend's address
            (a.client, a.node, NP_ONE, TCP, Verdict.FORWARD),
            (a.client, a.node, NP_ONE, UDP, Verdict.FORWARD),
            (a.client, a.node, NP_TWO, TCP, Verdict.FORWARD),
            (a.client, a.node, NP_REJECT, TCP, Verdict.REFUSED),
            (a.client, a.node, NP_DROP, TCP, Verdict.UNREACHABLE),
            (a.client, a.node, NP_EMPTY, TCP, Verdict.REFUSED),
            (a.client, a.node, NP_FAMILY, TCP, Verdict.REFUSED),
            (a.client, a.node, NP_NOSLOT, TCP, Verdict.REFUSED),
            (a.client, a.node, NP_TWO, UDP, Verdict.UNTOUCHED),   # the protocol is in the key
            (a.client, a.lb_ip, 80, TCP, Verdict.FORWARD),        # inside the source ranges
            (a.client2, a.lb_ip, 80, TCP, Verdict.FORWARD),
            (a.other_client, a.lb_ip, 80, TCP, Verdict.DENIED),   # outside them
            (a.client, a.lb_ip, 81, TCP, Verdict.UNTOUCHED),
        ]
        for i, (src, dst, port, proto, want) in enumerate(cases):
            forget_flows(run)
            t, _ = agree(a, run, "kp_from_outside", src, 41000 + i, dst, port, Scope.EXT, proto)
            assert t.verdict is want, (src, dst, port, proto, t.verdict)


def test_trace_judges_source_ranges_before_the_action(harness, fam):
    """A range-limited LoadBalancer without endpoints: an outsider is dropped (DENIED), an
    admitted client refused, as kube-proxy's firewall chain runs before its reject."""
    a = fam
    with running(harness, [lb(a, [a.client_host], Action.REJECT)]) as run:
        for i, (src, want) in enumerate([(a.other_client, Verdict.DENIED),
                                         (a.client2, Verdict.DENIED),
                                         (a.client, Verdict.REFUSED)]):
            t, _ = agree(a, run, "kp_from_outside", src, 41100 + i, a.lb_ip, 80, Scope.EXT)
            assert t.verdict is want


def _affinity_hits(run: TcRun) -> int:
    return run.stat("affinity_hit")


def test_trace_and_the_c_agree_on_client_affinity(harness, fam):
    """Each branch of lib/lb.h kp_lb_from_affinity: a fresh row is used, a stale one, one
    whose slot is past the count or 0, and one whose slot now holds another backend are
    not (a new choice)."""
    a = fam
    ps = pods(a, 3)
    f = ext(a, NP_AFF, ps, affinity=30)
    with running(harness, [f]) as run:
        key = L.svc_key(a.node, NP_AFF, TCP, scope=L.SCOPE_EXT)
        head = run.maps["svc"].get(key)
        ids = [run.maps["svc"].get(L.svc_key(a.node, NP_AFF, TCP, slot=s, scope=L.SCOPE_EXT))
               .backend_id for s in (1, 2, 3)]
        akey = L.AffKey(client=tc_client(a.client), svc_id=head.svc_id, type=AFF_CLIENT,
                        family=6 if a.family == "ipv6" else 4)
        cases = [   # (age in s, slot, backend id, the C uses the row)
            (1, 2, ids[1], True),
            (29, 3, ids[2], True),
            (31, 2, ids[1], False),            # older than the timeout
            (1, 4, ids[1], False),             # past the count
            (1, 0, ids[0], False),             # slot 0
            (1, 2, ids[0], False),             # slot 2 holds another backend now
        ]
        for i, (age, slot, bid, used) in enumerate(cases):
            forget_flows(run)
            run.maps["affinity"].put(akey, L.AffVal(last_used=now_ns() - age * 10**9,
                                                    backend_id=bid, slot=slot))
            hits = _affinity_hits(run)
            t, did = agree(a, run, "kp_from_outside", a.client, 41200 + i, a.node, NP_AFF,
                           Scope.EXT)
            c_used = _affinity_hits(run) == hits + 1
            assert c_used is used, (age, slot, bid)
            trace_used = any(s.step == "affinity" and "->" in s.found for s in t.steps)
            assert trace_used is used, (age, slot, bid, [(s.step, s.found) for s in t.steps])


def test_trace_names_the_backend_of_a_flows_maglev_entry(harness, fam):
    """For a frontend with a Maglev table trace names the backend a flow gets (the entry its
    hash picks, the row and offset lib/maglev.h reads); a table whose rows are gone, or
    belong to another table, or a slot 0 without a size, is refused by the C, and by
    trace."""
    a = fam
    ps = pods(a, 4)
    f = ext(a, NP_MAGLEV, ps, maglev=MAGLEV_SIZE)
    sources = [a.client, a.client2, a.other_client]
    with running(harness, [f]) as run:
        for i in range(60):
            forget_flows(run)
            t, did = agree(a, run, "kp_from_outside", sources[i % 3], 42000 + 97 * i, a.node,
                           NP_MAGLEV, Scope.EXT)
            assert t.chosen is not None and did == ("forward", t.chosen)
        key = L.svc_key(a.node, NP_MAGLEV, TCP, scope=L.SCOPE_EXT)
        head = run.maps["svc"].get(key)
        table = head.backend_id
        rows = {k.row: run.maps["maglev"].get(k) for k in run.maps["maglev"].keys()
                if k.table == table}
        mkey = L.STRUCTS["kp_maglev_key"]
        try:
            # Another table's tag on the rows: what a reader meets when a row was recycled.
            for r, row in rows.items():
                tagged = type(row).from_buffer_copy(row)
                tagged.table = table + 1000
                run.maps["maglev"].put(mkey(table=table, row=r), tagged)
            forget_flows(run)
            t, _ = agree(a, run, "kp_from_outside", a.client, 43000, a.node, NP_MAGLEV,
                         Scope.EXT)
            assert t.verdict is Verdict.REFUSED
            for r in rows:
                run.maps["maglev"].delete(mkey(table=table, row=r))
            forget_flows(run)
            t, _ = agree(a, run, "kp_from_outside", a.client, 43001, a.node, NP_MAGLEV,
                         Scope.EXT)
            assert t.verdict is Verdict.REFUSED
            for r, row in rows.items():
                run.maps["maglev"].put(mkey(table=table, row=r), row)
            # Slot 0 names a table but no size.
            broken = L.SvcVal.from_buffer_copy(head)
            broken.maglev_size = 0
            run.maps["svc"].put(key, broken)
            forget_flows(run)
            t, _ = agree(a, run, "kp_from_outside", a.client, 43002, a.node, NP_MAGLEV,
                         Scope.EXT)
            assert t.verdict is Verdict.REFUSED
        finally:
            run.maps["svc"].put(key, head)
            for r, row in rows.items():
                run.maps["maglev"].put(mkey(table=table, row=r), row)


# -- trace's walk, a pod's packet (the per-packet ClusterIP path) ---------------------------------

VIP, OTHER_CIP, POD = "10.96.0.10", "10.96.0.20", "10.244.1.5"


def cip(ip: str, port: int, ips=(), action=Action.FORWARD) -> Frontend:
    return tcrun.frontend(ip, port, FrontendKind.CLUSTER_IP, f"cip{port}",
                          [(b, True) for b in ips], action, scope=Scope.SOCK)


def test_trace_walks_the_lookups_of_a_pods_packet(harness):
    """No frontend: the ServiceCIDR verdicts (lib/servicecidr.h) of an allocated ClusterIP
    without that port, one another proxy serves, an unallocated address of a ServiceCIDR
    and an address outside; and the verdicts of scope-SOCK frontends."""
    a = V4
    nsutil.set_route(NETNS, "10.244.1.0/24", "kpt1")       # the pod's route (ICMP errors)
    fes = [cip(VIP, 80, [a.local_be]), cip(VIP, 81, action=Action.REJECT),
           cip(VIP, 82, action=Action.DROP), cip(VIP, 83, [a.local_be, a.local_be2])]
    with running(harness, fes) as run:
        run.maps["clusterip"].put(L.IP16.from_buffer_copy(L.ip_bytes(VIP)),
                                  L.CipVal(action=L.const("KP_CIP_REJECT")))
        run.maps["clusterip"].put(L.IP16.from_buffer_copy(L.ip_bytes(OTHER_CIP)),
                                  L.CipVal(action=L.const("KP_CIP_PASS")))
        cidr = L.CidrKey(prefixlen=L.prefix_bits("10.96.0.0", 16), addr=L.ip16("10.96.0.0"))
        run.maps["servicecidr"].put(cidr, L.U32(1))
        try:
            cases = [(VIP, 80, Verdict.FORWARD), (VIP, 83, Verdict.FORWARD),
                     (VIP, 81, Verdict.REFUSED), (VIP, 82, Verdict.UNREACHABLE),
                     (VIP, 99, Verdict.REFUSED),            # an allocated ClusterIP, no such port
                     (OTHER_CIP, 80, Verdict.UNTOUCHED),    # another proxy's
                     ("10.96.0.30", 80, Verdict.UNREACHABLE),   # in the ServiceCIDR, unallocated
                     ("10.97.0.30", 80, Verdict.UNTOUCHED)]     # outside it
            for i, (dst, port, want) in enumerate(cases):
                forget_flows(run)
                t, _ = agree(a, run, "kp_from_pod", POD, 44000 + i, dst, port, Scope.SOCK)
                assert t.verdict is want, (dst, port, t.verdict)
        finally:
            for m in ("clusterip", "servicecidr"):
                for k in run.maps[m].keys():
                    run.maps[m].delete(k)


# -- ct_keeps_backend -----------------------------------------------------------------------------

def test_ct_keeps_backend_is_kp_ct_usable(harness):
    """layout.ct_keeps_backend(proto) says which tracked flows keep their backend
    whatever the backend id names now; lib/ct_pkt.h kp_ct_usable, for a packet that is not a
    client SYN (the only packets the agent's purge stands for), keeps exactly those."""
    a = V4
    nsutil.set_route(NETNS, "10.244.1.0/24", "kpt1")
    fes = [ext(a, NP_ONE, [a.local_be]), ext(a, NP_ONE, [a.local_be], proto=UDP),
           cip(VIP, 80, [a.local_be]),
           tcrun.frontend(VIP, 53, FrontendKind.CLUSTER_IP, "dns", [(a.local_be, True)],
                          proto=UDP, scope=Scope.SOCK)]
    cases = [("kp_from_outside", a.client, a.node, NP_ONE, TCP),
             ("kp_from_outside", a.client, a.node, NP_ONE, UDP),
             ("kp_from_pod", POD, VIP, 80, TCP),
             ("kp_from_pod", POD, VIP, 53, UDP)]
    with running(harness, fes) as run:
        seen = set()
        for i, (prog, src, dst, port, proto) in enumerate(cases):
            forget_flows(run)
            sport = 45000 + i
            frame = packet(src, sport, dst, port, proto)
            assert parse(run.run(prog, frame)[1])["dst"] == a.local_be
            key, row = run.ct(src, sport, dst, port, proto)
            # layout.ct_scope: the scope of the frontend the C balanced the flow by
            assert L.ct_scope(row.flags) is (Scope.SOCK if prog == "kp_from_pod" else Scope.EXT)
            keeps = L.ct_keeps_backend(key.proto)
            seen.add(keeps)
            bid = row.backend_id
            run.maps["backend"].put(L.U32(bid), L.backend_val(a.local_be2, 8080, proto))
            try:
                expired = run.stat("tc_ct_expired")
                mid = packet(src, sport, dst, port, proto, flags=ACK)
                # A TCP flow that does not keep its backend is left alone mid-stream
                # (kp_ct_may_open): only its client's next SYN balances it anew.
                moves = not keeps and proto is UDP
                assert parse(run.run(prog, mid)[1])["dst"] == (
                    a.local_be2 if moves else a.local_be if keeps else dst)
                assert (run.stat("tc_ct_expired") == expired) is not moves, (prog, proto)
            finally:
                run.maps["backend"].put(L.U32(bid), L.backend_val(a.local_be, 8080, proto))
        assert seen == {True, False}


# -- purge's reply tuple --------------------------------------------------------------------------

def test_purge_deletes_the_reply_row_the_c_wrote(harness, fam):
    """conntrack.purge computes each flow's kp_rnat key (lib/ct.h kp_ct_reply_key): for a
    UDP flow with SNAT (a remote backend) and one without, the rows the C wrote are the ones it
    deletes; a TCP flow keeps both of its rows (TCP is never purged)."""
    a = fam
    remote = tcrun.frontend(a.node, NP_TWO, FrontendKind.NODE_PORT, "remote",
                            [(a.remote_be, False)], proto=UDP)
    fes = [ext(a, NP_ONE, [a.local_be]), ext(a, NP_ONE, [a.local_be], proto=UDP), remote]
    with running(harness, fes) as run:
        forget_flows(run)
        for i, (port, proto) in enumerate([(NP_ONE, TCP), (NP_ONE, UDP), (NP_TWO, UDP)]):
            run.run("kp_from_outside", packet(a.client, 46000 + i, a.node, port, proto))
        flags = {row.flags & L.CT_F_SNAT for _, row in run.maps["ct"].items()}
        assert len(run.maps["ct"].keys()) == 3 and flags == {0, L.CT_F_SNAT}
        assert len(run.maps["rnat"].keys()) == 3
        assert conntrack.purge(run.maps, lambda fkey, be: False).removed == 2
        kept = run.maps["ct"].keys()
        assert [k.proto for k in kept] == [L.PROTO_NUM[TCP]] and len(run.maps["rnat"].keys()) == 1


# -- the socket path's affinity client (lib/lb.h alone) -------------------------------------------

LBRUN = Path("/sys/fs/bpf/kproxy-crules-lbrun")


@pytest.fixture(scope="module")
def lb_run():
    remove_pins(LBRUN)
    bpf = compile_program(bpf_dir() / "tests" / "lb_run.c", LBRUN)
    maps = {}
    try:
        from bcc import BPF

        fd = bpf.load_func(b"kp_lb_run", BPF.SCHED_CLS).fd
        maps = open_pinned_maps(LBRUN)
        writer = MapWriter(maps)
        writer.restore()
        yield fd, maps, writer
        writer.apply({})
    finally:
        for m in maps.values():
            m.close()
        bpf.cleanup()
        remove_pins(LBRUN)


def test_trace_keys_socket_affinity_by_the_netns_cookie(lb_run):
    """The socket path's ClientIP affinity (sock_lb.c: the client is the netns cookie):
    trace's row for a cookie is the row lib/lb.h uses for that cookie."""
    fd, maps, writer = lb_run
    for vip, pod in (("10.96.7.1", "10.244.1.{}"), ("fd00:96::7:1", "fd00:244:1::{}")):
        ips = [pod.format(10 + i) for i in range(4)]
        f = tcrun.frontend(vip, 80, FrontendKind.CLUSTER_IP, "aff", [(ip, False) for ip in ips],
                           affinity=30, scope=Scope.SOCK)
        assert writer.apply({f.key: f}).ok
        now = now_ns()
        for cookie in (1, 77, 1 << 40):
            for k in maps["affinity"].keys():
                maps["affinity"].delete(k)
            first = _lb_run(fd, vip, rnd=(cookie % 4, 0), client=cookie, now=now)
            t = trace(maps, vip, 80, TCP, Scope.SOCK, netns_cookie=cookie, now_ns=now + 10**9)
            again = _lb_run(fd, vip, rnd=((cookie + 1) % 4, 0), client=cookie, now=now + 10**9)
            assert again.affinity_hit
            assert t.chosen == hostport(L.ip_str(again.be.addr), L.port_host(again.be.port)) \
                == hostport(L.ip_str(first.be.addr), L.port_host(first.be.port))
            other = trace(maps, vip, 80, TCP, Scope.SOCK, netns_cookie=cookie + 1,
                          now_ns=now + 10**9)
            assert other.chosen is None
            assert not _lb_run(fd, vip, rnd=(0, 0), client=cookie + 1, now=now).affinity_hit


def _lb_run(fd: int, vip: str, rnd, client: int, now: int):
    req = L.LbReq(key=L.svc_key(vip, 80, TCP), client=client, now=now)
    req.rnd[0], req.rnd[1] = rnd
    ret, out = libbpf.prog_test_run(fd, bytes(14) + L.raw(req) + bytes(ctypes.sizeof(L.LbRes)))
    assert ret == 0
    res = L.LbRes.from_buffer_copy(out, 14 + ctypes.sizeof(L.LbReq))
    assert res.verdict == L.const("KP_LB_FORWARD")
    return res
