"""North-south with real packets: a 2-node dual-stack lab with the external client
(10.250.0.250, fd00:250::250).

Each node's TC datapath is driven as the agent drives it, minus the API: the real ProxyState
(both scopes), the real MapWriter, tc_lb.c compiled by bcc and attached with pyroute2 to the
node's eth0. The echo servers answer "<pod> <client-ip>:<client-port>", so each test sees the
source address the backend saw. A test taking `fam` runs once per family (NsFam), with that
family's Service, endpoints, node addresses and client.

Lab "tcns": node1 10.250.0.11 / fd00:250::11 (pod a1), node2 10.250.0.12 / fd00:250::12 (pod b1);
ExternalIPs are routed from the external client via node1 (10.250.100.0/24, fd00:250:100::/64).
"""
from __future__ import annotations

import json
import os
import socket
import subprocess
import time
from pathlib import Path

import pytest
from click.testing import CliRunner

from kproxy_ebpf.cli.main import main
from kproxy_ebpf.datapath.flows import conntrack
from kproxy_ebpf.datapath.load import libbpf, tcx
from kproxy_ebpf.datapath.load.bpffs import open_pinned_maps, remove_pins
from kproxy_ebpf.datapath.load.tc import TcDatapath, attached, attachments, detach_all, write_config
from kproxy_ebpf.datapath.maps import layout as L
from kproxy_ebpf.datapath.maps.pinned import cpu_id_bound
from kproxy_ebpf.datapath.write.writer import MapWriter
from kproxy_ebpf.dev.lab import Lab, nsutil
from kproxy_ebpf.dev.lab.addressing import PLANS
from kproxy_ebpf.model.objects import IPFamily, Node, Protocol, Service, ServicePort, ServiceType, hostport
from kproxy_ebpf.serve.service_health import ServiceHealthServers

from ..support import fresh_lab
from .dplab import LAB_FAMILIES, Fam, cluster_view

pytestmark = pytest.mark.root

LAB = "tcns"
PODS = {"a1": "node1", "b1": "node2"}
PORTS = (("tcp", 8080), ("udp", 5353))
EXT_NETS = {"IPv4": "10.250.100.0/24", "IPv6": "fd00:250:100::/64"}
EXT_IPS = {"IPv4": "10.250.100.1", "IPv6": "fd00:250:100::1"}


class NsFam(Fam):
    """One family of lab "tcns": the node addresses, the external client, the ExternalIP."""

    def node_ip(self, lab: Lab, node: str) -> str:
        return lab.node(node).ip_of(self.family)

    def seen_node(self, lab: Lab, node: str) -> str:
        """How an echo server prints `node`'s address (a SNATed client)."""
        return self.peer(self.node_ip(lab, node))

    @property
    def client(self) -> str:
        return self.peer(PLANS[IPFamily(self.family)].external)

    @property
    def ext_ip(self) -> str:
        return EXT_IPS[self.family]


@pytest.fixture(params=LAB_FAMILIES)
def fam(request) -> NsFam:
    return NsFam(request.param)


@pytest.fixture(scope="module")
def lab():
    with fresh_lab(LAB, nodes=2, external=True, families=LAB_FAMILIES) as lab:
        for pod, node in PODS.items():
            lab.create_pod(pod, node, ports=PORTS)
        for net in EXT_NETS.values():
            lab.add_external_route(net, "node1")
        yield lab


class TcNode:
    """One node's north-south datapath."""

    def __init__(self, lab: Lab, name: str):
        info = lab.node(name)
        self.netns = info.netns
        self.node = Node(name, addresses=info.ips)
        self.snat_addrs = info.ips
        self.bpffs = Path(info.bpffs)
        self.maps = {}
        self.tc = TcDatapath(self.bpffs, ["eth0"], info.ips)
        try:
            self.tc.load()
            self.maps = open_pinned_maps(self.bpffs)
            self.writer = MapWriter(self.maps)
            nsutil.run_in_thread(self.netns, self.tc.attach)
        except BaseException:
            self.close()
            raise

    def program(self, *objs) -> None:
        state = cluster_view(self.node, objs, node_port_addresses=())
        result = self.writer.apply(state.compute(full=True).frontends)
        assert result.ok, result.errors
        self.state = state

    def close(self) -> None:
        nsutil.run_in_thread(self.netns, detach_all)
        for m in self.maps.values():
            m.close()
        self.tc.close()
        remove_pins(self.bpffs)


@pytest.fixture(scope="module")
def nodes(lab):
    made = []
    try:
        for name in ("node1", "node2"):
            made.append(TcNode(lab, name))
        yield made
    finally:
        for n in made:
            n.close()
        for name in ("node1", "node2"):
            assert nsutil.run_in_thread(lab.node(name).netns, attached) == [], "filters left"
            assert not (Path(lab.node(name).bpffs) / tcx.PIN_DIR).exists(), "tcx pins left"


def nodeport(fam: Fam, name: str, etp_local: bool = False, external_ips=()) -> Service:
    return Service("default", name, type=ServiceType.NODE_PORT, cluster_ips=(fam.vip(50),),
                   ports=(ServicePort("tcp", Protocol.TCP, 80, node_port=30080),
                          ServicePort("udp", Protocol.UDP, 53, node_port=30053)),
                   external_ips=tuple(external_ips), external_traffic_local=etp_local)


def program(nodes, lab, fam: Fam, svc: Service, pods: list[str]) -> None:
    eps = fam.endpoints(lab, svc.name, pods, ("tcp", "TCP", 8080), ("udp", "UDP", 5353))
    for n in nodes:
        n.program(svc, eps)


def seen(lines: list[str]) -> set[tuple[str, str]]:
    """{(pod, the client address it saw)} of echo lines."""
    return {(ln.split()[0], ln.split()[1].rsplit(":", 1)[0]) if len(ln.split()) == 2 else (ln, "")
            for ln in lines}


def test_attached_to_eth0_both_ways(lab, nodes):
    got = nsutil.run_in_thread(lab.node("node1").netns, attachments)
    assert got == [("eth0", "egress", "kp_to_outside", "tcx"),
                   ("eth0", "ingress", "kp_from_outside", "tcx")]
    index = nsutil.run_in_thread(lab.node("node1").netns, lambda: socket.if_nametoindex("eth0"))
    assert sorted(p.name for p in (nodes[0].bpffs / tcx.PIN_DIR).iterdir()) == [
        f"{index}-egress", f"{index}-ingress"]


def hooks(node: TcNode) -> dict[str, list[tuple[str | None, int]]]:
    """(program name, link id) on eth0's tcx hooks, by direction."""
    def read() -> dict[str, list[tuple[str | None, int]]]:
        index = socket.if_nametoindex("eth0")
        return {where: tcx.programs(index, where) for where in tcx.DIRECTIONS}
    return nsutil.run_in_thread(node.netns, read)


def prog_ids(node: TcNode) -> set[int]:
    def read() -> set[int]:
        index = socket.if_nametoindex("eth0")
        return {p for where in tcx.DIRECTIONS for p, _ in tcx._query(index, where)}
    return nsutil.run_in_thread(node.netns, read)


def restart(node: TcNode, **kw) -> None:
    """What a new agent does on the node: loads the programs anew and attaches them."""
    new = TcDatapath(node.bpffs, ["eth0"], node.snat_addrs, **kw)
    new.load()
    try:
        nsutil.run_in_thread(node.netns, new.attach)
    except BaseException:
        new.close()
        raise
    old, node.tc = node.tc, new
    old.close()


def test_a_restart_keeps_the_links_and_swaps_the_programs(lab, nodes, fam):
    node1 = nodes[0]
    program(nodes, lab, fam, nodeport(fam, "np-restart"), ["b1"])
    before, progs = hooks(node1), prog_ids(node1)
    restart(node1)
    after = hooks(node1)
    assert [link for w in sorted(after) for _, link in after[w]] == \
        [link for w in sorted(before) for _, link in before[w]], "the same pinned links"
    assert prog_ids(node1).isdisjoint(progs), "each runs the new agent's program"
    lines = lab.probe("ext", fam.node_ip(lab, "node1"), 30080, count=3)
    assert seen(lines) == {("b1", fam.seen_node(lab, "node1"))}, lines


def test_an_older_agents_clsact_filters_are_replaced_by_links_put_first(lab, nodes, fam):
    """An agent of the clsact era left its filters; another tool's tcx program is there too.
    The new agent's links go before it, and the old filters are deleted."""
    node1 = nodes[0]
    program(nodes, lab, fam, nodeport(fam, "np-upgrade"), ["b1"])
    nsutil.run_in_thread(node1.netns, lambda: detach_all(bpffs_dir=node1.bpffs))
    legacy = TcDatapath(node1.bpffs, ["eth0"], node1.snat_addrs, _tcx=False)
    legacy._fds = {p: os.dup(fd) for p, fd in node1.tc._fds.items()}
    nsutil.run_in_thread(node1.netns, legacy.attach)
    legacy.close()
    assert {a[3] for a in nsutil.run_in_thread(node1.netns, attachments)} == {"clsact"}
    other = nsutil.run_in_thread(node1.netns, lambda: libbpf.link_create(
        node1.tc._fds["kp_to_pod"], socket.if_nametoindex("eth0"), libbpf.ATTACH_TCX_INGRESS))
    try:
        restart(node1)
        assert nsutil.run_in_thread(node1.netns, attachments) == [
            ("eth0", "egress", "kp_to_outside", "tcx"), ("eth0", "ingress", "kp_from_outside", "tcx"),
            ("eth0", "ingress", "kp_to_pod", "tcx")]
        assert [name for name, _ in hooks(node1)["ingress"]] == ["kp_from_outside", "kp_to_pod"]
        lines = lab.probe("ext", fam.node_ip(lab, "node1"), 30080, count=3)
        assert seen(lines) == {("b1", fam.seen_node(lab, "node1"))}, lines
    finally:
        os.close(other)        # not pinned: its last fd closed, it detaches
    assert [name for name, _ in hooks(node1)["ingress"]] == ["kp_from_outside"]


def test_a_deleted_devices_pins_go_and_detach_all_leaves_no_link(lab, nodes):
    """A pod-like veth on node2 gets the pod programs; deleted, its links turn defunct and
    remove_defunct drops their pins; one made anew gets new links; detach_all with the bpffs
    directory detaches them and removes the pins, and leaves eth0's alone."""
    from pyroute2 import IPRoute

    from kproxy_ebpf.datapath.load.tc import POD_PROGRAMS

    node2 = nodes[1]
    pins = node2.bpffs / tcx.PIN_DIR

    def veth(op: str) -> None:
        subprocess.run(["ip", "-n", node2.netns, "link", *(
            ["add", "kptcx0", "type", "veth", "peer", "name", "kptcx1"] if op == "add"
            else ["del", "kptcx0"])], check=True)

    def put() -> int:
        with IPRoute() as ipr:
            index = ipr.link_lookup(ifname="kptcx0")[0]
            node2.tc._attach_dev(ipr, index, "kptcx0", POD_PROGRAMS)
        return index

    eth0 = {p.name for p in pins.iterdir()}
    veth("add")
    try:
        index = nsutil.run_in_thread(node2.netns, put)
        assert {p.name for p in pins.iterdir()} - eth0 == {f"{index}-egress", f"{index}-ingress"}
        veth("del")
        assert {p.name for p in pins.iterdir()} - eth0 == {f"{index}-egress", f"{index}-ingress"}
        assert len(tcx.remove_defunct(node2.bpffs, index)) == 2
        assert {p.name for p in pins.iterdir()} == eth0
        veth("add")
        index = nsutil.run_in_thread(node2.netns, put)
        assert ("kptcx0", "ingress", "kp_from_pod") in nsutil.run_in_thread(node2.netns, attached)
        removed = nsutil.run_in_thread(node2.netns, lambda: detach_all(POD_PROGRAMS, node2.bpffs))
        assert {r for r in removed if r.startswith("tcx ")} == {"tcx kptcx0 egress",
                                                                "tcx kptcx0 ingress"}
        assert {p.name for p in pins.iterdir()} == eth0
        assert [a[0] for a in nsutil.run_in_thread(node2.netns, attached)] == ["eth0", "eth0"]
    finally:
        subprocess.run(["ip", "-n", node2.netns, "link", "del", "kptcx0"], capture_output=True)


@pytest.mark.parametrize("udp", [False, True], ids=["tcp", "udp"])
def test_cluster_policy_remote_backend_sees_the_node_address(lab, nodes, fam, udp):
    program(nodes, lab, fam, nodeport(fam, "np-remote"), ["b1"])
    lines = lab.probe("ext", fam.node_ip(lab, "node1"), 30053 if udp else 30080, udp=udp, count=5)
    assert seen(lines) == {("b1", fam.seen_node(lab, "node1"))}, lines


@pytest.mark.parametrize("udp", [False, True], ids=["tcp", "udp"])
def test_cluster_policy_local_backend_sees_the_client(lab, nodes, fam, udp):
    program(nodes, lab, fam, nodeport(fam, "np-local"), ["a1"])
    lines = lab.probe("ext", fam.node_ip(lab, "node1"), 30053 if udp else 30080, udp=udp, count=5)
    assert seen(lines) == {("a1", fam.client)}, lines


def test_cluster_policy_spreads_over_both_nodes_backends(lab, nodes, fam):
    program(nodes, lab, fam, nodeport(fam, "np-both"), ["a1", "b1"])
    lines = lab.probe("ext", fam.node_ip(lab, "node1"), 30080, count=30)
    assert seen(lines) == {("a1", fam.client), ("b1", fam.seen_node(lab, "node1"))}, lines


@pytest.mark.parametrize("udp", [False, True], ids=["tcp", "udp"])
def test_local_policy_keeps_the_client_address_and_the_other_node_drops(lab, nodes, fam, udp):
    program(nodes, lab, fam, nodeport(fam, "np-etp-local", etp_local=True), ["b1"])
    port = 30053 if udp else 30080
    lines = lab.probe("ext", fam.node_ip(lab, "node2"), port, udp=udp, count=5)
    assert seen(lines) == {("b1", fam.client)}, lines
    assert lab.probe("ext", fam.node_ip(lab, "node1"), port, udp=udp, count=2, timeout=0.5) == ["TIMEOUT"] * 2


@pytest.mark.parametrize("udp", [False, True], ids=["tcp", "udp"])
def test_no_endpoint_anywhere_is_refused_at_once(lab, nodes, fam, udp):
    program(nodes, lab, fam, nodeport(fam, "np-empty"), [])
    port = 30053 if udp else 30080
    # IPv6 TCP: the client's connect() still holds its socket when the ICMPv6 error comes back
    # (the lab's veths deliver it within the SYN's own softirq), so tcp_v6_err only notes it
    # (TcpExtLockDroppedIcmps) and the error about the SYN retransmitted 1 s later refuses the
    # connect. kube-proxy nftables in an IPv6 lab does the same (measured: TIMEOUT at 1 s, one
    # LockDroppedIcmps per attempt); IPv4 clients are refused at once under both.
    timeout = 2.5 if fam.v6 and not udp else 1.0
    assert lab.probe("ext", fam.node_ip(lab, "node1"), port, udp=udp, count=3,
                     timeout=timeout) == ["REFUSED"] * 3


def test_external_ip_reaches_a_remote_backend(lab, nodes, fam):
    program(nodes, lab, fam, nodeport(fam, "eip", external_ips=[fam.ext_ip]), ["b1"])
    lines = lab.probe("ext", fam.ext_ip, 80, count=5)
    assert seen(lines) == {("b1", fam.seen_node(lab, "node1"))}, lines
    lines = lab.probe("ext", fam.ext_ip, 53, udp=True, count=5)
    assert seen(lines) == {("b1", fam.seen_node(lab, "node1"))}, lines


def test_ext_keep_alive_connection_survives_many_requests(lab, nodes, fam):
    program(nodes, lab, fam, nodeport(fam, "np-keep"), ["b1"])
    lines = lab.probe("ext", fam.node_ip(lab, "node1"), 30080, count=20, keep=True)
    assert len({ln.split()[1] for ln in lines}) == 1 and seen(lines) == {("b1", fam.seen_node(lab, "node1"))}


def test_removed_backend_answers_no_more_and_its_entries_are_gone(lab, nodes, fam):
    node1 = nodes[0]
    b1 = fam.ip(lab, "b1")
    program(nodes, lab, fam, nodeport(fam, "np-purge"), ["b1"])
    lines = lab.probe("ext", fam.node_ip(lab, "node1"), 30053, udp=True, count=3)
    assert seen(lines) == {("b1", fam.seen_node(lab, "node1"))}, lines
    out = CliRunner().invoke(main, ["ct", "list", "--bpffs-dir", str(node1.bpffs), "-o", "json",
                                    "--service", "default/np-purge"])
    assert out.exit_code == 0, out.output
    assert any(r["backend"] == hostport(b1, 5353) and r["snat"] for r in json.loads(out.output))

    program(nodes, lab, fam, nodeport(fam, "np-purge"), ["a1"])
    assert conntrack.purge(node1.maps, lambda k, b: b in node1.writer.held.backends_of(k)).removed >= 3
    # UDP flows go; TCP connections would keep their backend (kube-proxy's rule).
    assert not any(r["backend"] == hostport(b1, 5353) for r in conntrack.entries(node1.maps))
    lines = lab.probe("ext", fam.node_ip(lab, "node1"), 30053, udp=True, count=3)
    assert seen(lines) == {("a1", fam.client)}, lines


def test_every_map_dumps_as_the_kernel_holds_it_while_flows_of_both_families_are_tracked(
        lab, nodes):
    """`maps dump` decodes every map the TC path shares, conntrack of both families and the
    per-CPU scratch row included (socket storage, which cannot be listed, says so instead),
    and every row it prints is the kernel's: bpftool's raw bytes of the same map, decoded by
    the header's field types alone (kernel_view.py), byte order included."""
    node1 = nodes[0]
    for fam in (NsFam("IPv4"), NsFam("IPv6")):
        program(nodes, lab, fam, nodeport(fam, f"np-dump-{fam.family.lower()}"), ["b1"])
        assert lab.probe("ext", fam.node_ip(lab, "node1"), 30053, udp=True)[0].startswith("b1")
    checked = {}
    for name, m in node1.maps.items():
        out = CliRunner().invoke(main, ["maps", "dump", name, "--bpffs-dir", str(node1.bpffs),
                                        "-o", "json"])
        if m.spec.per_socket:
            assert out.exit_code != 0 and "socket storage" in out.output, out.output
            continue
        assert out.exit_code == 0, (name, out.output)
        checked[name] = same_as_the_kernel(m, json.loads(out.output))
    empty = [n for n in ("svc", "backend", "meta", "ct", "rnat", "tccfg", "extaddr", "stats")
             if not checked[n]]
    assert not empty, checked
    ct = json.loads(CliRunner().invoke(main, ["maps", "dump", "ct", "--bpffs-dir",
                                              str(node1.bpffs), "-o", "json"]).output)
    # This test's flows, at their port (not 20480-style byte-swapped); the module's earlier
    # TCP flows stay until they end (TCP rows are never purged).
    assert {r["key"]["dport"] for r in ct if r["key"]["proto"] == "UDP"} == {30053}, ct
    flows = json.loads(CliRunner().invoke(main, ["ct", "list", "--bpffs-dir", str(node1.bpffs),
                                                 "-o", "json"]).output)
    assert {f["frontend"] for f in flows} >= {"10.250.0.11:30053", "[fd00:250::11]:30053"}


def _ours_raw(spec_id: str, row: dict) -> dict:
    """A `maps dump` row's fields back in the header's numbers (names of constants, flag
    lists, a slot 0's maglev_table), for comparison with the kernel's view."""
    def back(field: str, v):
        if field == "proto" and isinstance(v, str):
            return L.PROTO_NUM[Protocol(v)]
        if field in ("action", "kind", "scope") and isinstance(v, str):
            prefix = {"action": "KP_ACTION_", "kind": "KP_KIND_", "scope": "KP_SCOPE_"}[field]
            return {n: k for k, n in L.enum_names(prefix).items()}[v]
        if field in ("be_flags", "fe_flags"):
            prefix = "KP_BE_F_" if field == "be_flags" else "KP_FE_F_"
            names = {n: k for k, n in L.enum_names(prefix).items()}
            return sum(names[f] for f in v)
        return back_all(v) if isinstance(v, dict) else v

    def back_all(d: dict) -> dict:
        d = dict(d)
        if "maglev_table" in d:
            d["backend_id"] = d.pop("maglev_table")
        return {k: back(k, v) for k, v in d.items()}
    return back_all(row) if isinstance(row, dict) else row


def same_as_the_kernel(m, printed: list[dict]) -> int:
    """Compares every printed row with the kernel's; returns how many rows there were."""
    from .kernel_view import bpftool_rows, decode

    spec = L.G.MAPS[m.spec.id]
    kernel = {}
    for key, value in bpftool_rows(m.path):
        k = decode(spec["key"], key)
        v = ([decode(spec["value"], x) for x in value] if isinstance(value, list)
             else decode(spec["value"], value))
        kernel[json.dumps(k, sort_keys=True)] = v
    assert len(printed) == len(kernel), (m.spec.id, len(printed), len(kernel))
    for row in printed:
        k = json.dumps(_ours_raw(m.spec.id, row["key"]), sort_keys=True)
        assert k in kernel, (m.spec.id, k, list(kernel)[:3])
        want = kernel[k]
        if isinstance(want, list):                    # per CPU: every CPU's value
            assert [_ours_raw(m.spec.id, v) for v in row["per_cpu"]] == want, (m.spec.id, k)
            continue
        got = _ours_raw(m.spec.id, row["value"])
        if isinstance(got, dict):                     # a kp_svc row shows only what it is
            assert {f: want[f] for f in got} == got, (m.spec.id, k, got, want)
            assert not any(v for f, v in want.items() if f not in got), (m.spec.id, k, want)
        else:
            assert got == want, (m.spec.id, k, got, want)
    return len(printed)


HTTP_GET = ("import json, sys, urllib.request, urllib.error\n"
            "try:\n"
            "    r = urllib.request.urlopen(sys.argv[1], timeout=5)\n"
            "except urllib.error.HTTPError as e:\n"
            "    r = e\n"
            "print(r.status if hasattr(r, 'status') else r.code, json.dumps(json.loads(r.read())))\n")


def test_health_check_node_port_answers_on_each_node(lab, nodes, fam):
    svc = Service("default", "lb-local", type=ServiceType.LOAD_BALANCER,
                  cluster_ips=(fam.vip(51),), external_traffic_local=True,
                  health_check_node_port=32100,
                  ports=(ServicePort("tcp", Protocol.TCP, 80, node_port=30081),))
    eps = fam.endpoints(lab, "lb-local", ["b1"], ("tcp", "TCP", 8080))
    servers = []
    try:
        for n in nodes:
            n.program(svc, eps)
            hc = ServiceHealthServers(lambda: True)
            servers.append(hc)
            # The listening socket is made in the node's netns, as the agent's would be.
            nsutil.run_in_thread(n.netns, lambda hc=hc, n=n: hc.sync(n.state.health_checks()))
        answers = {}
        for node, ip in (("node1", fam.node_ip(lab, "node1")), ("node2", fam.node_ip(lab, "node2"))):
            r = lab.exec("ext", [lab.python, "-c", HTTP_GET, f"http://{fam.peer(ip)}:32100/healthz"],
                         capture_output=True, text=True, timeout=30)
            code, body = r.stdout.split(" ", 1)
            answers[node] = (int(code), json.loads(body)["localEndpoints"])
        assert answers == {"node1": (503, 0), "node2": (200, 1)}
        # NodePort traffic for it goes only to the node with the endpoint.
        assert seen(lab.probe("ext", fam.node_ip(lab, "node2"), 30081, count=3)) == {("b1", fam.client)}
    finally:
        for hc in servers:
            hc.close()


# -- path MTU: an ICMP error about a reply reaches its backend --------------------------------

FAR = {"IPv4": ("10.251.0.1", "10.251.0.2", 24), "IPv6": ("fd00:251::1", "fd00:251::2", 64)}
NARROW_MTU = 1280
BULK_PORT, BULK_NODE_PORT, BULK_BYTES = 9000, 30090, 256 * 1024
# A server that sends BULK_BYTES to each client and closes (both families on one socket).
BULK = ("import socket\n"
        "s = socket.socket(socket.AF_INET6)\n"
        "s.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)\n"
        "s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)\n"
        f"s.bind(('::', {BULK_PORT}))\n"
        "s.listen(16)\n"
        "while True:\n"
        "    c, _ = s.accept()\n"
        f"    c.sendall(b'x' * {BULK_BYTES})\n"
        "    c.close()\n")


@pytest.fixture(scope="module")
def far_client(lab):
    """A client behind the lab router on a narrow link (MTU 1280) that still advertises a
    1500-byte path's MSS (route advmss), as a client behind a tunnel does: the backend's full
    segments meet the router, which answers their source, the NodePort address, with a packet
    too big (fragmentation needed in IPv4). Its netns and link are removed after."""
    ns = f"kproxy-{LAB}-far"
    nsutil.delete(ns)
    try:
        nsutil.add(ns)
        nsutil.add_veth(lab.rtr_netns, "kpn-far", ns)
        for netns, dev in ((lab.rtr_netns, "kpn-far"), (ns, "eth0")):
            with nsutil.iproute(netns) as ipr:
                ipr.link("set", index=nsutil.need_link(ipr, dev, netns), mtu=NARROW_MTU)
            nsutil.link_up(netns, dev)
        for family, (rtr_ip, far_ip, plen) in FAR.items():
            nsutil.set_addr(lab.rtr_netns, "kpn-far", f"{rtr_ip}/{plen}")
            nsutil.set_addr(ns, "eth0", f"{far_ip}/{plen}")
            with nsutil.iproute(ns) as ipr:
                ipr.route("replace", dst="::/0" if family == "IPv6" else "0.0.0.0/0",
                          gateway=rtr_ip, oif=nsutil.need_link(ipr, "eth0", ns),
                          family=10 if family == "IPv6" else 2,
                          metrics={"RTAX_ADVMSS": 1500 - (60 if family == "IPv6" else 40)})
        for pod in ("a1", "b1"):
            lab.spawn(pod, [lab.python, "-I", "-S", "-c", BULK], name=f"bulk-{pod}")
            listening(lab.pod(pod).netns, BULK_PORT)
        yield ns
    finally:
        nsutil.delete(ns)


def listening(netns: str, port: int, within: float = 10.0) -> None:
    """Waits until something accepts on ::1 port `port` in `netns`."""
    deadline = time.monotonic() + within

    def attempt() -> bool:
        try:
            socket.create_connection(("::1", port), timeout=1).close()
            return True
        except OSError:
            return False
    while not nsutil.run_in_thread(netns, attempt):
        assert time.monotonic() < deadline, f"nothing listens on port {port} in {netns}"
        time.sleep(0.05)


def fetch(netns: str, addr: str, port: int, timeout: float = 10.0) -> int:
    """Connects from `netns` and reads until the server closes: the bytes received (fewer than
    BULK_BYTES when the transfer stalled)."""
    def go() -> int:
        got = 0
        with socket.create_connection((addr, port), timeout=timeout) as s:
            try:
                while chunk := s.recv(65536):
                    got += len(chunk)
            except TimeoutError:
                pass
        return got
    return nsutil.run_in_thread(netns, go)


@pytest.mark.parametrize("where", ["local", "remote"])
def test_a_packet_too_big_from_a_router_reaches_the_backend(lab, nodes, fam, far_client, where):
    """The backend's full-size reply leaves node1 as NodePort -> client and meets a narrower
    link; the router's packet too big (IPv6: routers never fragment) or fragmentation needed
    (IPv4, DF set) comes back to node1's address. tc_lb.c passes it on to the backend, which
    lowers its path MTU and resends: the whole response arrives. Dropped at the node (it holds
    no socket for the flow), the transfer would stall on segments that never fit."""
    pod = "a1" if where == "local" else "b1"
    svc = Service("default", f"bulk-{where}", type=ServiceType.NODE_PORT, cluster_ips=(fam.vip(60),),
                  ports=(ServicePort("tcp", Protocol.TCP, 80, node_port=BULK_NODE_PORT),))
    eps = fam.endpoints(lab, svc.name, [pod], ("tcp", "TCP", BULK_PORT))
    for n in nodes:
        n.program(svc, eps)
    before = stat(nodes[0], "icmp_err")
    assert fetch(far_client, fam.node_ip(lab, "node1"), BULK_NODE_PORT) == BULK_BYTES
    assert stat(nodes[0], "icmp_err") > before, "the router's error went through tc_lb.c"


SNAT_PORTS = 4   # 2 per CPU on 2 CPUs: each port is used again and again


@pytest.fixture(params=[False, True], ids=["fin-client-first", "rst"])
def few_snat_ports(request, nodes):
    """node1 SNATs from SNAT_PORTS ports only, so reusing a port is the common case, not the
    rare one (the default range has 4536 ports per backend). Each test gets ports no earlier
    test used: a port that ended less than KP_SNAT_REUSE_S ago is not taken."""
    node1 = nodes[0]
    first = 61000 + SNAT_PORTS * request.param_index
    node1.snat_range = (first, first + SNAT_PORTS - 1)
    write_config(node1.bpffs, node1.snat_addrs, node1.snat_range)
    yield node1, request.param
    write_config(node1.bpffs, node1.snat_addrs, TcDatapath.snat_ports)


def test_many_short_connections_reuse_snat_ports_without_a_loss(lab, nodes, fam, few_snat_ports):
    """Every port of the range serves several connections in a row: a port whose flow has
    ended is taken again (a closed flow's reply row must not hold it until the map evicts it),
    and no SYN is lost. Client-first FIN: the backend ends in LAST_ACK/CLOSED, no TIME_WAIT;
    RST: the backend's socket is gone. A port is taken again KP_SNAT_REUSE_S after its flow
    ended, so the connections are spaced for one CPU's ports to come free in turn."""
    node1, abort = few_snat_ports
    program(nodes, lab, fam, nodeport(fam, "np-reuse"), ["b1"])
    full, reuse = stat(node1, "snat_full"), stat(node1, "snat_reuse")
    before = snat_ports_toward(lab, fam, node1, "b1")
    n = 3 * SNAT_PORTS
    # The smallest CPU slice (ports // ncpus) cycles once per KP_SNAT_REUSE_S, 40 % to spare.
    gap = 1.4 * L.const("KP_SNAT_REUSE_S") / max(1, SNAT_PORTS // cpu_id_bound())
    lines = lab.probe("ext", fam.node_ip(lab, "node1"), 30080, count=n, abort=abort, interval=gap)
    assert seen(lines) == {("b1", fam.seen_node(lab, "node1"))}, [ln for ln in lines if "b1" not in ln][:5]
    assert stat(node1, "snat_full") == full
    assert stat(node1, "snat_reuse") - reuse >= n - SNAT_PORTS
    out = CliRunner().invoke(main, ["stats", "--bpffs-dir", str(node1.bpffs), "-o", "json"])
    assert json.loads(out.output)["tc_snat_reuse"] == stat(node1, "snat_reuse")
    first, last = node1.snat_range
    used = snat_ports_toward(lab, fam, node1, "b1") - before
    node_ip = fam.node_ip(lab, "node1")
    assert used and used <= {hostport(node_ip, p) for p in range(first, last + 1)}


def snat_ports_toward(lab, fam: NsFam, node: TcNode, pod: str) -> set[str]:
    """The SNAT address:port of every conntrack row toward `pod`'s TCP port."""
    return {r["snat"] for r in conntrack.entries(node.maps)
            if r["backend"] == hostport(fam.ip(lab, pod), 8080)}


def stat(node: TcNode, name: str) -> int:
    idx = {n: v for v, n in L.STAT_NAMES.items()}[f"tc_{name}"]
    return sum(node.maps["stats"].get(L.U32(idx)))
