"""The agent as a process on node1 of the lab "dp", fed from manifests: start it, read its log,
its metrics and what it programmed (fixture `agents` in conftest.py)."""
from __future__ import annotations

import os
import sys
from pathlib import Path

from kproxy_ebpf.datapath.load.bpffs import open_pinned_maps
from kproxy_ebpf.datapath.maps import layout as L
from kproxy_ebpf.datapath.maps import reader
from kproxy_ebpf.dev.lab.binaries import cli_module


def service_manifest(name: str, cluster_ip: str, endpoints) -> str:
    """YAML for `run --manifests`: Service default/<name> on <cluster_ip>:80 (http, to 8080)
    and its slice <name>-1 with one ready endpoint per (ip, node or None)."""
    eps = "".join(f"- {{addresses: [{ip}], conditions: {{ready: true}}"
                  + (f", nodeName: {node}" if node else "") + "}\n" for ip, node in endpoints)
    return f"""---
apiVersion: v1
kind: Service
metadata: {{name: {name}, namespace: default}}
spec:
  clusterIP: {cluster_ip}
  ports: [{{name: http, port: 80, targetPort: 8080}}]
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {{name: {name}-1, namespace: default, labels: {{kubernetes.io/service-name: {name}}}}}
addressType: IPv4
ports: [{{name: http, port: 8080, protocol: TCP}}]
endpoints:
{eps}"""


def web_manifest(lab) -> str:
    """Service web (10.96.0.80:80) with endpoints a1 (node1) and b1 (node2)."""
    return service_manifest("web", "10.96.0.80", [(lab.pod(p).ip, lab.pod(p).node) for p in ("a1", "b1")])


def start_agent(lab, manifest: Path, name: str, flags: tuple[str, ...] = (),
                tree: Path | None = None):
    """`tree`: run the agent of another checkout (an older release, for upgrade tests)."""
    node = lab.node("node1")
    argv = [sys.executable, "-m", cli_module(tree), "run", "--manifests", str(manifest),
            "--cgroup", node.cgroup, "--bpffs-dir", node.bpffs, "--hostname-override", "node1",
            "--healthz-bind-address", "127.0.0.1:10256", "--metrics-bind-address", "",
            "--min-sync-period", "50ms",
            # the lab's own program cache (gone with the lab); a later --program-cache wins
            "--program-cache", os.path.join(lab.state_dir, "programs"), *flags]
    # The lab appends to a name's log: an earlier agent's "first sync" must not count.
    Path(lab.log_path(name)).unlink(missing_ok=True)
    if tree is None:
        return lab.spawn("node1", argv, name)
    return lab.spawn("node1", argv, name, env={**os.environ, "PYTHONPATH": str(tree)},
                     cwd=str(tree))


def log_of(lab, name: str) -> str:
    return Path(lab.log_path(name)).read_text()


def programmed(bpffs: str) -> list[dict]:
    if not Path(bpffs, L.MAPS["svc"].name).exists():
        return []
    maps = open_pinned_maps(Path(bpffs))
    try:
        return [s for s in reader.services(maps) if s["address"] == "10.96.0.80" and s["backends"]]
    finally:
        for m in maps.values():
            m.close()


def metrics(lab) -> str:
    script = ("import urllib.request\n"
              "print(urllib.request.urlopen('http://127.0.0.1:10249/metrics').read().decode())")
    return lab.exec("node1", [sys.executable, "-c", script], capture_output=True, text=True,
                    check=True).stdout


def sample(text: str, name: str) -> float:
    for line in text.splitlines():
        if line.startswith(name + " "):
            return float(line.rsplit(" ", 1)[1])
    return 0.0
