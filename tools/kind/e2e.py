#!/usr/bin/env python3
"""`make e2e`: Kubernetes' own e2e suite (upstream e2e.test, the `[sig-network]` specs) on kind,
against kproxy-ebpf and against upstream kube-proxy in nftables mode, each on a cluster of its
own, one after the other in one run; the report goes to e2e/results/latest.{json,md}.

Where things run: hack/kind-up.sh makes each cluster (PROXY=kproxy or nftables). The suite
runs in a container on the kind network (the runner image of tools/kind/images.sh), so every
packet it sends to a node, a NodePort or a pod starts outside the nodes and never in the
host's own network namespace. The test images are preloaded into the nodes under the names
tools/kind/e2e-repo-list.yaml gives them; a spec that asks for another image fails on a refused
local port, it never reaches a registry. The skip list, with a reason for every pattern, is
tools/kind/e2e-skip.yaml. The egress guards' drop counters are read before and after the specs.

`--smoke` is what `make test` runs: the `[Conformance]` specs of `[sig-network] Services`,
against kproxy only, with the report written to --json-out instead of e2e/results.

`--ip-family dual` brings the clusters up dual-stack (hack/kind-up.sh IP_FAMILY=dual) and runs
the `[Feature:IPv6DualStack]` specs, which the IPv4 run skips; its report is
e2e/results/dual.{json,md}. A list entry with `families` holds for those families only.
"""
from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import platform
import re
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[2]
KIND = ROOT / "tools" / "kind"
PROXIES = {"kproxy": "kproxy-ebpf", "nftables": "kube-proxy nftables",
           "iptables": "kube-proxy iptables"}
FOCUS = r"\[sig-network\]"
SMOKE_FOCUS = r"\[sig-network\] Services.*\[Conformance\]"
DUAL_FOCUS = r"\[sig-network\] \[Feature:IPv6DualStack\]"
FAMILIES = ("ipv4", "dual")
NET = "kproxy-kind"

# Cilium's own kind job skips these while it runs the same suite without kube-proxy
# (cilium/cilium .github/workflows/k8s-kind-network-e2e.yaml, IPv4 lane; fetched 2026-12-02).
# The report counts how many [sig-network] specs each list keeps from running.
CILIUM_SKIP = (
    r"Alpha|Beta|Experimental|Federation|PerformanceDNS|Disruptive|Serial|KubeProxy|kube-proxy"
    r"|ExternalIP|LoadBalancer|GCE|Netpol|NetworkPolicy|rejected|externalTrafficPolicy"
    r"|SCTPConnectivity|IPv6DualStack"
    r"|Conntrack.proxy.implementation.should.not.be.vulnerable.to.the.invalid.conntrack.state.bug"
    r"|Services.should.fallback.to.local.terminating.endpoints.when.there.are.no.ready.endpoints"
    r".with.internalTrafficPolicy=Local"
    r"|Networking.IPerf2.\[Feature:Networking\-Performance\].should.run.iperf2"
    r"|Networking.Granular.Checks:.Services.should.update.endpoints|DualStack|IPv6")


@dataclass(frozen=True)
class Listed:
    """One pattern of tools/kind/e2e-skip.yaml (not run) or e2e-differences.yaml (a spec the
    oracle passes and kproxy-ebpf does not, on purpose or until an issue closes it)."""
    pattern: str
    reason: str
    until: str = ""            # the issue that will make the spec run, if one will
    families: tuple[str, ...] = ()   # the clusters' IP families it holds for; (): all

    def matches(self, name: str) -> bool:
        return re.search(self.pattern, name) is not None


def load_listed(path: Path, family: str | None = None) -> list[Listed]:
    """The entries of one list; with `family`, only those that hold for it."""
    listed = [Listed(**{**entry, "families": tuple(entry.get("families") or ())})
              for entry in yaml.safe_load(path.read_text()) or []]
    return [e for e in listed if family is None or not e.families or family in e.families]


def skip_regex(skips: list[Listed]) -> str:
    return "|".join(f"(?:{s.pattern})" for s in skips)


@dataclass
class Outcome:
    """One spec under one proxy."""
    state: str                 # passed | failed | skipped | not-run
    seconds: float = 0.0
    message: str = ""          # the failure, or the suite's own reason for a runtime skip


def spec_name(spec: dict) -> str:
    return " ".join(t for t in [*(spec.get("ContainerHierarchyTexts") or []),
                                spec.get("LeafNodeText", "")] if t)


def outcomes(report: list[dict]) -> dict[str, Outcome]:
    """Ginkgo's JSON report -> the outcome of every [sig-network] It, by full spec text.
    A spec the focus/skip regexes filtered out is `not-run`; one that ran and called Skip()
    (the suite's own environment checks) is `skipped` with its message."""
    out: dict[str, Outcome] = {}
    for suite in report:
        for spec in suite.get("SpecReports") or []:
            if spec.get("LeafNodeType") != "It":
                continue
            name = spec_name(spec)
            if "[sig-network]" not in name:
                continue
            state = spec.get("State", "")
            msg = ((spec.get("Failure") or {}).get("Message") or "").strip()
            if state == "skipped" and not msg:
                state = "not-run"
            elif state in ("failed", "panicked", "interrupted", "aborted", "timedout"):
                state = "failed"
            out[name] = Outcome(state, round((spec.get("RunTime") or 0) / 1e9, 1),
                                msg.splitlines()[0][:300] if msg else "")
    return out


STARTED = time.monotonic()


def sh(*argv: str, env: dict | None = None, check: bool = True, **kw) -> subprocess.CompletedProcess:
    # Each step with the time since the start (kind-up and the suite take many minutes).
    print(f"+ [+{time.monotonic() - STARTED:.0f}s]", " ".join(argv), file=sys.stderr, flush=True)
    return subprocess.run(argv, cwd=ROOT, env={**os.environ, **(env or {})}, check=check,
                          text=True, **kw)


def guard_drops(cluster: str) -> dict:
    r = sh("hack/kind-guard.sh", env={"CLUSTER": cluster}, stdout=subprocess.PIPE)
    return json.loads(r.stdout)


@dataclass
class Run:
    proxy: str
    cluster: str
    seconds: float = 0.0
    suite_rc: int = 0
    guard_before: dict = field(default_factory=dict)
    guard_after: dict = field(default_factory=dict)
    specs: dict[str, Outcome] = field(default_factory=dict)
    operator: dict = field(default_factory=dict)


def operator_checks(cluster: str) -> dict:
    """What an operator runs in the agent pod on a real node (issue 27), with no flags:
    `kubectl exec ds/kproxy-ebpf -- kproxy-ebpf services -o json|wide` and `trace` of the
    cluster's DNS Service, beside the CoreDNS endpoints the API lists, and `check --all-nodes`
    (every node's agent asked over its health port)."""
    def kc(*argv: str) -> subprocess.CompletedProcess:
        return sh("hack/kind-env.sh", "kubectl", "--context", f"kind-{cluster}", *argv,
                  stdout=subprocess.PIPE, stderr=subprocess.PIPE, check=False)

    def kproxy(*argv: str) -> subprocess.CompletedProcess:
        """`kubectl kproxy`: this checkout's kubectl-kproxy first on PATH; kubectl passes no
        flag given before a plugin's name, so the context goes after it."""
        path = os.pathsep.join((os.path.dirname(sys.executable), os.environ.get("PATH", "")))
        return sh("hack/kind-env.sh", "kubectl", "kproxy", "--context", f"kind-{cluster}",
                  *argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, check=False,
                  env={"PATH": path})

    agent = ("-n", "kube-system", "exec", "ds/kproxy-ebpf", "-c", "agent", "--", "kproxy-ebpf")
    dns = kc("-n", "kube-system", "get", "svc", "kube-dns", "-o",
             "jsonpath={.spec.clusterIP}").stdout.strip()
    slices = kc("-n", "kube-system", "get", "endpointslices", "-l",
                "kubernetes.io/service-name=kube-dns", "-o", "json")
    coredns = sorted({a for sl in json.loads(slices.stdout or "{}").get("items", [])
                      for e in sl.get("endpoints") or [] for a in e.get("addresses", [])
                      if (e.get("conditions") or {}).get("ready")})
    services = kc(*agent, "services", "-o", "json")
    traced = kc(*agent, "trace", f"{dns}:53/UDP", "-o", "json")
    text = kc(*agent, "trace", f"{dns}:53/UDP", "--explain")
    wide = kc(*agent, "services", "-o", "wide", "--service", "kube-system/kube-dns")
    nodes = kc(*agent, "check", "--all-nodes", "-o", "json")
    # The kubectl plugin: a worker's frontends from its own agent pod, and every agent's check.
    worker = kc("get", "nodes", "-l", "!node-role.kubernetes.io/control-plane", "-o",
                "jsonpath={.items[0].metadata.name}").stdout.strip()
    plugin = kproxy("--node", worker, "services", "-o", "json")
    plugin_check = kproxy("check", "--all-nodes", "-o", "json")
    return {"dns": dns, "coredns": coredns, "worker": worker,
            "plugin_rc": plugin.returncode,
            "plugin_dns_frontends": sum(1 for r in json.loads(plugin.stdout or "[]")
                                        if r.get("address") == dns)
            if plugin.returncode == 0 else plugin.stderr,
            "plugin_check_rc": plugin_check.returncode,
            "plugin_check": json.loads(plugin_check.stdout)
            if plugin_check.stdout.startswith("[") else plugin_check.stderr,
            "wide_rc": wide.returncode, "wide": wide.stdout or wide.stderr,
            "all_nodes_rc": nodes.returncode,
            "all_nodes": json.loads(nodes.stdout) if nodes.stdout.startswith("[") else nodes.stderr,
            "services_rc": services.returncode,
            "dns_frontends": sum(1 for r in json.loads(services.stdout or "[]")
                                 if r.get("address") == dns),
            "trace_rc": traced.returncode,
            "trace": json.loads(traced.stdout) if traced.returncode == 0 else traced.stderr,
            "trace_text": text.stdout or text.stderr}


def run_suite(proxy: str, cluster: str, focus: str, skip: str, procs: int, images: list[str],
              runner: str, work: Path, keep: bool, family: str = "ipv4") -> Run:
    run = Run(proxy, cluster)
    out = work / proxy
    out.mkdir(parents=True)
    start = time.monotonic()
    env = {"CLUSTER": cluster, "PROXY": proxy, "IP_FAMILY": family}
    try:
        # kind-up reuses a cluster of that name; one left by a run killed half-way is not clean.
        if cluster in sh("hack/kind-env.sh", "kind", "get", "clusters", stdout=subprocess.PIPE).stdout.split():
            print(f"e2e: removing cluster {cluster}, left by an earlier run", file=sys.stderr)
            sh("hack/kind-down.sh", env={"CLUSTER": cluster})
        sh("hack/kind-up.sh", env=env)
        archive = work / "e2e-images.tar"
        if not archive.exists():
            sh("podman", "save", "-q", "-m", "-o", str(archive), *images)
        sh("hack/kind-env.sh", "kind", "load", "image-archive", str(archive), "--name", cluster)
        kubeconfig = sh("hack/kind-env.sh", "kind", "get", "kubeconfig", "--internal", "--name", cluster,
                        stdout=subprocess.PIPE).stdout
        (out / "kubeconfig").write_text(kubeconfig)
        (out / "repo-list.yaml").write_text((KIND / "e2e-repo-list.yaml").read_text())
        run.guard_before = guard_drops(cluster)
        r = sh("hack/kind-env.sh", "podman", "run", "--rm", "--network", NET, "--pull=never",
               "-v", f"{out}:/out", "-e", "KUBE_TEST_REPO_LIST=/out/repo-list.yaml",
               "-e", "KUBERNETES_CONFORMANCE_TEST=y", runner,
               "ginkgo", f"--procs={procs}", f"--focus={focus}", f"--skip={skip}",
               "--json-report=report.json", "--output-dir=/out", "--timeout=6h",
               "--silence-skips", "--no-color",
               "/usr/local/bin/e2e.test", "--",
               "--kubeconfig=/out/kubeconfig", "--provider=skeleton", "--num-nodes=2",
               "--kubectl-path=/usr/local/bin/kubectl", "--disable-log-dump=true",
               "--report-dir=/out", check=False)
        run.suite_rc = r.returncode
        run.guard_after = guard_drops(cluster)
        report = out / "report.json"
        if not report.exists():
            raise SystemExit(f"e2e: the suite against {proxy} wrote no report (rc {r.returncode})")
        run.specs = outcomes(json.loads(report.read_text()))
        if proxy == "kproxy":
            run.operator = operator_checks(cluster)
    finally:
        run.seconds = round(time.monotonic() - start, 1)
        if not keep:
            sh("hack/kind-down.sh", env={"CLUSTER": cluster}, check=False)
    return run


def environment(family: str = "ipv4") -> dict:
    versions = dict(line.split("=", 1) for line in (ROOT / "tools/k8s/versions.env").read_text()
                    .splitlines() if re.match(r"^[A-Z0-9_]+=", line))
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, text=True,
                            capture_output=True).stdout.strip()
    dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=ROOT,
                           text=True, capture_output=True).stdout.strip()
    podman = subprocess.run(["podman", "--version"], text=True, capture_output=True).stdout.strip()
    return {"date": dt.datetime.now(dt.UTC).strftime("%Y-%m-%d %H:%M UTC"),
            "commit": commit + ("+changes" if dirty else ""), "kernel": platform.release(),
            "cpus": os.cpu_count(), "kubernetes": versions.get("K8S_VERSION"),
            "kind": versions.get("KIND_VERSION"), "podman": podman,
            "nodes": "1 control plane (schedulable) + 1 worker, ptp CNI, no registry",
            "ip_family": family}


def report(runs: list[Run], skips: list[Listed], differences: list[Listed], focus: str, env: dict) -> dict:
    """Every [sig-network] spec with its outcome under each proxy, the skip reasons, and the
    comparison kproxy vs kube-proxy."""
    names = sorted(set().union(*(r.specs for r in runs)))
    specs = []
    for name in names:
        row = {"spec": name}
        for r in runs:
            row[r.proxy] = asdict(r.specs.get(name, Outcome("not-run")))
        ours = next((s for s in skips if s.matches(name)), None)
        if ours:
            row["skip"] = {"reason": ours.reason, "until": ours.until}
        row["cilium_skips"] = re.search(CILIUM_SKIP, name) is not None
        specs.append(row)
    proxies = [r.proxy for r in runs]
    summary = {r.proxy: {s: sum(1 for row in specs if row[r.proxy]["state"] == s)
                         for s in ("passed", "failed", "skipped", "not-run")} for r in runs}
    diff = {}
    if "kproxy" in proxies and len(proxies) > 1:
        oracle = next(p for p in proxies if p != "kproxy")
        worse = [row["spec"] for row in specs
                 if row[oracle]["state"] == "passed" and row["kproxy"]["state"] != "passed"]
        listed = {name: next((asdict(d) for d in differences if d.matches(name)), None) for name in worse}
        diff = {"oracle": oracle,
                "oracle_passes_kproxy_fails": worse,
                "unexplained": [name for name, why in listed.items() if why is None],
                "explained": {name: why for name, why in listed.items() if why},
                "kproxy_passes_oracle_fails": [row["spec"] for row in specs
                                               if row["kproxy"]["state"] == "passed"
                                               and row[oracle]["state"] != "passed"]}
    in_focus = [row for row in specs if re.search(focus, row["spec"])]
    return {"environment": env, "focus": focus, "skip_list": [asdict(s) for s in skips],
            "skipped_by_us": sum(1 for row in in_focus if "skip" in row),
            "skipped_by_cilium_list": sum(1 for row in in_focus if row["cilium_skips"]),
            "runs": [{"proxy": r.proxy, "cluster": r.cluster, "seconds": r.seconds,
                      "suite_rc": r.suite_rc, "guard_drops_before": r.guard_before,
                      "guard_drops_after": r.guard_after, "operator": r.operator}
                     for r in runs],
            "summary": summary, "comparison": diff, "specs": specs}


def _drops(d: dict) -> int:
    return sum((d.get("nodes") or {}).values()) + int(d.get("host") or 0)


def markdown(rep: dict) -> str:
    env, runs, summary = rep["environment"], rep["runs"], rep["summary"]
    proxies = [r["proxy"] for r in runs]
    out = [f"# Kubernetes e2e `{rep['focus']}` on kind: kproxy-ebpf and kube-proxy",
           "", "Written by `make e2e` (tools/kind/e2e.py); do not edit by hand.", "",
           "| | " + " | ".join(f"`{k}`" for k in env) + " |",
           "|---|" + "---|" * len(env), "| environment | " + " | ".join(str(v) for v in env.values()) + " |",
           "", "## Summary", "",
           "| proxy | passed | failed | skipped by the suite | not run (skip list) | minutes "
           "| egress guard drops during the specs |",
           "|---|---|---|---|---|---|---|"]
    for r in runs:
        s = summary[r["proxy"]]
        during = _drops(r["guard_drops_after"]) - _drops(r["guard_drops_before"])
        out.append(f"| {PROXIES[r['proxy']]} | {s['passed']} | {s['failed']} | {s['skipped']} | "
                   f"{s['not-run']} | {r['seconds'] / 60:.0f} | {during} (before: "
                   f"{_drops(r['guard_drops_before'])}) |")
    cmp = rep["comparison"]
    if cmp:
        out += ["", f"Specs {PROXIES[cmp['oracle']]} passes and kproxy-ebpf does not: "
                f"**{len(cmp['oracle_passes_kproxy_fails'])}**"]
        for name in cmp["oracle_passes_kproxy_fails"]:
            why = cmp["explained"].get(name)
            out.append(f"- {name}: " + (f"{why['reason']} (until: {why['until'] or '-'})" if why
                                         else "**not in tools/kind/e2e-differences.yaml**"))
        out += ["", f"Specs kproxy-ebpf passes and {PROXIES[cmp['oracle']]} does not: "
                f"{len(cmp['kproxy_passes_oracle_fails'])}"]
        out += [f"- {s}" for s in cmp["kproxy_passes_oracle_fails"]]
    out += ["", "## Skip list (tools/kind/e2e-skip.yaml)", "",
            f"{rep['skipped_by_us']} specs of the focus are not run; Cilium's kind job's skip "
            f"list would keep {rep['skipped_by_cilium_list']} of the same specs from running.", "",
            "| pattern | specs | why | until |", "|---|---|---|---|"]
    for s in rep["skip_list"]:
        n = sum(1 for row in rep["specs"] if row.get("skip", {}).get("reason") == s["reason"])
        out.append(f"| `{s['pattern']}` | {n} | {s['reason']} | {s['until'] or '-'} |")
    out += ["", "## Every spec", "",
            "| spec | " + " | ".join(PROXIES[p] for p in proxies) + " |",
            "|---|" + "---|" * len(proxies)]
    for row in rep["specs"]:
        cells = []
        for p in proxies:
            o = row[p]
            cell = o["state"] + (f" ({o['seconds']:.0f} s)" if o["state"] in ("passed", "failed") else "")
            if o["state"] in ("failed", "skipped") and o["message"]:
                cell += ": " + o["message"][:160].replace("|", "/")
            cells.append(cell)
        name = row["spec"].replace("|", "/")
        if "skip" in row:
            name += f" *(skip list: {row['skip']['reason']})*"
        out.append(f"| {name} | " + " | ".join(cells) + " |")
    return "\n".join(out) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--proxies", default="kproxy,nftables")
    ap.add_argument("--focus", default=FOCUS)
    ap.add_argument("--smoke", action="store_true",
                    help="[Conformance] specs of [sig-network] Services against kproxy only")
    ap.add_argument("--ip-family", choices=FAMILIES, default="ipv4",
                    help="dual: dual-stack clusters and the [Feature:IPv6DualStack] specs")
    ap.add_argument("--cluster-prefix", default="kproxy-e2e",
                    help="the clusters are named PREFIX-PROXY (the smoke's: kproxy-smoke)")
    ap.add_argument("--procs", type=int, default=2)
    ap.add_argument("--results-dir", type=Path, default=ROOT / "e2e" / "results")
    ap.add_argument("--json-out", type=Path, help="write the report here instead of --results-dir")
    ap.add_argument("--keep", action="store_true", help="leave the clusters up")
    args = ap.parse_args(argv)
    if args.smoke:
        args.proxies, args.focus = "kproxy", SMOKE_FOCUS
    elif args.ip_family == "dual" and args.focus == FOCUS:
        args.focus = DUAL_FOCUS
    proxies = [p for p in args.proxies.split(",") if p]
    unknown = [p for p in proxies if p not in PROXIES]
    if unknown:
        ap.error(f"unknown proxy {unknown}: choose from {sorted(PROXIES)}")
    skips = load_listed(KIND / "e2e-skip.yaml", args.ip_family)
    differences = load_listed(KIND / "e2e-differences.yaml", args.ip_family)
    names = sh("tools/kind/images.sh", "e2e", stdout=subprocess.PIPE).stdout.split()
    images, runner = names[:-1], names[-1]
    env = environment(args.ip_family)   # before the runs: the commit they test, not one made meanwhile
    runs = []
    with tempfile.TemporaryDirectory(prefix="kproxy-e2e.", dir="/var/tmp") as work:
        # kind, kubectl and helm keep the clusters' contexts here, not in the user's
        # ~/.kube/config (kind's default), which a run would otherwise leave rewritten.
        os.environ["KUBECONFIG"] = str(Path(work) / "kubeconfig")
        for proxy in proxies:
            cluster = "kproxy-smoke" if args.smoke else f"{args.cluster_prefix}-{proxy}"
            runs.append(run_suite(proxy, cluster, args.focus, skip_regex(skips), args.procs,
                                  images, runner, Path(work), args.keep, args.ip_family))
    rep = report(runs, skips, differences, args.focus, env)
    if args.json_out:
        args.json_out.write_text(json.dumps(rep, indent=1) + "\n")
    else:
        args.results_dir.mkdir(parents=True, exist_ok=True)
        stem = "latest" if args.ip_family == "ipv4" else args.ip_family
        (args.results_dir / f"{stem}.json").write_text(json.dumps(rep, indent=1) + "\n")
        (args.results_dir / f"{stem}.md").write_text(markdown(rep))
        print(f"e2e: wrote {args.results_dir}/{stem}.md", file=sys.stderr)
    for r in runs:
        s = rep["summary"][r.proxy]
        print(f"e2e: {PROXIES[r.proxy]}: {s['passed']} passed, {s['failed']} failed, "
              f"{s['skipped']} skipped by the suite, {s['not-run']} not run", file=sys.stderr)
    unexplained = rep["comparison"].get("unexplained", [])
    for name in unexplained:
        print(f"e2e: kube-proxy passes and kproxy-ebpf fails, not listed in "
              f"tools/kind/e2e-differences.yaml: {name}", file=sys.stderr)
    return 1 if unexplained else 0


if __name__ == "__main__":
    sys.exit(main())
