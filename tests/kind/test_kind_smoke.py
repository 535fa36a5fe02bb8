"""The user's first step, for real, inside `make test`: hack/kind-up.sh makes a kind cluster
(kubelet, containerd, the ptp CNI, CoreDNS; kube-proxy disabled) from images made on this
machine, installs the chart with helm, runs `helm test` and its own ClusterIP, CoreDNS and
NodePort-from-outside checks; then upstream e2e.test runs the [Conformance] specs of
[sig-network] Services against kproxy-ebpf from a container on the kind network
(tools/kind/e2e.py --smoke), and hack/kind-down.sh removes everything. `make e2e` is the whole
[sig-network] suite beside kube-proxy nftables."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from kproxy_ebpf.dev.lab.binaries import repo_root

from ..support import require_root

ROOT = repo_root()
CLUSTER = "kproxy-smoke"


def _podman_names(*filters: str) -> list[str]:
    argv = ["podman", "ps", "-a", "--format", "{{.Names}}"] + [f"--filter={f}" for f in filters]
    return subprocess.run(argv, text=True, capture_output=True).stdout.split()


def leftovers() -> list[str]:
    """What the kind path may leave of this test's cluster: its node containers and, when no
    other cluster shares it (a user's `make kind-up`), the podman network and the host guard."""
    out = [n for n in _podman_names() if n.startswith(CLUSTER)]
    if [n for n in _podman_names("network=kproxy-kind") if not n.startswith(CLUSTER)]:
        return out
    if subprocess.run(["podman", "network", "exists", "kproxy-kind"]).returncode == 0:
        out.append("network kproxy-kind")
    rules = subprocess.run(["iptables", "-w", "-S", "FORWARD"], text=True, capture_output=True).stdout
    out += [r for r in rules.splitlines() if "KPROXY-KIND-GUARD" in r]
    return out


def remove_stale() -> None:
    """A run killed half-way (a session's end, CI's timeout) leaves its cluster behind: the name
    is this test's own, so hack/kind-down.sh removes it before the run, as it does after."""
    if leftovers():
        subprocess.run(["hack/kind-down.sh"], cwd=ROOT, env={**os.environ, "CLUSTER": CLUSTER}, check=False)
    assert not leftovers(), "hack/kind-down.sh could not remove what an earlier run left: see its output"


# kind-up, the node and e2e images when the cache is cold (~9 minutes), 15 specs: far past the
# suite's 300 s per test; the subprocess has its own limit.
@pytest.mark.timeout(3600)
def test_kind_install_path_and_conformance_services(tmp_path):
    require_root()
    remove_stale()
    out = tmp_path / "smoke.json"
    r = subprocess.run([sys.executable, "tools/kind/e2e.py", "--smoke", "--json-out", str(out)],
                       cwd=ROOT, timeout=3600)
    assert r.returncode == 0
    rep = json.loads(out.read_text())
    ran = [s for s in rep["specs"] if s["kproxy"]["state"] != "not-run"]
    # test/e2e/network/service.go holds 15 such specs in v1.36.3: all of them must have run.
    assert len(ran) >= 15, [s["spec"] for s in ran]
    failed = {s["spec"]: s["kproxy"] for s in ran if s["kproxy"]["state"] != "passed"}
    assert not failed
    run = rep["runs"][0]
    during = {n: run["guard_drops_after"]["nodes"][n] - run["guard_drops_before"]["nodes"].get(n, 0)
              for n in run["guard_drops_after"]["nodes"]}
    assert sum(during.values()) == 0 and run["guard_drops_after"]["host"] == run["guard_drops_before"]["host"], run
    # An operator's commands in the agent pod, with no flags (issue 27): the cluster DNS
    # Service's frontends, and a trace that lists the CoreDNS pods the API names.
    op = run["operator"]
    assert op["services_rc"] == 0 and op["dns_frontends"] >= 2, op        # 53/UDP, 53/TCP, ...
    assert op["trace_rc"] == 0 and op["trace"]["verdict"] == "forward", op
    assert sorted(c.rsplit(":", 1)[0] for c in op["trace"]["candidates"]) == op["coredns"], op
    assert "VERDICT" in op["trace_text"] and "kp_svc" in op["trace_text"], op
    # The DNS Service's traffic: CoreDNS is queried through it by every pod of the suite.
    header = op["wide"].splitlines()[0] if op["wide_rc"] == 0 else ""
    assert "CONNS" in header and "kube-system/kube-dns:dns" in op["wide"], op
    assert op["all_nodes_rc"] == 0, op
    assert len(op["all_nodes"]) >= 2 and all(n["clean"] for n in op["all_nodes"]), op
    # The same through the kubectl plugin, from outside the cluster: the worker's agent pod.
    assert op["worker"] and op["plugin_rc"] == 0 and op["plugin_dns_frontends"] >= 2, op
    assert op["plugin_check_rc"] == 0 and len(op["plugin_check"]) >= 2, op
    assert not leftovers()
