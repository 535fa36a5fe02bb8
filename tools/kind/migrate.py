#!/usr/bin/env python3
"""`make migrate`: a live kind cluster moved from kube-proxy to kproxy-ebpf and back, node by
node, under counted traffic (issue 45); once with kube-proxy in iptables mode, once in nftables.

Per pass: a cluster made as `make kind-up` makes it (hack/kind-up.sh, PROXY=iptables|nftables:
offline, images preloaded, CoreDNS without forward), 1 control plane + WORKERS workers; the
traffic of tools/kind/migrate_traffic.py started; then the steps, each followed by a pause
under traffic (DWELL seconds), every outcome counted by the step it fell in:

  kube-proxy alone; the chart installed with its agents kept off the nodes (nodeSelector
  kproxy-ebpf=enabled, config.kubeProxyCleanup=on); kube-proxy's DaemonSet given a node
  affinity that skips nodes labelled migrate.kproxy-ebpf/kube-proxy=off (its pods roll once);
  per node: the agent starts beside kube-proxy (label kproxy-ebpf=enabled, agent ready and
  its TC filters and cgroup hooks on the node), then
  kube-proxy leaves (label kube-proxy=off, its pod gone); kube-proxy's DaemonSet deleted;
  kube-proxy's leftovers looked for on every node (the agents remove them); kube-proxy's
  DaemonSet recreated from the saved copy; per node: kube-proxy back (label removed, its pod
  ready), then the agent leaves (label removed, its pod gone); helm uninstall; kproxy-ebpf's
  leftovers looked for on every node (pins, TC filters, nft table, cgroup hooks).

Writes e2e/results/migrate-latest.{json,md}. Every cluster, container and network it made is
removed at the end, also on failure (hack/kind-down.sh)."""
from __future__ import annotations

import argparse
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
from datetime import datetime
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import migrate_report  # type: ignore[import-not-found]
import migrate_traffic as traffic  # type: ignore[import-not-found]
from migrate_cluster import AGENT, AGENT_LABEL, KUBE_PROXY, SKIP_LABEL, Cluster  # type: ignore[import-not-found]

from e2e import ROOT, environment, guard_drops, sh  # type: ignore[import-not-found]

MODES = ("iptables", "nftables")


class Pass:
    def __init__(self, c: Cluster, dwell: float) -> None:
        self.c, self.dwell = c, dwell
        self.steps: list[dict] = []
        self.t = time.time()

    def step(self, name: str, action=None) -> None:
        """Runs ACTION, then lets the traffic run DWELL seconds; the step covers both."""
        print(f"migrate: {self.c.name}: {name}", file=sys.stderr, flush=True)
        start = self.t
        info = action() if action else None
        time.sleep(self.dwell)
        self.t = time.time()
        # The egress guards' counters at the end of every step, so a drop is tied to one.
        guard = guard_drops(self.c.name)
        self.steps.append({"name": name, "start": start, "end": self.t,
                           "seconds": round(self.t - start, 1), "guard_after": guard,
                           **({"info": info} if info else {})})


def guard_log(since: float, steps: list[dict]) -> list[dict]:
    """The host guard's logged drops (hack/kind-lib.sh: LOG before DROP) since SINCE (unix
    time) from the kernel log, each with its time, the step it fell in and its headers."""
    r = subprocess.run(["dmesg", "--time-format=iso"], text=True, capture_output=True)
    found = []
    for ln in r.stdout.splitlines():
        if "kproxy-kind-guard:" not in ln:
            continue
        stamp, _, rest = ln.partition(" ")
        try:
            t = datetime.fromisoformat(stamp.replace(",", ".")).timestamp()
        except ValueError:
            continue
        if t < since:
            continue
        fields = dict(f.split("=", 1) for f in rest.split() if "=" in f)
        st = next((s["name"] for s in steps if s["start"] <= t < s["end"]), None)
        flags = [f for f in rest.split() if f in ("SYN", "ACK", "RST", "FIN", "PSH")]
        found.append({"t": round(t, 2), "step": st, "flags": flags, **{
            k: fields[k] for k in ("IN", "OUT", "SRC", "DST", "PROTO", "SPT", "DPT")
            if k in fields}})
    return found


def leftovers_gone(c: Cluster, nodes: list[str], what, timeout: float) -> dict:
    """Polls WHAT(node) on every node until each is empty (or TIMEOUT); the last finding."""
    start = time.monotonic()
    while True:
        found = {n: what(n) for n in nodes}
        if all(not any(v.values()) for v in found.values()) or time.monotonic() - start > timeout:
            return {"after_s": round(time.monotonic() - start, 1), "nodes": found,
                    "clean": all(not any(v.values()) for v in found.values())}
        time.sleep(3)


# Agent log lines kept in the report's JSON (agent_log): the TC conntrack purge, the datapath's
# attach, and anything logged as a warning or an error (agent/run.py's format: the level's
# first letter after the time).
AGENT_NOTABLE = re.compile(r"purged|attached kp_| [WE] \S+: ")
# A line of the agent's own logging (after kubectl's stamp): what ends a traceback's lines.
AGENT_RECORD = re.compile(r"^\S+ \d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3} [A-Z] ")


def notable(lines: list[str]) -> list[str]:
    """The lines AGENT_NOTABLE names, and every traceback whole (with the line before it,
    which names the thread or the message)."""
    out: list[str] = []
    in_traceback = False
    for i, ln in enumerate(lines):
        if "Traceback (most recent call last)" in ln:
            in_traceback = True
            if i and lines[i - 1] not in out[-1:]:
                out.append(lines[i - 1])
        elif in_traceback and AGENT_RECORD.match(ln):
            in_traceback = False
        if in_traceback or AGENT_NOTABLE.search(ln):
            out.append(ln)
    return out


def run_pass(mode: str, cluster: str, workers: int, image: str, dwell: float, work: Path) -> dict:
    c = Cluster(cluster)
    res: dict = {"mode": mode, "cluster": cluster, "workers": workers}
    started = time.time()
    begin = time.monotonic()
    saved = work / f"kube-proxy-{mode}.json"
    p = Pass(c, dwell)
    try:
        if cluster in c.env("kind", "get", "clusters").stdout.split():
            sh("hack/kind-down.sh", env={"CLUSTER": cluster})
        sh("hack/kind-up.sh", env={"CLUSTER": cluster, "PROXY": mode, "WORKERS": str(workers)})
        res["cluster_up_s"] = round(time.monotonic() - begin, 1)
        nodes = c.nodes()
        res["nodes"] = nodes
        res["guard_before"] = guard_drops(cluster)
        res["kube_proxy_rules_before"] = {n: c.kube_proxy_leftovers(n) for n in nodes}
        cip = traffic.start_servers(c, image)
        traffic.start_clients(c, image, cip, work)
        time.sleep(5)       # every client connected before the first step starts
        p.t = time.time()
        p.step("kube-proxy alone")
        p.step("chart installed, agents kept off the nodes",
               lambda: c.helm_install(image, Path("/sys/fs/cgroup/cgroup.controllers").exists()))
        p.step("kube-proxy DaemonSet skips labelled nodes (its pods restart once)",
               c.kube_proxy_skip_labelled)
        for n in nodes:
            def agent_on(n: str = n) -> dict:
                c.label(n, AGENT_LABEL, "enabled")
                ready = c.wait_ready(AGENT, n)
                # Ready is not programmed: while kube-proxy holds port 10256 the readiness
                # probe meets kube-proxy's /healthz. Wait for the node's TC filters and hooks.
                attached = c.wait(f"the datapath on {n}", lambda: all(
                    c.kproxy_leftovers(n)[k] for k in ("tc", "cgroup_progs")))
                info = {"agent_ready_s": ready, "datapath_attached_s": round(ready + attached, 1)}
                at = c.tc_attached_at(n)    # the instant, from the agent's log
                if at is not None:
                    info["tc_attached_at_s"] = round(at - p.t, 2)
                return info

            def kube_proxy_off(n: str = n) -> dict:
                c.label(n, SKIP_LABEL, "off")
                return {"kube_proxy_gone_s": c.wait_gone(KUBE_PROXY, n)}
            p.step(f"{n}: agent starts beside kube-proxy", agent_on)
            p.step(f"{n}: kube-proxy leaves", kube_proxy_off)
        c.save_kube_proxy(saved)
        p.step("kube-proxy DaemonSet deleted",
               lambda: c.kc("-n", "kube-system", "delete", "daemonset", "kube-proxy", "--wait"))
        res["kube_proxy_leftovers"] = {}
        p.step("kube-proxy's leftovers looked for on every node",
               lambda: res["kube_proxy_leftovers"].update(
                   leftovers_gone(c, nodes, c.kube_proxy_leftovers, 90)))
        # What the leftover check finds while the agents run: shows that it looks where they are.
        res["kproxy_while_running"] = {n: {k: len(v) for k, v in c.kproxy_leftovers(n).items()}
                                       for n in nodes}
        p.step("kube-proxy DaemonSet recreated (no node selected yet)",
               lambda: c.restore_kube_proxy(saved))
        for n in nodes:
            def kube_proxy_on(n: str = n) -> dict:
                c.label(n, SKIP_LABEL, None)
                return {"kube_proxy_ready_s": c.wait_ready(KUBE_PROXY, n)}

            def agent_off(n: str = n) -> dict:
                # What the agent did while it served (its log goes with its pod): purges,
                # warnings, errors, for failures the counts cannot explain.
                res.setdefault("agent_log", {})[n] = notable(c.agent_log(n))[-120:]
                res.setdefault("agent_counters", {})[n] = c.agent_counters(n)
                c.label(n, AGENT_LABEL, None)
                return {"agent_gone_s": c.wait_gone(AGENT, n)}
            p.step(f"{n}: kube-proxy back beside the agent", kube_proxy_on)
            p.step(f"{n}: the agent leaves", agent_off)
        p.step("helm uninstall", c.helm_uninstall)
        res["kproxy_leftovers"] = leftovers_gone(c, nodes, c.kproxy_leftovers, 60)
        p.step("kube-proxy alone again")
    except Exception as exc:  # noqa: BLE001  # the steps so far are still counted and written
        res["error"] = f"{type(exc).__name__}: {exc}"
        print(f"migrate: {mode}: {res['error']}", file=sys.stderr)
    finally:
        try:
            lines = traffic.stop_clients(c, work)
            traffic.collect(lines, p.steps)
            res["guard_after"] = guard_drops(cluster)
            res["guard_log"] = guard_log(started, p.steps)
            res["probe_failures"] = c.probe_failures(traffic.NS)
        except Exception as exc:  # noqa: BLE001
            res.setdefault("error", f"collecting: {type(exc).__name__}: {exc}")
        traffic.remove_outside()
        res["steps"] = p.steps
        res["seconds"] = round(time.monotonic() - begin, 1)
        sh("hack/kind-down.sh", env={"CLUSTER": cluster}, check=False)
    return res


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--modes", default=",".join(MODES))
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--dwell", type=float, default=10.0, help="seconds of traffic after each step")
    ap.add_argument("--cluster-prefix", default="kproxy-migrate")
    ap.add_argument("--results-dir", type=Path, default=ROOT / "e2e" / "results")
    args = ap.parse_args(argv)
    image = os.environ.get("IMAGE") or "localhost/kproxy-ebpf:" + next(
        ln.split('"')[1] for ln in (ROOT / "pyproject.toml").read_text().splitlines()
        if ln.startswith("version = "))
    # SIGTERM runs the same cleanup as an error (the finally blocks).
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    env = environment()
    env["nodes"] = f"1 control plane (schedulable) + {args.workers} workers, ptp CNI, no registry"
    passes = []
    with tempfile.TemporaryDirectory(prefix="kproxy-migrate.", dir="/var/tmp") as work:
        os.environ["KUBECONFIG"] = str(Path(work) / "kubeconfig")
        for mode in [m for m in args.modes.split(",") if m]:
            if mode not in MODES:
                ap.error(f"unknown mode {mode}: choose from {MODES}")
            passes.append(run_pass(mode, f"{args.cluster_prefix}-{mode}", args.workers, image,
                                   args.dwell, Path(work)))
            rep = {"environment": env, "traffic": migrate_report.traffic_info(), "passes": passes}
            args.results_dir.mkdir(parents=True, exist_ok=True)
            (args.results_dir / "migrate-latest.json").write_text(json.dumps(rep, indent=1) + "\n")
            (args.results_dir / "migrate-latest.md").write_text(migrate_report.markdown(rep))
    print(f"migrate: wrote {args.results_dir}/migrate-latest.md", file=sys.stderr)
    return 1 if any(p.get("error") for p in passes) else 0


if __name__ == "__main__":
    sys.exit(main())
