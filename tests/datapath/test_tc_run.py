"""bpf/tc_lb.c's scope-EXT programs (kp_from_outside, kp_to_outside) run with BPF_PROG_TEST_RUN
on hand-built packets, with real maps (harness: tcrun.py): the frontends are programmed by the
real MapWriter, and every translated packet's IP and TCP/UDP checksums are verified with a
checksum computed in Python.
"""
from __future__ import annotations

import contextlib
import ctypes
import os
import struct
import time

import pytest

from kproxy_ebpf.datapath.flows import ct_upgrade
from kproxy_ebpf.datapath.load import libbpf
from kproxy_ebpf.datapath.maps import layout as L
from kproxy_ebpf.datapath.maps.pinned import cpu_id_bound
from kproxy_ebpf.model.desired import Action, Frontend, FrontendKind
from kproxy_ebpf.model.objects import hostport

from .tcrun import (
    ACK,
    BPFFS,
    FAMILIES,
    FIN,
    PORTS,
    RST,
    SYN,
    TC_ACT_OK,
    TC_ACT_REDIRECT,
    TC_ACT_SHOT,
    TCP,
    UDP,
    V4,
    Addrs,
    TcRun,
    csum,
    ct_key,
    frontend,
    icmp_error,
    moved_snat_reply,
    ntop,
    packet,
    parse,
    pton,
    snat_reply_key,
)

pytestmark = pytest.mark.root

LRU_HASH = 9                # BPF_MAP_TYPE_LRU_HASH
NP_REMOTE, NP_LOCAL, NP_REJECT, NP_DROP, NP_UDP = 30080, 30081, 30082, 30083, 30053
NP_LOCAL2 = 30084           # a second frontend of the local backend


def ext(a: Addrs, port, backends, action=Action.FORWARD, proto=TCP, affinity=0) -> Frontend:
    return frontend(a.node, port, FrontendKind.NODE_PORT, f"np{port}", backends, action, proto,
                    affinity)


class ExtRun(TcRun):
    """The scope-EXT programs with the addresses of one family (`a`)."""

    def __init__(self, harness, a: Addrs, frontends: list[Frontend]):
        super().__init__(harness, frontends)
        self.a = a

    def ingress(self, frame: bytes, cpu: int | None = None) -> tuple[int, bytes]:
        return self.run("kp_from_outside", frame, cpu)

    def egress(self, frame: bytes) -> tuple[int, bytes]:
        return self.run("kp_to_outside", frame)

    def ct(self, sport, dport, proto=TCP, src=None):
        return super().ct(src or self.a.client, sport, self.a.node, dport, proto)


@contextlib.contextmanager
def ext_run(harness, a: Addrs):
    run = ExtRun(harness, a, [ext(a, NP_REMOTE, [(a.remote_be, False)]),
                              ext(a, NP_LOCAL, [(a.local_be, True)]),
                              ext(a, NP_LOCAL2, [(a.local_be, True)]),
                              ext(a, NP_REJECT, [], Action.REJECT), ext(a, NP_DROP, [], Action.DROP),
                              ext(a, NP_UDP, [(a.remote_be, False)], proto=UDP)])
    try:
        yield run
    finally:
        run.close()


@pytest.fixture(params=sorted(FAMILIES))
def fam(request) -> Addrs:
    """Each family's addresses: the tests below run once per family, on one code path."""
    return FAMILIES[request.param]


@pytest.fixture
def tc(harness, fam):
    with ext_run(harness, fam) as run:
        yield run


@pytest.fixture
def tc4(harness):
    """For what only IPv4 has (options, fragment offsets, the IPv4-only layouts)."""
    with ext_run(harness, V4) as run:
        yield run


def now_ns() -> int:
    return time.clock_gettime_ns(time.CLOCK_MONOTONIC)


# -- tests ----------------------------------------------------------------------------------------

def test_not_a_frontend_passes_untouched(tc):
    frame = packet(tc.a.client, 40000, tc.a.node, 22)
    ret, out = tc.ingress(frame)
    assert (ret, out[:len(frame)]) == (TC_ACT_OK, frame)
    ret, out = tc.egress(frame)
    assert (ret, out[:len(frame)]) == (TC_ACT_OK, frame)


def passes_until_listed(tc, hook, frame, filter_map, addr, field, want) -> None:
    """A TC filter at work: `frame` passes `hook` untouched while `addr` has no row in
    `filter_map`, and is translated (its `field` becomes `want`) once it has one."""
    ret, out = hook(frame)
    assert (ret, out[:len(frame)]) == (TC_ACT_OK, frame)
    tc.maps[filter_map].put(addr, L.U32(1))
    try:
        assert parse(hook(frame)[1])[field] == want
    finally:
        tc.maps[filter_map].delete(addr)


def test_a_packet_to_an_address_of_no_ext_frontend_skips_the_lookups(tc):
    # Only packets to an EXT frontend's address (kp_extaddr) or to the SNAT address reach
    # conntrack and the service map: a conntrack row alone does not translate a packet sent
    # to any other address (pod-to-pod traffic between nodes leaves after two small lookups).
    tc.ingress(packet(tc.a.client, 40010, tc.a.node, NP_LOCAL))
    key, row = tc.ct(40010, NP_LOCAL)
    other = L.ip16(tc.a.elsewhere)
    key.daddr = other
    tc.maps["ct"].put(key, row)
    frame = packet(tc.a.client, 40010, tc.a.elsewhere, NP_LOCAL, flags=ACK)
    passes_until_listed(tc, tc.ingress, frame, "extaddr", other, "dst", tc.a.local_be)


def test_a_snat_reply_is_translated_with_no_frontend_on_the_snat_address(harness, fam):
    # An external IP's flow to a remote backend: the reply comes to the node address, which
    # no frontend uses here; the SNAT address in kp_tccfg lets it through.
    eip = fam.eip
    run = ExtRun(harness, fam, [frontend(eip, 80, FrontendKind.EXTERNAL_IP, "eip",
                                         [(fam.remote_be, False)])])
    try:
        assert [L.ip_text(k) for k in run.maps["extaddr"].keys()] == [eip]
        _, out = run.ingress(packet(fam.client, 40020, eip, 80))
        p = parse(out)
        assert (p["src"], p["dst"]) == (fam.node, fam.remote_be)
        ret, out = run.ingress(packet(fam.remote_be, 8080, fam.node, p["sport"], flags=SYN | ACK))
        r = parse(out)
        assert ret == TC_ACT_REDIRECT
        assert (r["src"], r["sport"], r["dst"], r["dport"]) == (eip, 80, fam.client, 40020)
    finally:
        run.close()
    assert run.maps["extaddr"].keys() == []


def test_ip_options_move_the_ports_and_a_short_udp_packet_is_whole(tc4):
    tc = tc4
    frame = packet(tc.a.client, 40040, tc.a.node, NP_LOCAL, ip_options=b"\x01\x01\x01\x00")
    ret, out = tc.ingress(frame)
    p = parse(out)
    assert ret == TC_ACT_OK and (p["dst"], p["dport"], p["sport"]) == (tc.a.local_be, 8080, 40040)
    assert p["ip_ok"] and p["l4_ok"]
    _, out = tc.ingress(packet(tc.a.client, 5001, tc.a.node, NP_UDP, proto=UDP, payload=b""))
    p = parse(out)
    assert (p["dst"], p["dport"]) == (tc.a.remote_be, 8080) and p["l4_ok"]


def test_what_is_not_an_unfragmented_ipv4_tcp_or_udp_header_passes_untouched(tc4):
    tc = tc4
    later_fragment = packet(tc.a.client, 40041, tc.a.node, NP_LOCAL, frag=100)   # no ports in it
    arp = bytes.fromhex("ffffffffffff02000000000b0806") + bytes(28)
    cut_tcp = packet(tc.a.client, 40042, tc.a.node, NP_LOCAL)[:14 + 20 + 10]      # no flags byte
    for frame in (later_fragment, arp, cut_tcp):
        for hook in (tc.ingress, tc.egress):
            ret, out = hook(frame)
            assert (ret, out[:len(frame)]) == (TC_ACT_OK, frame)


def test_local_backend_dnat_only_and_the_reply_on_egress(tc):
    ret, out = tc.ingress(packet(tc.a.client, 40000, tc.a.node, NP_LOCAL))
    p = parse(out)
    assert ret == TC_ACT_OK, "a local backend is reached through the stack"
    assert (p["src"], p["sport"], p["dst"], p["dport"]) == (tc.a.client, 40000, tc.a.local_be, 8080)
    assert p["ip_ok"] and p["l4_ok"]
    _, ct = tc.ct(40000, NP_LOCAL)
    assert ct is not None and not ct.flags & L.const("KP_CT_F_SNAT")
    assert L.CT_STATE_NAMES[ct.state] == "new"

    ret, out = tc.egress(packet(tc.a.local_be, 8080, tc.a.client, 40000, flags=SYN | ACK))
    p = parse(out)
    assert ret == TC_ACT_OK
    assert (p["src"], p["sport"], p["dst"], p["dport"]) == (tc.a.node, NP_LOCAL, tc.a.client, 40000)
    assert p["ip_ok"] and p["l4_ok"]
    assert L.CT_STATE_NAMES[tc.ct(40000, NP_LOCAL)[1].state] == "established"
    # The egress hook leaves the SNAT flows' replies to the ingress hook, and vice versa.
    ret, out = tc.ingress(packet(tc.a.local_be, 8080, tc.a.client, 40000, flags=ACK))
    assert parse(out)["src"] == tc.a.local_be


def test_one_client_port_to_two_frontends_of_a_local_backend_moves_the_second_ones_port(tc):
    """Two flows would make one reply tuple (backend -> client:40010): the second gets its
    source port moved in the SNAT range, its address kept (lib/snat.h kp_reply_held), and
    each reply goes back to its own connection."""
    a = tc.a
    tc.ingress(packet(a.client, 40010, a.node, NP_LOCAL))
    tc.egress(packet(a.local_be, 8080, a.client, 40010, flags=SYN | ACK))
    before = tc.stat("tc_port_moved")
    ret, out = tc.ingress(packet(a.client, 40010, a.node, NP_LOCAL2))
    p = parse(out)
    assert ret == TC_ACT_OK, "still the client's address: routed through the stack"
    assert (p["src"], p["dst"], p["dport"]) == (a.client, a.local_be, 8080)
    assert PORTS[0] <= p["sport"] <= PORTS[1] and p["ip_ok"] and p["l4_ok"]
    assert tc.stat("tc_port_moved") == before + 1
    moved = p["sport"]
    _, ct = tc.ct(40010, NP_LOCAL2)
    assert ct.flags & L.const("KP_CT_F_SNAT") and L.port_host(ct.nat_port) == moved

    ret, out = tc.egress(packet(a.local_be, 8080, a.client, moved, flags=SYN | ACK))
    p = parse(out)
    assert ret == TC_ACT_OK and p["ip_ok"] and p["l4_ok"]
    assert (p["src"], p["sport"], p["dst"], p["dport"]) == (a.node, NP_LOCAL2, a.client, 40010)
    _, out = tc.egress(packet(a.local_be, 8080, a.client, 40010, flags=ACK))
    assert (parse(out)["sport"], parse(out)["dport"]) == (NP_LOCAL, 40010)
    _, out = tc.ingress(packet(a.client, 40010, a.node, NP_LOCAL2, flags=ACK))
    assert parse(out)["sport"] == moved, "later packets keep the moved port"


def test_a_reply_from_no_local_ext_backend_is_not_looked_up_on_egress(tc):
    # kp_to_outside looks for a reply's flow only when its source is a local backend of an
    # EXT frontend (kp_extbe): a conntrack reply row alone does not translate a packet from
    # any other address.
    tc.ingress(packet(tc.a.client, 40030, tc.a.node, NP_LOCAL))
    other = L.ip16(tc.a.elsewhere)
    orig, _ = tc.ct(40030, NP_LOCAL)
    rkey = ct_key(tc.a.elsewhere, 8080, tc.a.client, 40030)
    tc.maps["rnat"].put(rkey, orig)
    row = tc.ct(40030, NP_LOCAL)[1]
    row.be_addr = other
    tc.maps["ct"].put(orig, row)
    frame = packet(tc.a.elsewhere, 8080, tc.a.client, 40030, flags=SYN | ACK)
    passes_until_listed(tc, tc.egress, frame, "extbe", other, "src", tc.a.node)


def test_remote_backend_dnat_snat_and_the_reply(tc):
    before = tc.stat("tc_snat")
    ret, out = tc.ingress(packet(tc.a.client, 40001, tc.a.node, NP_REMOTE))
    p = parse(out)
    assert ret == TC_ACT_REDIRECT, "sent past the stack (its source is a local address now)"
    assert (p["src"], p["dst"], p["dport"]) == (tc.a.node, tc.a.remote_be, 8080)
    assert PORTS[0] <= p["sport"] <= PORTS[1]
    assert p["ip_ok"] and p["l4_ok"]
    assert tc.stat("tc_snat") == before + 1
    nat_port = p["sport"]

    # A second packet of the flow keeps backend and port.
    _, out = tc.ingress(packet(tc.a.client, 40001, tc.a.node, NP_REMOTE, flags=ACK))
    assert (parse(out)["dst"], parse(out)["sport"]) == (tc.a.remote_be, nat_port)

    ret, out = tc.ingress(packet(tc.a.remote_be, 8080, tc.a.node, nat_port, flags=SYN | ACK))
    p = parse(out)
    assert ret == TC_ACT_REDIRECT
    assert (p["src"], p["sport"], p["dst"], p["dport"]) == (tc.a.node, NP_REMOTE, tc.a.client, 40001)
    assert p["ip_ok"] and p["l4_ok"]
    assert L.CT_STATE_NAMES[tc.ct(40001, NP_REMOTE)[1].state] == "established"



def test_only_a_port_of_the_snat_range_is_asked_for_a_snat_reply(tc):
    """A request to a NodePort on the SNAT address (NodePorts sit below snatPortRange) skips
    the kp_rnat4 lookup: only a destination port of the range can be a SNAT flow's."""
    tc.ingress(packet(tc.a.client, 40002, tc.a.node, NP_REMOTE))
    frame = moved_snat_reply(tc, tc.ct(40002, NP_REMOTE)[0], port=PORTS[0] - 1)
    ret, out = tc.ingress(frame)
    assert (ret, out[:len(frame)]) == (TC_ACT_OK, frame)


# The older conntrack layouts, as their programs wrote them: IPv4 tuples of __be32 addresses
# (kp_ct4_key, also kp_rnat4's value); kp_ct4_val v1 (expires, be_addr, nat_addr, be_port,
# nat_port, backend_id, svc_id, state, flags, seen_reply) and v2 (life, be_addr, nat_addr,
# be_port, nat_port, backend_id, svc_id, isn).
V4_TUPLE = struct.Struct("=IIHHB3x")
CT_V1 = struct.Struct("=QIIHHIIBBBx")
CT_V2 = struct.Struct("=QIIHHIII")


def be32(addr) -> int:
    return L.ip_be(L.ip_text(addr)) if any(bytes(addr)) else 0


def old_tuple(key: L.CtKey) -> bytes:
    return V4_TUPLE.pack(be32(key.saddr), be32(key.daddr), key.sport, key.dport, key.proto)


def as_v1(ct: L.CtVal) -> bytes:
    """ct as the version-1 programs kept it: no ISN (they had neither the field nor its flag)."""
    return CT_V1.pack(ct.expires, be32(ct.be_addr), be32(ct.nat_addr), ct.be_port, ct.nat_port,
                      ct.backend_id, ct.svc_id, ct.state, ct.flags & ~L.const("KP_CT_F_ISN"),
                      ct.seen_reply)


def as_v2(ct: L.CtVal) -> bytes:
    return CT_V2.pack(ct.life, be32(ct.be_addr), be32(ct.nat_addr), ct.be_port, ct.nat_port,
                      ct.backend_id, ct.svc_id, ct.isn)


def without_isn(ct: L.CtVal) -> bytes:
    """ct as carried over from version 1."""
    out = L.CtVal.from_buffer_copy(bytes(ct))
    out.isn, out.flags = 0, ct.flags & ~L.const("KP_CT_F_ISN")
    return bytes(out)


def changed(ct: L.CtVal, **fields) -> L.CtVal:
    out = L.CtVal.from_buffer_copy(bytes(ct))
    for name, value in fields.items():
        setattr(out, name, value)
    return out


@pytest.mark.parametrize("version,pack,carried", [(1, as_v1, without_isn), (2, as_v2, bytes)],
                         ids=["kp_ct4_v1", "kp_ct4_v2"])
def test_flows_of_the_older_conntrack_layouts_carry_over(tc4, version, pack, carried):
    """An upgrade from IPv4-only programs (kp_ct4 v1 or v2, kp_rnat4_v1): their flows are
    copied into kp_ct and kp_rnat before the new programs are attached and again after, so a
    SNAT flow opened before the upgrade still gets its replies translated. The second copy
    brings flows opened or changed in between, but leaves a row the new programs have written
    since."""
    tc = tc4
    flows, replies = {}, {}
    for sport, np in ((40070, NP_REMOTE), (40071, NP_LOCAL), (40072, NP_LOCAL)):
        tc.ingress(packet(tc.a.client, sport, tc.a.node, np))
        flows[sport] = tc.ct(sport, np)
        replies[sport] = next(k for k, v in tc.maps["rnat"].items()
                              if bytes(v) == bytes(flows[sport][0]))
        tc.maps["ct"].delete(flows[sport][0])       # only the old programs' maps have it
        tc.maps["rnat"].delete(replies[sport])
    pins = [BPFFS / f"kp_ct4_v{version}", BPFFS / "kp_rnat4_v1"]
    ct_fd = libbpf.map_create(LRU_HASH, "kp_ct4", V4_TUPLE.size,
                              CT_V1.size if version == 1 else CT_V2.size, 64)
    rnat_fd = libbpf.map_create(LRU_HASH, "kp_rnat4", V4_TUPLE.size, V4_TUPLE.size, 64)
    try:
        libbpf.obj_pin(ct_fd, str(pins[0]))
        libbpf.obj_pin(rnat_fd, str(pins[1]))

        def old_flow(sport, row):
            libbpf.map_update(ct_fd, old_tuple(flows[sport][0]), pack(row))
            libbpf.map_update(rnat_fd, old_tuple(replies[sport]), old_tuple(flows[sport][0]))

        for sport in (40070, 40072):
            old_flow(sport, flows[sport][1])
        up = ct_upgrade.find(BPFFS)
        assert up is not None
        try:
            assert up.copy() == 4, "two flows, each with its reply row"
            key, row = flows[40070]
            assert bytes(tc.maps["ct"].get(key)) == carried(row)
            ret, out = tc.ingress(packet(tc.a.remote_be, 8080, tc.a.node, L.port_host(row.nat_port),
                                         flags=SYN | ACK))
            p = parse(out)
            assert ret == TC_ACT_REDIRECT
            assert (p["src"], p["sport"], p["dst"], p["dport"]) == (tc.a.node, NP_REMOTE, tc.a.client, 40070)
            assert L.CT_STATE_NAMES[tc.ct(40070, NP_REMOTE)[1].state] == "established"

            # Meanwhile the old programs saw FINs of 40070 and 40072 and a new flow 40071.
            closing = L.const("KP_CT_CLOSING")
            for sport in (40070, 40072):
                old_flow(sport, changed(flows[sport][1], state=closing))
            old_flow(40071, flows[40071][1])
            assert up.copy() == 3, "40072's row and 40071's two (40070's reply row is as it was)"
            assert L.CT_STATE_NAMES[tc.ct(40070, NP_REMOTE)[1].state] == "established"
            assert tc.ct(40072, NP_LOCAL)[1].state == closing
            assert bytes(tc.ct(40071, NP_LOCAL)[1]) == carried(flows[40071][1])
            assert up.copy() == 0
        finally:
            up.close()
    finally:
        for pin in pins:
            pin.unlink(missing_ok=True)
        os.close(ct_fd)
        os.close(rnat_fd)


@pytest.mark.parametrize("udp_csum", [True, False], ids=["checksum", "no-checksum"])
def test_udp_both_ways(tc, udp_csum):
    _, out = tc.ingress(packet(tc.a.client, 5000, tc.a.node, NP_UDP, proto=UDP, udp_csum=udp_csum))
    p = parse(out)
    assert (p["dst"], p["dport"], p["src"]) == (tc.a.remote_be, 8080, tc.a.node)
    assert p["ip_ok"] and p["l4_ok"] == (True if udp_csum else "none")
    _, out = tc.ingress(packet(tc.a.remote_be, 8080, tc.a.node, p["sport"], proto=UDP, udp_csum=udp_csum))
    r = parse(out)
    assert (r["src"], r["sport"], r["dst"], r["dport"]) == (tc.a.node, NP_UDP, tc.a.client, 5000)
    assert r["ip_ok"] and r["l4_ok"] == (True if udp_csum else "none")
    key, ct = tc.ct(5000, NP_UDP, UDP)
    assert L.CT_STATE_NAMES[ct.state] == "established"
    # UDP seen both ways lives nf_conntrack_udp_timeout_stream (120 s) from the last packet.
    assert ct.expires - now_ns() <= 120 * 10**9 and ct.expires - now_ns() > 100 * 10**9


def reply_key(a: Addrs, port: int) -> L.CtKey:
    """The reply tuple remote_be:8080 -> node:port of a flow SNATed to `port`."""
    return ct_key(a.remote_be, 8080, a.node, port)


def hold(tc, port: int, sport: int) -> None:
    """A live flow from client2:sport to NP_REMOTE that holds SNAT port `port`."""
    key = ct_key(tc.a.client2, sport, tc.a.node, NP_REMOTE)
    tc.maps["ct"].put(key, L.CtVal(
        expires=now_ns() + 3600 * 10**9, be_addr=L.ip16(tc.a.remote_be), be_port=L.port_be(8080),
        nat_addr=L.ip16(tc.a.node), nat_port=L.port_be(port), state=L.const("KP_CT_ESTABLISHED"),
        flags=L.const("KP_CT_F_SNAT"), seen_reply=1))
    tc.maps["rnat"].put(reply_key(tc.a, port), key)


def test_port_collision_takes_another_port_and_exhaustion_drops(tc):
    """The range has 4 ports; three are held toward the backend by live flows, so the new
    flow must get the fourth; with all four held the flow is dropped and counted."""
    for i, port in enumerate([PORTS[0], PORTS[0] + 1, PORTS[0] + 2]):
        hold(tc, port, 50000 + i)
    _, out = tc.ingress(packet(tc.a.client, 40002, tc.a.node, NP_REMOTE))
    assert parse(out)["sport"] == PORTS[1]
    full = tc.stat("tc_snat_full")
    ret, _ = tc.ingress(packet(tc.a.client, 40003, tc.a.node, NP_REMOTE))
    assert ret == TC_ACT_SHOT and tc.stat("tc_snat_full") == full + 1
    assert tc.ct(40003, NP_REMOTE)[1] is None


def open_all_ports(tc) -> dict[int, int]:
    """One live flow per SNAT port (client ports 41000...): {SNAT port: client port}."""
    held = {}
    for sport in range(41000, 41000 + PORTS[1] - PORTS[0] + 1):
        _, out = tc.ingress(packet(tc.a.client, sport, tc.a.node, NP_REMOTE))
        held[parse(out)["sport"]] = sport
    assert sorted(held) == list(range(PORTS[0], PORTS[1] + 1))
    return held


def cpu_of(port: int) -> int:
    """The CPU whose slice holds `port` (tc.write_config sets ncpus to the possible CPUs)."""
    return (port - PORTS[0]) % cpu_id_bound()


def ended_long_ago(tc, sport: int) -> None:
    """Moves the flow from client:sport back in time by KP_SNAT_REUSE_S, as if its last
    packet had passed that long ago (its port may then go to a new flow)."""
    key, ct = tc.ct(sport, NP_REMOTE)
    ct.expires -= L.const("KP_SNAT_REUSE_S") * 10**9
    tc.maps["ct"].put(key, ct)


# The ends of a connection, as (direction, TCP flags) in order: "in" from the client, "out"
# the backend's reply.
ENDS = {"rst-client": [("in", RST | ACK)],
        "rst-backend": [("out", RST | ACK)],
        "fin-client-first": [("in", FIN | ACK), ("out", FIN | ACK), ("in", ACK)],
        # the client's last ACK not yet through: the backend is still in LAST_ACK
        "fin-client-first-unacked": [("in", FIN | ACK), ("out", FIN | ACK)],
        "fin-backend-first": [("out", FIN | ACK), ("in", FIN | ACK), ("out", ACK)]}


@pytest.mark.parametrize("end", sorted(ENDS))
def test_an_ended_flows_snat_port_goes_to_a_new_flow_unless_the_backend_holds_a_time_wait(
        tc, end):
    """The range is full of live flows; one of them ends. A RST leaves no state on the
    backend, nor does a close the client began (the backend closes second: no TIME_WAIT);
    so the next flow gets that port, once the end is KP_SNAT_REUSE_S old (the flow's last
    packet must reach the backend before a SYN on the same tuple). A close the backend began
    leaves it in TIME_WAIT for the tuple: the port stays held (a SYN there may be answered for
    the old connection) until the row expires, and the new flow is dropped as the range is
    full; so it is while the backend waits in LAST_ACK for the client's ACK of its FIN."""
    held = open_all_ports(tc)
    port = PORTS[0] + 1
    for way, flags in [("out", SYN | ACK)] + ENDS[end]:
        if way == "in":
            tc.ingress(packet(tc.a.client, held[port], tc.a.node, NP_REMOTE, flags=flags))
        else:
            ret, _ = tc.ingress(packet(tc.a.remote_be, 8080, tc.a.node, port, flags=flags))
            assert ret == TC_ACT_REDIRECT
    reuse, full = tc.stat("tc_snat_reuse"), tc.stat("tc_snat_full")
    # Just ended: the last packet may still be on its way to the backend; the port waits.
    ret, _ = tc.ingress(packet(tc.a.client, 42000, tc.a.node, NP_REMOTE), cpu=cpu_of(port))
    assert ret == TC_ACT_SHOT and tc.stat("tc_snat_full") == full + 1
    ended_long_ago(tc, held[port])
    ret, out = tc.ingress(packet(tc.a.client, 42000, tc.a.node, NP_REMOTE), cpu=cpu_of(port))
    if end in ("fin-backend-first", "fin-client-first-unacked"):
        assert ret == TC_ACT_SHOT and tc.stat("tc_snat_full") == full + 2
        return
    assert ret == TC_ACT_REDIRECT and parse(out)["sport"] == port
    assert tc.stat("tc_snat_reuse") == reuse + 1
    # The port's replies now reach the new flow only; the old flow's row is not touched.
    _, out = tc.ingress(packet(tc.a.remote_be, 8080, tc.a.node, port, flags=SYN | ACK))
    assert (parse(out)["dst"], parse(out)["dport"]) == (tc.a.client, 42000)
    _, old = tc.ct(held[port], NP_REMOTE)
    assert L.port_host(old.nat_port) == port and old.state >= L.const("KP_CT_CLOSING")


def test_an_ended_flows_port_is_reused_only_by_the_cpu_whose_slice_holds_it(tc):
    """Two new flows on two CPUs never take over the same row: a CPU reuses only the ports of
    its own slice (min + cpu + k * ncpus)."""
    if cpu_id_bound() < 2:
        pytest.skip("one CPU: every port is in its slice")
    held = open_all_ports(tc)
    port = PORTS[0] + 1
    tc.ingress(packet(tc.a.client, held[port], tc.a.node, NP_REMOTE, flags=RST))
    ended_long_ago(tc, held[port])
    other = (cpu_of(port) + 1) % cpu_id_bound()
    if other not in os.sched_getaffinity(0):
        pytest.skip(f"CPU {other} is not ours to run on")
    ret, _ = tc.ingress(packet(tc.a.client, 42001, tc.a.node, NP_REMOTE), cpu=other)
    assert ret == TC_ACT_SHOT
    ret, out = tc.ingress(packet(tc.a.client, 42001, tc.a.node, NP_REMOTE), cpu=cpu_of(port))
    assert ret == TC_ACT_REDIRECT and parse(out)["sport"] == port


def test_expired_entry_is_left_alone_mid_stream_and_balanced_anew_by_a_syn(tc):
    """A mid-stream packet of an expired flow is no flow of ours any more: it passes untouched
    (another backend could only reset it). The client's next SYN on the tuple balances anew,
    and the old reply tuple is dead."""
    _, out = tc.ingress(packet(tc.a.client, 40004, tc.a.node, NP_REMOTE))
    old_port = parse(out)["sport"]
    key, ct = tc.ct(40004, NP_REMOTE)
    ct.expires = 1                          # long past
    tc.maps["ct"].put(key, ct)
    expired, mid = tc.stat("tc_ct_expired"), tc.stat("tc_midstream")
    frame = packet(tc.a.client, 40004, tc.a.node, NP_REMOTE, flags=ACK)
    ret, out = tc.ingress(frame)
    assert (ret, out[:len(frame)]) == (TC_ACT_OK, frame)
    assert (tc.stat("tc_ct_expired"), tc.stat("tc_midstream")) == (expired, mid + 1)
    _, out = tc.ingress(packet(tc.a.client, 40004, tc.a.node, NP_REMOTE, seq=2000))
    assert tc.stat("tc_ct_expired") == expired + 1
    new_port = parse(out)["sport"]
    _, ct = tc.ct(40004, NP_REMOTE)
    assert ct.expires > now_ns()
    if new_port != old_port:
        # The old port's row may stay (another flow may own the port by now): it no longer
        # matches the flow, so a reply there is not translated into it.
        ret, out = tc.ingress(packet(tc.a.remote_be, 8080, tc.a.node, old_port, flags=ACK))
        assert ret == TC_ACT_OK and parse(out)["dport"] == old_port


@pytest.mark.parametrize("flags", [ACK, ACK | 0x08, FIN | ACK, RST, RST | ACK, SYN | ACK],
                         ids=["ack", "psh", "fin", "rst", "rst-ack", "syn-ack"])
@pytest.mark.parametrize("port", [NP_REMOTE, NP_LOCAL, NP_REJECT], ids=["remote", "local", "reject"])
def test_a_mid_stream_packet_of_a_flow_we_did_not_start_passes_untouched(tc, port, flags):
    """A connection kube-proxy's DNAT started before the agent attached: with no kp_ct row, a
    TCP packet other than a client's SYN is left to the stack (whose conntrack keeps
    translating it), tracked nowhere, not refused even by a frontend without endpoints (kube-
    proxy rejects only new connections), and counted. A SYN then still balances."""
    before = {c: tc.stat(c) for c in ("tc_midstream", "tc_forward", "tc_reject", "tc_ct_expired")}
    frame = packet(tc.a.client, 40020, tc.a.node, port, flags=flags)
    ret, out = tc.ingress(frame)
    assert (ret, out[:len(frame)]) == (TC_ACT_OK, frame)
    assert tc.ct(40020, port)[1] is None
    assert {c: tc.stat(c) for c in before} == {**before, "tc_midstream": before["tc_midstream"] + 1}
    if port != NP_REJECT:
        ret, out = tc.ingress(packet(tc.a.client, 40020, tc.a.node, port))
        assert parse(out)["dst"] == (tc.a.remote_be if port == NP_REMOTE else tc.a.local_be)
        assert tc.stat("tc_forward") == before["tc_forward"] + 1


def test_mid_stream_rule_is_tcp_only_and_counts_frontends_only(tc):
    """UDP has no mid-stream mark: a datagram without a flow is balanced as before. A TCP
    packet to the node address on a port that is no frontend passes uncounted."""
    mid = tc.stat("tc_midstream")
    _, out = tc.ingress(packet(tc.a.client, 5020, tc.a.node, NP_UDP, proto=UDP))
    assert parse(out)["dst"] == tc.a.remote_be
    frame = packet(tc.a.client, 40021, tc.a.node, 22, flags=ACK)
    ret, out = tc.ingress(frame)
    assert (ret, out[:len(frame)]) == (TC_ACT_OK, frame)
    assert tc.stat("tc_midstream") == mid


def test_a_reopened_flow_marked_ended_by_a_late_packet_still_gets_its_syn_ack(tc):
    """The client's RST of its last connection, overtaken by the SYN of the next one from the
    same port (two CPUs), marks the reopened flow closed before its first reply: that reply
    is still the flow's. Only an answered flow that ended gives a SYN-ACK to another
    connection (test_tc_pod_run.py)."""
    _, out = tc.ingress(packet(tc.a.client, 40007, tc.a.node, NP_REMOTE))
    tc.ingress(packet(tc.a.remote_be, 8080, tc.a.node, parse(out)["sport"], flags=SYN | ACK))
    tc.ingress(packet(tc.a.client, 40007, tc.a.node, NP_REMOTE, flags=RST))
    _, out = tc.ingress(packet(tc.a.client, 40007, tc.a.node, NP_REMOTE))           # reopened
    nat_port = parse(out)["sport"]
    tc.ingress(packet(tc.a.client, 40007, tc.a.node, NP_REMOTE, flags=RST))         # the late RST
    assert L.CT_STATE_NAMES[tc.ct(40007, NP_REMOTE)[1].state] == "closed"
    ret, out = tc.ingress(packet(tc.a.remote_be, 8080, tc.a.node, nat_port, flags=SYN | ACK))
    r = parse(out)
    assert ret == TC_ACT_REDIRECT
    assert (r["src"], r["sport"], r["dst"], r["dport"]) == (tc.a.node, NP_REMOTE, tc.a.client, 40007)


def test_tcp_states_follow_the_flags(tc):
    t0 = now_ns()
    tc.ingress(packet(tc.a.client, 40005, tc.a.node, NP_LOCAL))
    _, ct = tc.ct(40005, NP_LOCAL)
    assert ct.expires - t0 >= 120 * 10**9 and ct.expires - now_ns() <= 120 * 10**9   # syn_sent
    tc.egress(packet(tc.a.local_be, 8080, tc.a.client, 40005, flags=SYN | ACK))
    _, ct = tc.ct(40005, NP_LOCAL)
    assert ct.expires - now_ns() > 3600 * 10**9                                  # established
    tc.ingress(packet(tc.a.client, 40005, tc.a.node, NP_LOCAL, flags=FIN | ACK))
    assert L.CT_STATE_NAMES[tc.ct(40005, NP_LOCAL)[1].state] == "closing"
    tc.egress(packet(tc.a.local_be, 8080, tc.a.client, 40005, flags=RST))
    _, ct = tc.ct(40005, NP_LOCAL)
    assert L.CT_STATE_NAMES[ct.state] == "closed" and ct.expires - now_ns() <= 10 * 10**9


@pytest.mark.parametrize("end", sorted(ENDS))
def test_an_ended_flow_is_written_again_whole_and_still_translates_late_replies(tc, end):
    """kp_ct_track writes a flow's row whole once more when it ends (a new element for the
    LRU, bpf/lib/ct.h kp_ct_ended): everything but the life word must come through as it was,
    and the flow's late packets (a retransmitted FIN, the client's last ACK) still find it."""
    sport = 40020
    tc.ingress(packet(tc.a.client, sport, tc.a.node, NP_REMOTE))
    _, opened = tc.ct(sport, NP_REMOTE)
    nat_port = L.port_host(opened.nat_port)
    tc.ingress(packet(tc.a.remote_be, 8080, tc.a.node, nat_port, flags=SYN | ACK))
    for way, flags in ENDS[end]:
        if way == "in":
            tc.ingress(packet(tc.a.client, sport, tc.a.node, NP_REMOTE, flags=flags))
        else:
            tc.ingress(packet(tc.a.remote_be, 8080, tc.a.node, nat_port, flags=flags))
    _, ended = tc.ct(sport, NP_REMOTE)
    keep = [f for f, *_ in L.CtVal._fields_ if f != "life"]

    def fields(row):
        return {f: bytes(v) if isinstance(v := getattr(row, f), ctypes.Array) else v for f in keep}
    assert fields(ended) == fields(opened)
    assert ended.state >= L.const("KP_CT_CLOSING") and ended.seen_reply
    assert ended.flags & L.const("KP_CT_F_ISN") and ended.flags & L.const("KP_CT_F_SNAT")
    ret, out = tc.ingress(packet(tc.a.remote_be, 8080, tc.a.node, nat_port, flags=FIN | ACK))
    assert ret == TC_ACT_REDIRECT
    assert (parse(out)["dst"], parse(out)["dport"], parse(out)["sport"]) == (tc.a.client, sport,
                                                                              NP_REMOTE)
    ret, out = tc.ingress(packet(tc.a.client, sport, tc.a.node, NP_REMOTE, flags=ACK))
    assert ret == TC_ACT_REDIRECT
    assert (parse(out)["dst"], parse(out)["sport"]) == (tc.a.remote_be, nat_port)
    assert tc.ct(sport, NP_REMOTE)[1].backend_id == opened.backend_id


def test_a_removed_backends_tcp_flow_keeps_it_mid_stream_and_a_new_syn_rebalances(tc):
    """Once its backend left the frontend a TCP connection still reaches it, as under
    kube-proxy, whose conntrack cleanup clears UDP entries only (a pod that stops being ready
    still answers the connections it has; another backend could only reset it), and the
    client's next SYN on the tuple gets a backend the frontend has."""
    tc.ingress(packet(tc.a.client, 40006, tc.a.node, NP_LOCAL))
    assert L.ip_text(tc.ct(40006, NP_LOCAL)[1].be_addr) == tc.a.local_be
    moved = ext(tc.a, NP_LOCAL, [(tc.a.local_be2, True)])
    assert tc.writer.apply({moved.key: moved}, candidates=[moved.key]).ok
    ret, out = tc.ingress(packet(tc.a.client, 40006, tc.a.node, NP_LOCAL, flags=ACK))
    assert ret == TC_ACT_OK and parse(out)["dst"] == tc.a.local_be
    _, out = tc.ingress(packet(tc.a.client, 40006, tc.a.node, NP_LOCAL, seq=3000))
    assert parse(out)["dst"] == tc.a.local_be2


def test_reject_answers_icmp_port_unreachable(tc):
    frame = packet(tc.a.client, 40007, tc.a.node, NP_REJECT)
    ret, out = tc.ingress(frame)
    p = parse(out)
    assert ret == TC_ACT_REDIRECT, "sent back out of the device it came in on"
    assert (p["proto"], p["type"], p["code"]) == (tc.a.icmp, *tc.a.port_unreach)
    assert (p["src"], p["dst"]) == (tc.a.node, tc.a.client)
    assert p["ip_ok"] and p["l4_ok"]
    assert p["quote"] == frame[14:14 + tc.a.quote], "the original IP header and 8 bytes of TCP"
    assert out[:6] == frame[6:12] and out[6:12] == frame[:6], "MACs swapped"


def test_drop_drops(tc):
    before = tc.stat("tc_drop")
    ret, _ = tc.ingress(packet(tc.a.client, 40008, tc.a.node, NP_DROP))
    assert ret == TC_ACT_SHOT and tc.stat("tc_drop") == before + 1


def test_purge_removes_udp_flows_of_a_backend_that_left_their_frontend_not_tcp(tc):
    from kproxy_ebpf.datapath.flows import conntrack

    def keeps(k, b):
        return b in tc.writer.held.backends_of(k)

    tc.ingress(packet(tc.a.client, 40009, tc.a.node, NP_REMOTE))
    tc.ingress(packet(tc.a.client, 40010, tc.a.node, NP_UDP, proto=UDP))
    key, ct = tc.ct(40010, NP_UDP, UDP)
    reply = snat_reply_key(key, ct)
    assert tc.maps["rnat"].get(reply) is not None
    assert conntrack.purge(tc.maps, keeps).removed == 0, "nothing changed yet"
    # The remote backend leaves both frontends.
    moved = [ext(tc.a, NP_REMOTE, [(tc.a.local_be, True)]),
             ext(tc.a, NP_UDP, [(tc.a.local_be, True)], proto=UDP)]
    assert tc.writer.apply({f.key: f for f in moved}, candidates=[f.key for f in moved]).ok
    # A partial sync checks the flows of the frontends it changed only.
    other = ext(tc.a, NP_LOCAL, [(tc.a.local_be, True)])
    res = conntrack.purge(tc.maps, keeps, frontends=[other.key])
    assert res.removed == 0 and res.entries >= 2
    # The UDP flow goes, with its reply row; the TCP connection keeps its backend.
    assert conntrack.purge(tc.maps, keeps, frontends=[f.key for f in moved]).removed == 1
    assert tc.ct(40010, NP_UDP, UDP)[1] is None and tc.maps["rnat"].get(reply) is None
    rows = [r for r in conntrack.entries(tc.maps) if r["client"] == hostport(tc.a.client, 40009)]
    assert [(r["backend"], bool(r["snat"]), r["service"]) for r in rows] == [
        (hostport(tc.a.remote_be, 8080), True, f"t/np{NP_REMOTE}")]


# -- loadBalancerSourceRanges ---------------------------------------------------------------------

def lb(a: Addrs, backends, ranges, action=Action.FORWARD) -> Frontend:
    return frontend(a.lb_ip, 80, FrontendKind.LOAD_BALANCER, "lb", backends, action,
                    ranges=ranges)


def test_source_ranges_admit_one_range_and_drop_another(tc):
    f = lb(tc.a, [(tc.a.local_be, True)], [tc.a.client_net])
    assert tc.writer.apply({f.key: f}).ok
    before = tc.stat("tc_src_drop")
    ret, out = tc.ingress(packet(tc.a.client, 40100, tc.a.lb_ip, 80))
    p = parse(out)
    assert ret == TC_ACT_OK and (p["dst"], p["dport"]) == (tc.a.local_be, 8080)
    ret, _ = tc.ingress(packet(tc.a.other_client, 40100, tc.a.lb_ip, 80))
    assert ret == TC_ACT_SHOT and tc.stat("tc_src_drop") == before + 1

    # A range change flips it for new flows; the flow already tracked keeps going, as
    # kube-proxy's firewall only judges "ct state new".
    f = lb(tc.a, [(tc.a.local_be, True)], [tc.a.other_net])
    assert tc.writer.apply({f.key: f}).ok
    ret, out = tc.ingress(packet(tc.a.other_client, 40101, tc.a.lb_ip, 80))
    assert ret == TC_ACT_OK and parse(out)["dst"] == tc.a.local_be
    ret, _ = tc.ingress(packet(tc.a.client, 40102, tc.a.lb_ip, 80))
    assert ret == TC_ACT_SHOT
    ret, out = tc.ingress(packet(tc.a.client, 40100, tc.a.lb_ip, 80, flags=ACK))
    assert ret == TC_ACT_OK and parse(out)["dst"] == tc.a.local_be

    # No ranges: no filtering (and no trie lookup: the flag is clear).
    f = lb(tc.a, [(tc.a.local_be, True)], [])
    assert tc.writer.apply({f.key: f}).ok
    assert len(tc.maps["srcrange"].keys()) == 0
    ret, _ = tc.ingress(packet(tc.a.client, 40103, tc.a.lb_ip, 80))
    assert ret == TC_ACT_OK


def test_source_ranges_drop_before_the_no_endpoint_reject(tc):
    """kube-proxy's firewall chain runs before DNAT and the no-endpoint reject: an outsider
    learns nothing (dropped), an admitted client is refused."""
    f = lb(tc.a, [], [tc.a.client_host], action=Action.REJECT)
    assert tc.writer.apply({f.key: f}).ok
    ret, _ = tc.ingress(packet(tc.a.other_client, 40110, tc.a.lb_ip, 80))
    assert ret == TC_ACT_SHOT
    ret, out = tc.ingress(packet(tc.a.client, 40110, tc.a.lb_ip, 80))
    assert ret == TC_ACT_REDIRECT and parse(out)["proto"] == tc.a.icmp


# -- ICMP errors about tracked flows ---------------------------------------------------------

def too_big(a: Addrs, reply: bytes) -> bytes:
    """What a router that cannot forward `reply` (a frame leaving toward the client) sends
    back: ICMPv6 packet too big (MTU 1280), or ICMP fragmentation needed (next-hop MTU 1280),
    quoting the reply's IP packet."""
    quoted = reply[14:]
    if a.family == "ipv6":
        return icmp_error(a.router, parse(reply)["src"], 2, 0, quoted[:1232], info=1280)
    return icmp_error(a.router, parse(reply)["src"], 3, 4, quoted[:28], info=1280)


def quoted(a: Addrs, p: dict) -> tuple:
    """(src, sport, dst, dport) of an error's quote, and whether a quoted IPv4 header's checksum
    holds."""
    q = p["icmp_body"]
    if a.family == "ipv6":
        return (ntop(q[8:24]), struct.unpack("!H", q[40:42])[0], ntop(q[24:40]),
                struct.unpack("!H", q[42:44])[0], True)
    return (ntop(q[12:16]), struct.unpack("!H", q[20:22])[0], ntop(q[16:20]),
            struct.unpack("!H", q[22:24])[0], csum(q[:20]) == 0)


@pytest.mark.parametrize("where", ["local", "remote"])
def test_a_packet_too_big_about_a_reply_goes_on_to_the_backend(tc, where):
    """The reply left as frontend -> client; a router's packet too big (fragmentation needed)
    comes back to the frontend address. It goes on to the backend as the error about the
    backend's own packet: outer destination the backend, the quote backend -> client (a SNAT
    flow's: backend -> SNAT address and port), checksums whole. The backend's TCP lowers its
    MSS and resends; without this the connection stalls (IPv6 routers never fragment)."""
    a = tc.a
    np, sport = (NP_LOCAL, 40200) if where == "local" else (NP_REMOTE, 40201)
    _, out = tc.ingress(packet(a.client, sport, a.node, np))
    if where == "local":
        be, be_port = a.local_be, 8080
        _, reply = tc.egress(packet(a.local_be, 8080, a.client, sport, flags=ACK, payload=bytes(1400)))
        quote_dst = (a.client, sport)
    else:
        be, be_port, nat_port = a.remote_be, 8080, parse(out)["sport"]
        _, reply = tc.ingress(packet(a.remote_be, 8080, a.node, nat_port, flags=ACK, payload=bytes(1400)))
        quote_dst = (a.node, nat_port)
    assert (parse(reply)["src"], parse(reply)["sport"]) == (a.node, np)
    before = tc.stat("tc_icmp_err")
    ret, out = tc.ingress(too_big(a, reply))
    p = parse(out)
    assert ret == TC_ACT_OK, "routed on to the backend"
    assert (p["src"], p["dst"], p["proto"]) == (a.router, be, a.icmp)
    assert p["ip_ok"] and p["l4_ok"], "outer header and ICMP checksums"
    src, qsport, dst, qdport, inner_ok = quoted(a, p)
    assert (src, qsport) == (be, be_port) and (dst, qdport) == quote_dst
    assert inner_ok, "the quoted IPv4 header's checksum"
    assert tc.stat("tc_icmp_err") == before + 1


def test_an_icmp_error_about_no_tracked_flow_and_other_icmp_pass_untouched(tc):
    """An error about the node's own connection (port 22, no flow), an echo request, and in
    IPv6 the neighbour discovery to the node address: none is ours to touch."""
    a = tc.a
    own = packet(a.node, 22, a.client, 40210, flags=ACK)
    frames = [too_big(a, own)]
    if a.family == "ipv6":
        frames += [icmp_error(a.router, a.node, 128, 0, b"ping"),       # echo request
                   icmp_error(a.router, a.node, 135, 0, pton(a.node))]  # neighbour solicitation
    else:
        frames += [icmp_error(a.router, a.node, 8, 0, b"ping")]
    for frame in frames:
        for hook in (tc.ingress, tc.egress):
            ret, out = hook(frame)
            assert (ret, out[:len(frame)]) == (TC_ACT_OK, frame)


def test_an_ipv6_packet_with_extension_headers_passes_untouched(harness):
    """kp_parse_ip6 reads a TCP, UDP or ICMPv6 header right after the IPv6 one only: with a
    hop-by-hop options or fragment header in between the packet is not translated (as an IPv4
    fragment after the first is not)."""
    with ext_run(harness, FAMILIES["ipv6"]) as tc:
        a = tc.a
        plain = packet(a.client, 40220, a.node, NP_LOCAL)
        ip, l4 = plain[14:54], plain[54:]
        for nexthdr, ext_hdr in ((0, bytes([6, 0]) + bytes(6)),            # hop-by-hop, PadN
                                 (44, bytes([6, 0, 0, 0]) + bytes(4))):    # fragment, offset 0
            hdr = ip[:4] + struct.pack("!H", len(ext_hdr) + len(l4)) + bytes([nexthdr]) + ip[7:]
            frame = plain[:14] + hdr + ext_hdr + l4
            ret, out = tc.ingress(frame)
            assert (ret, out[:len(frame)]) == (TC_ACT_OK, frame)
