"""Helpers for integration tests on a lab cluster (started by tests/support.py lab_cluster;
tests/conformance has the differential Service scenarios): Services, probes, and what our
agent programmed and counts.

Conventions: node1 10.250.0.11 (zone-a), node2 10.250.0.12 (zone-b), client pod "client" on
node1; namespace default; Service IPs allocated by the API server from 10.96.0.0/16.
"""
from __future__ import annotations

import json
import sys
from collections import Counter

from kubernetes import client

from kproxy_ebpf.dev.lab.cluster import Cluster
from kproxy_ebpf.dev.lab.probe import is_reply

from ..builders import api_service

HTTP = {"name": "http", "port": 80, "targetPort": 8080, "protocol": "TCP"}


def make_service(c: Cluster, name: str, app: str, udp: bool = False) -> str:
    ports = [HTTP] + ([{"name": "dns", "port": 53, "targetPort": 5353, "protocol": "UDP"}]
                      if udp else [])
    body = api_service(name, None, typed=True, selector={"app": app}, ports=ports)
    return client.CoreV1Api(c.api()).create_namespaced_service("default", body).spec.cluster_ip


def http_service(core: client.CoreV1Api, name: str, app: str, **spec) -> client.V1Service:
    """Service default/<name> selecting app=<app>, port http 80 -> 8080/TCP; `spec`: more of
    its spec (type, policies, ...)."""
    return core.create_namespaced_service(
        "default", api_service(name, None, typed=True, selector={"app": app}, ports=[HTTP], **spec))


def delete_service(c: Cluster, name: str) -> None:
    client.CoreV1Api(c.api()).delete_namespaced_service(name, "default")


def pods_of(lines: list[str]) -> Counter:
    return Counter(line.split()[0] for line in lines)


def served_by(c: Cluster, ip: str, count: int = 1, port: int = 80, udp: bool = False) -> set[str]:
    return set(pods_of([x for x in c.lab.probe("pod/client", ip, port, udp=udp, count=count,
                                               timeout=0.5) if is_reply(x)]))


def seen_from_outside(c: Cluster, ip: str, port: int, udp: bool = False,
                      source: str | None = None, count: int = 2, timeout: float = 0.5) -> set[str]:
    """{'<pod> <the client address it saw>'} or the failures, from the external client."""
    lines = c.lab.probe("ext", ip, port, udp=udp, count=count, timeout=timeout, source=source)
    return {f"{ln.split()[0]} {ln.split()[1].rsplit(':', 1)[0]}" if len(ln.split()) == 2 else ln
            for ln in lines}


def services_on(c: Cluster, node: str, counters: bool = False) -> list[dict]:
    """`services -o json` on `node`; the rows' traffic counters (which move with every probe)
    only when asked for, so that two listings compare as the programmed state."""
    out = c.lab.exec(f"node/{node}", [sys.executable, "-m", "kproxy_ebpf.cli.main", "services",
                                      "--bpffs-dir", c.lab.node(node).bpffs, "-o", "json"],
                     capture_output=True, text=True, check=True)
    rows = json.loads(out.stdout)
    for r in rows if not counters else ():
        r.pop("counters", None)
    return rows


def metric(c: Cluster, node: str, name: str, labels: str = "") -> float:
    for line in c.agent_metrics(node).splitlines():
        if line.startswith(name + (f"{{{labels}}}" if labels else "")):
            return float(line.rsplit(" ", 1)[1])
    return 0.0
