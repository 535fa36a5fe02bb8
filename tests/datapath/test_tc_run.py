"""bpf/tc_lb.c's scope-EXT programs (kp_from_outside, kp_to_outside) run with BPF_PROG_TEST_RUN
on hand-built packets, with real maps (harness: tcrun.py): the frontends are programmed by the
real MapWriter, and every translated packet's IP and TCP/UDP checksums are verified with a
checksum computed in Python.
"""
from __future__ import annotations

import ctypes
import os
import struct
import time

import pytest

from kproxy_ebpf.datapath import ct_upgrade, libbpf
from kproxy_ebpf.datapath import layout as L
from kproxy_ebpf.datapath.tc import possible_cpus
from kproxy_ebpf.desired import Action, Backend, Frontend, FrontendKind, Scope, ServicePortName

from .tcrun import (ACK, BPFFS, CLIENT, FIN, LOCAL_BE, NODE, PORTS, REMOTE_BE, RST, SYN, TC_ACT_OK,
                    TC_ACT_REDIRECT, TC_ACT_SHOT, TCP, UDP, TcRun, ct_key, moved_snat_reply, packet,
                    parse, snat_reply_key)

pytestmark = pytest.mark.root

LRU_HASH = 9                # BPF_MAP_TYPE_LRU_HASH
NP_REMOTE, NP_LOCAL, NP_REJECT, NP_DROP, NP_UDP = 30080, 30081, 30082, 30083, 30053


def ext(port, backends, action=Action.FORWARD, proto=TCP, affinity=0) -> Frontend:
    bs = tuple(Backend(ip, 8080, proto, local=local) for ip, local in backends)
    return Frontend(NODE, port, proto, FrontendKind.NODE_PORT,
                    ServicePortName("t", f"np{port}", "", proto), action, bs, affinity, Scope.EXT)


class ExtRun(TcRun):
    def ingress(self, frame: bytes, cpu: int | None = None) -> tuple[int, bytes]:
        return self.run("kp_from_outside", frame, cpu)

    def egress(self, frame: bytes) -> tuple[int, bytes]:
        return self.run("kp_to_outside", frame)

    def ct(self, sport, dport, proto=TCP, src=CLIENT):
        return super().ct(src, sport, NODE, dport, proto)


@pytest.fixture
def tc(harness):
    run = ExtRun(harness, [ext(NP_REMOTE, [(REMOTE_BE, False)]), ext(NP_LOCAL, [(LOCAL_BE, True)]),
                           ext(NP_REJECT, [], Action.REJECT), ext(NP_DROP, [], Action.DROP),
                           ext(NP_UDP, [(REMOTE_BE, False)], proto=UDP)])
    yield run
    run.close()


def now_ns() -> int:
    return time.clock_gettime_ns(time.CLOCK_MONOTONIC)


# -- tests ----------------------------------------------------------------------------------------

def test_not_a_frontend_passes_untouched(tc):
    frame = packet(CLIENT, 40000, NODE, 22)
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
    tc.ingress(packet(CLIENT, 40010, NODE, NP_LOCAL))
    key, row = tc.ct(40010, NP_LOCAL)
    other = L.ip16("10.244.9.9")
    key.daddr = L.ip_be("10.244.9.9")
    tc.maps["ct"].put(key, row)
    frame = packet(CLIENT, 40010, "10.244.9.9", NP_LOCAL, flags=ACK)
    passes_until_listed(tc, tc.ingress, frame, "extaddr", other, "dst", LOCAL_BE)


def test_a_snat_reply_is_translated_with_no_frontend_on_the_snat_address(harness):
    # An external IP's flow to a remote backend: the reply comes to the node address, which
    # no frontend uses here; the SNAT address in kp_tccfg lets it through.
    eip = "192.0.2.7"
    run = ExtRun(harness, [Frontend(eip, 80, TCP, FrontendKind.EXTERNAL_IP,
                                    ServicePortName("t", "eip", "", TCP), Action.FORWARD,
                                    (Backend(REMOTE_BE, 8080, TCP),), 0, Scope.EXT)])
    try:
        assert [L.ip_text(k) for k in run.maps["extaddr"].keys()] == [eip]
        _, out = run.ingress(packet(CLIENT, 40020, eip, 80))
        p = parse(out)
        assert (p["src"], p["dst"]) == (NODE, REMOTE_BE)
        ret, out = run.ingress(packet(REMOTE_BE, 8080, NODE, p["sport"], flags=SYN | ACK))
        r = parse(out)
        assert ret == TC_ACT_REDIRECT
        assert (r["src"], r["sport"], r["dst"], r["dport"]) == (eip, 80, CLIENT, 40020)
    finally:
        run.close()
    assert run.maps["extaddr"].keys() == []


def test_ip_options_move_the_ports_and_a_short_udp_packet_is_whole(tc):
    frame = packet(CLIENT, 40040, NODE, NP_LOCAL, ip_options=b"\x01\x01\x01\x00")
    ret, out = tc.ingress(frame)
    p = parse(out)
    assert ret == TC_ACT_OK and (p["dst"], p["dport"], p["sport"]) == (LOCAL_BE, 8080, 40040)
    assert p["ip_ok"] and p["l4_ok"]
    _, out = tc.ingress(packet(CLIENT, 5001, NODE, NP_UDP, proto=UDP, payload=b""))
    p = parse(out)
    assert (p["dst"], p["dport"]) == (REMOTE_BE, 8080) and p["l4_ok"]


def test_what_is_not_an_unfragmented_ipv4_tcp_or_udp_header_passes_untouched(tc):
    later_fragment = packet(CLIENT, 40041, NODE, NP_LOCAL, frag=100)   # no ports in it
    arp = bytes.fromhex("ffffffffffff02000000000b0806") + bytes(28)
    cut_tcp = packet(CLIENT, 40042, NODE, NP_LOCAL)[:14 + 20 + 10]      # no flags byte
    for frame in (later_fragment, arp, cut_tcp):
        for hook in (tc.ingress, tc.egress):
            ret, out = hook(frame)
            assert (ret, out[:len(frame)]) == (TC_ACT_OK, frame)


def test_local_backend_dnat_only_and_the_reply_on_egress(tc):
    ret, out = tc.ingress(packet(CLIENT, 40000, NODE, NP_LOCAL))
    p = parse(out)
    assert ret == TC_ACT_OK, "a local backend is reached through the stack"
    assert (p["src"], p["sport"], p["dst"], p["dport"]) == (CLIENT, 40000, LOCAL_BE, 8080)
    assert p["ip_ok"] and p["l4_ok"]
    _, ct = tc.ct(40000, NP_LOCAL)
    assert ct is not None and not ct.flags & L.const("KP_CT_F_SNAT")
    assert L.CT_STATE_NAMES[ct.state] == "new"

    ret, out = tc.egress(packet(LOCAL_BE, 8080, CLIENT, 40000, flags=SYN | ACK))
    p = parse(out)
    assert ret == TC_ACT_OK
    assert (p["src"], p["sport"], p["dst"], p["dport"]) == (NODE, NP_LOCAL, CLIENT, 40000)
    assert p["ip_ok"] and p["l4_ok"]
    assert L.CT_STATE_NAMES[tc.ct(40000, NP_LOCAL)[1].state] == "established"
    # The egress hook leaves the SNAT flows' replies to the ingress hook, and vice versa.
    ret, out = tc.ingress(packet(LOCAL_BE, 8080, CLIENT, 40000, flags=ACK))
    assert parse(out)["src"] == LOCAL_BE


def test_a_reply_from_no_local_ext_backend_is_not_looked_up_on_egress(tc):
    # kp_to_outside looks for a reply's flow only when its source is a local backend of an
    # EXT frontend (kp_extbe): a conntrack reply row alone does not translate a packet from
    # any other address.
    tc.ingress(packet(CLIENT, 40030, NODE, NP_LOCAL))
    other = L.ip16("10.244.1.99")
    orig, _ = tc.ct(40030, NP_LOCAL)
    rkey = ct_key("10.244.1.99", 8080, CLIENT, 40030)
    tc.maps["rnat"].put(rkey, orig)
    row = tc.ct(40030, NP_LOCAL)[1]
    row.be_addr = L.ip_be("10.244.1.99")
    tc.maps["ct"].put(orig, row)
    frame = packet("10.244.1.99", 8080, CLIENT, 40030, flags=SYN | ACK)
    passes_until_listed(tc, tc.egress, frame, "extbe", other, "src", NODE)


def test_remote_backend_dnat_snat_and_the_reply(tc):
    before = tc.stat("tc_snat")
    ret, out = tc.ingress(packet(CLIENT, 40001, NODE, NP_REMOTE))
    p = parse(out)
    assert ret == TC_ACT_REDIRECT, "sent past the stack (its source is a local address now)"
    assert (p["src"], p["dst"], p["dport"]) == (NODE, REMOTE_BE, 8080)
    assert PORTS[0] <= p["sport"] <= PORTS[1]
    assert p["ip_ok"] and p["l4_ok"]
    assert tc.stat("tc_snat") == before + 1
    nat_port = p["sport"]

    # A second packet of the flow keeps backend and port.
    _, out = tc.ingress(packet(CLIENT, 40001, NODE, NP_REMOTE, flags=ACK))
    assert (parse(out)["dst"], parse(out)["sport"]) == (REMOTE_BE, nat_port)

    ret, out = tc.ingress(packet(REMOTE_BE, 8080, NODE, nat_port, flags=SYN | ACK))
    p = parse(out)
    assert ret == TC_ACT_REDIRECT
    assert (p["src"], p["sport"], p["dst"], p["dport"]) == (NODE, NP_REMOTE, CLIENT, 40001)
    assert p["ip_ok"] and p["l4_ok"]
    assert L.CT_STATE_NAMES[tc.ct(40001, NP_REMOTE)[1].state] == "established"



def test_only_a_port_of_the_snat_range_is_asked_for_a_snat_reply(tc):
    """A request to a NodePort on the SNAT address (NodePorts sit below snatPortRange) skips
    the kp_rnat4 lookup: only a destination port of the range can be a SNAT flow's."""
    tc.ingress(packet(CLIENT, 40002, NODE, NP_REMOTE))
    frame = moved_snat_reply(tc, tc.ct(40002, NP_REMOTE)[0], port=PORTS[0] - 1)
    ret, out = tc.ingress(frame)
    assert (ret, out[:len(frame)]) == (TC_ACT_OK, frame)


# kp_ct4_val of layout version 1, as the programs before the life word wrote it: expires,
# be_addr, nat_addr, be_port, nat_port, backend_id, svc_id, state, flags, seen_reply, pad.
CT_V1 = struct.Struct("=QIIHHIIBBBx")


def as_v1(ct: L.CtVal, **changes) -> bytes:
    """ct as the version-1 programs kept it: no ISN (they had neither the field nor its flag)."""
    f = {n: getattr(ct, n) for n in ("expires", "be_addr", "nat_addr", "be_port", "nat_port",
                                     "backend_id", "svc_id", "state", "flags", "seen_reply")}
    f["flags"] &= ~L.const("KP_CT_F_ISN")
    f.update(changes)
    return CT_V1.pack(*f.values())


def without_isn(ct: L.CtVal) -> bytes:
    """ct as carried over from version 1."""
    out = L.CtVal.from_buffer_copy(bytes(ct))
    out.isn, out.flags = 0, ct.flags & ~L.const("KP_CT_F_ISN")
    return bytes(out)


def test_flows_of_the_older_conntrack_layout_carry_over(tc):
    """An upgrade from programs that kept kp_ct4_v1: its flows are copied into the current
    map before the new programs are attached and again after, so a SNAT flow opened before
    the upgrade still gets its replies translated. The second copy brings flows opened or
    changed in between, but leaves a row the new programs have written since."""
    flows = {}
    for sport, np in ((40070, NP_REMOTE), (40071, NP_LOCAL), (40072, NP_LOCAL)):
        tc.ingress(packet(CLIENT, sport, NODE, np))
        flows[sport] = tc.ct(sport, np)
        tc.maps["ct"].delete(flows[sport][0])       # only the old programs' map has it
    v1 = BPFFS / f"{L.MAPS['ct'].base}_v1"
    fd = libbpf.map_create(LRU_HASH, "kp_ct4", ctypes.sizeof(L.CtKey), CT_V1.size, 64)
    try:
        libbpf.obj_pin(fd, str(v1))
        for sport in (40070, 40072):
            libbpf.map_update(fd, flows[sport][0], as_v1(flows[sport][1]))
        up = ct_upgrade.find(BPFFS)
        assert up is not None
        try:
            assert up.copy() == 2
            key, row = flows[40070]
            assert bytes(tc.maps["ct"].get(key)) == without_isn(row)
            ret, out = tc.ingress(packet(REMOTE_BE, 8080, NODE, L.port_host(row.nat_port),
                                         flags=SYN | ACK))
            p = parse(out)
            assert ret == TC_ACT_REDIRECT
            assert (p["src"], p["sport"], p["dst"], p["dport"]) == (NODE, NP_REMOTE, CLIENT, 40070)
            assert L.CT_STATE_NAMES[tc.ct(40070, NP_REMOTE)[1].state] == "established"

            # Meanwhile the old programs saw FINs of 40070 and 40072 and a new flow 40071.
            closing = L.const("KP_CT_CLOSING")
            for sport in (40070, 40072):
                libbpf.map_update(fd, flows[sport][0], as_v1(flows[sport][1], state=closing))
            libbpf.map_update(fd, flows[40071][0], as_v1(flows[40071][1]))
            assert up.copy() == 2
            assert L.CT_STATE_NAMES[tc.ct(40070, NP_REMOTE)[1].state] == "established"
            assert tc.ct(40072, NP_LOCAL)[1].state == closing
            assert bytes(tc.ct(40071, NP_LOCAL)[1]) == without_isn(flows[40071][1])
            assert up.copy() == 0
        finally:
            up.close()
    finally:
        v1.unlink(missing_ok=True)
        os.close(fd)


@pytest.mark.parametrize("udp_csum", [True, False], ids=["checksum", "no-checksum"])
def test_udp_both_ways(tc, udp_csum):
    _, out = tc.ingress(packet(CLIENT, 5000, NODE, NP_UDP, proto=UDP, udp_csum=udp_csum))
    p = parse(out)
    assert (p["dst"], p["dport"], p["src"]) == (REMOTE_BE, 8080, NODE)
    assert p["ip_ok"] and p["l4_ok"] == (True if udp_csum else "none")
    _, out = tc.ingress(packet(REMOTE_BE, 8080, NODE, p["sport"], proto=UDP, udp_csum=udp_csum))
    r = parse(out)
    assert (r["src"], r["sport"], r["dst"], r["dport"]) == (NODE, NP_UDP, CLIENT, 5000)
    assert r["ip_ok"] and r["l4_ok"] == (True if udp_csum else "none")
    key, ct = tc.ct(5000, NP_UDP, UDP)
    assert L.CT_STATE_NAMES[ct.state] == "established"
    # UDP seen both ways lives nf_conntrack_udp_timeout_stream (120 s) from the last packet.
    assert ct.expires - now_ns() <= 120 * 10**9 and ct.expires - now_ns() > 100 * 10**9


def reply_key(port: int) -> L.CtKey:
    """The reply tuple REMOTE_BE:8080 -> NODE:port of a flow SNATed to `port`."""
    return ct_key(REMOTE_BE, 8080, NODE, port)


def hold(tc, port: int, sport: int) -> None:
    """A live flow from 10.250.0.99:sport to NP_REMOTE that holds SNAT port `port`."""
    key = ct_key("10.250.0.99", sport, NODE, NP_REMOTE)
    tc.maps["ct"].put(key, L.CtVal(
        expires=now_ns() + 3600 * 10**9, be_addr=L.ip_be(REMOTE_BE), be_port=L.port_be(8080),
        nat_addr=L.ip_be(NODE), nat_port=L.port_be(port), state=L.const("KP_CT_ESTABLISHED"),
        flags=L.const("KP_CT_F_SNAT"), seen_reply=1))
    tc.maps["rnat"].put(reply_key(port), key)


def test_port_collision_takes_another_port_and_exhaustion_drops(tc):
    """The range has 4 ports; three are held toward the backend by live flows, so the new
    flow must get the fourth; with all four held the flow is dropped and counted."""
    for i, port in enumerate([PORTS[0], PORTS[0] + 1, PORTS[0] + 2]):
        hold(tc, port, 50000 + i)
    _, out = tc.ingress(packet(CLIENT, 40002, NODE, NP_REMOTE))
    assert parse(out)["sport"] == PORTS[1]
    full = tc.stat("tc_snat_full")
    ret, _ = tc.ingress(packet(CLIENT, 40003, NODE, NP_REMOTE))
    assert ret == TC_ACT_SHOT and tc.stat("tc_snat_full") == full + 1
    assert tc.ct(40003, NP_REMOTE)[1] is None


def open_all_ports(tc) -> dict[int, int]:
    """One live flow per SNAT port (client ports 41000...): {SNAT port: client port}."""
    held = {}
    for sport in range(41000, 41000 + PORTS[1] - PORTS[0] + 1):
        _, out = tc.ingress(packet(CLIENT, sport, NODE, NP_REMOTE))
        held[parse(out)["sport"]] = sport
    assert sorted(held) == list(range(PORTS[0], PORTS[1] + 1))
    return held


def cpu_of(port: int) -> int:
    """The CPU whose slice holds `port` (tc.write_config sets ncpus to the possible CPUs)."""
    return (port - PORTS[0]) % possible_cpus()


def ended_long_ago(tc, sport: int) -> None:
    """Moves the flow from CLIENT:sport back in time by KP_SNAT_REUSE_S, as if its last
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
            tc.ingress(packet(CLIENT, held[port], NODE, NP_REMOTE, flags=flags))
        else:
            ret, _ = tc.ingress(packet(REMOTE_BE, 8080, NODE, port, flags=flags))
            assert ret == TC_ACT_REDIRECT
    reuse, full = tc.stat("tc_snat_reuse"), tc.stat("tc_snat_full")
    # Just ended: the last packet may still be on its way to the backend; the port waits.
    ret, _ = tc.ingress(packet(CLIENT, 42000, NODE, NP_REMOTE), cpu=cpu_of(port))
    assert ret == TC_ACT_SHOT and tc.stat("tc_snat_full") == full + 1
    ended_long_ago(tc, held[port])
    ret, out = tc.ingress(packet(CLIENT, 42000, NODE, NP_REMOTE), cpu=cpu_of(port))
    if end in ("fin-backend-first", "fin-client-first-unacked"):
        assert ret == TC_ACT_SHOT and tc.stat("tc_snat_full") == full + 2
        return
    assert ret == TC_ACT_REDIRECT and parse(out)["sport"] == port
    assert tc.stat("tc_snat_reuse") == reuse + 1
    # The port's replies now reach the new flow only; the old flow's row is not touched.
    _, out = tc.ingress(packet(REMOTE_BE, 8080, NODE, port, flags=SYN | ACK))
    assert (parse(out)["dst"], parse(out)["dport"]) == (CLIENT, 42000)
    _, old = tc.ct(held[port], NP_REMOTE)
    assert L.port_host(old.nat_port) == port and old.state >= L.const("KP_CT_CLOSING")


def test_an_ended_flows_port_is_reused_only_by_the_cpu_whose_slice_holds_it(tc):
    """Two new flows on two CPUs never take over the same row: a CPU reuses only the ports of
    its own slice (min + cpu + k * ncpus)."""
    if possible_cpus() < 2:
        pytest.skip("one CPU: every port is in its slice")
    held = open_all_ports(tc)
    port = PORTS[0] + 1
    tc.ingress(packet(CLIENT, held[port], NODE, NP_REMOTE, flags=RST))
    ended_long_ago(tc, held[port])
    other = (cpu_of(port) + 1) % possible_cpus()
    if other not in os.sched_getaffinity(0):
        pytest.skip(f"CPU {other} is not ours to run on")
    ret, _ = tc.ingress(packet(CLIENT, 42001, NODE, NP_REMOTE), cpu=other)
    assert ret == TC_ACT_SHOT
    ret, out = tc.ingress(packet(CLIENT, 42001, NODE, NP_REMOTE), cpu=cpu_of(port))
    assert ret == TC_ACT_REDIRECT and parse(out)["sport"] == port


def test_expired_entry_is_balanced_anew_and_its_old_reply_tuple_is_dead(tc):
    _, out = tc.ingress(packet(CLIENT, 40004, NODE, NP_REMOTE))
    old_port = parse(out)["sport"]
    key, ct = tc.ct(40004, NP_REMOTE)
    ct.expires = 1                          # long past
    tc.maps["ct"].put(key, ct)
    expired = tc.stat("tc_ct_expired")
    _, out = tc.ingress(packet(CLIENT, 40004, NODE, NP_REMOTE, flags=ACK))
    assert tc.stat("tc_ct_expired") == expired + 1
    new_port = parse(out)["sport"]
    _, ct = tc.ct(40004, NP_REMOTE)
    assert ct.expires > now_ns()
    if new_port != old_port:
        # The old port's row may stay (another flow may own the port by now): it no longer
        # matches the flow, so a reply there is not translated into it.
        ret, out = tc.ingress(packet(REMOTE_BE, 8080, NODE, old_port, flags=ACK))
        assert ret == TC_ACT_OK and parse(out)["dport"] == old_port


def test_a_reopened_flow_marked_ended_by_a_late_packet_still_gets_its_syn_ack(tc):
    """The client's RST of its last connection, overtaken by the SYN of the next one from the
    same port (two CPUs), marks the reopened flow closed before its first reply: that reply
    is still the flow's. Only an answered flow that ended gives a SYN-ACK to another
    connection (test_tc_pod_run.py)."""
    _, out = tc.ingress(packet(CLIENT, 40007, NODE, NP_REMOTE))
    tc.ingress(packet(REMOTE_BE, 8080, NODE, parse(out)["sport"], flags=SYN | ACK))
    tc.ingress(packet(CLIENT, 40007, NODE, NP_REMOTE, flags=RST))
    _, out = tc.ingress(packet(CLIENT, 40007, NODE, NP_REMOTE))           # reopened
    nat_port = parse(out)["sport"]
    tc.ingress(packet(CLIENT, 40007, NODE, NP_REMOTE, flags=RST))         # the late RST
    assert L.CT_STATE_NAMES[tc.ct(40007, NP_REMOTE)[1].state] == "closed"
    ret, out = tc.ingress(packet(REMOTE_BE, 8080, NODE, nat_port, flags=SYN | ACK))
    r = parse(out)
    assert ret == TC_ACT_REDIRECT
    assert (r["src"], r["sport"], r["dst"], r["dport"]) == (NODE, NP_REMOTE, CLIENT, 40007)


def test_tcp_states_follow_the_flags(tc):
    t0 = now_ns()
    tc.ingress(packet(CLIENT, 40005, NODE, NP_LOCAL))
    _, ct = tc.ct(40005, NP_LOCAL)
    assert ct.expires - t0 >= 120 * 10**9 and ct.expires - now_ns() <= 120 * 10**9   # syn_sent
    tc.egress(packet(LOCAL_BE, 8080, CLIENT, 40005, flags=SYN | ACK))
    _, ct = tc.ct(40005, NP_LOCAL)
    assert ct.expires - now_ns() > 3600 * 10**9                                  # established
    tc.ingress(packet(CLIENT, 40005, NODE, NP_LOCAL, flags=FIN | ACK))
    assert L.CT_STATE_NAMES[tc.ct(40005, NP_LOCAL)[1].state] == "closing"
    tc.egress(packet(LOCAL_BE, 8080, CLIENT, 40005, flags=RST))
    _, ct = tc.ct(40005, NP_LOCAL)
    assert L.CT_STATE_NAMES[ct.state] == "closed" and ct.expires - now_ns() <= 10 * 10**9


@pytest.mark.parametrize("end", sorted(ENDS))
def test_an_ended_flow_is_written_again_whole_and_still_translates_late_replies(tc, end):
    """kp_ct_track writes a flow's row whole once more when it ends (a new element for the
    LRU, bpf/lib/ct.h kp_ct_ended): everything but the life word must come through as it was,
    and the flow's late packets (a retransmitted FIN, the client's last ACK) still find it."""
    sport = 40020
    tc.ingress(packet(CLIENT, sport, NODE, NP_REMOTE))
    _, opened = tc.ct(sport, NP_REMOTE)
    nat_port = L.port_host(opened.nat_port)
    tc.ingress(packet(REMOTE_BE, 8080, NODE, nat_port, flags=SYN | ACK))
    for way, flags in ENDS[end]:
        if way == "in":
            tc.ingress(packet(CLIENT, sport, NODE, NP_REMOTE, flags=flags))
        else:
            tc.ingress(packet(REMOTE_BE, 8080, NODE, nat_port, flags=flags))
    _, ended = tc.ct(sport, NP_REMOTE)
    keep = [f for f, *_ in L.CtVal._fields_ if f != "life"]
    assert {f: getattr(ended, f) for f in keep} == {f: getattr(opened, f) for f in keep}
    assert ended.state >= L.const("KP_CT_CLOSING") and ended.seen_reply
    assert ended.flags & L.const("KP_CT_F_ISN") and ended.flags & L.const("KP_CT_F_SNAT")
    ret, out = tc.ingress(packet(REMOTE_BE, 8080, NODE, nat_port, flags=FIN | ACK))
    assert ret == TC_ACT_REDIRECT
    assert (parse(out)["dst"], parse(out)["dport"], parse(out)["sport"]) == (CLIENT, sport,
                                                                              NP_REMOTE)
    ret, out = tc.ingress(packet(CLIENT, sport, NODE, NP_REMOTE, flags=ACK))
    assert ret == TC_ACT_REDIRECT
    assert (parse(out)["dst"], parse(out)["sport"]) == (REMOTE_BE, nat_port)
    assert tc.ct(sport, NP_REMOTE)[1].backend_id == opened.backend_id


def test_a_removed_backend_gets_the_flow_rebalanced(tc):
    tc.ingress(packet(CLIENT, 40006, NODE, NP_LOCAL))
    assert tc.ct(40006, NP_LOCAL)[1].be_addr == L.ip_be(LOCAL_BE)
    moved = ext(NP_LOCAL, [("10.244.1.11", True)])
    assert tc.writer.apply({moved.key: moved}, candidates=[moved.key]).ok
    _, out = tc.ingress(packet(CLIENT, 40006, NODE, NP_LOCAL, flags=ACK))
    assert parse(out)["dst"] == "10.244.1.11"


def test_reject_answers_icmp_port_unreachable(tc):
    frame = packet(CLIENT, 40007, NODE, NP_REJECT)
    ret, out = tc.ingress(frame)
    p = parse(out)
    assert ret == TC_ACT_REDIRECT, "sent back out of the device it came in on"
    assert (p["proto"], p["type"], p["code"]) == (1, 3, 3)
    assert (p["src"], p["dst"]) == (NODE, CLIENT)
    assert p["ip_ok"] and p["l4_ok"]
    assert p["quote"] == frame[14:42], "the original IP header and 8 bytes of TCP"
    assert out[:6] == frame[6:12] and out[6:12] == frame[:6], "MACs swapped"


def test_drop_drops(tc):
    before = tc.stat("tc_drop")
    ret, _ = tc.ingress(packet(CLIENT, 40008, NODE, NP_DROP))
    assert ret == TC_ACT_SHOT and tc.stat("tc_drop") == before + 1


def test_purge_removes_flows_of_a_backend_that_left_their_frontend(tc):
    from kproxy_ebpf.datapath import conntrack

    tc.ingress(packet(CLIENT, 40009, NODE, NP_REMOTE))
    tc.ingress(packet(CLIENT, 40010, NODE, NP_LOCAL))
    key, ct = tc.ct(40009, NP_REMOTE)
    reply = snat_reply_key(key, ct)
    assert tc.maps["rnat"].get(reply) is not None
    assert conntrack.purge(tc.maps, tc.writer).removed == 0, "nothing changed yet"
    # The remote backend leaves NP_REMOTE (it still exists: NP_UDP uses it).
    moved = ext(NP_REMOTE, [(LOCAL_BE, True)])
    assert tc.writer.apply({moved.key: moved}, candidates=[moved.key]).ok
    # A partial sync checks the flows of the frontends it changed only.
    other = ext(NP_LOCAL, [(LOCAL_BE, True)])
    res = conntrack.purge(tc.maps, tc.writer, frontends=[other.key])
    assert res.removed == 0 and res.entries >= 2
    assert conntrack.purge(tc.maps, tc.writer, frontends=[moved.key]).removed == 1
    assert tc.ct(40009, NP_REMOTE)[1] is None and tc.maps["rnat"].get(reply) is None
    assert tc.ct(40010, NP_LOCAL)[1] is not None
    rows = conntrack.entries(tc.maps)
    assert [(r["client"], r["backend"], r["snat"], r["state"], r["service"]) for r in rows] == [
        (f"{CLIENT}:40010", f"{LOCAL_BE}:8080", None, "new", f"t/np{NP_LOCAL}")]


# -- loadBalancerSourceRanges ---------------------------------------------------------------------

LB_IP = "10.250.200.7"
OTHER_CLIENT = "10.250.1.250"


def lb(backends, ranges, action=Action.FORWARD) -> Frontend:
    bs = tuple(Backend(ip, 8080, TCP, local=local) for ip, local in backends)
    return Frontend(LB_IP, 80, TCP, FrontendKind.LOAD_BALANCER,
                    ServicePortName("t", "lb", "", TCP), action, bs, 0, Scope.EXT,
                    source_ranges=tuple(ranges))


def test_source_ranges_admit_one_range_and_drop_another(tc):
    f = lb([(LOCAL_BE, True)], ["10.250.0.0/24"])
    assert tc.writer.apply({f.key: f}).ok
    before = tc.stat("tc_src_drop")
    ret, out = tc.ingress(packet(CLIENT, 40100, LB_IP, 80))
    p = parse(out)
    assert ret == TC_ACT_OK and (p["dst"], p["dport"]) == (LOCAL_BE, 8080)
    ret, _ = tc.ingress(packet(OTHER_CLIENT, 40100, LB_IP, 80))
    assert ret == TC_ACT_SHOT and tc.stat("tc_src_drop") == before + 1

    # A range change flips it for new flows; the flow already tracked keeps going, as
    # kube-proxy's firewall only judges "ct state new".
    f = lb([(LOCAL_BE, True)], ["10.250.1.0/24"])
    assert tc.writer.apply({f.key: f}).ok
    ret, out = tc.ingress(packet(OTHER_CLIENT, 40101, LB_IP, 80))
    assert ret == TC_ACT_OK and parse(out)["dst"] == LOCAL_BE
    ret, _ = tc.ingress(packet(CLIENT, 40102, LB_IP, 80))
    assert ret == TC_ACT_SHOT
    ret, out = tc.ingress(packet(CLIENT, 40100, LB_IP, 80, flags=ACK))
    assert ret == TC_ACT_OK and parse(out)["dst"] == LOCAL_BE

    # No ranges: no filtering (and no trie lookup: the flag is clear).
    f = lb([(LOCAL_BE, True)], [])
    assert tc.writer.apply({f.key: f}).ok
    assert len(tc.maps["srcrange"].keys()) == 0
    ret, _ = tc.ingress(packet(CLIENT, 40103, LB_IP, 80))
    assert ret == TC_ACT_OK


def test_source_ranges_drop_before_the_no_endpoint_reject(tc):
    """kube-proxy's firewall chain runs before DNAT and the no-endpoint reject: an outsider
    learns nothing (dropped), an admitted client is refused."""
    f = lb([], ["10.250.0.250/32"], action=Action.REJECT)
    assert tc.writer.apply({f.key: f}).ok
    ret, _ = tc.ingress(packet(OTHER_CLIENT, 40110, LB_IP, 80))
    assert ret == TC_ACT_SHOT
    ret, out = tc.ingress(packet(CLIENT, 40110, LB_IP, 80))
    assert ret == TC_ACT_REDIRECT and parse(out)["proto"] == 1
