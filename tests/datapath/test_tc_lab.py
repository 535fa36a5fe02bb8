"""North-south with real packets: a 2-node lab with the external client (10.250.0.250).

Each node's TC datapath is driven as the agent drives it, minus the API: the real ProxyState
(both scopes), the real MapWriter, tc_lb.c compiled by bcc and attached with pyroute2 to the
node's eth0. The echo servers answer "<pod> <client-ip>:<client-port>", so each test sees the
source address the backend saw.

Lab "tcns": node1 10.250.0.11 (pod a1), node2 10.250.0.12 (pod b1); ExternalIPs are routed from
the external client via node1 (10.250.100.0/24).
"""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from click.testing import CliRunner

from kproxy_ebpf.cli import main
from kproxy_ebpf.datapath import conntrack
from kproxy_ebpf.datapath.bpffs import open_pinned_maps, remove_pins
from kproxy_ebpf.datapath import layout as L
from kproxy_ebpf.datapath.tc import (TcDatapath, attached, detach_all, possible_cpus,
                                     write_config)
from kproxy_ebpf.datapath.writer import MapWriter
from kproxy_ebpf.lab import Lab
from kproxy_ebpf.lab import nsutil
from kproxy_ebpf.model import Node, Protocol, Service, ServicePort, ServiceType
from kproxy_ebpf.service_health import ServiceHealthServers

from ..support import fresh_lab
from .dplab import cluster_view, endpoints

pytestmark = pytest.mark.root

LAB = "tcns"
PODS = {"a1": "node1", "b1": "node2"}
PORTS = (("tcp", 8080), ("udp", 5353))
EXT_IP = "10.250.100.1"
CLIENT = "10.250.0.250"


@pytest.fixture(scope="module")
def lab():
    with fresh_lab(LAB, nodes=2, external=True) as lab:
        for pod, node in PODS.items():
            lab.create_pod(pod, node, ports=PORTS)
        lab.add_external_route("10.250.100.0/24", "node1")
        yield lab


class TcNode:
    """One node's north-south datapath."""

    def __init__(self, lab: Lab, name: str):
        info = lab.node(name)
        self.netns = info.netns
        self.node = Node(name, addresses=(info.ip,))
        self.bpffs = Path(info.bpffs)
        self.maps = {}
        self.tc = TcDatapath(self.bpffs, ["eth0"], info.ip)
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


def nodeport(name: str, etp_local: bool = False, external_ips=()) -> Service:
    return Service("default", name, type=ServiceType.NODE_PORT, cluster_ips=("10.96.0.50",),
                   ports=(ServicePort("tcp", Protocol.TCP, 80, node_port=30080),
                          ServicePort("udp", Protocol.UDP, 53, node_port=30053)),
                   external_ips=tuple(external_ips), external_traffic_local=etp_local)


def program(nodes, lab, svc: Service, pods: list[str]) -> None:
    eps = endpoints(lab, svc.name, pods, ("tcp", "TCP", 8080), ("udp", "UDP", 5353))
    for n in nodes:
        n.program(svc, eps)


def seen(lines: list[str]) -> set[tuple[str, str]]:
    """{(pod, the client address it saw)} of echo lines."""
    return {(ln.split()[0], ln.split()[1].rsplit(":", 1)[0]) if len(ln.split()) == 2 else (ln, "")
            for ln in lines}


def test_attached_to_eth0_both_ways(lab, nodes):
    got = nsutil.run_in_thread(lab.node("node1").netns, attached)
    assert got == [("eth0", "egress", "kp_to_outside"), ("eth0", "ingress", "kp_from_outside")]


@pytest.mark.parametrize("udp", [False, True], ids=["tcp", "udp"])
def test_cluster_policy_remote_backend_sees_the_node_address(lab, nodes, udp):
    program(nodes, lab, nodeport("np-remote"), ["b1"])
    lines = lab.probe("ext", "10.250.0.11", 30053 if udp else 30080, udp=udp, count=5)
    assert seen(lines) == {("b1", "10.250.0.11")}, lines


@pytest.mark.parametrize("udp", [False, True], ids=["tcp", "udp"])
def test_cluster_policy_local_backend_sees_the_client(lab, nodes, udp):
    program(nodes, lab, nodeport("np-local"), ["a1"])
    lines = lab.probe("ext", "10.250.0.11", 30053 if udp else 30080, udp=udp, count=5)
    assert seen(lines) == {("a1", CLIENT)}, lines


def test_cluster_policy_spreads_over_both_nodes_backends(lab, nodes):
    program(nodes, lab, nodeport("np-both"), ["a1", "b1"])
    lines = lab.probe("ext", "10.250.0.11", 30080, count=30)
    assert seen(lines) == {("a1", CLIENT), ("b1", "10.250.0.11")}, lines


@pytest.mark.parametrize("udp", [False, True], ids=["tcp", "udp"])
def test_local_policy_keeps_the_client_address_and_the_other_node_drops(lab, nodes, udp):
    program(nodes, lab, nodeport("np-etp-local", etp_local=True), ["b1"])
    port = 30053 if udp else 30080
    lines = lab.probe("ext", "10.250.0.12", port, udp=udp, count=5)
    assert seen(lines) == {("b1", CLIENT)}, lines
    assert lab.probe("ext", "10.250.0.11", port, udp=udp, count=2, timeout=0.5) == ["TIMEOUT"] * 2


@pytest.mark.parametrize("udp", [False, True], ids=["tcp", "udp"])
def test_no_endpoint_anywhere_is_refused_at_once(lab, nodes, udp):
    program(nodes, lab, nodeport("np-empty"), [])
    port = 30053 if udp else 30080
    assert lab.probe("ext", "10.250.0.11", port, udp=udp, count=3) == ["REFUSED"] * 3


def test_external_ip_reaches_a_remote_backend(lab, nodes):
    program(nodes, lab, nodeport("eip", external_ips=[EXT_IP]), ["b1"])
    lines = lab.probe("ext", EXT_IP, 80, count=5)
    assert seen(lines) == {("b1", "10.250.0.11")}, lines
    lines = lab.probe("ext", EXT_IP, 53, udp=True, count=5)
    assert seen(lines) == {("b1", "10.250.0.11")}, lines


def test_ext_keep_alive_connection_survives_many_requests(lab, nodes):
    program(nodes, lab, nodeport("np-keep"), ["b1"])
    lines = lab.probe("ext", "10.250.0.11", 30080, count=20, keep=True)
    assert len({ln.split()[1] for ln in lines}) == 1 and seen(lines) == {("b1", "10.250.0.11")}


def test_removed_backend_answers_no_more_and_its_entries_are_gone(lab, nodes):
    node1 = nodes[0]
    b1 = lab.pod("b1").ip
    program(nodes, lab, nodeport("np-purge"), ["b1"])
    lines = lab.probe("ext", "10.250.0.11", 30053, udp=True, count=3)
    assert seen(lines) == {("b1", "10.250.0.11")}, lines
    out = CliRunner().invoke(main, ["ct", "list", "--bpffs-dir", str(node1.bpffs), "-o", "json",
                                    "--service", "default/np-purge"])
    assert out.exit_code == 0, out.output
    assert any(r["backend"] == f"{b1}:5353" and r["snat"] for r in json.loads(out.output))

    program(nodes, lab, nodeport("np-purge"), ["a1"])
    assert conntrack.purge(node1.maps, node1.writer).removed >= 3
    assert not any(r["backend"].startswith(b1 + ":") for r in conntrack.entries(node1.maps))
    lines = lab.probe("ext", "10.250.0.11", 30053, udp=True, count=3)
    assert seen(lines) == {("a1", CLIENT)}, lines


HTTP_GET = ("import json, sys, urllib.request, urllib.error\n"
            "try:\n"
            "    r = urllib.request.urlopen(sys.argv[1], timeout=5)\n"
            "except urllib.error.HTTPError as e:\n"
            "    r = e\n"
            "print(r.status if hasattr(r, 'status') else r.code, json.dumps(json.loads(r.read())))\n")


def test_health_check_node_port_answers_on_each_node(lab, nodes):
    svc = Service("default", "lb-local", type=ServiceType.LOAD_BALANCER,
                  cluster_ips=("10.96.0.51",), external_traffic_local=True,
                  health_check_node_port=32100,
                  ports=(ServicePort("tcp", Protocol.TCP, 80, node_port=30081),))
    eps = endpoints(lab, "lb-local", ["b1"], ("tcp", "TCP", 8080))
    servers = []
    try:
        for n in nodes:
            n.program(svc, eps)
            hc = ServiceHealthServers(lambda: True)
            servers.append(hc)
            # The listening socket is made in the node's netns, as the agent's would be.
            nsutil.run_in_thread(n.netns, lambda hc=hc, n=n: hc.sync(n.state.health_checks()))
        answers = {}
        for node, ip in (("node1", "10.250.0.11"), ("node2", "10.250.0.12")):
            r = lab.exec("ext", [lab.python, "-c", HTTP_GET, f"http://{ip}:32100/healthz"],
                         capture_output=True, text=True, timeout=30)
            code, body = r.stdout.split(" ", 1)
            answers[node] = (int(code), json.loads(body)["localEndpoints"])
        assert answers == {"node1": (503, 0), "node2": (200, 1)}
        # NodePort traffic for it goes only to the node with the endpoint.
        assert seen(lab.probe("ext", "10.250.0.12", 30081, count=3)) == {("b1", CLIENT)}
    finally:
        for hc in servers:
            hc.close()


SNAT_PORTS = 4   # 2 per CPU on 2 CPUs: each port is used again and again


@pytest.fixture(params=[False, True], ids=["fin-client-first", "rst"])
def few_snat_ports(request, nodes):
    """node1 SNATs from SNAT_PORTS ports only, so reusing a port is the common case, not the
    rare one (the default range has 4536 ports per backend). Each test gets ports no earlier
    test used: a port that ended less than KP_SNAT_REUSE_S ago is not taken."""
    node1 = nodes[0]
    first = 61000 + SNAT_PORTS * request.param_index
    node1.snat_range = (first, first + SNAT_PORTS - 1)
    write_config(node1.bpffs, "10.250.0.11", node1.snat_range)
    yield node1, request.param
    write_config(node1.bpffs, "10.250.0.11", TcDatapath.snat_ports)


def test_many_short_connections_reuse_snat_ports_without_a_loss(lab, nodes, few_snat_ports):
    """Every port of the range serves several connections in a row: a port whose flow has
    ended is taken again (a closed flow's reply row must not hold it until the map evicts it),
    and no SYN is lost. Client-first FIN: the backend ends in LAST_ACK/CLOSED, no TIME_WAIT;
    RST: the backend's socket is gone. A port is taken again KP_SNAT_REUSE_S after its flow
    ended, so the connections are spaced for one CPU's ports to come free in turn."""
    node1, abort = few_snat_ports
    program(nodes, lab, nodeport("np-reuse"), ["b1"])
    full, reuse = stat(node1, "snat_full"), stat(node1, "snat_reuse")
    before = snat_ports_toward(lab, node1, "b1")
    n = 3 * SNAT_PORTS
    # The smallest CPU slice (ports // ncpus) cycles once per KP_SNAT_REUSE_S, 40 % to spare.
    gap = 1.4 * L.const("KP_SNAT_REUSE_S") / max(1, SNAT_PORTS // possible_cpus())
    lines = lab.probe("ext", "10.250.0.11", 30080, count=n, abort=abort, interval=gap)
    assert seen(lines) == {("b1", "10.250.0.11")}, [ln for ln in lines if "b1" not in ln][:5]
    assert stat(node1, "snat_full") == full
    assert stat(node1, "snat_reuse") - reuse >= n - SNAT_PORTS
    out = CliRunner().invoke(main, ["stats", "--bpffs-dir", str(node1.bpffs), "-o", "json"])
    assert json.loads(out.output)["tc_snat_reuse"] == stat(node1, "snat_reuse")
    first, last = node1.snat_range
    used = snat_ports_toward(lab, node1, "b1") - before
    assert used and used <= {f"10.250.0.11:{p}" for p in range(first, last + 1)}


def snat_ports_toward(lab, node: TcNode, pod: str) -> set[str]:
    """The SNAT address:port of every conntrack row toward `pod`'s TCP port."""
    return {r["snat"] for r in conntrack.entries(node.maps)
            if r["backend"].startswith(lab.pod(pod).ip + ":8080")}


def stat(node: TcNode, name: str) -> int:
    idx = {n: v for v, n in L.STAT_NAMES.items()}[f"tc_{name}"]
    return sum(node.maps["stats"].get(L.U32(idx)))
