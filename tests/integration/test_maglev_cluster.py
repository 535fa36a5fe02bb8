"""Maglev through the real agents against the real API server: lab "it-mg", kproxy on both
nodes, four backend pods (two per node), the external client at 10.250.0.250.

A flow from outside sent to either node's NodePort (as an ECMP router in front of the nodes
would) reaches the same backend on both when the Service's annotation asks for Maglev; with
the default random pick the two nodes disagree for some flow, so the agreement is the table's
doing. Each flow is a UDP exchange from its own source port; both nodes SNAT to themselves
(eTP Cluster), so the backend's answer names the pod.
"""
from __future__ import annotations

import json
import sys

import pytest
from kubernetes import client

from ..builders import api_service
from ..support import lab_cluster, wait_until
from .lab_services import services_on

pytestmark = [pytest.mark.root, pytest.mark.controlplane]

NODE1, NODE2, EXT_CLIENT = "10.250.0.11", "10.250.0.12", "10.250.0.250"
PODS = {"mg-a": "node1", "mg-b": "node1", "mg-c": "node2", "mg-d": "node2"}
FLOWS = range(42000, 42024)


@pytest.fixture(scope="module")
def cluster():
    with lab_cluster("it-mg", "kproxy") as c:
        c.pod_ips = {}
        for name, node in PODS.items():
            c.pod_ips[c.create_pod(name, node, labels={"app": "mg"}).ips[0]] = name
        yield c


def service(name: str, node_port: int, algorithm: str | None) -> dict:
    meta = {"annotations": {"kproxy-ebpf.io/lb-algorithm": algorithm}} if algorithm else {}
    return api_service(name, None, typed=True, meta=meta, type="NodePort", selector={"app": "mg"},
                       ports=[{"name": "dns", "port": 53, "targetPort": 5353,
                               "nodePort": node_port, "protocol": "UDP"}])


def backend(cluster, node_ip: str, node_port: int, sport: int) -> str:
    """The pod that answers a UDP flow from the external client's `sport`."""
    line = cluster.lab.probe("ext", node_ip, node_port, udp=True, sport=sport, timeout=1.0)[0]
    return line.split()[0]


def traced(cluster, node: str, node_ip: str, node_port: int, sport: int) -> str:
    """The pod `kproxy-ebpf trace` on `node` names for the external client's flow."""
    out = cluster.lab.exec(f"node/{node}", [
        sys.executable, "-m", "kproxy_ebpf.cli.main", "trace", f"{node_ip}:{node_port}/UDP",
        "--from-outside", "--from", EXT_CLIENT, "--from-port", str(sport),
        "--bpffs-dir", cluster.lab.node(node).bpffs, "-o", "json"],
        capture_output=True, text=True, check=True)
    return cluster.pod_ips[json.loads(out.stdout)["chosen"].rsplit(":", 1)[0]]


def answers_from_every_pod(cluster, node_ip: str, node_port: int) -> bool:
    return {backend(cluster, node_ip, node_port, s) for s in range(43000, 43040)} == set(PODS)


@pytest.fixture
def services(cluster):
    core = client.CoreV1Api(cluster.api())
    made = []

    def make(name: str, node_port: int, algorithm: str | None) -> None:
        core.create_namespaced_service("default", service(name, node_port, algorithm))
        made.append(name)
        for ip in (NODE1, NODE2):
            wait_until(lambda ip=ip: answers_from_every_pod(cluster, ip, node_port), 30,
                       f"{name}: all four pods behind {ip}:{node_port}")

    yield make
    for name in made:
        core.delete_namespaced_service(name, "default")


def test_every_node_sends_a_flow_to_the_same_backend(cluster, services):
    services("mg-maglev", 30253, "maglev")
    picks = {s: (backend(cluster, NODE1, 30253, s), backend(cluster, NODE2, 30253, s))
             for s in FLOWS}
    assert all(a == b for a, b in picks.values()), picks
    assert len({a for a, _ in picks.values()}) >= 3, "the flows spread over the backends"
    for node in ("node1", "node2"):
        ext = [r for r in services_on(cluster, node) if r["port"] == 30253 and r["scope"] == 1]
        assert ext and all(r["maglev"] == 16381 for r in ext), ext
    # trace on either node names the pod a flow reaches, before it is sent
    for s in list(FLOWS)[:4]:
        assert traced(cluster, "node1", NODE1, 30253, s) == picks[s][0]
        assert traced(cluster, "node2", NODE2, 30253, s) == picks[s][0]


def test_without_maglev_the_nodes_disagree_for_some_flow(cluster, services):
    services("mg-random", 30254, None)
    picks = {s: (backend(cluster, NODE1, 30254, s), backend(cluster, NODE2, 30254, s))
             for s in FLOWS}
    # each node picks one of four at random: all 24 alike by chance is 4**-24
    assert any(a != b for a, b in picks.values()), picks
