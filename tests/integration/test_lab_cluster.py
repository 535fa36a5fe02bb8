"""The lab as a cluster against a real kube-apiserver, kube-controller-manager (EndpointSlice
controller) and one proxy per node. The same probes run with our agent and with upstream
kube-proxy (iptables, nftables): the baseline is real, and where our behaviour differs the
test says so.

Conventions: lab "it-<proxy>", node1 10.250.0.11 (zone-a), node2 10.250.0.12 (zone-b), client
pod on node1; backends on both nodes; namespace default; Service IPs allocated by the API
server from 10.96.0.0/16.
"""
from __future__ import annotations

import os
import sys
import threading
import time
from collections import Counter

import pytest
from kubernetes import client

from kproxy_ebpf.lab.cluster import Cluster

from ..support import require_controlplane, wait_until

pytestmark = [pytest.mark.root, pytest.mark.controlplane]

# "image": our agent from the container image with the Helm chart's DaemonSet pod spec
# (capabilities, mounts, ServiceAccount token, config), not privileged (make image).
MODES = {"kproxy": ("kproxy", "process"), "image": ("kproxy", "image"),
         "iptables": ("iptables", "process"), "nftables": ("nftables", "process")}


@pytest.fixture(scope="module", params=list(MODES))
def cluster(request):
    require_controlplane()
    proxy, agent = MODES[request.param]
    c = Cluster(f"it-{request.param}")
    c.down()
    c.up(nodes=2, proxy=proxy, agent=agent)
    try:
        c.create_pod("client", "node1", ports=(("tcp", 8080),))
        yield c
    finally:
        problems = c.down()
        assert not problems, problems


def make_service(c: Cluster, name: str, app: str, udp: bool = False) -> str:
    ports = [{"name": "http", "port": 80, "targetPort": 8080, "protocol": "TCP"}]
    if udp:
        ports.append({"name": "dns", "port": 53, "targetPort": 5353, "protocol": "UDP"})
    body = {"apiVersion": "v1", "kind": "Service", "metadata": {"name": name},
            "spec": {"selector": {"app": app}, "ports": ports}}
    return client.CoreV1Api(c.api()).create_namespaced_service("default", body).spec.cluster_ip


def delete_service(c: Cluster, name: str) -> None:
    client.CoreV1Api(c.api()).delete_namespaced_service(name, "default")


def pods_of(lines: list[str]) -> Counter:
    return Counter(line.split()[0] for line in lines)


def served_by(c: Cluster, ip: str, count: int = 1, port: int = 80, udp: bool = False) -> set[str]:
    return set(pods_of([x for x in c.lab.probe("pod/client", ip, port, udp=udp, count=count,
                                               timeout=0.5)
                        if not x.startswith(("REFUSED", "TIMEOUT", "ERROR", "WRONG"))]))


def test_new_service_is_reachable_through_its_clusterip(cluster):
    for name, node in (("reach-1", "node1"), ("reach-2", "node2")):
        cluster.create_pod(name, node, labels={"app": "reach"})
    t0 = time.monotonic()
    ip = make_service(cluster, "reach", "reach", udp=True)
    wait_until(lambda: served_by(cluster, ip), 15, "the first answer through the ClusterIP",
               step=0.02)
    latency = time.monotonic() - t0
    print(f"\n{cluster.info.proxy}: service create -> first answer through {ip}: {latency:.3f}s")
    if cluster.info.proxy == "kproxy":
        # The requirement for our agent (kube-proxy's own minSyncPeriod is 1 s).
        assert latency < 1.0, f"reachable only after {latency:.2f}s"
    wait_until(lambda: served_by(cluster, ip, count=30) == {"reach-1", "reach-2"}, 10,
               "both backends")
    assert served_by(cluster, ip, port=53, udp=True, count=30) == {"reach-1", "reach-2"}
    delete_service(cluster, "reach")


def test_scaling_3_5_1_follows_with_no_failed_connection(cluster):
    names = [f"scale-{i}" for i in range(1, 6)]
    for n in names[:3]:
        cluster.create_pod(n, "node1" if n[-1] in "135" else "node2", labels={"app": "scale"})
    ip = make_service(cluster, "scale", "scale")
    wait_until(lambda: served_by(cluster, ip, count=40) == set(names[:3]), 15, "3 backends")

    lines: list[str] = []
    loop = threading.Thread(target=lambda: lines.extend(cluster.lab.probe(
        "pod/client", ip, 80, count=800, interval=0.01, timeout=2)))
    loop.start()
    for n in names[3:]:                                    # 3 -> 5
        cluster.create_pod(n, "node1" if n[-1] in "135" else "node2", labels={"app": "scale"})
    wait_until(lambda: served_by(cluster, ip, count=60) == set(names), 15, "5 backends")
    for n in names[1:]:                                    # 5 -> 1, the way a kubelet would:
        # the pod turns terminating and not ready first; its server stops after the grace.
        from kproxy_ebpf.lab import kubeobjects
        kubeobjects.mark_pod_terminating(cluster.api(), "default", n)
        kubeobjects.set_pod_ready(cluster.api(), "default", n, False)
    wait_until(lambda: served_by(cluster, ip, count=40) == {"scale-1"}, 15, "1 backend")
    for n in names[1:]:
        cluster.delete_pod(n)
    loop.join()
    failed = [x for x in lines if x.split()[0] not in names]
    assert not failed, f"{len(failed)} of {len(lines)} connections failed, e.g. {failed[:3]}"
    assert set(pods_of(lines)) == set(names)
    delete_service(cluster, "scale")
    cluster.delete_pod("scale-1")


def test_deleted_service_stops_answering(cluster):
    cluster.create_pod("gone-1", "node2", labels={"app": "gone"})
    ip = make_service(cluster, "gone", "gone")
    wait_until(lambda: served_by(cluster, ip), 15, "the service to answer")
    delete_service(cluster, "gone")
    wait_until(lambda: not served_by(cluster, ip), 15, "the deleted service to stop answering")
    result = cluster.lab.probe("pod/client", ip, 80, count=3, timeout=1)
    print(f"\n{cluster.info.proxy}: a deleted service's ClusterIP gives {result}")
    # Nothing answers in any mode. With no frontend left, our connect goes out untranslated and
    # the node, which has no route for the service range, answers "network unreachable" at once:
    # what kube-proxy's iptables mode does too (no rule left). nftables mode instead drops
    # packets to unallocated service IPs, so its clients mostly time out.
    assert not any(x.split()[0].startswith("gone") for x in result)
    if cluster.info.proxy == "kproxy":
        assert result == ["ERROR ENETUNREACH"] * 3
    cluster.delete_pod("gone-1")


def test_the_charts_helm_test_pod_reaches_the_kubernetes_clusterip(cluster):
    """The chart's `helm test` hook, run from a lab pod: the API server through the
    `kubernetes` Service's ClusterIP (the kubelet's KUBERNETES_SERVICE_HOST/PORT)."""
    from kproxy_ebpf.lab import agent_image

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


CAPS = {"NET_ADMIN": 12, "SYS_ADMIN": 21, "BPF": 39}      # linux/capability.h


def test_each_proxy_runs_inside_its_nodes_cgroup_and_the_image_agent_as_the_chart_says(cluster):
    """Every proxy process lives in its node's cgroup (the image agent through podman's
    --cgroup-parent). The image agent has exactly the chart's capabilities, not privileged."""
    import subprocess

    from kproxy_ebpf.lab import agent_image

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
            out = wait_until(lambda: _container_status(cluster, node.name), 15,
                             "the hooks to be attached")
            assert {h["cgroup"] for h in out["hooks"]} == {"/run/kproxy-ebpf/cgroup"}
            assert {h["cgroup_id"] for h in out["hooks"]} == {os.stat(node.cgroup).st_ino}
            assert out["warnings"] == [] and out["agent"]["status"] == 200


def _container_status(cluster, node: str) -> dict | None:
    import json
    import subprocess

    from kproxy_ebpf.lab import agent_image

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
