"""Per-Service counters (kp_svcstat) move with the traffic a test sends, in a lab running
kproxy: connects balanced through the socket hook, refusals by reason (no endpoints, a Local
policy without a local endpoint, loadBalancerSourceRanges), packets and bytes both ways of a
NodePort flow from outside (TC); `services -o json|wide` and the agent's metrics say the same."""
from __future__ import annotations

import sys

import pytest
from kubernetes import client
from prometheus_client.parser import text_string_to_metric_families

from kproxy_ebpf.dev.lab.cluster import Cluster
from kproxy_ebpf.dev.lab.probe import is_reply

from ..support import lab_cluster, wait_until
from .lab_services import http_service as service
from .lab_services import seen_from_outside, served_by, services_on

pytestmark = [pytest.mark.root, pytest.mark.controlplane]

NODE1, CLIENT2 = "10.250.0.11", "10.250.0.251"
PROBES = 5


@pytest.fixture(scope="module")
def cluster():
    with lab_cluster("it-counters", "kproxy", client_pod=True) as c:
        c.create_pod("ct-a", "node1", labels={"app": "ct"})
        c.create_pod("ct-b", "node2", labels={"app": "ct"})
        yield c


@pytest.fixture
def core(cluster):
    return client.CoreV1Api(cluster.api())


def counters(c: Cluster, name: str, node: str = "node1",
             where: str | None = None) -> dict[str, int]:
    """The service port's counters as `services -o json` on `node` shows them: those of the
    frontends `where` ("node": the node's own sockets; "outside": packets from outside; every
    frontend of one carries the same), or (None) both added up."""
    rows = [r for r in services_on(c, node, counters=True)
            if r["service"] == f"default/{name}:http"]
    assert rows, f"default/{name} is not programmed on {node}"
    by_scope = {}
    for r in rows:
        assert by_scope.setdefault(r["from"], r["counters"]) == r["counters"], rows
    if where is not None:
        return by_scope[where]
    return {k: sum(c[k] for c in by_scope.values()) for k in rows[0]["counters"]}


def answered_by_ct(lines: set[str]) -> bool:
    """Every probe line names one of the module's backends (`<pod> <client address>`)."""
    return bool(lines) and {ln.split()[0] for ln in lines} <= {"ct-a", "ct-b"}


def moved(before: dict[str, int], after: dict[str, int]) -> dict[str, int]:
    return {k: after[k] - before[k] for k in before if after[k] != before[k]}


def scraped(c: Cluster, name: str) -> dict[tuple[str, str], float]:
    """kproxy_service_* samples of default/<name>:http/TCP from node1's agent, by (metric,
    direction or reason)."""
    out = {}
    for fam in text_string_to_metric_families(c.agent_metrics("node1")):
        for s in fam.samples:
            want = {"namespace": "default", "name": name, "port": "http", "protocol": "TCP"}
            if s.name.startswith("kproxy_service_") and want.items() <= s.labels.items():
                out[(s.name, s.labels.get("direction") or s.labels.get("reason") or "")] = s.value
    return out


def test_connects_are_counted_and_scraped_with_the_service_labels(cluster, core):
    ip = service(core, "ct-web", "ct").spec.cluster_ip
    try:
        wait_until(lambda: served_by(cluster, ip), 20, "the Service to answer")
        before = counters(cluster, "ct-web")
        lines = cluster.lab.probe("pod/client", ip, 80, count=PROBES)
        assert all(is_reply(x) for x in lines), lines
        # The socket hook balances connect()s: no packet crosses TC for a pod's ClusterIP.
        assert moved(before, counters(cluster, "ct-web")) == {"conns": PROBES}
        got, now = scraped(cluster, "ct-web"), counters(cluster, "ct-web")
        assert got[("kproxy_service_connections_total", "")] == before["conns"] + PROBES
        # Probes made before the endpoints were synced were refused: the scrape says so too.
        assert got[("kproxy_service_refusals_total", "no_endpoints")] == now["refused"]
        # The other node saw none of it.
        assert counters(cluster, "ct-web", "node2")["conns"] == 0
    finally:
        core.delete_namespaced_service("ct-web", "default")


def test_refusals_are_counted_by_reason(cluster, core):
    none_ip = service(core, "ct-none", "nobody").spec.cluster_ip
    # The only endpoint is on node2: the client on node1 has no local one.
    local_ip = service(core, "ct-local", "ct-remote", internalTrafficPolicy="Local").spec.cluster_ip
    cluster.create_pod("ct-r", "node2", labels={"app": "ct-remote"})
    try:
        wait_until(lambda: cluster.lab.probe("pod/client", none_ip, 80) == ["REFUSED"], 20,
                   "the Service without endpoints refused")
        wait_until(lambda: cluster.lab.probe("pod/client", local_ip, 80)
                   == ["ERROR EHOSTUNREACH"], 20, "the Local-only Service programmed")
        none0, local0 = counters(cluster, "ct-none"), counters(cluster, "ct-local")
        assert cluster.lab.probe("pod/client", none_ip, 80, count=PROBES) == ["REFUSED"] * PROBES
        assert cluster.lab.probe("pod/client", local_ip, 80, count=PROBES) == \
            ["ERROR EHOSTUNREACH"] * PROBES
        assert moved(none0, counters(cluster, "ct-none")) == {"refused": PROBES}
        assert moved(local0, counters(cluster, "ct-local")) == {"dropped": PROBES}
        assert scraped(cluster, "ct-local")[("kproxy_service_refusals_total",
                                             "no_local_endpoints")] == local0["dropped"] + PROBES
    finally:
        core.delete_namespaced_service("ct-none", "default")
        core.delete_namespaced_service("ct-local", "default")
        cluster.delete_pod("ct-r")


def test_a_node_port_flow_from_outside_counts_packets_and_bytes_both_ways(cluster, core):
    port = service(core, "ct-np", "ct", type="NodePort").spec.ports[0].node_port
    try:
        # Only the pods' own answers count: before the NodePort is programmed the node's
        # stack refuses the SYN itself, which is not a failure line but not an answer either.
        wait_until(lambda: answered_by_ct(seen_from_outside(cluster, NODE1, port)), 20,
                   "the NodePort from outside")
        before = counters(cluster, "ct-np")
        got = seen_from_outside(cluster, NODE1, port, count=PROBES)
        assert answered_by_ct(got), got
        d = moved(before, counters(cluster, "ct-np"))
        # One new TC flow per probe; each is at least SYN, ACK and FIN one way and SYN-ACK,
        # the reply line and FIN the other, every one a whole IP packet.
        assert d.get("conns") == PROBES, d
        assert d.get("packets", 0) >= 3 * PROBES and d.get("reply_packets", 0) >= 3 * PROBES, d
        assert d["bytes"] >= 40 * d["packets"] and d["reply_bytes"] >= 40 * d["reply_packets"], d
        assert set(d) <= {"conns", "packets", "bytes", "reply_packets", "reply_bytes"}, d
        m = scraped(cluster, "ct-np")
        assert m[("kproxy_service_packets_total", "reply")] >= before["reply_packets"] + 3 * PROBES
    finally:
        core.delete_namespaced_service("ct-np", "default")


def test_source_range_denials_are_counted_on_both_paths(cluster, core):
    svc = service(core, "ct-lb", "ct", type="LoadBalancer",
                  loadBalancerSourceRanges=[f"{CLIENT2}/32"])
    try:
        ip = wait_until(lambda: (core.read_namespaced_service_status("ct-lb", "default")
                                 .status.load_balancer.ingress or [None])[0], 20,
                        "an LB address").ip
        cip = svc.spec.cluster_ip
        wait_until(lambda: cluster.lab.probe("pod/client", ip, 80) == ["ERROR EPERM"], 20,
                   "the ranges in force for pods")
        before = counters(cluster, "ct-lb")
        # A pod outside the ranges (socket hook: connect() fails with EPERM) ...
        assert cluster.lab.probe("pod/client", ip, 80, count=PROBES) == ["ERROR EPERM"] * PROBES
        assert moved(before, counters(cluster, "ct-lb")) == {"denied": PROBES}
        # ... and the external client outside them (TC: every SYN dropped, retries too).
        assert seen_from_outside(cluster, ip, 80, count=2) == {"TIMEOUT"}
        assert counters(cluster, "ct-lb")["denied"] >= before["denied"] + PROBES + 2
        # The ClusterIP of the same Service stays open, and its connects count.
        assert served_by(cluster, cip)
        assert counters(cluster, "ct-lb")["conns"] >= before["conns"] + 1
    finally:
        core.delete_namespaced_service("ct-lb", "default")


def test_each_frontend_scope_counts_the_traffic_it_carried(cluster, core):
    """A LoadBalancer Service reached through its ClusterIP from a pod, and through its
    NodePort and its LB IP from outside: the node's frontends count the pod's connections,
    the outside ones the other two, and `-o wide` shows each on a line that says whose."""
    svc = service(core, "ct-all", "ct", type="LoadBalancer")
    port = svc.spec.ports[0].node_port
    try:
        lb = wait_until(lambda: (core.read_namespaced_service_status("ct-all", "default")
                                 .status.load_balancer.ingress or [None])[0], 20,
                        "an LB address").ip
        wait_until(lambda: served_by(cluster, svc.spec.cluster_ip), 20, "the ClusterIP")
        for addr, p in ((NODE1, port), (lb, 80)):
            wait_until(lambda a=addr, p=p: answered_by_ct(seen_from_outside(cluster, a, p)), 20,
                       f"{addr}:{p} from outside")
        node0, out0 = counters(cluster, "ct-all", where="node"), \
            counters(cluster, "ct-all", where="outside")
        assert all(is_reply(x) for x in cluster.lab.probe("pod/client", svc.spec.cluster_ip, 80,
                                                          count=PROBES))
        assert answered_by_ct(seen_from_outside(cluster, NODE1, port, count=PROBES))
        assert answered_by_ct(seen_from_outside(cluster, lb, 80, count=PROBES))
        assert moved(node0, counters(cluster, "ct-all", where="node")) == {"conns": PROBES}
        d = moved(out0, counters(cluster, "ct-all", where="outside"))
        assert d["conns"] == 2 * PROBES and d["packets"] >= 6 * PROBES, d
        node = cluster.lab.node("node1")
        wide = cluster.lab.exec("node/node1", [sys.executable, "-m", "kproxy_ebpf.cli.main",
                                               "services", "--bpffs-dir", node.bpffs, "-o",
                                               "wide", "--service", "ct-all"],
                                capture_output=True, text=True, check=True).stdout
        totals = [ln for ln in wide.splitlines() if "(all from" in ln]
        assert len(totals) == 2 and "(all from the node)" in totals[0] and \
            "(all from outside)" in totals[1], wide
    finally:
        core.delete_namespaced_service("ct-all", "default")


def test_services_wide_shows_the_counter_columns(cluster, core):
    ip = service(core, "ct-wide", "ct").spec.cluster_ip
    try:
        wait_until(lambda: served_by(cluster, ip), 20, "the Service to answer")
        node = cluster.lab.node("node1")
        out = cluster.lab.exec("node/node1", [sys.executable, "-m", "kproxy_ebpf.cli.main", "services",
                                              "--bpffs-dir", node.bpffs, "-o", "wide",
                                              "--service", "default/ct-wide"],
                               capture_output=True, text=True, check=True).stdout
        header, *rows = out.splitlines()
        for column in ("CONNS", "PKTS IN/OUT", "BYTES IN/OUT", "REFUSED", "DROPPED", "DENIED"):
            assert column in header, header
        row = next(r for r in rows if "(all from the node)" in r)
        cells = row.split()
        assert cells[0] == "default/ct-wide:http"
        assert str(counters(cluster, "ct-wide")["conns"]) in cells, row
    finally:
        core.delete_namespaced_service("ct-wide", "default")
