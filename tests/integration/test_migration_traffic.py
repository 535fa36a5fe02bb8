"""A node handed over from kube-proxy to kproxy-ebpf and back under traffic, counted per step
(the lab version of `make migrate`). Real kube-proxy (nftables, then iptables mode) runs on
both lab nodes; node1 is migrated. Traffic, all from lab namespaces (lab/traffic.py):

* from a pod on node1 to the Service's ClusterIP: long-lived TCP connections (a message every
  100 ms), new TCP connections at 20/s, UDP queries at 20/s;
* from the lab's external namespace to node1's NodePort: the same three kinds;
* once the agent alone serves, both clients open LONG more long-lived connections ("long1",
  SIGUSR1 to lab/traffic.py): the agent's own, for the way back.

The Service has a backend on each node (eTP Cluster: the remote one is reached with SNAT).
Steps: kube-proxy alone; the agent starts beside it; kube-proxy stops; its leftovers are
removed (`kproxy-ebpf cleanup --kube-proxy-leftovers`, the code the agent's kubeProxyCleanup
runs, as a step of its own so that its effect is told from kube-proxy's exit); the agent
alone; kube-proxy starts again; the agent leaves with its datapath (the uninstall path: its
DaemonSet no longer selects the node); kube-proxy alone. Each step's failures are printed and
checked against what the kernel allows
(docs/design/deployment.md "Node-local steps of a migration")."""
from __future__ import annotations

import collections
import json
import os
import re
import signal
import sys
import time
from pathlib import Path

import pytest
from kubernetes import client

from kproxy_ebpf.dev.lab import traffic

from ..builders import api_service
from ..support import lab_cluster, wait_until

pytestmark = [pytest.mark.root, pytest.mark.controlplane]

DS_NAME, DS_NS = "kproxy-ebpf", "kube-system"
AGENT = "agent-node1"
SETTLE = 4.0          # seconds of traffic per step once the step's change is done
LONG = 3              # long-lived TCP connections per client
# What the kernel cannot carry over, measured (docs/design/deployment.md "Node-local steps of a
# migration"; docs/migrate.md), at most this many failures per step and traffic kind:
# - the TC path's own long-lived connections (NodePort from outside, opened while the agent
#   alone served) when its programs detach: their NAT lived in kp_ct only, and kube-proxy's
#   rules balance their next segment as a new flow, which the backend resets (3/3 measured in
#   both modes);
# - a NodePort UDP query or TCP handshake in flight across that detach (its request translated
#   by the TC path, its answer after: not translated back); 0-1 measured per run.
# kube-proxy's own connections across its exit and its rules' removal: 0 (kproxy-nat-hold).
KNOWN_BREAKS = {("agent leaves with its datapath", "ext long1"): LONG,
                ("agent leaves with its datapath", "ext udp"): 2,
                ("agent leaves with its datapath", "ext new"): 2}


def in_node(c, node: str, argv: list[str]) -> str:
    return c.lab.exec(f"node/{node}", argv, capture_output=True, text=True, timeout=60).stdout


def kube_proxy_rules(c, node: str) -> str:
    return in_node(c, node, ["nft", "list", "ruleset"]) + in_node(c, node, ["iptables-save"])


def nat_flows(c) -> int:
    """TCP flows node1's netfilter conntrack holds with a NAT binding (kube-proxy's)."""
    out = in_node(c, "node1", ["conntrack", "-L", "-p", "tcp", "--dst-nat"])
    return sum(1 for line in out.splitlines() if "ESTABLISHED" in line)


def agent_log(c, since: int = 0) -> str:
    path = Path(c.lab.log_path(AGENT))
    return path.read_text()[since:] if path.exists() else ""


class Steps:
    """Step boundaries on the clock the traffic lines carry."""

    def __init__(self) -> None:
        self.marks: list[tuple[str, float]] = []

    def begin(self, name: str) -> None:
        self.marks.append((name, time.time()))

    def counts(self, paths: dict[str, Path]) -> dict[str, dict[str, dict[str, int]]]:
        """{step: {"<source> <kind>": {"ok": n, "failed": n}}}, and the failure reasons."""
        out: dict[str, dict[str, dict[str, int]]] = {n: {} for n, _ in self.marks}
        for source, path in paths.items():
            for line in path.read_text().splitlines():
                t, kind, ok, *reason = line.split()
                step = next((n for n, start in reversed(self.marks) if float(t) >= start), None)
                if step is None:
                    continue
                row = out[step].setdefault(f"{source} {kind}", collections.Counter())
                row["ok" if ok == "1" else "failed"] += 1
                if ok != "1":
                    row[f"why:{reason[0] if reason else '?'}"] += 1
        return {s: {k: dict(v) for k, v in rows.items()} for s, rows in out.items()}


def failed(counts: dict, step: str, key: str) -> int:
    return counts[step].get(key, {}).get("failed", 0)


@pytest.fixture(scope="module", params=["nftables", "iptables"])
def cluster(request):
    with lab_cluster(f"kpmig-{request.param[:3]}", request.param) as c:
        yield c


def test_handover_to_kproxy_and_back_under_traffic(cluster, tmp_path):
    c = cluster
    mode = c.info.proxy
    core, apps = client.CoreV1Api(c.api()), client.AppsV1Api(c.api())
    for name, node in (("be1", "node1"), ("be2", "node2")):
        c.create_pod(name, node, labels={"app": "mig"})
    c.create_pod("client", "node1", ports=(("tcp", 8080),))
    body = api_service("mig", None, selector={"app": "mig"}, type="NodePort",
                       ports=[{"name": "tcp", "port": 80, "targetPort": 8080, "protocol": "TCP"},
                              {"name": "udp", "port": 53, "targetPort": 5353,
                               "protocol": "UDP"}])
    svc = core.create_namespaced_service("default", body)
    cip = svc.spec.cluster_ip
    nport = {p.protocol: p.node_port for p in svc.spec.ports}
    node_ip = c.lab.node("node1").ip
    wait_until(lambda: cip in kube_proxy_rules(c, "node1"), 30, "kube-proxy's rules on node1")
    wait_until(lambda: c.lab.probe("ext", node_ip, nport["TCP"])[0].split()[0] in ("be1", "be2"), 30,
               "the NodePort through kube-proxy")

    # The DaemonSet the agent asks about at SIGTERM (no controller runs it in the lab).
    labels = {"app": DS_NAME}
    apps.create_namespaced_daemon_set(DS_NS, {
        "metadata": {"name": DS_NAME, "namespace": DS_NS},
        "spec": {"selector": {"matchLabels": labels},
                 "template": {"metadata": {"labels": labels},
                              "spec": {"nodeSelector": {"kubernetes.io/os": "linux"},
                                       "containers": [{"name": "agent",
                                                       "image": "localhost/kproxy-ebpf"}]}}}})
    env = {**os.environ, "KPROXY_DAEMONSET_NAME": DS_NAME, "KPROXY_DAEMONSET_NAMESPACE": DS_NS}
    paths = {"pod": tmp_path / "pod.log", "ext": tmp_path / "ext.log"}
    script = [sys.executable, traffic.__file__, "--long", str(LONG), "--rate", "20"]
    gens = [c.lab.spawn("pod/client", script + ["--out", str(paths["pod"]), "--tcp", f"{cip}:80",
                                                "--udp", f"{cip}:53"], "traffic-pod").pid,
            c.lab.spawn("ext", script + ["--out", str(paths["ext"]),
                                         "--tcp", f"{node_ip}:{nport['TCP']}",
                                         "--udp", f"{node_ip}:{nport['UDP']}"], "traffic-ext").pid]
    steps, agent, midstream = Steps(), None, None
    tracked: dict[str, int] = {}
    try:
        steps.begin("kube-proxy")
        time.sleep(SETTLE)

        steps.begin("agent starts beside kube-proxy")
        agent = c.start_proxy("node1", mode="kproxy", env=env, name=AGENT)
        wait_until(lambda: "all sources listed" in agent_log(c), 60, "the agent's first sync")
        time.sleep(SETTLE)

        steps.begin("kube-proxy stops")
        tracked["kube-proxy running"] = nat_flows(c)
        c.stop_proxy("node1")
        time.sleep(SETTLE)
        tracked["kube-proxy stopped"] = nat_flows(c)

        # What the agent's kubeProxyCleanup does once kube-proxy is gone (the same code), run
        # here as its own step so that its effect is told from kube-proxy's exit.
        steps.begin("kube-proxy's leftovers removed")
        r = c.lab.exec("node/node1", [sys.executable, "-m", "kproxy_ebpf.cli.main", "cleanup",
                                      "--kube-proxy-leftovers", "--yes"],
                       capture_output=True, text=True, timeout=60)
        assert r.returncode == 0, r.stdout + r.stderr
        time.sleep(SETTLE)
        tracked["leftovers removed"] = nat_flows(c)
        assert cip not in kube_proxy_rules(c, "node1")

        steps.begin("agent alone")
        # The agent's own long-lived connections ("long1"), for the way back: the pod's through
        # the socket hooks, the outside client's through the TC path.
        for pid in gens:
            os.kill(pid, signal.SIGUSR1)
        time.sleep(SETTLE)
        # kube-proxy's NodePort connections crossed the TC path mid-stream and were left alone
        midstream = re.search(r'kproxy_datapath_events_total\{event="tc_midstream"\} (\S+)',
                              c.agent_metrics("node1"))

        steps.begin("kube-proxy starts again")
        c.start_proxy("node1", mode=mode)
        wait_until(lambda: cip in kube_proxy_rules(c, "node1"), 60, "kube-proxy's rules again")
        time.sleep(SETTLE)

        steps.begin("agent leaves with its datapath")
        apps.patch_namespaced_daemon_set(DS_NAME, DS_NS, {"spec": {"template": {"spec": {
            "nodeSelector": {"kubernetes.io/os": "linux", "pool": "elsewhere"}}}}})
        time.sleep(1)                    # the agent's watch sees the change
        at = len(agent_log(c))
        c.lab.kill(agent)
        agent = None
        assert "nothing of kproxy-ebpf is left on this node" in agent_log(c, at)
        time.sleep(SETTLE)

        steps.begin("kube-proxy alone again")
        time.sleep(SETTLE)
        steps.begin("end")
    finally:
        for pid in gens:
            c.lab.kill(pid)
        if agent is not None:
            c.lab.kill(agent)
        apps.delete_namespaced_daemon_set(DS_NAME, DS_NS)
    counts = steps.counts(paths)
    counts.pop("end", None)
    print(f"\n{mode}:\n" + json.dumps(counts, indent=1))
    print(f"NATed TCP flows in node1's conntrack: {tracked}")
    out = os.environ.get("KPROXY_MIGRATE_RESULTS")
    if out:
        Path(out).with_suffix(f".{mode}.json").write_text(json.dumps(counts, indent=1) + "\n")
    assert midstream and float(midstream.group(1)) > 0, "tc_midstream counted"
    assert all(counts["agent alone"].get(f"{src} long1", {}).get("ok") for src in paths), \
        "the agent's own long-lived connections ran"
    # Nothing may fail but what KNOWN_BREAKS lists (at most one break per long-lived connection).
    for step in counts:
        for key in counts[step]:
            allowed = KNOWN_BREAKS.get((step, key), 0)
            assert failed(counts, step, key) <= allowed, (step, key, counts[step][key])
