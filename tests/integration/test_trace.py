"""`kproxy-ebpf trace` against where a probe actually lands, in a lab cluster running kproxy:
a ClusterIP, a ClientIP affinity Service, internalTrafficPolicy Local with and without a local
endpoint, a NodePort from outside (TC), and a Service without endpoints; `watch` following
a scale-up; `check --all-nodes` finding a row deleted behind one node's agent. The commands
run as an operator runs them: inside node1's namespace, on node1's pins."""
from __future__ import annotations

import json
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from kubernetes import client

from kproxy_ebpf.agent.self_check import MIN_INTERVAL_S
from kproxy_ebpf.datapath.load.sock_hooks import SOCK_HOOKS
from kproxy_ebpf.datapath.maps import layout as L
from kproxy_ebpf.datapath.maps.pinned import PinnedMap
from kproxy_ebpf.dev.lab.cluster import Cluster
from kproxy_ebpf.dev.lab.probe import is_reply
from kproxy_ebpf.model.objects import Protocol

from ..support import lab_cluster, wait_until
from .lab_services import http_service as service
from .lab_services import seen_from_outside, served_by

pytestmark = [pytest.mark.root, pytest.mark.controlplane]

NODE1 = "10.250.0.11"
EXT_CLIENT = "10.250.0.250"


@pytest.fixture(scope="module")
def cluster():
    with lab_cluster("it-trace", "kproxy", client_pod=True) as c:
        c.create_pod("tr-a", "node1", labels={"app": "tr"})
        c.create_pod("tr-b", "node2", labels={"app": "tr"})
        c.create_pod("tr-r", "node2", labels={"app": "tr-remote"})
        yield c


@pytest.fixture
def core(cluster):
    return client.CoreV1Api(cluster.api())


def trace(c: Cluster, target: str, *args: str) -> dict:
    node = c.lab.node("node1")
    out = c.lab.exec("node/node1", [sys.executable, "-m", "kproxy_ebpf.cli.main", "trace", target,
                                    "--bpffs-dir", node.bpffs, "--cgroup", node.cgroup,
                                    "-o", "json", *args],
                     capture_output=True, text=True, check=True)
    return json.loads(out.stdout)


def explained(c: Cluster, target: str, *args: str) -> str:
    node = c.lab.node("node1")
    return c.lab.exec("node/node1", [sys.executable, "-m", "kproxy_ebpf.cli.main", "trace", target,
                                     "--bpffs-dir", node.bpffs, "--explain", *args],
                      capture_output=True, text=True, check=True).stdout


def addr(c: Cluster, pod: str) -> str:
    return f"{c.lab.pod(pod).ip}:8080"


def landed(c: Cluster, ip: str) -> str:
    line = c.lab.probe("pod/client", ip, 80)[0]
    assert is_reply(line), line
    return line.split()[0]


def test_cluster_ip_lists_the_backends_a_probe_lands_on(cluster, core):
    ip = service(core, "tr-plain", "tr").spec.cluster_ip
    try:
        wait_until(lambda: served_by(cluster, ip, count=20) == {"tr-a", "tr-b"}, 20, "both pods")
        t = trace(cluster, f"{ip}:80")
        assert t["verdict"] == "forward" and t["service"] == "default/tr-plain:http"
        assert sorted(t["candidates"]) == sorted([addr(cluster, "tr-a"), addr(cluster, "tr-b")])
        assert [s["step"] for s in t["steps"]] == ["frontend", "backends"]
        assert addr(cluster, landed(cluster, ip)) in t["candidates"]
    finally:
        core.delete_namespaced_service("tr-plain", "default")


def test_affinity_names_the_backend_the_client_keeps(cluster, core):
    ip = service(core, "tr-aff", "tr", sessionAffinity="ClientIP").spec.cluster_ip
    try:
        wait_until(lambda: served_by(cluster, ip), 20, "the affinity Service")
        first = landed(cluster, ip)
        assert {landed(cluster, ip) for _ in range(5)} == {first}, "affinity holds"
        t = trace(cluster, f"{ip}:80", "--from", cluster.lab.pod("client").ip)
        assert t["chosen"] == addr(cluster, first), t
        assert any(s["step"] == "affinity" and "slot" in s["found"] for s in t["steps"]), t
    finally:
        core.delete_namespaced_service("tr-aff", "default")


def test_internal_traffic_policy_local_with_and_without_a_local_endpoint(cluster, core):
    ip = service(core, "tr-itp", "tr-remote", internalTrafficPolicy="Local").spec.cluster_ip
    try:
        wait_until(lambda: trace(cluster, f"{ip}:80")["verdict"] == "unreachable", 20,
                   "the Local-only Service programmed")
        assert cluster.lab.probe("pod/client", ip, 80) == ["ERROR EHOSTUNREACH"]
        text = explained(cluster, f"{ip}:80")
        assert "internalTrafficPolicy Local and no endpoint on this node" in text, text
        # A local endpoint appears: the trace and the probe move to it.
        cluster.create_pod("tr-l", "node1", labels={"app": "tr-remote"})
        try:
            wait_until(lambda: trace(cluster, f"{ip}:80")["verdict"] == "forward", 20,
                       "the local endpoint programmed")
            t = trace(cluster, f"{ip}:80")
            assert t["candidates"] == [addr(cluster, "tr-l")] and t["chosen"] == t["candidates"][0]
            assert landed(cluster, ip) == "tr-l"
        finally:
            cluster.delete_pod("tr-l")
    finally:
        core.delete_namespaced_service("tr-itp", "default")


def test_node_port_from_outside_follows_the_tracked_flow(cluster, core):
    svc = service(core, "tr-np", "tr", type="NodePort")
    port = svc.spec.ports[0].node_port
    try:
        wait_until(lambda: seen_from_outside(cluster, NODE1, port, count=4)
                   <= {f"tr-a {EXT_CLIENT}", f"tr-b {NODE1}"}, 20, "the NodePort from outside")
        before = trace(cluster, f"{NODE1}:{port}", "--from-outside")
        assert before["verdict"] == "forward" and len(before["candidates"]) == 2
        got = seen_from_outside(cluster, NODE1, port, count=1)
        pod = next(iter(got)).split()[0]
        t = trace(cluster, f"{NODE1}:{port}", "--from-outside", "--from", EXT_CLIENT)
        conntrack = next(s for s in t["steps"] if s["step"] == "conntrack")
        assert addr(cluster, pod) in conntrack["found"], (pod, t)
        # Not a frontend from outside: the ClusterIP's port on the node address.
        other = trace(cluster, f"{NODE1}:81", "--from-outside")
        assert other["verdict"] == "untouched"
    finally:
        core.delete_namespaced_service("tr-np", "default")


def test_a_service_without_endpoints_is_refused(cluster, core):
    ip = service(core, "tr-none", "nobody").spec.cluster_ip
    try:
        wait_until(lambda: trace(cluster, f"{ip}:80")["verdict"] == "refused", 20,
                   "the Service without endpoints programmed")
        assert cluster.lab.probe("pod/client", ip, 80) == ["REFUSED"]
        assert "no usable endpoint" in explained(cluster, f"{ip}:80")
        # A port the ClusterIP does not have, and an address no Service holds.
        assert trace(cluster, f"{ip}:81")["verdict"] == "refused"
        assert trace(cluster, "10.96.255.254:80")["verdict"] == "unreachable"
    finally:
        core.delete_namespaced_service("tr-none", "default")


def test_watch_streams_a_new_service_and_its_scale_up(cluster, core, tmp_path):
    """The node watched before the Service exists (with --service, a Service not programmed
    is NotFound, as `kubectl get -w NAME`): its "+" line, then its first endpoint."""
    node = cluster.lab.node("node1")
    argv = [sys.executable, "-m", "kproxy_ebpf.cli.main", "watch", "--bpffs-dir", node.bpffs,
            "--interval", "0.2", "--duration", "15"]
    out_path, err_path = tmp_path / "out", tmp_path / "err"
    with ThreadPoolExecutor(1) as pool, out_path.open("w") as out, err_path.open("w") as err:
        # Not a terminal: one line per change (the first poll is the baseline, told on stderr).
        running = pool.submit(cluster.lab.exec, "node/node1", argv, stdout=out, stderr=err,
                              timeout=60)
        ip = None
        try:
            wait_until(lambda: "frontends" in err_path.read_text(), 20,
                       lambda: f"the watch to start: {err_path.read_text()!r}")
            ip = service(core, "tr-watch", "tr-w").spec.cluster_ip
            wait_until(lambda: "reject backends: none" in out_path.read_text(), 20,
                       lambda: f"the watch to show the Service without endpoints: "
                               f"{out_path.read_text()!r} {err_path.read_text()!r}")
            cluster.create_pod("tr-w1", "node2", labels={"app": "tr-w"})
            pod = f"{cluster.lab.pod('tr-w1').ip}:8080"
            wait_until(lambda: served_by(cluster, ip) == {"tr-w1"}, 20, "the new endpoint")
        finally:
            done = running.result()
            if ip is not None:
                core.delete_namespaced_service("tr-watch", "default")
            cluster.delete_pod("tr-w1")
    assert done.returncode == 0, err_path.read_text()
    assert "watching" in err_path.read_text()
    lines = [ln.split(" ", 1)[1] for ln in out_path.read_text().splitlines()
             if " default/tr-watch:" in ln]
    assert lines[0] == f"+ default/tr-watch:http ClusterIP {ip}:80/TCP reject backends: none", lines
    assert any(ln.startswith(f"~ default/tr-watch:http ClusterIP {ip}:80/TCP verdict reject "
                             f"-> forward, +{pod} (ready)") for ln in lines[1:]), lines


def check_all_nodes(c: Cluster) -> tuple[int, list[dict]]:
    """`kproxy-ebpf lab exec --node node1 -- kproxy-ebpf check --all-nodes -o json`, as an
    operator runs it (the node's kubeconfig comes with lab exec)."""
    r = subprocess.run([sys.executable, "-m", "kproxy_ebpf.cli.main", "lab", "exec", "--lab",
                        c.lab.name, "--node", "node1", "--", sys.executable, "-m",
                        "kproxy_ebpf.cli.main", "check", "--all-nodes", "-o", "json"],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode in (0, 1), r.stderr
    return r.returncode, json.loads(r.stdout)


def test_check_all_nodes_finds_a_row_deleted_behind_one_agent(cluster, core):
    ip = service(core, "tr-chk", "tr").spec.cluster_ip
    try:
        wait_until(lambda: served_by(cluster, ip, count=20) == {"tr-a", "tr-b"}, 20, "both pods")
        wait_until(lambda: check_all_nodes(cluster)[0] == 0, 30, "every node clean")
        rc, rows = check_all_nodes(cluster)
        assert [r["node"] for r in rows] == ["node1", "node2"]
        assert all(r["healthz"] == 200 and r["check"]["hooksAttached"] == len(SOCK_HOOKS)
                   for r in rows), rows
        # node2's frontend row, deleted behind its agent's back.
        pin = Path(cluster.lab.node("node2").bpffs) / L.MAPS["svc"].name
        with PinnedMap(pin, L.MAPS["svc"]) as svc:
            assert svc.delete(L.svc_key(ip, 80, Protocol.TCP))
        time.sleep(MIN_INTERVAL_S)       # past the last check's answer, which agents reuse
        rc, rows = check_all_nodes(cluster)
        by_node = {r["node"]: r for r in rows}
        assert rc == 1 and by_node["node1"]["clean"], rows
        bad = by_node["node2"]
        assert not bad["clean"] and bad["check"]["driftCount"] == 1, bad
        assert any(line.startswith("missing") and f"{ip}:80/TCP" in line
                   for line in bad["check"]["drift"]), bad
        # The self-check made node2's agent re-read its maps: clean after its next sync.
        wait_until(lambda: check_all_nodes(cluster)[0] == 0, 20, "node2 repaired")
        # The same for a ServiceCIDR row (the ClusterIP's own, which refuses its other ports).
        pin = Path(cluster.lab.node("node2").bpffs) / L.MAPS["clusterip"].name
        with PinnedMap(pin, L.MAPS["clusterip"]) as cip:
            assert cip.delete(L.ip16(ip))
        time.sleep(MIN_INTERVAL_S)
        rc, rows = check_all_nodes(cluster)
        bad = {r["node"]: r for r in rows}["node2"]
        assert rc == 1 and any(line.split()[:3] == ["missing", "ClusterIP", ip]
                               for line in bad["check"]["drift"]), bad
        wait_until(lambda: check_all_nodes(cluster)[0] == 0, 20, "node2's ClusterIP row back")
        # A TC program detached behind node2's agent (its tcx link; a clsact filter on a kernel
        # without tcx): attached again after its check.
        listing = cluster.lab.exec("node/node2", [sys.executable, "-c",
                                                  "import json; from kproxy_ebpf.datapath.load import tc; "
                                                  "print(json.dumps(tc.attachments()))"],
                                   capture_output=True, text=True, check=True).stdout
        dev, via = next((d, via) for d, where, prog, via in json.loads(listing)
                        if where == "ingress" and prog == "kp_from_outside")
        cluster.lab.exec("node/node2", [sys.executable, "-c", (
            "import socket; from kproxy_ebpf.datapath.load import tcx; "
            f"assert tcx.detach(socket.if_nametoindex({dev!r}), 'ingress', {{'kp_from_outside'}})")]
            if via == "tcx" else ["tc", "filter", "del", "dev", dev, "ingress", "pref", "1"],
            check=True)
        time.sleep(MIN_INTERVAL_S)
        rc, rows = check_all_nodes(cluster)
        bad = {r["node"]: r for r in rows}["node2"]
        assert rc == 1 and bad["check"]["tcMissing"] == [f"{dev} ingress kp_from_outside"], bad
        wait_until(lambda: check_all_nodes(cluster)[0] == 0, 20, "node2's TC program back")
    finally:
        core.delete_namespaced_service("tr-chk", "default")


def test_check_compares_the_service_cidr_rows(cluster, core):
    ip = service(core, "tr-cidr", "tr").spec.cluster_ip

    def check() -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "kproxy_ebpf.cli.main", "lab", "exec", "--lab",
                               cluster.lab.name, "--node", "node1", "--", sys.executable, "-m",
                               "kproxy_ebpf.cli.main", "check"], capture_output=True, text=True,
                              timeout=60)
    try:
        wait_until(lambda: served_by(cluster, ip), 20, "the Service to answer")
        wait_until(lambda: check().returncode == 0, 20, "node1 clean")
        pin = Path(cluster.lab.node("node1").bpffs) / L.MAPS["clusterip"].name
        with PinnedMap(pin, L.MAPS["clusterip"]) as cip:
            row = cip.get(L.ip16(ip))
            assert row is not None and cip.delete(L.ip16(ip))
            try:
                r = check()
                assert r.returncode == 1, r.stdout + r.stderr
                assert any(line.split()[:3] == ["missing", "ClusterIP", ip]
                           for line in r.stdout.splitlines()), r.stdout
            finally:
                cip.put(L.ip16(ip), row)
        assert check().returncode == 0
    finally:
        core.delete_namespaced_service("tr-cidr", "default")
