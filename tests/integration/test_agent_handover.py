"""The node-local steps of a migration from kube-proxy, with the lab's real API server:

* a kube-proxy stand-in (a process named kube-proxy holding 10256 in the node's network
  namespace) is on the node when the agent starts: the agent keeps running and programs the
  node, says the port is taken, leaves kube-proxy's leftovers alone; once the stand-in exits
  it serves /healthz and removes the leftovers (kubeProxyCleanup on), keeping the kubelet's;
* at SIGTERM the agent keeps its datapath while its DaemonSet runs on the node (a restart)
  and when the API server does not answer, and removes it (hooks, TC filters, pins) when the
  DaemonSet no longer selects the node, or is deleted (an uninstall).

Everything happens inside the lab nodes' network namespaces; no DaemonSet controller runs in
the lab, so the DaemonSet is only an object to ask about, as the agent does."""
from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from kubernetes import client

from ..support import lab_cluster, wait_until

pytestmark = [pytest.mark.root, pytest.mark.controlplane]

DS_NAME, DS_NS = "kproxy-ebpf", "kube-system"
# A process named kube-proxy (prctl PR_SET_NAME) that holds kube-proxy's healthz port.
STAND_IN = ("import ctypes, socket, time\n"
            "ctypes.CDLL(None).prctl(15, b'kube-proxy', 0, 0, 0)\n"
            "s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)\n"
            "s.bind(('0.0.0.0', 10256)); s.listen()\n"
            "time.sleep(600)\n")
LEFTOVERS = ("*nat\n:KUBE-SERVICES - [0:0]\n:KUBE-SVC-ABCDEF - [0:0]\n:KUBE-KUBELET-CANARY - [0:0]\n"
             "-A OUTPUT -m comment --comment \"kubernetes service portals\" -j KUBE-SERVICES\n"
             "-A KUBE-SERVICES -d 10.96.0.10/32 -p tcp --dport 53 -j KUBE-SVC-ABCDEF\n"
             "COMMIT\n")


@pytest.fixture(scope="module")
def cluster():
    with lab_cluster("kpho", "kproxy") as c:
        yield c


def agent_env(**extra: str) -> dict[str, str]:
    return {**os.environ, "KPROXY_DAEMONSET_NAME": DS_NAME, "KPROXY_DAEMONSET_NAMESPACE": DS_NS,
            **extra}


def in_node(c, node: str, argv: list[str], stdin: str | None = None) -> str:
    """Its output, without iptables-save's "# Generated ... on <date>" lines."""
    r = c.lab.exec(f"node/{node}", argv, input=stdin, capture_output=True, text=True,
                   timeout=60)
    assert r.returncode == 0, f"{argv}: {r.stdout}{r.stderr}"
    return "".join(line for line in r.stdout.splitlines(keepends=True)
                   if not line.startswith("#"))


def log_of(c, node: str, since: int = 0) -> str:
    """The agent's log (appended to by every agent of the node) from offset `since` on."""
    return Path(c.lab.log_path(c.proxy_name(node))).read_text()[since:]


def mark(c, node: str) -> int:
    return len(log_of(c, node))


def restart_agent(c, node: str, **env: str) -> None:
    c.stop_proxy(node)
    c.start_proxy(node, env=agent_env(**env))


def node_events(c, node: str, reason: str) -> list:
    return client.CoreV1Api(c.api()).list_namespaced_event(
        "default", field_selector=f"involvedObject.name={node},reason={reason}").items


def test_kube_proxys_port_taken_then_freed_and_its_leftovers_removed(cluster):
    c = cluster
    c.stop_proxy("node1")
    in_node(c, "node1", ["iptables-nft-restore", "--noflush"], LEFTOVERS)
    in_node(c, "node1", ["nft", "add", "table", "ip", "kube-proxy"])
    before = in_node(c, "node1", ["iptables-nft-save", "-t", "nat"])

    # dry-run: listed (log, gauge, Event), nothing changed
    at = mark(c, "node1")
    c.start_proxy("node1", env=agent_env(KPROXY_KUBE_PROXY_CLEANUP="dry-run"))
    wait_until(lambda: "kube-proxy's leftovers: listed (dry-run" in log_of(c, "node1", at), 60,
               lambda: "the dry-run's list; log:\n" + log_of(c, "node1", at)[-3000:])
    assert "kube-proxy leftover found (dry-run): nftables table ip kube-proxy" in \
        log_of(c, "node1", at)
    assert "kproxy_kubeproxy_leftovers 3.0" in c.agent_metrics("node1")
    assert in_node(c, "node1", ["iptables-nft-save", "-t", "nat"]) == before
    wait_until(lambda: node_events(c, "node1", "KubeProxyLeftoversFound"), 30, "the Event")
    c.stop_proxy("node1")

    stand_in = c.lab.spawn("node/node1", [sys.executable, "-c", STAND_IN], "stand-in").pid
    at = mark(c, "node1")
    try:
        c.start_proxy("node1", env=agent_env(KPROXY_KUBE_PROXY_CLEANUP="on"))
        wait_until(lambda: "all sources listed" in log_of(c, "node1", at), 60, "the agent's start")
        wait_until(lambda: 'kproxy_listen_port_in_use{server="healthz"} 1.0'
                   in c.agent_metrics("node1"), 30, "the port-in-use gauge")
        wait_until(lambda: "kube-proxy runs in this network namespace" in log_of(c, "node1", at),
                   60, "the agent waiting for kube-proxy to leave")
        assert "in use by another process (kube-proxy still running on this node?)" in \
            log_of(c, "node1", at)
        assert c.proxy_pid("node1") is not None                       # it did not die
        assert "KUBE-SERVICES" in in_node(c, "node1", ["iptables-nft-save", "-t", "nat"])
    finally:
        c.lab.kill(stand_in)
    c.wait_proxy_healthy("node1", timeout=30)                          # served once free
    assert "healthz: port 0.0.0.0:10256 is free now; serving healthz" in log_of(c, "node1", at)
    wait_until(lambda: "kube-proxy's leftovers: all removed" in log_of(c, "node1", at), 30,
               lambda: "the leftovers removed; log:\n" + log_of(c, "node1", at)[-3000:])
    nat = in_node(c, "node1", ["iptables-nft-save", "-t", "nat"])
    assert "KUBE-SERVICES" not in nat and "KUBE-SVC-ABCDEF" not in nat
    assert ":KUBE-KUBELET-CANARY" in nat                               # the kubelet's stays
    assert "kube-proxy" not in in_node(c, "node1", ["nft", "list", "tables"])
    assert "kube-proxy leftover removed: iptables-nft nat KUBE-SERVICES" in log_of(c, "node1", at)
    assert "kproxy_kubeproxy_leftovers_removed_total 3.0" in c.agent_metrics("node1")
    for reason in ("PortInUse", "PortFree", "KubeProxyLeftoversRemoved"):
        wait_until(lambda reason=reason: node_events(c, "node1", reason), 30, f"a {reason} Event")
    (removed,) = node_events(c, "node1", "KubeProxyLeftoversRemoved")
    assert removed.type == "Normal" and "removed 3 of kube-proxy's leftovers" in removed.message
    assert "Traceback" not in log_of(c, "node1", at), log_of(c, "node1", at)[-4000:]


def pinned(c, node: str) -> list[str]:
    root = Path(c.lab.node(node).bpffs)
    return sorted(str(p.relative_to(root)) for p in root.rglob("*")) if root.exists() else []


def tc_filters(c, node: str) -> str:
    return in_node(c, node, [sys.executable, "-c", "from kproxy_ebpf.datapath.load.tc import "
                             "attached; print(attached())"]).strip()


def cgroup_progs(c, node: str) -> str:
    return subprocess.run(["bpftool", "cgroup", "show", c.lab.node(node).cgroup],
                          capture_output=True, text=True, check=True).stdout


def test_a_restart_keeps_the_datapath_an_uninstall_or_a_node_taken_out_removes_it(cluster):
    c = cluster
    apps = client.AppsV1Api(c.api())
    labels = {"app": DS_NAME}
    body = {"metadata": {"name": DS_NAME, "namespace": DS_NS},
            "spec": {"selector": {"matchLabels": labels},
                     "template": {"metadata": {"labels": labels},
                                  "spec": {"nodeSelector": {"kubernetes.io/os": "linux"},
                                           "containers": [{"name": "agent",
                                                           "image": "localhost/kproxy-ebpf"}]}}}}
    apps.create_namespaced_daemon_set(DS_NS, body)
    try:
        for node in ("node1", "node2"):
            restart_agent(c, node)
            c.wait_proxy_healthy(node)
        before = pinned(c, "node1")
        assert any(p.startswith("links/") for p in before)

        # SIGTERM with the DaemonSet present and selecting the node: a restart
        at = mark(c, "node1")
        c.stop_proxy("node1")
        assert "the datapath stays programmed: DaemonSet kube-system/kproxy-ebpf still runs " \
               "on node node1" in log_of(c, "node1", at)
        assert pinned(c, "node1") == before and tc_filters(c, "node1") != "[]"
        assert "connect4" in cgroup_progs(c, "node1")
        c.start_proxy("node1", env=agent_env())
        c.wait_proxy_healthy("node1")

        # SIGTERM while the API server does not answer: kept, and said so
        kept = pinned(c, "node2")
        c.stop_apiserver()
        try:
            at = mark(c, "node2")
            c.stop_proxy("node2")
            assert "the API server did not answer whether DaemonSet kube-system/kproxy-ebpf " \
                   "still runs here" in log_of(c, "node2", at)
            assert pinned(c, "node2") == kept and tc_filters(c, "node2") != "[]"
        finally:
            c.start_apiserver()
        c.start_proxy("node2", env=agent_env())
        c.wait_proxy_healthy("node2")

        # node1 taken out (the DaemonSet's nodeSelector no longer matches it)
        apps.patch_namespaced_daemon_set(DS_NAME, DS_NS, {"spec": {"template": {"spec": {
            "nodeSelector": {"kubernetes.io/os": "linux", "pool": "elsewhere"}}}}})
        at = mark(c, "node1")
        c.stop_proxy("node1")
        assert "removing the datapath from this node: DaemonSet kube-system/kproxy-ebpf no " \
               "longer selects node node1" in log_of(c, "node1", at)
        assert pinned(c, "node1") == [] and tc_filters(c, "node1") == "[]"
        assert "connect4" not in cgroup_progs(c, "node1")
        assert "nothing of kproxy-ebpf is left on this node" in log_of(c, "node1", at)

        # helm uninstall: the DaemonSet deleted, then its pods get SIGTERM. By then helm has
        # deleted the agent's ServiceAccount and RBAC too and the API server no longer answers
        # it (test_chart_api.py): here it answers nobody, and the agent's watch decides.
        apps.delete_namespaced_daemon_set(DS_NAME, DS_NS)
        time.sleep(2)                    # the watch event; the garbage collector takes longer
        at = mark(c, "node2")
        c.stop_apiserver()
        try:
            c.stop_proxy("node2")
        finally:
            c.start_apiserver()
        assert "DaemonSet kube-system/kproxy-ebpf is gone (uninstalled)" in log_of(c, "node2", at)
        assert pinned(c, "node2") == [] and tc_filters(c, "node2") == "[]"
        assert "connect4" not in cgroup_progs(c, "node2")
    finally:
        try:
            apps.delete_namespaced_daemon_set(DS_NAME, DS_NS)
        except client.ApiException as exc:
            if exc.status != 404:
                raise
