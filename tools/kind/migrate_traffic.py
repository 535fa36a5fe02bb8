"""The counted traffic of `make migrate` (tools/kind/migrate.py), all of it run by
kproxy_ebpf/dev/lab/traffic.py with the agent image's Python (the image is preloaded on every
node; nothing is pulled):

* a backend on every node (a DaemonSet running lab/echo.py), behind one NodePort Service
  (TCP 80 -> NodePort 31080, UDP 81 -> NodePort 31081; externalTrafficPolicy Cluster);
* the same TCP clients in a host-network pod on every node (the node's own connections);
* a client pod on every node: long-lived TCP connections (some kept the whole run, some
  reopened every 20 s, so that some are always opened under the proxy of the moment) and new
  TCP connections to the
  Service's ClusterIP, DNS queries for the Service's name through CoreDNS's ClusterIP over one
  connected UDP socket and over new unconnected ones;
* one container on the kind network (outside every node, never the host's namespace) with, per
  node, long-lived and new TCP connections to that node's NodePort, UDP queries from new
  sockets and one UDP flow to its UDP NodePort; and the same TCP clients and UDP queries to a
  second NodePort Service of the same backends with externalTrafficPolicy Local (TCP 31082,
  UDP 31083: no SNAT, the client's address reaches the node's own backend).

Each client writes `<time> <kind> <ok> [reason]` lines; `collect` cuts them into the steps."""
from __future__ import annotations

import collections
import json
import subprocess
from pathlib import Path

from migrate_cluster import Cluster  # type: ignore[import-not-found]

from e2e import ROOT, sh  # type: ignore[import-not-found]

NS = "kproxy-migrate"
PY = "/opt/kproxy-ebpf/venv/bin/python"
LAB = ROOT / "kproxy_ebpf" / "dev" / "lab"
NET = "kproxy-kind"
OUTSIDE = "kproxy-migrate-outside"
TCP_NODEPORT, UDP_NODEPORT = 31080, 31081  # kind-check.sh takes 30080
LOCAL_TCP_NODEPORT, LOCAL_UDP_NODEPORT = 31082, 31083   # the externalTrafficPolicy Local twin
LONG, RATE = 2, 10        # per client: long-lived connections; new connections (queries) per s
CYCLED, LIFETIME = 2, 20  # per client: long-lived connections reopened every LIFETIME s
DNS = "10.96.0.10:53"


def _pod(name: str, image: str, args: list[str]) -> dict:
    return {"metadata": {"labels": {"app": name}}, "spec": {
        "tolerations": [{"operator": "Exists"}], "terminationGracePeriodSeconds": 1,
        "containers": [{"name": name, "image": image, "imagePullPolicy": "Never",
                        "command": [PY, *args],
                        "env": [{"name": "POD", "valueFrom": {"fieldRef": {
                            "fieldPath": "metadata.name"}}}],
                        "volumeMounts": [{"name": "lab", "mountPath": "/lab"}]}],
        "volumes": [{"name": "lab", "configMap": {"name": "lab"}}]}}


def _daemonset(name: str, pod: dict) -> dict:
    return {"apiVersion": "apps/v1", "kind": "DaemonSet", "metadata": {"name": name},
            "spec": {"selector": {"matchLabels": {"app": name}}, "template": pod}}


def _service(name: str, policy: str, tcp_nodeport: int, udp_nodeport: int) -> dict:
    return {"apiVersion": "v1", "kind": "Service", "metadata": {"name": name}, "spec": {
        "type": "NodePort", "selector": {"app": "echo"}, "externalTrafficPolicy": policy,
        "ports": [{"name": "tcp", "protocol": "TCP", "port": 80, "targetPort": 8080,
                   "nodePort": tcp_nodeport},
                  {"name": "udp", "protocol": "UDP", "port": 81, "targetPort": 8081,
                   "nodePort": udp_nodeport}]}}


def start_servers(c: Cluster, image: str) -> str:
    """The namespace, the echo backends and the Service; returns the ClusterIP."""
    c.kc("create", "namespace", NS)
    c.kc("-n", NS, "create", "configmap", "lab", f"--from-file={LAB / 'echo.py'}",
         f"--from-file={LAB / 'traffic.py'}")
    echo = _pod("echo", image, ["/lab/echo.py", "--name", "$(POD)", "--tcp", "8080",
                                "--udp", "8081"])
    echo["spec"]["containers"][0]["readinessProbe"] = {"tcpSocket": {"port": 8080},
                                                       "periodSeconds": 2}
    items = {"apiVersion": "v1", "kind": "List", "items": [
        _daemonset("echo", echo), _service("echo", "Cluster", TCP_NODEPORT, UDP_NODEPORT),
        _service("echo-local", "Local", LOCAL_TCP_NODEPORT, LOCAL_UDP_NODEPORT)]}
    c.kc("-n", NS, "apply", "-f", "-", stdin=json.dumps(items))
    c.kc("-n", NS, "rollout", "status", "daemonset/echo", "--timeout=180s")
    return c.kc("-n", NS, "get", "service", "echo", "-o", "jsonpath={.spec.clusterIP}").strip()


def start_clients(c: Cluster, image: str, cip: str, work: Path) -> None:
    args = ["/lab/traffic.py", "--out", "/dev/stdout", "--long", str(LONG), "--rate", str(RATE),
            "--cycled", str(CYCLED), "--lifetime", str(LIFETIME),
            "--tcp", f"{cip}:80", "--dns", DNS, "--dns-name", f"echo.{NS}.svc.cluster.local"]
    # the node's own network namespace: TCP only (a node resolves through its own resolver)
    host = _pod("hostclient", image, args[:args.index("--dns")])
    host["spec"].update(hostNetwork=True, dnsPolicy="ClusterFirstWithHostNet")
    items = {"apiVersion": "v1", "kind": "List", "items": [
        _daemonset("client", _pod("client", image, args)), _daemonset("hostclient", host)]}
    c.kc("-n", NS, "apply", "-f", "-", stdin=json.dumps(items))
    for ds in ("client", "hostclient"):
        c.kc("-n", NS, "rollout", "status", f"daemonset/{ds}", "--timeout=180s")
    script = []
    common = f"--long {LONG} --rate {RATE} --cycled {CYCLED} --lifetime {LIFETIME}"
    for node in c.nodes():
        ip = c.node_ip(node)
        script.append(f"{PY} /lab/traffic.py --out /out/outside-{node}.log {common} "
                      f"--tcp {ip}:{TCP_NODEPORT} --udp {ip}:{UDP_NODEPORT} "
                      f"--udp-flow {ip}:{UDP_NODEPORT} &")
        script.append(f"{PY} /lab/traffic.py --out /out/outlocal-{node}.log {common} "
                      f"--tcp {ip}:{LOCAL_TCP_NODEPORT} --udp {ip}:{LOCAL_UDP_NODEPORT} &")
    # SIGTERM to the shell reaches every client: they share its process group via `wait`.
    script.append("trap 'kill -TERM $(jobs -p); wait' TERM; wait")
    sh("hack/kind-env.sh", "podman", "run", "-d", "--name", OUTSIDE, "--network", NET,
       "--pull=never", "-v", f"{LAB}:/lab:ro", "-v", f"{work}:/out", "--entrypoint", "sh",
       image, "-c", "\n".join(script), stdout=subprocess.DEVNULL)


def stop_clients(c: Cluster, work: Path) -> dict[str, list[str]]:
    """Ends every client; returns each one's lines by source (`pod:NODE`, `host:NODE`,
    `outside:NODE`, `outlocal:NODE`)."""
    lines: dict[str, list[str]] = {}
    for app, where in (("client", "pod"), ("hostclient", "host")):
        out = c.kc("-n", NS, "get", "pods", "-l", f"app={app}", "-o",
                   "jsonpath={range .items[*]}{.metadata.name} {.spec.nodeName}{\"\\n\"}{end}")
        for row in out.splitlines():
            pod, node = row.split()
            lines[f"{where}:{node}"] = c.kc("-n", NS, "logs", pod, check=False).splitlines()
    remove_outside()
    for where in OUTSIDE_SOURCES:
        for f in sorted(work.glob(f"{where}-*.log")):
            lines[f"{where}:{f.stem.removeprefix(where + '-')}"] = f.read_text().splitlines()
    return lines


def remove_outside() -> None:
    subprocess.run(["podman", "stop", "-t", "5", OUTSIDE], capture_output=True)
    subprocess.run(["podman", "rm", "-f", OUTSIDE], capture_output=True)


# What each client kind is, as the tables name it.
KINDS = {("pod", "long"): "pod -> ClusterIP, long-lived TCP (messages)",
         ("pod", "cycled"): "pod -> ClusterIP, TCP reopened every 20 s (messages)",
         ("pod", "new"): "pod -> ClusterIP, new TCP",
         ("pod", "dnsconn"): "pod -> CoreDNS, connected UDP socket",
         ("pod", "dnsnew"): "pod -> CoreDNS, new sockets",
         ("host", "long"): "node -> ClusterIP, long-lived TCP (messages)",
         ("host", "cycled"): "node -> ClusterIP, TCP reopened every 20 s (messages)",
         ("host", "new"): "node -> ClusterIP, new TCP",
         ("outside", "long"): "outside -> NodePort, long-lived TCP (messages)",
         ("outside", "cycled"): "outside -> NodePort, TCP reopened every 20 s (messages)",
         ("outside", "new"): "outside -> NodePort, new TCP",
         ("outside", "udp"): "outside -> NodePort, UDP from new sockets",
         ("outside", "udpflow"): "outside -> NodePort, one UDP flow",
         ("outlocal", "long"): "outside -> NodePort eTP Local, long-lived TCP (messages)",
         ("outlocal", "cycled"): "outside -> NodePort eTP Local, TCP reopened every 20 s "
                                 "(messages)",
         ("outlocal", "new"): "outside -> NodePort eTP Local, new TCP",
         ("outlocal", "udp"): "outside -> NodePort eTP Local, UDP from new sockets"}
# The clients of the container on the kind network, by the Service they reach: their log files
# and the sources `collect` names them by.
OUTSIDE_SOURCES = ("outside", "outlocal")


def collect(lines: dict[str, list[str]], steps: list[dict]) -> None:
    """Adds to each step (name, start, end: unix times) its `counts`: per traffic kind the
    outcomes, the failures, the long-lived connections broken, and the reasons."""
    for st in steps:
        st["counts"] = {label: {"ok": 0, "failed": 0, "broken": 0, "reasons": {}}
                        for label in KINDS.values()}
        st["by_node"] = {}
    for source, rows in lines.items():
        where, node = source.split(":", 1)
        for row in rows:
            parts = row.split(maxsplit=3)
            if len(parts) < 3 or (where, parts[1]) not in KINDS:
                continue
            t, kind, ok = float(parts[0]), parts[1], parts[2] == "1"
            reason = parts[3] if len(parts) > 3 else ""
            st = next((s for s in steps if s["start"] <= t < s["end"]), None)
            if st is None:
                continue
            label = KINDS[(where, kind)]
            cell = st["counts"][label]
            cell["ok" if ok else "failed"] += 1
            if not ok:
                # a long-lived connection breaks once; its replacement's failed connects are
                # counted as failed messages, not as more broken connections
                if kind in ("long", "cycled") and not reason.startswith("connect:"):
                    cell["broken"] += 1
                cell["reasons"][reason] = cell["reasons"].get(reason, 0) + 1
                per = st["by_node"].setdefault(f"{source} {kind}",
                                               {"reasons": collections.Counter(), "at_s": []})
                per["reasons"][reason] += 1
                if len(per["at_s"]) < 10:   # when, in seconds since the step began
                    per["at_s"].append(round(t - st["start"], 1))
    for st in steps:
        st["by_node"] = {k: {"reasons": dict(v["reasons"]), "at_s": v["at_s"]}
                         for k, v in st["by_node"].items()}
