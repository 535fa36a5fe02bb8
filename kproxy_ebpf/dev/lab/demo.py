"""`make demo`: the main job, end to end, on the built-in lab.

A 2-node lab with kproxy on each node; pods web-1 (node1) and web-2 (node2) behind Service
`web`; a client pod on node2 connects to the ClusterIP and prints what answered. The lab is
removed at the end unless --keep.
"""
from __future__ import annotations

import subprocess
import sys
import time
from collections import Counter
from collections.abc import Callable

from kubernetes import client

from .cluster import NAMESPACE, Cluster


def _service(api, name: str, selector: dict[str, str]) -> str:
    body = {"apiVersion": "v1", "kind": "Service", "metadata": {"name": name},
            "spec": {"selector": selector, "ports": [
                {"name": "http", "port": 80, "targetPort": 8080, "protocol": "TCP"},
                {"name": "dns", "port": 53, "targetPort": 5353, "protocol": "UDP"}]}}
    svc = client.CoreV1Api(api).create_namespaced_service(NAMESPACE, body)
    return svc.spec.cluster_ip


def _wait(pred: Callable[[], bool], timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if pred():
            return True
        time.sleep(0.1)
    return False


NEXT = """
What to try next (the lab stays up with --keep; `kproxy-ebpf lab down --lab {lab}` removes it):
  kproxy-ebpf lab exec --lab {lab} --node node2 -- kproxy-ebpf services
  kproxy-ebpf lab exec --lab {lab} --node node2 -- kproxy-ebpf trace {ip}:80 --from {client} --explain
  kproxy-ebpf lab exec --lab {lab} --node node2 -- kproxy-ebpf watch --service web
  kproxy-ebpf lab exec --lab {lab} --node node2 -- kproxy-ebpf status
  kproxy-ebpf lab exec --lab {lab} --node node2 -- curl -s 127.0.0.1:10249/metrics
  kubectl --kubeconfig $(kproxy-ebpf lab kubeconfig --lab {lab}) scale ...   (or delete a pod and watch)"""


def run_demo(c: Cluster, keep: bool, echo: Callable[[str], None]) -> bool:
    if c.lab.exists():
        # Never the demo's to remove: kept by an earlier `--keep`, or someone's own lab.
        echo(f"a lab named {c.lab.name!r} is up already (an earlier `lab demo --keep`?): "
             f"`kproxy-ebpf lab down --lab {c.lab.name}` removes it, or give the demo another "
             "--lab")
        return False
    ok = False
    ip = client_ip = ""
    try:
        t0 = time.monotonic()
        c.up(nodes=2, proxy="kproxy",
             log=lambda m: echo(f"lab up: [+{time.monotonic() - t0:.0f}s] {m}"))
        for name, node in (("web-1", "node1"), ("web-2", "node2")):
            p = c.create_pod(name, node, labels={"app": "web"})
            echo(f"pod {name} on {node}: {p.ip}")
        client_ip = c.create_pod("client", "node2").ip
        ip = _service(c.api(), "web", {"app": "web"})
        echo(f"service default/web: ClusterIP {ip} (80/TCP -> 8080, 53/UDP -> 5353)")

        bpffs = c.lab.node("node2").bpffs
        services = [sys.executable, "-m", "kproxy_ebpf.cli.main", "services", "--bpffs-dir", bpffs]

        def programmed() -> bool:
            out = subprocess.run(services + ["-o", "json"], capture_output=True, text=True)
            return out.returncode == 0 and '"default/web:http"' in out.stdout and \
                out.stdout.count('"state": "ready') >= 4
        if not _wait(programmed, 30):
            echo("the service was not programmed on node2 within 30 s")
            return False
        echo(f"\n$ kproxy-ebpf services --bpffs-dir {bpffs}")
        echo(subprocess.run(services, capture_output=True, text=True).stdout)

        echo(f"$ kproxy-ebpf lab probe --pod client {ip}:80 --count 10   (client on node2)")
        lines = c.lab.probe("pod/client", ip, 80, count=10)
        for line in lines:
            echo(line)
        udp = c.lab.probe("pod/client", ip, 53, udp=True, count=4)
        echo(f"$ kproxy-ebpf lab probe --pod client {ip}:53 --udp --count 4")
        for line in udp:
            echo(line)
        seen = Counter(line.split()[0] for line in lines + udp)
        ok = set(seen) <= {"web-1", "web-2"} and sum(seen.values()) == 14
        echo(f"\nbackends reached through the ClusterIP: {dict(seen)}: {'OK' if ok else 'FAILED'}")
        return ok
    finally:
        if ok:
            echo(NEXT.format(lab=c.lab.name, ip=ip, client=client_ip))
        if keep and ok:
            echo(f"\nlab kept: `kproxy-ebpf lab down --lab {c.lab.name}` removes it")
        else:
            problems = c.down()
            echo("lab removed" if not problems else f"lab down problems: {problems}")
