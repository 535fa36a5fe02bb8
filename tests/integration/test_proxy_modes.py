"""How each proxy runs in the lab cluster (real kube-apiserver, EndpointSlice controller, one
proxy per node): our agent as a process and from the container image with the Helm chart's pod
spec, and upstream kube-proxy (iptables, nftables). The Service behaviour itself is compared in
tests/conformance; here: the chart's helm-test pod, cgroup placement and capabilities, and a
proxy killed and restarted.

Conventions: lab "it-<proxy>", node1 10.250.0.11 (zone-a), node2 10.250.0.12 (zone-b), client
pod on node1; backends on both nodes; namespace default; Service IPs allocated by the API
server from 10.96.0.0/16.
"""
from __future__ import annotations

import os
import sys

import pytest
from kubernetes import client

from ..support import lab_cluster, wait_until
from .lab_services import delete_service, make_service, served_by

pytestmark = [pytest.mark.root, pytest.mark.controlplane]

# "image": our agent from the container image with the Helm chart's DaemonSet pod spec
# (capabilities, mounts, ServiceAccount token, config), not privileged (make image).
MODES = {"kproxy": ("kproxy", "process"), "image": ("kproxy", "image"),
         "iptables": ("iptables", "process"), "nftables": ("nftables", "process")}


@pytest.fixture(scope="module", params=list(MODES))
def cluster(request):
    proxy, agent = MODES[request.param]
    with lab_cluster(f"it-{request.param}", proxy, agent, client_pod=True) as c:
        yield c


def test_the_charts_helm_test_pod_reaches_the_kubernetes_clusterip(cluster):
    """The chart's `helm test` hook, run from a lab pod: the API server through the
    `kubernetes` Service's ClusterIP (the kubelet's KUBERNETES_SERVICE_HOST/PORT)."""
    from kproxy_ebpf.dev.lab import agent_image

    (pod,) = agent_image.helm_template({}, extra_args=(
        "--show-only", "templates/tests/test-clusterip.yaml"))
    command = pod["spec"]["containers"][0]["command"]
    svc = client.CoreV1Api(cluster.api()).read_namespaced_service("kubernetes", "default")
    env = {"KUBERNETES_SERVICE_HOST": svc.spec.cluster_ip,
           "KUBERNETES_SERVICE_PORT": str(svc.spec.ports[0].port)}
    # The image's python is the host's here (the lab pod is a namespace, not a container).
    r = cluster.lab.exec("pod/client", [sys.executable, *command[1:]], env=env,
                         capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stdout + r.stderr
    assert f"ClusterIP {svc.spec.cluster_ip}:443 answered: v1." in r.stdout


CAPS = {"DAC_READ_SEARCH": 2, "NET_ADMIN": 12, "NET_RAW": 13, "SYS_PTRACE": 19,
        "SYS_ADMIN": 21, "BPF": 39}          # linux/capability.h


def test_each_proxy_runs_inside_its_nodes_cgroup_and_the_image_agent_as_the_chart_says(cluster):
    """Every proxy process lives in its node's cgroup (the image agent through podman's
    --cgroup-parent). The image agent has exactly the chart's capabilities, not privileged."""
    import subprocess

    from kproxy_ebpf.dev.lab import agent_image

    (ds,) = [o for o in agent_image.helm_template({}) if o["kind"] == "DaemonSet"]
    chart_caps = ds["spec"]["template"]["spec"]["containers"][0]["securityContext"][
        "capabilities"]["add"]
    for node in cluster.lab.nodes():
        pid = cluster.proxy_pid(node.name)
        if cluster.info.agent == "image":          # the recorded pid is the podman client
            pid = int(subprocess.run(
                ["podman", "inspect", "-f", "{{.State.Pid}}",
                 agent_image.container_name(cluster.lab.name, node.name)],
                capture_output=True, text=True, check=True).stdout)
        with open(f"/proc/{pid}/cgroup") as f:
            v2 = next(line.split(":", 2)[2].strip() for line in f if line.startswith("0::"))
        assert ("/sys/fs/cgroup/unified" + v2).startswith(node.cgroup + "/"), v2
        if cluster.info.agent == "image":
            with open(f"/proc/{pid}/status") as f:
                status = dict(line.split(":", 1) for line in f)
            want = sum(1 << CAPS[c] for c in chart_caps)
            for field in ("CapEff", "CapPrm", "CapBnd"):
                assert int(status[field], 16) == want, (field, status[field])
            assert status["NoNewPrivs"].strip() == "0"   # as the chart leaves it (SYS_ADMIN)
            # `status` in the agent's container says where the hooks are, and no warning.
            out = wait_until(lambda node=node: _container_status(cluster, node.name), 15,
                             "the hooks to be attached")
            assert {h["cgroup"] for h in out["hooks"]} == {"/run/kproxy-ebpf/cgroup"}
            assert {h["cgroup_id"] for h in out["hooks"]} == {os.stat(node.cgroup).st_ino}
            assert out["warnings"] == [] and out["agent"]["status"] == 200


def _container_status(cluster, node: str) -> dict | None:
    import json
    import subprocess

    from kproxy_ebpf.dev.lab import agent_image

    r = subprocess.run(["podman", "exec", agent_image.container_name(cluster.lab.name, node),
                        "kproxy-ebpf", "status", "--bpffs-dir", "/sys/fs/bpf/kproxy", "-o",
                        "json"], capture_output=True, text=True, check=True)
    out = json.loads(r.stdout)
    return out if all(h["pinned"] for h in out["hooks"]) else None


def test_a_proxy_killed_and_restarted_adopts_its_node_and_programs_new_services(cluster):
    """A crash (SIGKILL) and a restart of node1's proxy, as a DaemonSet pod restart: the old
    Service keeps answering, a Service made after the restart is programmed. For the image
    agent this is where the chart's capabilities must also cover adopting existing pins."""
    cluster.create_pod("crash-1", "node2", labels={"app": "crash"})
    ip = make_service(cluster, "crash", "crash")
    wait_until(lambda: served_by(cluster, ip), 15, "the service to answer")
    cluster.stop_proxy("node1", hard=True)
    cluster.start_proxy("node1")
    cluster.wait_proxy_healthy("node1")
    assert served_by(cluster, ip, count=5) == {"crash-1"}
    cluster.create_pod("after-1", "node2", labels={"app": "after"})
    ip2 = make_service(cluster, "after", "after")
    wait_until(lambda: served_by(cluster, ip2), 20, "a service made after the restart")
    assert cluster.proxy_pid("node1") is not None, "the restarted proxy is gone"
    for name in ("crash", "after"):
        delete_service(cluster, name)
        cluster.delete_pod(f"{name}-1")
