"""The lab CLI end to end, as separate processes (the interface the demo and benchmarks use):
lab up, pod create, kubectl against the lab's API server, probe, exec, services -o json,
pod delete, lab down. Lab "labcli": node1/node2, pods web-1 (node1), web-2 and client (node2)."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from kproxy_ebpf.dev.lab.binaries import k8s_bin_dir

from ..support import require_controlplane, wait_until

pytestmark = [pytest.mark.root, pytest.mark.controlplane]

LAB = ["--lab", "labcli"]


def kp(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "kproxy_ebpf.cli.main", *args], capture_output=True,
                          text=True, check=check, timeout=180)


@pytest.fixture(scope="module")
def lab_up():
    require_controlplane()
    kp("lab", "down", *LAB, check=False)
    try:
        out = kp("lab", "up", *LAB, "--nodes", "2", "--proxy", "kproxy")
        assert "is up" in out.stdout
        yield
    finally:
        down = kp("lab", "down", *LAB, check=False)
        assert down.returncode == 0, down.stderr


def test_lab_cli_round_trip(lab_up):
    kubeconfig = kp("lab", "kubeconfig", *LAB).stdout.strip()
    assert os.path.exists(kubeconfig)
    status = json.loads(kp("lab", "status", *LAB).stdout)
    assert set(status["nodes"]) == {"node1", "node2"}

    for name, node, labels in (("web-1", "node1", "app=web"), ("web-2", "node2", "app=web"),
                               ("client", "node2", "role=client")):
        out = kp("lab", "pod", "create", *LAB, name, "--node", node, "--labels", labels)
        assert out.stdout.startswith(f"pod {name} on {node}: 10.244.")

    kubectl = [str(k8s_bin_dir() / "kubectl"), "--kubeconfig", kubeconfig]
    subprocess.run(kubectl + ["create", "service", "clusterip", "web", "--tcp=80:8080"],
                   check=True, capture_output=True)
    ip = subprocess.run(kubectl + ["get", "service", "web", "-o", "jsonpath={.spec.clusterIP}"],
                        check=True, capture_output=True, text=True).stdout
    assert ip.startswith("10.96.")

    def served_by(all_ok: bool = False) -> set[str] | None:
        """The pods answering 20 probes from the client, through the CLI (None: the probe
        command failed and `all_ok` was asked)."""
        probe = kp("lab", "probe", *LAB, "--pod", "client", f"{ip}:80", "--count", "20",
                   check=False)
        if all_ok and probe.returncode != 0:
            return None
        return {line.split()[0] for line in probe.stdout.splitlines()}

    wait_until(lambda: served_by(all_ok=True) == {"web-1", "web-2"}, 30, "both pods behind the Service",
               step=0.3)

    bpffs = "/sys/fs/bpf/kproxy-labcli-node2"        # kproxy-<lab>-<node>
    services = json.loads(kp("lab", "exec", *LAB, "--node", "node2", "--", sys.executable, "-m",
                             "kproxy_ebpf.cli.main", "services", "--bpffs-dir", bpffs, "-o",
                             "json").stdout)
    web = [s for s in services if s["service"] == "default/web:80-8080"]
    assert len(web) == 1 and web[0]["address"] == ip and web[0]["type"] == "ClusterIP"
    assert sorted(b["state"] for b in web[0]["backends"]) == ["ready", "ready,local"]

    # On a node, `lab exec` names its pins, kubeconfig and name: no flags needed.
    on_node2 = ["lab", "exec", *LAB, "--node", "node2", "--", sys.executable, "-m",
                "kproxy_ebpf.cli.main"]
    status = kp(*on_node2, "status").stdout
    assert f"pinned under {bpffs}" in status, status
    assert "connect4      prog" in status and "kproxy-labcli/node2" in status, status
    assert "agent: healthy" in status, status
    # The README's forms exactly as written: the checkout's kproxy-ebpf on the node's PATH,
    # the node's hook cgroup passed (trace --from a pod's address finds its netns).
    plain = kp("lab", "exec", *LAB, "--node", "node2", "--", "kproxy-ebpf", "status").stdout
    assert "agent: healthy" in plain and "IPv6" not in plain, plain        # an IPv4 lab
    client_ip = json.loads(kp("lab", "status", *LAB).stdout)["pods"]["client"]["ip"]
    traced = kp("lab", "exec", *LAB, "--node", "node2", "--", "kproxy-ebpf", "trace",
                f"{ip}:80", "--from", client_ip, "--explain", check=False)
    assert traced.returncode == 0 and "give --from" not in traced.stdout + traced.stderr, \
        traced.stdout + traced.stderr
    check = kp(*on_node2, "check", check=False)
    assert check.returncode == 0 and " 0 differences" in check.stdout, check.stdout + check.stderr
    # The host's admin kubeconfig (127.0.0.1) is not reachable from the node: one sentence.
    check = kp(*on_node2, "check", "--kubeconfig", kubeconfig, check=False)
    assert check.returncode == 1 and "Traceback" not in check.stdout + check.stderr
    assert "cannot list the cluster at https://127.0.0.1:" in check.stderr, check.stderr

    exec_rc = kp("lab", "exec", *LAB, "--pod", "client", "--", "sh", "-c", "exit 7", check=False)
    assert exec_rc.returncode == 7, "lab exec passes the exit code through"

    kp("lab", "pod", "delete", *LAB, "web-1")
    wait_until(lambda: served_by() == {"web-2"}, 30, "web-1 gone from the Service", step=0.3)
