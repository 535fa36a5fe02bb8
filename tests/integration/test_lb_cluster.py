"""LoadBalancer Services end to end: the lab's allocator (lab/lballoc.py) writes
status.loadBalancer.ingress through the real API server, the proxies serve the address to the
external client, and loadBalancerSourceRanges decide which client gets in.

Each test runs against our agent and against upstream kube-proxy nftables (the oracle) in labs
of their own ("it-lb-kproxy", "it-lb-nftables"): the same packets, the same expected answers.
Backend pod "lbb" on node2; the pool is routed from the external client via node1, then moved
to node2 with `lab route` for externalTrafficPolicy Local. The external client has a second
source address, 10.250.0.251, for the source-range checks.
"""
from __future__ import annotations

import ipaddress
import json
import subprocess
import sys

import pytest
from kubernetes import client

from kproxy_ebpf.dev.lab.cluster import Cluster
from kproxy_ebpf.dev.lab.lballoc import DEFAULT_POOL
from kproxy_ebpf.dev.lab.probe import is_reply

from ..builders import api_service
from ..support import lab_cluster, wait_until
from .lab_services import HTTP, seen_from_outside

pytestmark = [pytest.mark.root, pytest.mark.controlplane]

NODE1, NODE2 = "10.250.0.11", "10.250.0.12"
CLIENT, CLIENT2 = "10.250.0.250", "10.250.0.251"
POOL = ipaddress.IPv4Network(DEFAULT_POOL)


@pytest.fixture(scope="module", params=["kproxy", "nftables"])
def cluster(request):
    with lab_cluster(f"it-lb-{request.param}", request.param) as c:
        c.lab.add_external_address(CLIENT2)
        c.create_pod("lbb", "node2", labels={"app": "lbb"})
        c.create_pod("client", "node1")
        yield c


@pytest.fixture
def core(cluster):
    return client.CoreV1Api(cluster.api())


def lb_service(name: str, **spec) -> dict:
    return api_service(name, None, typed=True,
                       **{"ports": [HTTP], "type": "LoadBalancer", "selector": {"app": "lbb"},
                          **spec})


def patch(core, name: str, body: dict) -> None:
    """A JSON merge patch (null deletes a field)."""
    core.patch_namespaced_service(name, "default", body,
                                  _content_type="application/merge-patch+json")


def ingress(core, name: str) -> list[dict]:
    svc = core.read_namespaced_service_status(name, "default")
    return [i.to_dict() for i in (svc.status.load_balancer.ingress or [])]


def allocated(core, name: str) -> str:
    """The address the allocator wrote (waits for it)."""
    got = wait_until(lambda: ingress(core, name), 20, f"an LB address for {name}")
    assert len(got) == 1 and ipaddress.IPv4Address(got[0]["ip"]) in POOL, got
    # ipMode is not set by the allocator (the API server may default it to VIP).
    assert got[0].get("ip_mode") in (None, "VIP"), got
    return got[0]["ip"]


def seen(c: Cluster, ip: str, port: int = 80, source: str | None = None, count: int = 2,
         timeout: float = 0.5) -> set[str]:
    return seen_from_outside(c, ip, port, source=source, count=count, timeout=timeout)


def lab_route(c: Cluster, *args: str) -> None:
    """`kproxy-ebpf lab route ...` as an operator runs it."""
    subprocess.run([sys.executable, "-m", "kproxy_ebpf.cli.main", "lab", "route", *args,
                    "--lab", c.lab.name], check=True, capture_output=True, text=True)


def route_pool_via(c: Cluster, node: str) -> None:
    lab_route(c, str(POOL), "--via", node)
    assert c.lab.status()["external_routes"][str(POOL)] == node


def test_lb_ip_from_the_allocator_is_reachable_with_both_policies(cluster, core):
    core.create_namespaced_service("default", lb_service("lb-web"))
    try:
        ip = allocated(core, "lb-web")
        # Cluster: node1 forwards to node2's pod, which sees node1's address.
        wait_until(lambda: seen(cluster, ip) == {f"lbb {NODE1}"}, 30,
                   "the LB IP via node1 to node2's pod")
        patch(core, "lb-web", {"spec": {"externalTrafficPolicy": "Local"}})
        # Local: node1 has no local endpoint and drops; node2 keeps the client's address.
        wait_until(lambda: seen(cluster, ip) == {"TIMEOUT"}, 30, "node1 dropping under eTP Local")
        route_pool_via(cluster, "node2")
        try:
            wait_until(lambda: seen(cluster, ip) == {f"lbb {CLIENT}"}, 30,
                       "the LB IP via node2 with the client's own address")
            # Without the route the pool goes to the lab router, which leads nowhere.
            lab_route(cluster, str(POOL), "--delete")
            assert str(POOL) not in cluster.lab.status()["external_routes"]
            # 1.5 s: past the SYN retransmission, which reports the router's ICMP error even
            # when it arrived while connect() held the socket (see the conformance notes).
            assert seen(cluster, ip, timeout=1.5) == {"ERROR ENETUNREACH"}
        finally:
            route_pool_via(cluster, "node1")
    finally:
        core.delete_namespaced_service("lb-web", "default")


def test_allocator_honours_requests_releases_and_survives_a_restart(cluster, core):
    wanted = str(POOL.network_address + 77)
    core.create_namespaced_service("default", lb_service("lb-a"))
    core.create_namespaced_service("default", lb_service("lb-b", loadBalancerIP=wanted))
    core.create_namespaced_service("default", lb_service("lb-c", loadBalancerIP="192.0.2.1"))
    try:
        a = allocated(core, "lb-a")
        assert allocated(core, "lb-b") == wanted
        assert ingress(core, "lb-c") == [], "a requested address outside the pool is not given"

        # The allocator restarts: every address stays where it was, a newcomer gets a new one.
        cluster.stop_lb_allocator()
        cluster.start_lb_allocator()
        core.create_namespaced_service("default", lb_service("lb-d"))
        d = allocated(core, "lb-d")
        assert d not in (a, wanted)
        assert (allocated(core, "lb-a"), allocated(core, "lb-b")) == (a, wanted)

        # No longer a LoadBalancer: the status is cleared and the address can be given again.
        patch(core, "lb-a", {"spec": {"type": "ClusterIP"}})
        wait_until(lambda: ingress(core, "lb-a") == [], 20, "lb-a's status cleared")
        core.delete_namespaced_service("lb-d", "default")
        core.create_namespaced_service("default", lb_service("lb-e", loadBalancerIP=a))
        assert allocated(core, "lb-e") == a
    finally:
        for name in ("lb-a", "lb-b", "lb-c", "lb-d", "lb-e"):
            try:
                core.delete_namespaced_service(name, "default")
            except client.ApiException as exc:
                if exc.status != 404:
                    raise


def _node1(c: Cluster, command: str) -> object:
    """`kproxy-ebpf COMMAND -o json` on node1's maps."""
    out = subprocess.run([sys.executable, "-m", "kproxy_ebpf.cli.main", command, "-o", "json",
                          "--bpffs-dir", c.lab.bpffs("node1")], check=True,
                         capture_output=True, text=True).stdout
    return json.loads(out)


def _ranges_in_maps(c: Cluster, ip: str) -> list[list[str]]:
    """What `services` shows for the LB frontends of ip (one per scope)."""
    return [r.get("source_ranges") for r in _node1(c, "services")
            if r["address"] == ip and r["type"] == "LoadBalancer"]


def test_source_ranges_let_one_client_in_and_keep_the_other_out(cluster, core):
    core.create_namespaced_service("default", lb_service(
        "lb-fw", loadBalancerSourceRanges=[f" {CLIENT}/32 "]))
    try:
        ip = allocated(core, "lb-fw")
        np = core.read_namespaced_service("lb-fw", "default").spec.ports[0].node_port
        drops = _node1(cluster, "stats")["tc_src_drop"] if cluster.info.proxy == "kproxy" else 0
        # Both at once: the allocator may hand out the address a Service of the previous test
        # held, and until the proxy has synced that deletion its unfiltered rules for the same
        # backend answer both clients (seen once under kube-proxy nftables).
        wait_until(lambda: seen(cluster, ip) == {f"lbb {NODE1}"}
                   and seen(cluster, ip, source=CLIENT2) == {"TIMEOUT"}, 30,
                   "the admitted client in and the other one dropped")
        if cluster.info.proxy == "kproxy":
            # Counted in kp_stats: at least the first SYN of each of the two probes.
            assert _node1(cluster, "stats")["tc_src_drop"] >= drops + 2
        # Only the LB IP is filtered: the NodePort of the same Service lets both in.
        assert seen(cluster, NODE1, np, source=CLIENT2) == {f"lbb {NODE1}"}
        if cluster.info.proxy == "kproxy":
            # Two frontends: the socket scope's (unfiltered) and the one from outside.
            assert [f"{CLIENT}/32"] in _ranges_in_maps(cluster, ip)

        # A range change through the API flips it.
        patch(core, "lb-fw", {"spec": {"loadBalancerSourceRanges": [f"{CLIENT2}/32"]}})
        wait_until(lambda: seen(cluster, ip, source=CLIENT2) == {f"lbb {NODE1}"}, 30,
                   "the second client admitted after the change")
        assert seen(cluster, ip) == {"TIMEOUT"}, "the first client is dropped now"

        # A range holding the node's address also admits the LB IP as a source
        # (kube-proxy's allowFromNode); the clients outside it stay out.
        patch(core, "lb-fw", {"spec": {
            "loadBalancerSourceRanges": [f"{NODE1}/32"]}})
        wait_until(lambda: seen(cluster, ip, source=CLIENT2) == {"TIMEOUT"}, 30,
                   "both clients out with only the node's range")
        if cluster.info.proxy == "kproxy":
            wait_until(lambda: [f"{NODE1}/32", f"{ip}/32"] in _ranges_in_maps(cluster, ip), 30,
                       "the node's range and the LB IP in the maps")

        # No ranges: everyone in again.
        patch(core, "lb-fw", {"spec": {"loadBalancerSourceRanges": None}})
        wait_until(lambda: seen(cluster, ip) == {f"lbb {NODE1}"}, 30, "the ranges lifted")
        assert seen(cluster, ip, source=CLIENT2) == {f"lbb {NODE1}"}
    finally:
        core.delete_namespaced_service("lb-fw", "default")


def from_inside(c: Cluster, target: str, ip: str, udp: bool = False) -> set[str]:
    """What a pod (`pod/NAME`) or a node's own process (`node/NAME`) meets at ip: the pods
    that answered, or the failures."""
    port = 53 if udp else 80
    lines = c.lab.probe(target, ip, port, udp=udp, count=2, timeout=0.5)
    return {ln.split()[0] if is_reply(ln) else ln for ln in lines}


def refused(got: set[str]) -> bool:
    """No answer: kube-proxy drops (a TCP SYN times out; a node's own UDP send meets EPERM),
    our hook refuses the connect or send at once with EPERM (docs/design/source-ranges.md)."""
    return bool(got) and "lbb" not in got


def test_source_ranges_hold_for_pods_and_the_node_itself(cluster, core):
    """kube-proxy's firewall chain hooks output as well as prerouting: a pod or a node process
    outside loadBalancerSourceRanges does not reach the LB IP, one inside does (its own
    address judged), and the ClusterIP of the same Service stays open."""
    core.create_namespaced_service("default", lb_service("lb-in", loadBalancerSourceRanges=[
        f"{CLIENT}/32"], ports=[
            {"name": "http", "port": 80, "targetPort": 8080, "protocol": "TCP"},
            {"name": "dns", "port": 53, "targetPort": 5353, "protocol": "UDP"}]))
    kproxy = cluster.info.proxy == "kproxy"
    try:
        ip = allocated(core, "lb-in")
        cip = core.read_namespaced_service("lb-in", "default").spec.cluster_ip
        pod_ip = cluster.lab.pod("client").ip
        # Until the proxy has synced the deletion of a previous test's Service that held the
        # same address, its unfiltered rules answer everyone: wait for the other client's drop.
        wait_until(lambda: seen(cluster, ip) == {f"lbb {NODE1}"}
                   and seen(cluster, ip, source=CLIENT2) == {"TIMEOUT"}, 30, "the ranges in force")
        before = _node1(cluster, "stats")["src_deny"] if kproxy else 0
        for udp in (False, True):
            for target in ("pod/client", "node/node1"):
                got = from_inside(cluster, target, ip, udp)
                assert refused(got), (target, udp, got)
                if kproxy:
                    assert got == {"ERROR EPERM"}, (target, udp, got)
            assert from_inside(cluster, "pod/client", cip, udp) == {"lbb"}, "ClusterIP open"
        if kproxy:
            assert _node1(cluster, "stats")["src_deny"] >= before + 8

        # The pod's own address in the ranges: the pod in, the node still out.
        patch(core, "lb-in", {"spec": {"loadBalancerSourceRanges": [f"{pod_ip}/32"]}})
        wait_until(lambda: from_inside(cluster, "pod/client", ip) == {"lbb"}, 30,
                   "the pod admitted by its address")
        assert from_inside(cluster, "pod/client", ip, udp=True) == {"lbb"}
        assert refused(from_inside(cluster, "node/node1", ip))
        # A pod created while the ranges hold, inside them (its node's pod range): admitted
        # within the agent's scan for new namespaces, and so under kube-proxy at once.
        patch(core, "lb-in", {"spec": {"loadBalancerSourceRanges": [
            str(ipaddress.ip_network(f"{pod_ip}/24", strict=False))]}})
        wait_until(lambda: from_inside(cluster, "pod/client", ip) == {"lbb"}, 30,
                   "the pod's range in force")
        cluster.create_pod("late", "node1")
        try:
            wait_until(lambda: from_inside(cluster, "pod/late", ip) == {"lbb"}, 5,
                       "a new pod inside the ranges admitted")
        finally:
            cluster.delete_pod("late")

        # The node's address in the ranges: the node in (kube-proxy's allowFromNode adds the
        # LB IP as a source as well), the pod out again.
        patch(core, "lb-in", {"spec": {"loadBalancerSourceRanges": [f"{NODE1}/32"]}})
        wait_until(lambda: from_inside(cluster, "node/node1", ip) == {"lbb"}, 30,
                   "the node admitted by its address")
        assert from_inside(cluster, "node/node1", ip, udp=True) == {"lbb"}
        assert refused(from_inside(cluster, "pod/client", ip))
    finally:
        core.delete_namespaced_service("lb-in", "default")
