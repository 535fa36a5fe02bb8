"""North-south: Services reached from outside the cluster (the external client "ext" at
10.250.0.250, on the nodes' underlay), one scenario body for every proxy (conftest.py). kproxy
serves these with bpf/tc_lb.c on the nodes' eth0; kube-proxy with its nftables/iptables rules.
Cells name the source address the backend saw: "ext" (the client's own), "node" (node1),
"node2", "pod" (the client pod on node1)."""
from __future__ import annotations

import time

import pytest

from kproxy_ebpf.dev.lab.cluster import NAMESPACE
from kproxy_ebpf.dev.lab.probe import is_reply
from kproxy_ebpf.model.objects import hostport

from ..held import Held
from ..support import wait_until
from .scenario import CLIENT, EXT, HOST

pytestmark = [pytest.mark.root, pytest.mark.controlplane]

# Routed from the external client to node1 (Scenario.route_from_outside); outside the lab's
# pod, node and Service ranges and away from the lab LoadBalancer pool's.
# IPv6 (the IPv6 lab): in the documentation prefix, routed nowhere but inside the lab.
EXTERNAL_IP_CIDR, EXTERNAL_IP = ("10.250.110.0/24", "2001:db8:110::/64"), ("10.250.110.10",
                                                                          "2001:db8:110::10")
LB_CIDR, LB_IP = ("10.250.111.0/24", "2001:db8:111::/64"), ("10.250.111.10", "2001:db8:111::10")
# Services of type LoadBalancer here are ours to "provision": a class no controller serves
# keeps any lab LoadBalancer allocator away from them (kube-proxy ignores the class).
LB_CLASS = "kproxy.test/conformance"


def ports(tcp_node_port: int, udp_node_port: int | None = None) -> list[dict]:
    out = [{"name": "http", "port": 80, "targetPort": 8080, "protocol": "TCP",
            "nodePort": tcp_node_port}]
    if udp_node_port:
        out.append({"name": "dns", "port": 53, "targetPort": 5353, "protocol": "UDP",
                    "nodePort": udp_node_port})
    return out


def health_body(code: int, service: str, local_endpoints: int) -> str:
    """kube-proxy's healthCheckNodePort answer as a cell (verdicts.http_cell)."""
    return (f"{code} localEndpoints={local_endpoints} service.name={service} "
            f"service.namespace={NAMESPACE} serviceProxyHealthy=true")


def test_nodeport_etp_cluster(scenario):
    """externalTrafficPolicy Cluster: any node forwards to any backend. kube-proxy masquerades
    every such connection; kproxy only when the backend is on another node (DIVERGENCES)."""
    scenario.pods("npr", {"npr-2": "node2"})
    scenario.pods("npl", {"npl-1": "node1"})
    scenario.service("np-remote", "npr", ports(30100, 30101), type="NodePort")
    scenario.service("np-local", "npl", ports(30102, 30103), type="NodePort")
    node1 = scenario.node_ip("node1")
    scenario.check_tcp_udp("ext -> node1, backend on node2", EXT, node1, (30100, 30101), "npr-2 from node")
    scenario.check_tcp_udp("ext -> node1, backend on node1", EXT, node1, (30102, 30103), "npl-1 from node")
    # The other node answers the same NodePort (the backend now remote from node2).
    scenario.check("tcp ext -> node2, backend on node1", EXT, scenario.node_ip("node2"), 30102,
                   "npl-1 from node2")
    # From inside the cluster (semantics 1.8): kube-proxy masquerades pod clients of a
    # NodePort too; the socket hook connects the pod to the backend directly.
    scenario.check_tcp_udp("pod -> node1", CLIENT, node1, (30100, 30101), "npr-2 from node")
    scenario.check("tcp host -> node1", HOST, node1, 30100, "npr-2 from node")


def test_nodeport_etp_local(scenario):
    """externalTrafficPolicy Local: only local endpoints, the client's address kept; a node
    without one drops, and says so on its healthCheckNodePort."""
    scenario.pods("etl", {"etl-1": "node1"})
    scenario.service("etp-local", "etl", ports(30110, 30111), type="LoadBalancer",
                     loadBalancerClass=LB_CLASS, externalTrafficPolicy="Local",
                     healthCheckNodePort=32110)
    node1, node2 = scenario.node_ip("node1"), scenario.node_ip("node2")
    scenario.check_tcp_udp("ext -> node1 (local endpoint)", EXT, node1, (30110, 30111), "etl-1 from ext")
    scenario.check_tcp_udp("ext -> node2 (no local endpoint)", EXT, node2, (30110, 30111), "TIMEOUT", count=2)
    scenario.health("healthCheckNodePort node1", "node1", 32110, health_body(200, "etp-local", 1))
    scenario.health("healthCheckNodePort node2", "node2", 32110, health_body(503, "etp-local", 0))


def test_nodeport_etp_local_from_inside(scenario):
    """kube-proxy's short-circuit (semantics 1.7): traffic from pods and from the node itself
    uses the Cluster set even under eTP Local, so node1 without a local endpoint forwards it;
    pods keep their address, the node's own traffic is masqueraded."""
    scenario.pods("etr", {"etr-2": "node2"})
    scenario.service("etp-local-in", "etr", ports(30112, 30113), type="NodePort",
                     externalTrafficPolicy="Local")
    node1 = scenario.node_ip("node1")
    scenario.check("tcp ext -> node1 (no local endpoint)", EXT, node1, 30112, "TIMEOUT", count=2)
    scenario.check_tcp_udp("pod -> node1", CLIENT, node1, (30112, 30113), "etr-2 from pod")
    scenario.check("tcp host -> node1", HOST, node1, 30112, "etr-2 from node")


def test_nodeport_no_endpoints(scenario):
    """No usable endpoint anywhere: REJECT for every frontend and either policy."""
    scenario.service("np-empty", "nothing-matches", ports(30120, 30121), type="NodePort")
    scenario.service("np-empty-local", "nothing-matches", ports(30122, 30123), type="NodePort",
                     externalTrafficPolicy="Local")
    scenario.wait_endpoints("np-empty", 0)
    node1 = scenario.node_ip("node1")
    scenario.check_tcp_udp("ext -> node1, eTP Cluster", EXT, node1, (30120, 30121), "REFUSED", count=3)
    scenario.check_tcp_udp("ext -> node1, eTP Local", EXT, node1, (30122, 30123), "REFUSED", count=3)


def test_external_ip_and_load_balancer_ip(scenario):
    """An ExternalIP and a LoadBalancer ingress IP, both routed by the outside to node1."""
    external_ip, lb_ip = scenario.pick(*EXTERNAL_IP), scenario.pick(*LB_IP)
    scenario.route_from_outside(scenario.pick(*EXTERNAL_IP_CIDR), "node1")
    scenario.route_from_outside(scenario.pick(*LB_CIDR), "node1")
    scenario.pods("eip", {"eip-2": "node2"})
    scenario.service("eip", "eip", ports(30140, 30141), type="LoadBalancer",
                     loadBalancerClass=LB_CLASS, externalIPs=[external_ip])
    scenario.set_load_balancer_ip("eip", lb_ip)
    scenario.check_tcp_udp("ext -> externalIP", EXT, external_ip, (80, 53), "eip-2 from node")
    scenario.check_tcp_udp("ext -> LB IP", EXT, lb_ip, (80, 53), "eip-2 from node")
    # From a pod (eTP Cluster: kube-proxy masquerades, semantics 1.8).
    scenario.check("tcp pod -> LB IP", CLIENT, lb_ip, 80, "eip-2 from node")


def test_nodeport_backend_removed(scenario):
    """One long UDP flow (a fixed client port) through node1's NodePort: when its backend
    leaves the Service (not ready; the pod still runs and would answer), the flow's next
    datagram goes to the backend that remains. kube-proxy deletes the flow's conntrack entry;
    kproxy purges its own (checked with `ct list`, kproxy only)."""
    scenario.pods("rm", {"rm-1": "node2"})
    scenario.service("np-rm", "rm", ports(30150, 30151), type="NodePort")
    node1, sport = scenario.node_ip("node1"), 40151
    scenario.check("udp ext -> node1, one flow", EXT, node1, 30151, "rm-1 from node", udp=True,
                   count=5, sport=sport)
    gone = hostport(scenario.c.lab.pod("rm-1").ip, "")
    if scenario.ours:
        assert any(f["backend"].startswith(gone) and f["snat"]
                   for f in scenario.kproxy_flows("node1", "np-rm")), "no tracked flow to rm-1"
    scenario.pods("rm", {"rm-2": "node2"})
    scenario.wait_endpoints("np-rm", 2)
    scenario.ready("rm-1", False)
    scenario.check("the same flow after rm-1 left", EXT, node1, 30151, "rm-2 from node",
                   udp=True, count=5, sport=sport)
    scenario.check("tcp ext -> node1 after rm-1 left", EXT, node1, 30150, "rm-2 from node")
    if scenario.ours:
        wait_until(lambda: not any(f["backend"].startswith(gone) for f in
                                   scenario.kproxy_flows("node1", "np-rm")),
                   10, "kproxy's conntrack rows of rm-1 purged")


def test_nodeport_tcp_connection_outlives_its_backends_readiness(scenario):
    """A TCP connection from outside through node1's NodePort goes on to its backend when the
    backend stops being ready (the pod still runs and answers), while new connections go to
    the one that remains: kube-proxy's conntrack keeps TCP entries of removed endpoints (its
    cleanup clears UDP only), kproxy's TC path keeps the flow's backend (lib/ct_pkt.h
    kp_ct_usable). Until 2026-12-07 kproxy moved the flow and the connection died."""
    scenario.pods("keep", {"keep-1": "node2"})
    scenario.service("np-keep", "keep", ports(30160), type="NodePort")
    node1 = scenario.node_ip("node1")
    scenario.check("tcp ext -> node1", EXT, node1, 30160, "keep-1 from node")
    with Held(scenario.c, EXT, node1, 30160, "held-np-keep", udp=False) as held:
        assert held.first_pod() == "keep-1", held.log
        scenario.pods("keep", {"keep-2": "node2"})
        scenario.wait_endpoints("np-keep", 2)
        scenario.ready("keep-1", False)
        scenario.check("tcp ext -> node1 after keep-1 left", EXT, node1, 30160,
                       "keep-2 from node")
        t0 = time.time()
        wait_until(lambda: len(held.answers(t0)) >= 10, 10, f"10 more answers ({held.log})")
        after = [r for t, r in held.lines() if t > t0]
        kept = ",".join(sorted({p for _, p in held.answers(t0)}))
        scenario.note("held tcp connection after keep-1 left", kept)
        assert kept == "keep-1" and all(is_reply(r) for r in after), held.log


# Two connections from one client port, to two NodePorts of one backend (run in "ext").
SAME_PORT = r"""
import socket, sys
ip, sport, ports = sys.argv[1], int(sys.argv[2]), [int(p) for p in sys.argv[3:]]
conns, out = {}, []
def line(s):
    buf = b""
    while not buf.endswith(b"\n"):
        data = s.recv(100)
        if not data:
            return "EOF"
        buf += data
    return buf.decode().split()[0]
six = ":" in ip
for port in ports:
    s = socket.socket(socket.AF_INET6 if six else socket.AF_INET)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.settimeout(2)
    s.bind(("::" if six else "0.0.0.0", sport))
    try:
        s.connect((ip, port))
        conns[port] = s
        out.append(f"{port}:{line(s)}")
    except OSError as e:
        out.append(f"{port}:{type(e).__name__}")
for port, s in conns.items():
    try:
        s.sendall(b"again\n")
        out.append(f"{port}:{line(s)}")
    except OSError as e:
        out.append(f"{port}:{type(e).__name__}")
print(" ".join(out))
"""


def test_two_node_ports_of_one_backend_from_one_client_port(scenario):
    """A client may use one source port for two connections to different destinations; two
    NodePorts of one Service (externalTrafficPolicy Local: no SNAT) then lead to the same
    backend address and port from the same client address and port. The kernel's NAT tells
    such a clash and moves the second connection's source port (nf_nat's null binding picks a
    unique tuple), so both connections work under kube-proxy."""
    scenario.pods("twin", {"twin-1": "node1"})
    twin_ports = [{"name": f"p{i}", "port": 80 + i, "targetPort": 8080, "protocol": "TCP",
                   "nodePort": 30180 + i} for i in range(2)]
    scenario.service("np-twin", "twin", twin_ports, type="NodePort",
                     externalTrafficPolicy="Local")
    node1 = scenario.node_ip("node1")
    scenario.check("tcp ext -> node1 p0", EXT, node1, 30180, "twin-1 from ext")
    scenario.check("tcp ext -> node1 p1", EXT, node1, 30181, "twin-1 from ext")
    r = scenario.c.lab.exec(EXT, [scenario.c.lab.python, "-I", "-S", "-c", SAME_PORT, node1,
                                  "40123", "30180", "30181"], capture_output=True, text=True,
                            timeout=30)
    got = r.stdout.strip()
    scenario.note("two NodePorts from one client port", got)
    assert got == "30180:twin-1 30181:twin-1 30180:twin-1 30181:twin-1", r.stdout + r.stderr
