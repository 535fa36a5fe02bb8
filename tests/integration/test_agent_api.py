"""Our agent against API-server trouble: an outage (the datapath stays as it was, then the agent
reconnects and converges) and a forced 410 Gone (a relist that neither duplicates nor loses an
entry). Lab "it-api", kproxy on both nodes; conventions as in lab_services.py."""
from __future__ import annotations

import os
import signal
import subprocess
import sys

import pytest
from kubernetes import client

from kproxy_ebpf.dev.lab.cluster import Cluster

from ..support import lab_cluster, wait_until
from .lab_services import delete_service, make_service, metric, pods_of, served_by, services_on

pytestmark = [pytest.mark.root, pytest.mark.controlplane]


@pytest.fixture(scope="module")
def cluster():
    with lab_cluster("it-api", "kproxy", client_pod=True) as c:
        yield c


def check(c: Cluster, node: str) -> subprocess.CompletedProcess:
    """`kproxy-ebpf check` on the node: the maps against a fresh list of the cluster."""
    return c.lab.exec(f"node/{node}", [sys.executable, "-m", "kproxy_ebpf.cli.main", "check",
                                       "--bpffs-dir", c.lab.node(node).bpffs, "--kubeconfig",
                                       c.info.lab_kubeconfig, "--hostname-override", node],
                      capture_output=True, text=True)


def test_api_outage_keeps_the_datapath_and_the_agent_converges_after(cluster):
    for name, node in (("out-1", "node1"), ("out-2", "node2")):
        cluster.create_pod(name, node, labels={"app": "out"})
    ip = make_service(cluster, "outage", "out")
    wait_until(lambda: served_by(cluster, ip, count=30) == {"out-1", "out-2"}, 15, "2 backends")
    # The EndpointSlice controller stamps each change; the agent reports trigger -> programmed.
    assert metric(cluster, "node1", "kproxy_network_programming_duration_seconds_count") >= 1
    # The API server removes itself from the `kubernetes` Service when it shuts down (a real
    # change the agent applies before the outage); compare everything else.
    def ours():
        return [s for s in services_on(cluster, "node1") if s["service"] != "default/kubernetes:https"]
    programmed = ours()

    cluster.stop_apiserver()
    try:
        lines = cluster.lab.probe("pod/client", ip, 80, count=150, interval=0.02)
        assert set(pods_of(lines)) == {"out-1", "out-2"}, "the datapath serves while the API is away"
        assert ours() == programmed, "nothing was removed or rewritten"
    finally:
        cluster.start_apiserver()

    # A change made after the outage reaches the datapath: the agent reconnected by itself.
    ip2 = make_service(cluster, "after-outage", "out")
    wait_until(lambda: served_by(cluster, ip2, count=20) == {"out-1", "out-2"}, 40,
               "a service created after the outage")
    assert metric(cluster, "node1", "kproxy_api_watch_restarts_total", 'resource="services"') >= 1
    for name in ("outage", "after-outage"):
        delete_service(cluster, name)


def test_agent_started_while_the_api_is_dead_keeps_the_datapath_then_converges(cluster):
    cluster.create_pod("dead-1", "node2", labels={"app": "dead"})
    ip = make_service(cluster, "dead", "dead")
    wait_until(lambda: served_by(cluster, ip, count=5) == {"dead-1"}, 20, "service dead")

    cluster.stop_apiserver()
    try:
        cluster.stop_proxy("node1")                 # the agent exits; its datapath stays
        cluster.start_proxy("node1")                # and a new one starts with no API
        log_path = cluster.lab.log_path(cluster.proxy_name("node1"))
        wait_until(lambda: open(log_path).read().count("adopted") >= 2, 30,
                   "the second agent to adopt the pinned maps")
        lines = cluster.lab.probe("pod/client", ip, 80, count=50, interval=0.02)
        assert set(pods_of(lines)) == {"dead-1"}, "the adopted datapath serves with no API"
    finally:
        cluster.start_apiserver()
    ip2 = make_service(cluster, "dead-after", "dead")
    wait_until(lambda: served_by(cluster, ip2, count=5) == {"dead-1"}, 60,
               "the new agent to converge once the API is back")
    for name in ("dead", "dead-after"):
        delete_service(cluster, name)


def test_forced_410_relists_without_duplicates_or_losses(cluster):
    core = client.CoreV1Api(cluster.api())
    cluster.create_pod("gone-a", "node2", labels={"app": "rl-a"})
    cluster.create_pod("gone-b", "node2", labels={"app": "rl-b"})
    ip_a = make_service(cluster, "rl-a", "rl-a")
    wait_until(lambda: served_by(cluster, ip_a), 20, "service rl-a")
    relists_before = metric(cluster, "node1", "kproxy_api_relists_total", 'resource="services"')

    # Freeze node1's agent, change the cluster behind its back, compact etcd past what it has
    # seen and restart the API server (its watch cache would otherwise still serve the old
    # resourceVersion): when the agent wakes, its watch can only get 410 Gone.
    agent = cluster.proxy_pid("node1")
    os.kill(agent, signal.SIGSTOP)
    try:
        delete_service(cluster, "rl-a")
        ip_b = make_service(cluster, "rl-b", "rl-b")
        for i in range(20):
            core.create_namespaced_config_map("default", {"metadata": {"name": f"rl-{i}"}})
        cluster.compact_etcd()
        cluster.restart_apiserver()
    finally:
        os.kill(agent, signal.SIGCONT)

    wait_until(lambda: metric(cluster, "node1", "kproxy_api_relists_total",
                              'resource="services"') > relists_before, 40, "a relist after 410")
    wait_until(lambda: served_by(cluster, ip_b, count=5) == {"gone-b"}, 20, "rl-b programmed")
    wait_until(lambda: not served_by(cluster, ip_a), 20, "rl-a removed by the relist")
    names = [s["service"] for s in services_on(cluster, "node1")]
    assert "default/rl-a:http" not in names
    assert names.count("default/rl-b:http") == 1
    frontends = [(s["address"], s["port"], s["protocol"]) for s in services_on(cluster, "node1")]
    assert len(frontends) == len(set(frontends))
    # The frozen agent now holds the same frontends as node2's, which never stopped (backend
    # states differ only in which node calls them local).
    def view(node):
        return sorted((s["service"], s["address"], s["port"], s["protocol"], s["action"],
                       tuple(sorted(b["address"] for b in s["backends"])))
                      for s in services_on(cluster, node))
    wait_until(lambda: view("node1") == view("node2"), 30, "node1 and node2 to agree")
    result = check(cluster, "node1")
    assert result.returncode == 0, f"node1 differs from the cluster:\n{result.stdout}"
    delete_service(cluster, "rl-b")
    for i in range(20):
        core.delete_namespaced_config_map(f"rl-{i}", "default")


KUBE_PROXY_MOVING = ("kubeproxy_sync_proxy_rules_service_changes_total",
                     "kubeproxy_sync_proxy_rules_endpoint_changes_total",
                     "kubeproxy_sync_proxy_rules_last_timestamp_seconds")
NO_LOCAL = ("kubeproxy_sync_proxy_rules_no_local_endpoints_total",
            'ip_family="IPv4",traffic_policy="internal"')


def test_kube_proxys_metric_names_are_served_and_move_with_a_service(cluster):
    """A dashboard or alert written for kube-proxy reads this agent unchanged: kube-proxy's
    names are on the agent's metrics port and follow a Service change; an
    internalTrafficPolicy Local Service whose one endpoint is on the other node counts in
    node1's no_local_endpoints, and no longer once it is gone."""
    before = {n: metric(cluster, "node1", n) for n in KUBE_PROXY_MOVING}
    no_local = metric(cluster, "node1", *NO_LOCAL)
    cluster.create_pod("km-1", "node2", labels={"app": "km"})
    ip = make_service(cluster, "kube-names", "km")
    client.CoreV1Api(cluster.api()).patch_namespaced_service(
        "kube-names", "default", {"spec": {"internalTrafficPolicy": "Local"}})
    try:
        wait_until(lambda: all(metric(cluster, "node1", n) > v for n, v in before.items()), 20,
                   "kube-proxy's change counters and last sync time moved")
        wait_until(lambda: metric(cluster, "node1", *NO_LOCAL) == no_local + 1, 20,
                   "the Local Service without a local endpoint counted")
        assert served_by(cluster, ip, count=3) == set(), "node1 has no local endpoint: dropped"
        assert metric(cluster, "node1", "kubeproxy_sync_proxy_rules_duration_seconds_count",
                      'ip_family="IPv4"') >= 1
        assert metric(cluster, "node1", "kubeproxy_network_programming_duration_seconds_count",
                      'ip_family="IPv4"') >= 1
    finally:
        delete_service(cluster, "kube-names")
        cluster.delete_pod("km-1")
    wait_until(lambda: metric(cluster, "node1", *NO_LOCAL) == no_local, 20, "uncounted after")
