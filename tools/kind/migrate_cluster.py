"""The cluster side of `make migrate` (tools/kind/migrate.py): kubectl and helm through the
kind path's environment (hack/kind-env.sh), waits on pods per node, kube-proxy's DaemonSet
(its node affinity, saved and recreated), the chart, and the leftover checks run in each node
container (podman exec; read-only) and, for the cgroup hooks, with the host's bpftool on the
node container's own cgroup (read-only)."""
from __future__ import annotations

import json
import subprocess
import sys
import time
from datetime import UTC, datetime
from pathlib import Path

from e2e import ROOT, sh  # type: ignore[import-not-found]

NS = "kube-system"
AGENT = "app.kubernetes.io/name=kproxy-ebpf"
KUBE_PROXY = "k8s-app=kube-proxy"
AGENT_LABEL = "kproxy-ebpf"               # =enabled: the chart's nodeSelector picks the node
SKIP_LABEL = "migrate.kproxy-ebpf/kube-proxy"  # =off: kube-proxy's DaemonSet skips the node
NODE_CGROUP2 = "/run/kproxy-cgroup2"
# The kubelet's own chains, which stay (docs/design/deployment.md).
KUBELET_CHAINS = {"KUBE-FIREWALL", "KUBE-KUBELET-CANARY", "KUBE-IPTABLES-HINT", "KUBE-MARK-DROP"}


class Cluster:
    def __init__(self, name: str) -> None:
        self.name, self.ctx = name, f"kind-{name}"

    def env(self, *argv: str, check: bool = True) -> subprocess.CompletedProcess:
        return sh("hack/kind-env.sh", *argv, stdout=subprocess.PIPE, check=check)

    def kc(self, *argv: str, check: bool = True, quiet: bool = False,
           stdin: str | None = None) -> str:
        r = subprocess.run(["hack/kind-env.sh", "kubectl", "--context", self.ctx, *argv], cwd=ROOT,
                           text=True, capture_output=True, input=stdin)
        if check and r.returncode:
            raise RuntimeError(f"kubectl {' '.join(argv)}: {r.stderr.strip()}")
        return r.stdout

    def nodes(self) -> list[str]:
        return sorted(self.env("kind", "get", "nodes", "--name", self.name).stdout.split())

    def node_ip(self, node: str) -> str:
        return self.kc("get", "node", node, "-o",
                       'jsonpath={.status.addresses[?(@.type=="InternalIP")].address}').split()[0]

    def in_node(self, node: str, script: str) -> str:
        return subprocess.run(["podman", "exec", node, "sh", "-c", script], text=True,
                              capture_output=True).stdout

    # --- pods per node ---------------------------------------------------------------
    def pods_on(self, selector: str, node: str) -> list[tuple[str, bool]]:
        out = self.kc("-n", NS, "get", "pods", "-l", selector, "--field-selector",
                      f"spec.nodeName={node}", "-o", "json")
        pods = []
        for p in json.loads(out)["items"]:
            ready = any(c["type"] == "Ready" and c["status"] == "True"
                        for c in p.get("status", {}).get("conditions", []))
            pods.append((p["metadata"]["name"], ready and not p["metadata"].get("deletionTimestamp")))
        return pods

    def wait(self, what: str, cond, timeout: float = 180) -> float:
        start = time.monotonic()
        while not cond():
            if time.monotonic() - start > timeout:
                raise RuntimeError(f"timed out after {timeout:.0f} s waiting for {what}")
            time.sleep(1)
        return round(time.monotonic() - start, 1)

    def wait_ready(self, selector: str, node: str) -> float:
        return self.wait(f"{selector} ready on {node}",
                         lambda: any(r for _, r in self.pods_on(selector, node)))

    def wait_gone(self, selector: str, node: str) -> float:
        return self.wait(f"{selector} gone from {node}", lambda: not self.pods_on(selector, node))

    def agent_log(self, node: str) -> list[str]:
        """The log of NODE's agent, each line stamped by kubectl (--timestamps); [] without one."""
        pods = self.pods_on(AGENT, node)
        if not pods:
            return []
        return self.kc("-n", NS, "logs", pods[0][0], "--timestamps", check=False).splitlines()

    def agent_counters(self, node: str) -> dict[str, int]:
        """NODE's datapath counters (`kproxy-ebpf stats` in its agent's pod); {} without one."""
        pods = self.pods_on(AGENT, node)
        if not pods:
            return {}
        out = self.kc("-n", NS, "exec", pods[0][0], "--", "kproxy-ebpf", "stats", "-o", "json",
                      check=False)
        try:
            return {k: int(v) for k, v in json.loads(out or "{}").items()}
        except (ValueError, TypeError, AttributeError):
            return {}

    def probe_failures(self, namespace: str) -> list[dict]:
        """The probe failures (events "Unhealthy") of NAMESPACE's pods: a readiness flap takes
        an endpoint out of its Services for a moment, which the traffic counts may show."""
        try:
            items = json.loads(self.kc("-n", namespace, "get", "events", "-o", "json",
                                       check=False) or "{}").get("items", [])
        except ValueError:
            return []
        return [{"pod": e["involvedObject"]["name"], "count": e.get("count", 1),
                 "first": e.get("firstTimestamp") or e.get("eventTime"),
                 "last": e.get("lastTimestamp"), "message": (e.get("message") or "")[:200]}
                for e in items if e.get("reason") == "Unhealthy"]

    def tc_attached_at(self, node: str) -> float | None:
        """When the agent on NODE attached its TC filters (unix time; its log line `attached
        kp_... to eth0`, as kubectl's --timestamps gives it), or None."""
        for ln in self.agent_log(node):
            if " attached kp_" in ln:
                stamp = ln.split()[0].rstrip("Z")[:26]     # microseconds at most
                try:
                    return datetime.fromisoformat(stamp).replace(tzinfo=UTC).timestamp()
                except ValueError:
                    return None
        return None

    def label(self, node: str, key: str, value: str | None) -> None:
        self.kc("label", "node", node, "--overwrite", f"{key}={value}" if value else f"{key}-")

    # --- kube-proxy's DaemonSet -------------------------------------------------------
    def kube_proxy_skip_labelled(self) -> None:
        """kube-proxy's DaemonSet skips nodes labelled SKIP_LABEL=off (its pods roll once)."""
        patch = {"spec": {"template": {"spec": {"affinity": {"nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
                {"matchExpressions": [{"key": SKIP_LABEL, "operator": "NotIn",
                                       "values": ["off"]}]}]}}}}}}}
        self.kc("-n", NS, "patch", "daemonset", "kube-proxy", "--type=strategic",
                "-p", json.dumps(patch))
        self.kc("-n", NS, "rollout", "status", "daemonset/kube-proxy", "--timeout=300s")

    def save_kube_proxy(self, path: Path) -> None:
        ds = json.loads(self.kc("-n", NS, "get", "daemonset", "kube-proxy", "-o", "json"))
        meta = ds["metadata"]
        ds["metadata"] = {k: meta[k] for k in ("name", "namespace", "labels") if k in meta}
        ds.pop("status", None)
        path.write_text(json.dumps(ds, indent=1))

    def restore_kube_proxy(self, path: Path) -> None:
        self.kc("create", "-f", "-", stdin=path.read_text())

    # --- the chart ----------------------------------------------------------------------
    def helm_install(self, image: str, cgroup_v2: bool) -> None:
        repo, tag = image.rsplit(":", 1)
        args = ["helm", "upgrade", "--install", "kproxy-ebpf", "charts/kproxy-ebpf",
                "--kube-context", self.ctx, "--namespace", NS,
                "--set", f"image.repository={repo}", "--set", f"image.tag={tag}",
                "--set", "image.pullPolicy=Never",
                "--set", f"apiServer.host={self.name}-control-plane", "--set", "apiServer.port=6443",
                "--set", f"nodeSelector.{AGENT_LABEL}=enabled",
                "--set", "config.kubeProxyCleanup=on"]
        if not cgroup_v2:
            args += ["--set", f"hostPaths.cgroupRoot={NODE_CGROUP2}"]
        sh("hack/kind-env.sh", *args, stdout=subprocess.DEVNULL)

    def helm_uninstall(self) -> None:
        sh("hack/kind-env.sh", "helm", "uninstall", "kproxy-ebpf", "--kube-context", self.ctx,
           "--namespace", NS, "--wait", "--timeout", "120s", stdout=subprocess.DEVNULL)

    # --- leftovers ----------------------------------------------------------------------
    def kube_proxy_leftovers(self, node: str) -> dict:
        """kube-proxy's chains (every iptables backend and family) and nft tables on NODE."""
        out = self.in_node(node, """
for t in iptables-legacy-save iptables-nft-save ip6tables-legacy-save ip6tables-nft-save; do
  $t 2>/dev/null | sed -n "s/^:\\(KUBE-[^ ]*\\).*/$t \\1/p"
done
nft list tables 2>/dev/null | sed -n 's/^table \\(.*\\)/nft \\1/p'""")
        chains = sorted({ln for ln in out.splitlines() if ln.split()[0] != "nft"
                         and ln.split()[1] not in KUBELET_CHAINS})
        tables = sorted(ln[4:] for ln in out.splitlines() if ln.startswith("nft ")
                        and "kube-proxy" in ln)
        return {"chains": chains, "nft_tables": tables}

    def kproxy_leftovers(self, node: str) -> dict:
        """What kproxy-ebpf would leave on NODE: pins in the node's bpffs (not the kernel's own
        maps.debug and progs.debug of every bpffs mount), TC filters and tcx programs on any
        of its links, its nftables table, and programs attached to the node's cgroup."""
        out = self.in_node(node, """
find /sys/fs/bpf -mindepth 1 ! -name maps.debug ! -name progs.debug 2>/dev/null | sed 's/^/pin /'
for d in $(ls /sys/class/net); do for h in ingress egress; do
  tc filter show dev $d $h 2>/dev/null | grep -q . && echo "tc $d $h"
done; done
nft list tables 2>/dev/null | grep kproxy | sed 's/^/nft /'""")
        lines = out.splitlines()
        return {"pins": [ln[4:] for ln in lines if ln.startswith("pin ")],
                "tc": [ln[3:] for ln in lines if ln.startswith("tc ")] + self.tcx_progs(node),
                "nft_tables": [ln[4:] for ln in lines if ln.startswith("nft ")],
                "cgroup_progs": self.cgroup_progs(node)}

    def tcx_progs(self, node: str) -> list[str]:
        """Every program on a tcx hook of NODE's links ("eth0 ingress tcx kp_from_outside"),
        pinned or not. Read from the host in the node's netns with this repository's code: the
        kind node has no bpftool, and the host's (7.1) does not list tcx."""
        pid = self._pid(node)
        code = ("import socket\nfrom kproxy_ebpf.datapath.load import tcx\n"
                "for i, n in socket.if_nameindex():\n"
                "    for w in tcx.DIRECTIONS:\n"
                "        for name, _ in tcx.programs(i, w):\n"
                "            print(n, w, 'tcx', name)\n")
        r = subprocess.run(["nsenter", f"--net=/proc/{pid}/ns/net", sys.executable, "-c", code],
                           text=True, capture_output=True, cwd=ROOT)
        if r.returncode != 0:
            return [f"(tcx hooks not listed: {r.stderr.strip()[-200:]})"]
        return r.stdout.splitlines()

    def _pid(self, node: str) -> str:
        return subprocess.run(["podman", "inspect", "-f", "{{.State.Pid}}", node], text=True,
                              capture_output=True).stdout.strip()

    def cgroup_progs(self, node: str) -> list[str]:
        """Programs attached in the node's own cgroup2 subtree (its cgroup namespace's root,
        where the agent attaches), systemd's own (sd_*) left out."""
        pid = self._pid(node)

        def unified(text: str) -> str:
            return next((ln.split("::", 1)[1] for ln in text.splitlines() if ln.startswith("0::")), "")
        try:
            host = unified(Path(f"/proc/{pid}/cgroup").read_text())
        except OSError:
            host = ""
        inner = unified(self.in_node(node, "cat /proc/1/cgroup"))
        if not host or not inner or not host.endswith(inner):
            return [f"(the node's cgroup2 root not found: {host!r}, {inner!r})"]
        rel = host[:len(host) - len(inner)] if inner != "/" else host
        root = Path("/sys/fs/cgroup/unified" if not Path("/sys/fs/cgroup/cgroup.controllers")
                    .exists() else "/sys/fs/cgroup") / rel.lstrip("/")
        r = subprocess.run(["bpftool", "-j", "cgroup", "tree", str(root)], text=True,
                           capture_output=True)
        progs = []
        for cg in json.loads(r.stdout or "[]"):
            for p in cg.get("programs", []):
                if not str(p.get("name", "")).startswith("sd_"):
                    progs.append(f"{cg.get('cgroup', '')[len(str(root)):] or '/'} "
                                 f"{p.get('attach_type')} {p.get('name')}")
        return progs
