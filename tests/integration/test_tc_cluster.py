"""North-south through the real agent against the real API server: lab "it-ns", kproxy on both
nodes (the agent finds eth0 from the node's addresses, SNATs to the node address), the
external client at 10.250.0.250, a backend pod on node2 only."""
from __future__ import annotations

import pytest
from kubernetes import client

from kproxy_ebpf.dev.lab.cluster import Cluster

from ..support import lab_cluster, wait_until
from .lab_services import seen_from_outside

pytestmark = [pytest.mark.root, pytest.mark.controlplane]

NODE1, NODE2, CLIENT = "10.250.0.11", "10.250.0.12", "10.250.0.250"
NODE_PORT = 30180


@pytest.fixture(scope="module")
def cluster():
    with lab_cluster("it-ns", "kproxy") as c:
        c.create_pod("nsb", "node2", labels={"app": "nsb"})
        yield c


def seen_by_backend(c: Cluster, node_ip: str, udp: bool = False, count: int = 3) -> set[str]:
    return seen_from_outside(c, node_ip, NODE_PORT, udp=udp, count=count)


def test_nodeport_from_outside_with_both_traffic_policies(cluster):
    core = client.CoreV1Api(cluster.api())
    body = {"apiVersion": "v1", "kind": "Service", "metadata": {"name": "ns-np"},
            "spec": {"type": "NodePort", "selector": {"app": "nsb"},
                     "ports": [{"name": "http", "port": 80, "targetPort": 8080,
                                "nodePort": NODE_PORT, "protocol": "TCP"}]}}
    core.create_namespaced_service("default", body)
    try:
        # Cluster: node1 forwards to node2's pod, which sees node1's address.
        wait_until(lambda: seen_by_backend(cluster, NODE1) == {f"nsb {NODE1}"}, 30,
                   "the NodePort on node1 through SNAT to node2's pod")
        core.patch_namespaced_service("ns-np", "default",
                                      {"spec": {"externalTrafficPolicy": "Local"}})
        # Local: node2 keeps the client's address; node1 has no local endpoint and drops.
        wait_until(lambda: seen_by_backend(cluster, NODE2) == {f"nsb {CLIENT}"}, 30,
                   "the NodePort on node2 with the client's own address")
        wait_until(lambda: seen_by_backend(cluster, NODE1, count=2) == {"TIMEOUT"}, 30,
                   "node1 dropping under eTP Local")
    finally:
        core.delete_namespaced_service("ns-np", "default")
