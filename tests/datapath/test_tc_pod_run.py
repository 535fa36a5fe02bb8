"""The per-packet ClusterIP path (`socketLB: false`: kp_from_pod / kp_to_pod of tc_lb.c) run
with BPF_PROG_TEST_RUN on hand-built packets, with real maps: the harness, packets and checksum
checks of tcrun.py, scope-SOCK frontends written by the real MapWriter.

The pod POD (10.244.1.5) of this node opens the flows; its host-side veth's ingress runs
kp_from_pod and the egress toward it kp_to_pod.
"""
from __future__ import annotations

import pytest

from kproxy_ebpf.datapath.flows import conntrack
from kproxy_ebpf.datapath.maps import layout as L
from kproxy_ebpf.dev.lab import nsutil
from kproxy_ebpf.model.desired import Action, Frontend, FrontendKind, Scope

from .tcrun import (
    ACK,
    FIN,
    LOCAL_BE,
    NETNS,
    NODE,
    PORTS,
    REMOTE_BE,
    RST,
    SYN,
    TC_ACT_OK,
    TC_ACT_REDIRECT,
    TCP,
    UDP,
    TcRun,
    ct_key,
    frontend,
    moved_snat_reply,
    packet,
    parse,
)

pytestmark = pytest.mark.root

VIP, POD = "10.96.0.10", "10.244.1.5"
REMOTE, LOCAL, REJECT, DROP, HAIRPIN, DNS = 80, 81, 82, 83, 84, 53


def cip(port, backends, action=Action.FORWARD, proto=TCP) -> Frontend:
    return frontend(VIP, port, FrontendKind.CLUSTER_IP, f"cip{port}", backends, action, proto,
                    scope=Scope.SOCK)


class PodRun(TcRun):
    def from_pod(self, frame: bytes) -> tuple[int, bytes]:
        return self.run("kp_from_pod", frame)

    def to_pod(self, frame: bytes) -> tuple[int, bytes]:
        return self.run("kp_to_pod", frame)

    def ct(self, sport, dport, proto=TCP):
        return super().ct(POD, sport, VIP, dport, proto)[1]


@pytest.fixture
def pod(harness):
    # The pods' /32 routes of a node: here one route for the pod CIDR, toward the veth.
    nsutil.set_route(NETNS, "10.244.1.0/24", "kpt1")
    run = PodRun(harness, [cip(REMOTE, [(REMOTE_BE, False)]), cip(LOCAL, [(LOCAL_BE, True)]),
                           cip(REJECT, [], Action.REJECT), cip(DROP, [], Action.DROP),
                           cip(HAIRPIN, [(POD, True)]), cip(DNS, [(REMOTE_BE, False)], proto=UDP)])
    yield run
    run.close()


def tuple_of(p: dict) -> tuple:
    return (p["src"], p["sport"], p["dst"], p["dport"])


def test_not_a_frontend_passes_untouched(pod):
    frame = packet(POD, 40000, REMOTE_BE, 8080)
    for hook in (pod.from_pod, pod.to_pod):
        ret, out = hook(frame)
        assert (ret, out[:len(frame)]) == (TC_ACT_OK, frame)


@pytest.mark.parametrize("port, backend", [(REMOTE, REMOTE_BE), (LOCAL, LOCAL_BE)],
                         ids=["remote", "local"])
def test_dnat_only_and_the_reply_toward_the_pod(pod, port, backend):
    """Wherever the backend runs, the client keeps its address (no SNAT) and the stack routes
    the packet; the reply gets the ClusterIP back on its way into the client pod."""
    forwards = pod.stat("tc_forward")
    ret, out = pod.from_pod(packet(POD, 40001, VIP, port))
    p = parse(out)
    assert ret == TC_ACT_OK
    assert tuple_of(p) == (POD, 40001, backend, 8080) and p["ip_ok"] and p["l4_ok"]
    assert pod.stat("tc_forward") == forwards + 1
    ct = pod.ct(40001, port)
    assert ct.flags == L.const("KP_CT_F_POD") | L.const("KP_CT_F_ISN"), \
        "tracked as a pod's flow, without SNAT, and its SYN's sequence number kept"
    assert ct.isn == L.ip_be("0.0.3.232"), "ISN 1000, as sent"

    ret, out = pod.to_pod(packet(backend, 8080, POD, 40001, flags=SYN | ACK))
    r = parse(out)
    assert ret == TC_ACT_OK
    assert tuple_of(r) == (VIP, port, POD, 40001) and r["ip_ok"] and r["l4_ok"]
    assert L.CT_STATE_NAMES[pod.ct(40001, port).state] == "established"
    # The reply passing the backend pod's own veth (ingress) is left alone there.
    ret, out = pod.from_pod(packet(backend, 8080, POD, 40001, flags=ACK))
    assert (ret, parse(out)["src"]) == (TC_ACT_OK, backend)


def test_udp_both_ways(pod):
    _, out = pod.from_pod(packet(POD, 5000, VIP, DNS, proto=UDP))
    assert tuple_of(parse(out)) == (POD, 5000, REMOTE_BE, 8080)
    _, out = pod.to_pod(packet(REMOTE_BE, 8080, POD, 5000, proto=UDP))
    r = parse(out)
    assert tuple_of(r) == (VIP, DNS, POD, 5000) and r["ip_ok"] and r["l4_ok"]


@pytest.mark.parametrize("port, code, counter", [(REJECT, 3, "tc_reject"), (DROP, 1, "tc_drop")],
                         ids=["reject-port-unreachable", "itp-local-host-unreachable"])
def test_verdicts_are_icmp_errors_from_the_clusterip(pod, port, code, counter):
    """REJECT: port unreachable (ECONNREFUSED at once), as the socket path and kube-proxy;
    DROP (internalTrafficPolicy Local, no local endpoint): host unreachable, the socket path's
    EHOSTUNREACH at once."""
    before = pod.stat(counter)
    frame = packet(POD, 40002, VIP, port)
    ret, out = pod.from_pod(frame)
    p = parse(out)
    assert ret == TC_ACT_REDIRECT, "sent back to the pod"
    assert (p["proto"], p["type"], p["code"]) == (1, 3, code)
    assert (p["src"], p["dst"]) == (VIP, POD) and p["ip_ok"] and p["l4_ok"]
    assert p["quote"] == frame[14:42]
    assert pod.stat(counter) == before + 1
    assert pod.ct(40002, port) is None


def test_a_tcp_connection_keeps_its_backend_new_ones_rebalance(pod):
    """Like a connect() the socket path translated: a connection stays on its backend after
    the backend left the Service (another backend would only answer with a RST)."""
    pod.from_pod(packet(POD, 40003, VIP, LOCAL))
    moved = cip(LOCAL, [("10.244.1.11", True)])
    assert pod.writer.apply({moved.key: moved}, candidates=[moved.key]).ok
    _, out = pod.from_pod(packet(POD, 40003, VIP, LOCAL, flags=ACK))
    assert parse(out)["dst"] == LOCAL_BE
    _, out = pod.from_pod(packet(POD, 40004, VIP, LOCAL))
    assert parse(out)["dst"] == "10.244.1.11"
    # Once it ended, a SYN on the same tuple is a new connection.
    pod.from_pod(packet(POD, 40003, VIP, LOCAL, flags=RST))
    _, out = pod.from_pod(packet(POD, 40003, VIP, LOCAL))
    assert parse(out)["dst"] == "10.244.1.11"


@pytest.mark.parametrize("flags", [ACK, FIN | ACK, RST], ids=["ack", "fin", "rst"])
def test_a_mid_stream_packet_of_no_flow_passes_untouched(pod, flags):
    """`socketLB: false` under kube-proxy before the agent: a pod's connection to a ClusterIP
    that netfilter's DNAT started has no kp_ct row; its packets are left to the stack, whose
    conntrack keeps translating them, and not refused even on a frontend without endpoints.
    The pod's next SYN balances as before."""
    for port in (REMOTE, REJECT):
        mid = pod.stat("tc_midstream")
        frame = packet(POD, 40030, VIP, port, flags=flags)
        ret, out = pod.from_pod(frame)
        assert (ret, out[:len(frame)]) == (TC_ACT_OK, frame)
        assert pod.ct(40030, port) is None and pod.stat("tc_midstream") == mid + 1
    _, out = pod.from_pod(packet(POD, 40030, VIP, REMOTE))
    assert parse(out)["dst"] == REMOTE_BE


def test_hairpin_gets_snat_both_ways(pod):
    """A pod reaching itself through its Service: without SNAT it would answer itself inside
    its netns, from its own address; with the node as the peer the reply comes back here."""
    ret, out = pod.from_pod(packet(POD, 40005, VIP, HAIRPIN))
    p = parse(out)
    assert ret == TC_ACT_REDIRECT
    assert (p["src"], p["dst"], p["dport"]) == (NODE, POD, 8080) and p["ip_ok"] and p["l4_ok"]
    assert PORTS[0] <= p["sport"] <= PORTS[1]
    ret, out = pod.from_pod(packet(POD, 8080, NODE, p["sport"], flags=SYN | ACK))
    r = parse(out)
    assert ret == TC_ACT_REDIRECT
    assert tuple_of(r) == (VIP, HAIRPIN, POD, 40005) and r["ip_ok"] and r["l4_ok"]


def test_purge_keeps_pod_tcp_connections_and_drops_udp_flows_of_a_removed_backend(pod):
    pod.from_pod(packet(POD, 40006, VIP, REMOTE))
    pod.from_pod(packet(POD, 5001, VIP, DNS, proto=UDP))
    def keeps(k, b):        # the slots only
        return b in pod.writer.held.backends_of(k)

    assert conntrack.purge(pod.maps, keeps).removed == 0, "nothing changed yet"
    moved = [cip(REMOTE, [(LOCAL_BE, True)]), cip(DNS, [(LOCAL_BE, True)], proto=UDP)]
    assert pod.writer.apply({f.key: f for f in moved}, candidates=[f.key for f in moved]).ok
    assert conntrack.purge(pod.maps, keeps).removed == 1
    assert pod.ct(5001, DNS, UDP) is None and pod.ct(40006, REMOTE) is not None
    rows = conntrack.entries(pod.maps)
    assert [(r["client"], r["frontend"], r["backend"], r["path"]) for r in rows] == [
        (f"{POD}:40006", f"{VIP}:{REMOTE}", f"{REMOTE_BE}:8080", "pod")]


def test_a_flow_whose_backend_id_now_names_another_backend_is_rebalanced(pod):
    """Backend ids are recycled once freed: a UDP flow (a new socket that got an old source
    port) must not follow its old id to a backend it never chose, nor keep a backend that left."""
    pod.from_pod(packet(POD, 5002, VIP, DNS, proto=UDP))
    key = ct_key(POD, 5002, VIP, DNS, UDP)
    ct = pod.ct(5002, DNS, UDP)
    ct.be_addr = L.ip16("10.244.2.99")   # as if the id had named this backend before
    pod.maps["ct"].put(key, ct)
    _, out = pod.from_pod(packet(POD, 5002, VIP, DNS, proto=UDP))
    assert parse(out)["dst"] == REMOTE_BE
    assert L.ip_text(pod.ct(5002, DNS, UDP).be_addr) == REMOTE_BE


def connect_and_close(pod, sport: int, ending: list[tuple[str, int]]) -> None:
    """A connection from POD:sport through the ClusterIP to REMOTE_BE, ended by `ending`."""
    pod.from_pod(packet(POD, sport, VIP, REMOTE))
    pod.to_pod(packet(REMOTE_BE, 8080, POD, sport, flags=SYN | ACK))
    pod.from_pod(packet(POD, sport, VIP, REMOTE, flags=ACK))
    for way, flags in ending:
        if way == "in":
            pod.from_pod(packet(POD, sport, VIP, REMOTE, flags=flags))
        else:
            pod.to_pod(packet(REMOTE_BE, 8080, POD, sport, flags=flags))


@pytest.mark.parametrize("ending", [
    [("in", FIN | ACK), ("out", FIN | ACK), ("in", ACK)],
    [("out", FIN | ACK), ("in", FIN | ACK), ("out", ACK)],
    [("in", RST)],
], ids=["fin-client-first", "fin-backend-first", "rst"])
def test_a_direct_connection_on_an_ended_flows_reply_tuple_is_left_alone(pod, ending):
    """The pod's next connection from the same port straight to the backend's pod IP (the
    kernel picks ephemeral ports per destination, so reuse within the ended flow's 120 s is
    common; the benchmark's crr to pod IPs after one through the Service met it at once) has
    the ended flow's reply tuple. Its SYN-ACK must reach the client from the backend, not from
    the ClusterIP, or the connect fails: it opens a new connection, and it frees the tuple
    for the rest of that connection."""
    connect_and_close(pod, 40010, ending)
    direct_connection_passes(pod, 40010)


# Another connection's ISN: far from the test clients' (1000), as two connections' ISNs are
# (a reply acknowledging up to KP_CT_SYN_DATA_MAX past a flow's ISN counts as the flow's).
OTHER_ISN = 0x40000000


def direct_connection_passes(pod, sport: int) -> None:
    """A connection from POD:sport straight to REMOTE_BE (its own ISN) passes both ways
    untouched, its SYN-ACK first."""
    frame = packet(POD, sport, REMOTE_BE, 8080, seq=OTHER_ISN)
    ret, out = pod.from_pod(frame)
    assert (ret, out[:len(frame)]) == (TC_ACT_OK, frame)
    for flags in (SYN | ACK, ACK):
        frame = packet(REMOTE_BE, 8080, POD, sport, flags=flags, ack=OTHER_ISN + 1)
        ret, out = pod.to_pod(frame)
        assert (ret, out[:len(frame)]) == (TC_ACT_OK, frame), f"flags {flags:#x}"


@pytest.mark.parametrize("reply", [SYN | ACK, RST | ACK], ids=["syn-ack", "refused"])
def test_a_direct_connection_on_a_never_answered_flows_reply_tuple_is_left_alone(pod, reply):
    """The same clash on a flow the backend never answered (its SYN was lost or dropped): the
    direct connection's first reply, accepting or refusing it, acknowledges the direct
    connection's SYN, not the flow's, and must reach the client from the backend (a refusal
    from the ClusterIP would leave its connect() waiting for a timeout)."""
    pod.from_pod(packet(POD, 40012, VIP, REMOTE))
    frame = packet(POD, 40012, REMOTE_BE, 8080, seq=OTHER_ISN)
    assert pod.from_pod(frame)[1][:len(frame)] == frame
    frame = packet(REMOTE_BE, 8080, POD, 40012, flags=reply, ack=OTHER_ISN + 1)
    ret, out = pod.to_pod(frame)
    assert (ret, out[:len(frame)]) == (TC_ACT_OK, frame)
    assert L.CT_STATE_NAMES[pod.ct(40012, REMOTE).state] == "new", "the flow saw no reply"


def test_a_new_syn_on_a_never_answered_flow_is_balanced_anew(pod):
    """A client SYN with another sequence number on a flow never answered is a new connection
    (the client gave the first attempt up): it gets a row of its own, so the backend's SYN-ACK
    to it is translated, while a retransmitted SYN (same number) keeps the flow."""
    pod.from_pod(packet(POD, 40013, VIP, REMOTE))
    first = pod.ct(40013, REMOTE)
    pod.from_pod(packet(POD, 40013, VIP, REMOTE))
    assert bytes(pod.ct(40013, REMOTE)) == bytes(first), "a retransmit changes nothing"
    pod.from_pod(packet(POD, 40013, VIP, REMOTE, seq=OTHER_ISN))
    assert pod.ct(40013, REMOTE).isn == L.ip_be("64.0.0.0"), "the new SYN's ISN"
    _, out = pod.to_pod(packet(REMOTE_BE, 8080, POD, 40013, flags=SYN | ACK, ack=OTHER_ISN + 1))
    assert tuple_of(parse(out)) == (VIP, REMOTE, POD, 40013)
    # and a reply to the abandoned attempt is no longer the flow's
    frame = packet(REMOTE_BE, 8080, POD, 40013, flags=SYN | ACK, ack=1001)
    assert pod.to_pod(frame)[1][:len(frame)] == frame


def test_a_live_flows_retransmitted_syn_ack_is_still_translated(pod):
    """The SYN-ACK rule above is for ended flows only: a backend repeats its SYN-ACK when the
    client's ACK is lost, and that one belongs to the live flow."""
    connect_and_close(pod, 40011, [])
    _, out = pod.to_pod(packet(REMOTE_BE, 8080, POD, 40011, flags=SYN | ACK))
    assert tuple_of(parse(out)) == (VIP, REMOTE, POD, 40011)


def test_an_expired_flow_translates_no_reply(pod):
    """A reply after the flow's conntrack lifetime is no longer the flow's, as when the kernel's
    conntrack has dropped the entry: a UDP socket that reused the port toward the backend
    directly gets its answers from the backend."""
    pod.from_pod(packet(POD, 5003, VIP, DNS, proto=UDP))
    key = ct_key(POD, 5003, VIP, DNS, UDP)
    ct = pod.ct(5003, DNS, UDP)
    ct.expires = 1                          # long past
    pod.maps["ct"].put(key, ct)
    frame = packet(REMOTE_BE, 8080, POD, 5003, proto=UDP)
    ret, out = pod.to_pod(frame)
    assert (ret, out[:len(frame)]) == (TC_ACT_OK, frame)


def test_only_a_packet_to_the_snat_address_is_asked_for_a_snat_reply(pod):
    """A SNAT flow's reply is sent to the SNAT address (kp_tccfg), so kp_rnat4 is asked only
    for packets to it: every other packet a pod sends skips that lookup. A hairpin flow moved
    to another address is translated nowhere."""
    pod.from_pod(packet(POD, 40012, VIP, HAIRPIN))
    key = ct_key(POD, 40012, VIP, HAIRPIN)
    frame = moved_snat_reply(pod, key, addr="10.250.0.99")
    ret, out = pod.from_pod(frame)
    assert (ret, out[:len(frame)]) == (TC_ACT_OK, frame)
