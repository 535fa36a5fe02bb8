"""`kproxy-ebpf bench`: the benchmark (issue 9) and, with --scale, the scale run (issue 11).

Needs root and the control-plane binaries; runs in labs named bench*; takes the machine's
test lock for the whole run so it never shares the machine's CPUs with a root test suite."""
from __future__ import annotations

import fcntl
import os
import sys
import time
from pathlib import Path

import click

from .suite import ALL_MODES
from .testbed import PROXY_MODES

LOCK_PATH = "/run/lock/kproxy-ebpf-tests.lock"
MAX_N = 50000


def _ints(text: str | None) -> list[int] | None:
    if not text:
        return None
    try:
        out = [int(x) for x in text.replace(" ", "").split(",") if x]
    except ValueError as e:
        raise click.BadParameter(f"{text!r}: a comma-separated list of integers") from e
    if not out or any(n < 1 or n > MAX_N for n in out):
        raise click.BadParameter(f"sizes must be in 1..{MAX_N}")
    return out


def _modes(text: str | None, allowed=ALL_MODES) -> list[str] | None:
    if not text:
        return None
    out = [m for m in text.replace(" ", "").split(",") if m]
    bad = [m for m in out if m not in allowed]
    if bad:
        raise click.BadParameter(f"unknown mode(s) {bad}; choose from {', '.join(ALL_MODES)}")
    return out


def _log(msg: str) -> None:
    click.echo(f"{time.strftime('%H:%M:%S')} bench: {msg}", err=True)


def _done(paths: list[Path], goal_rows: list[dict]) -> None:
    """Names the files a run wrote and its goals, and ends (a run asserts nothing)."""
    for p in paths:
        click.echo(f"wrote {p}")
    for g in goal_rows:
        click.echo(f"{g['status']:13} {g['goal']}: {g['measured']}")
    sys.exit(0)


class _TestLock:
    """flock on the machine's test lock (the Makefile's root suites take the same one)."""

    def __enter__(self):
        self.fd = os.open(LOCK_PATH, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(self.fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            _log(f"waiting for {LOCK_PATH} (a root test run holds it)")
            fcntl.flock(self.fd, fcntl.LOCK_EX)
        return self

    def __exit__(self, *exc):
        os.close(self.fd)


@click.command()
@click.option("--quick", is_flag=True, help="Reduced sizes and repeats (< 5 minutes): a smoke run.")
@click.option("--modes", help=f"Comma-separated subset of {','.join(ALL_MODES)}.")
@click.option("--sizes", help=f"Comma-separated N values (<= {MAX_N}); default 100,1000,10000 "
                              "(quick: 100,1000).")
@click.option("--repeats", type=click.IntRange(1), help="crr runs per percentile (median).")
@click.option("--m5-changes", type=click.IntRange(1), help="Changes measured for M5.")
@click.option("--cold-timeout", type=click.FloatRange(1), help="Seconds a proxy may take to "
              "program N x E before it is recorded as not finished, at N <= 10000; "
              "proportionally more above.  [default: 60]")
@click.option("--scale", is_flag=True,
              help="The scale run instead of the benchmark: N Services filled while both "
                   "nodes' proxies run (writes bench/results/scale-latest.*).")
@click.option("--idle", type=click.FloatRange(0), default=600.0, show_default=True,
              help="Scale run: the idle window after the fill, seconds.")
@click.option("--scale-n", type=click.IntRange(1, MAX_N), default=10000, show_default=True,
              help="Scale run: Services to fill.")
@click.option("--scale-change-ns", default="1000,10000", show_default=True,
              help="Scale run: the N at which CPU per single change is measured.")
@click.option("--scale-changes", type=click.IntRange(1), default=200, show_default=True,
              help="Scale run: single changes per measurement.")
@click.option("--scale-change-window", type=click.FloatRange(1), default=60.0, show_default=True,
              help="Scale run: seconds the single changes are spread over (and the idle "
                   "reference window before them).")
@click.option("--scale-bitmap-allocator", is_flag=True,
              help="Scale run: the lab API server allocates ClusterIPs with 1.33's bitmap "
                   "(it emulates 1.33), whose fill is linear; 1.36's lists every IPAddress per "
                   "allocation, ~70 minutes of fill to 50,000.")
@click.option("--soak", type=click.FloatRange(0.5), default=None,
              help="The churn soak for this many minutes instead of the benchmark "
                   "(writes bench/results/reliability.md).")
@click.option("--soak-services", type=click.IntRange(1, MAX_N), default=1000, show_default=True,
              help="Soak: filler Services.")
@click.option("--faults", is_flag=True,
              help="The control-plane faults under probes instead of the benchmark "
                   "(writes bench/results/reliability.md).")
@click.option("--fault-outage", type=click.FloatRange(5), default=180.0, show_default=True,
              help="Faults: seconds the API server stays down.")
@click.option("--change-cost", is_flag=True,
              help="CPU per endpoint change of node1's proxy instead of the benchmark: each N "
                   "(--sizes), pod density and mode (--modes, default kproxy,nftables; "
                   "kproxy-before: the agent of the checkout in $KPROXY_BENCH_AGENT_TREE), "
                   "changes paced and in bursts (writes bench/results/change-cost-latest.*).")
@click.option("--schedulers", is_flag=True,
              help="kproxy's load-balancing algorithms side by side instead of the benchmark: "
                   "M1/M2 and kp_connect4's cost per algorithm, and three backends, one ten "
                   "times slower, under connection-per-request clients (writes "
                   "bench/results/schedulers-latest.*; --quick: 2 shorter rounds).")
@click.option("--sched-rounds", type=click.IntRange(1),
              help="Scheduler bench: rounds, each algorithm once per round.  [default: 3]")
@click.option("--sched-threads", type=click.IntRange(1, 64),
              help="Scheduler bench: closed-loop clients of the slow-backend case.  [default: 8]")
@click.option("--pod-densities", default="5,100", show_default=True,
              help="Change cost: pods on node1 (idle ones added) for each measurement.")
@click.option("--pods", type=click.IntRange(1, 250), default=50, show_default=True,
              help="Benchmark and scale run: pods on each node, idle ones added (a node holds "
                   "up to 110).")
@click.option("--lab", "lab_name", default=None, help="Lab name (default bench / bench-scale).")
@click.option("--tools-dir", help="Where `make bench-tools` put kpbench-client and "
                                  "kpbench-server.  [default: the checkout's build/bench]")
@click.option("--out", "out_dir", type=click.Path(file_okay=False),
              help="Results directory.  [default: the checkout's bench/results]")
@click.option("--no-readme", is_flag=True, help="Do not rewrite README.md's generated section.")
@click.option("--no-pin", is_flag=True, help="Do not pin client and servers to CPUs 0 and 1.")
@click.option("--ip-family", type=click.Choice(["ipv4", "ipv6"]), default="ipv4",
              show_default=True, help="The lab's family: every measured address IPv6 with "
                                      "ipv6 (M9 then runs for the baselines only).")
def bench(quick, modes, sizes, repeats, m5_changes, cold_timeout, scale, idle, scale_n, scale_change_ns,
          scale_changes, scale_change_window, scale_bitmap_allocator, soak, soak_services, faults, fault_outage,
          change_cost, schedulers, sched_rounds, sched_threads, pod_densities, pods, lab_name, tools_dir, out_dir,
          no_readme, no_pin, ip_family) -> None:
    """Benchmark kproxy against kube-proxy iptables/nftables and the direct path, in the lab."""
    if os.geteuid() != 0:
        raise click.ClickException("the benchmark needs root (namespaces, BPF, iptables)")
    from . import report
    from .env import REPO

    out = Path(out_dir) if out_dir else REPO / "bench" / "results"
    tools_dir = str(Path(tools_dir).resolve()) if tools_dir else str(REPO / "build" / "bench")
    readme = None if no_readme else REPO / "README.md"
    with _TestLock():
        if faults:
            from .faults import FaultConfig, faults_passed, run_faults

            doc = run_faults(FaultConfig(outage_s=fault_outage, lab_name=lab_name or "faults"),
                             _log)
            for p in report.write_faults(doc, out):
                click.echo(f"wrote {p}")
            v = doc["verdict"]
            click.echo(f"failed connections {v['failed_connections']}, wrong "
                       f"{v['wrong_connections']}, unrecovered {v['unrecovered'] or 'none'}, "
                       f"rows lost {v['rows_lost_during_outage'] or 'none'}")
            sys.exit(0 if faults_passed(doc) else 1)
        if change_cost:
            from .change_cost import ChangeCostConfig, run_change_cost

            cc = ChangeCostConfig(lab_name=lab_name or "bench-changes", tools_dir=tools_dir)
            cc.sizes = _ints(sizes) or cc.sizes
            cc.modes = _modes(modes, PROXY_MODES) or cc.modes
            cc.densities = _ints(pod_densities) or cc.densities
            doc = run_change_cost(cc, _log)
            _done(report.write_change_cost(doc, out), doc["goals"])
        if schedulers:
            from .schedulers import SchedConfig, run_schedulers

            sc = SchedConfig.make(quick, lab_name=lab_name or "bench-sched", tools_dir=tools_dir,
                                  rounds=sched_rounds, threads=sched_threads, pin=not no_pin)
            doc = run_schedulers(sc, _log)
            _done(report.write_schedulers(doc, out), doc["goals"])
        if soak:
            from .soak import SoakConfig, run_soak, soak_passed

            doc = run_soak(SoakConfig(minutes=soak, services=soak_services,
                                      lab_name=lab_name or "soak"), _log)
            paths = report.write_soak(doc, out)
            for p in paths:
                click.echo(f"wrote {p}")
            v = doc["verdict"]
            click.echo(f"wrong connections {v['wrong_connections']}, unexpected failures "
                       f"{v['unexpected_failures']}, RSS flat {v['rss_flat']}, propagation "
                       f"window {doc['propagation_window_s']} s")
            sys.exit(0 if soak_passed(doc) else 1)
        if scale:
            from .scale import ScaleConfig, run_scale

            cfg = ScaleConfig(n=scale_n, idle_seconds=idle, lab_name=lab_name or "bench-scale",
                              change_ns=tuple(n for n in _ints(scale_change_ns) or ()
                                              if n <= scale_n),
                              changes=scale_changes, change_window=scale_change_window,
                              bitmap_ip_allocator=scale_bitmap_allocator, tools_dir=tools_dir,
                              modes=_modes(modes) or None, pods=pods)
            doc = run_scale(cfg, _log)
            paths = report.write_scale(doc, out, readme)
        else:
            from .suite import BenchConfig, run_bench

            cfg = BenchConfig.make(quick, sizes=_ints(sizes), modes=_modes(modes),
                                   repeats=repeats, m5_changes=m5_changes,
                                   cold_timeout=cold_timeout,
                                   lab_name=lab_name or "bench", tools_dir=tools_dir,
                                   pin=not no_pin, ip_family=ip_family, pods=pods)
            doc = run_bench(cfg, _log)
            paths = report.write_bench(doc, out, readme)
    for p in paths:
        click.echo(f"wrote {p}")
    if not scale:
        for g in doc["goals"]:
            click.echo(f"{g['metric']:4} {g['status']:13} {g['goal']}: {g['measured']}")
    sys.exit(0)
