"""The scheduler bench (issue 46, `kproxy-ebpf bench --schedulers`): kproxy's algorithms on the
socket path side by side, random (the default) beside round robin and least connection.

One lab, kproxy on node1 started once per algorithm and round with `--lb-algorithm` node-wide
(the modes kproxy, kproxy-rr, kproxy-lc of testbed.py), the algorithms' order rotated from
round to round so that the machine's drift (2 cores shared with other work) does not favour
one. In each start:

* M1/M2 as the main bench measures them: crr runs (connect, one request, close) with 1 and 2
  client threads through the ClusterIP of `kpbench-target` (10 backends on node2).
* The connect cost: kp_connect4's kernel run time per connect (bpf_stats, bpfcost.py) over
  one crr run through the target (the node-wide algorithm), and kp_release's per socket
  close beside it (the hook that counts sockets down). bpf_stats gives a mean, which moves
  with the machine's load from minute to minute by more than the 10 % the issue allows, so
  the cost compared between algorithms is measured interleaved: one Service per algorithm
  (its kproxy-ebpf.io/lb-algorithm annotation overrides the node's), over the same 10 pods
  and over 3, crr runs through each in turn, `cost_pairs` times per start; the comparison
  is the median of the ratios to random's run just before or after.
* The slow-backend case: `kpbench-sched`, a ClusterIP Service over three pods whose servers
  (kpbench-server --delay-us) each have one worker; two take `fast_us` per request, the
  third ten times that. Closed-loop clients (`threads` of them, in the client pod on node1)
  open one connection per request for `seconds`. Recorded: the requests' p50 and p99 (from
  connect to reply) and the share of connections each backend answered.

Why least-conn matters there: each backend serves one request at a time, so the slow one
handles at most 1/(10 x fast_us) a second. Random and round robin send it a third of the
requests anyway, and while it works through its queue the clients waiting on it hold their
connections open; least connection sees those open connections (kp_conns counts the
node's sockets from connect to close) and sends new ones elsewhere.

Maglev is not run: on the socket path it picks like random (its tables serve flows from
outside, at TC), see NORTH_SOUTH_ONLY in suite.py.
"""
from __future__ import annotations

import os
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field

from . import bpfcost, stats
from .fill import SERVICE_PORT, create_service
from .loadgen import SERVER, start_server, wait_answers
from .testbed import TARGET, Testbed, backend_name

# Algorithm (as kproxy-ebpf.io/lb-algorithm names it) -> the bench mode that runs it.
ALGORITHMS = {"random": "kproxy", "round-robin": "kproxy-rr", "least-conn": "kproxy-lc"}
SCHED_SERVICE = "kpbench-sched"
SCHED_PORT = 8090           # the slow-worker servers' request port in the three pods
SCHED_SINK_PORT = 8091
SCHED_BACKENDS = 3
SLOW_FACTOR = 10
ANNOTATION = "kproxy-ebpf.io/lb-algorithm"
COST_BACKENDS = (10, 3)     # the interleaved cost's Services: over the target's pods, and 3


def cost_service(algorithm: str, backends: int) -> str:
    return f"kpbench-alg-{algorithm}-{backends}"


@dataclass
class SchedConfig:
    lab_name: str = "bench-sched"
    tools_dir: str = "build/bench"
    quick: bool = False
    rounds: int = 3
    seconds: float = 5.0        # one slow-backend run
    # Enough clients that connections overlap: with 8 in a closed loop, the slow backend's
    # queue under random holds most of them.
    threads: int = 8
    fast_us: int = 1000         # per request, the two fast backends; the slow one 10x
    m1_runs: int = 5            # crr runs with 1 thread per start (M1, M2's rate_1)
    m2_runs: int = 3            # with 2 threads (M2's rate_2)
    crr_seconds: float = 1.5
    cost_pairs: int = 3         # interleaved cost runs per algorithm and Service, per start
    cost_seconds: float = 1.0
    endpoints: int = 10         # the target's, as the main bench's
    pin: bool = True
    algorithms: list[str] = field(default_factory=lambda: list(ALGORITHMS))

    @classmethod
    def make(cls, quick: bool, **kw) -> SchedConfig:
        base = cls(quick=quick)
        if quick:
            base.rounds, base.seconds, base.m1_runs, base.m2_runs = 2, 3.0, 3, 2
            base.crr_seconds, base.cost_pairs = 1.0, 2
        for k, v in kw.items():
            if v is not None:
                setattr(base, k, v)
        return base


def round_order(algorithms: list[str], rnd: int) -> list[str]:
    """The algorithms of round `rnd`, rotated by one each round: over len(algorithms)
    rounds each runs first, second and last once."""
    k = rnd % len(algorithms) if algorithms else 0
    return algorithms[k:] + algorithms[:k]


def delays(cfg: SchedConfig) -> dict[str, int]:
    """The three backends' time per request (us): the last one is the slow one."""
    names = [backend_name(i) for i in range(SCHED_BACKENDS)]
    return {n: cfg.fast_us * (SLOW_FACTOR if i == SCHED_BACKENDS - 1 else 1)
            for i, n in enumerate(names)}


@dataclass
class SchedRun:
    tb: Testbed
    cfg: SchedConfig
    log: Callable[[str], None]
    vip: str = ""
    cost_vips: dict[str, str] = field(default_factory=dict)

    def setup(self) -> dict[str, int]:
        """The slow-worker servers beside the pods' normal ones, and kpbench-sched over them."""
        tb = self.tb
        lab = tb.cluster.lab
        cpu = 1 if tb.pin and (os.cpu_count() or 1) > 1 else None
        per_request = delays(self.cfg)
        for pod, us in per_request.items():
            start_server(lab, tb.tools[SERVER], pod, SCHED_PORT, SCHED_SINK_PORT, cpu,
                         delay_us=us)
        for pod in per_request:
            wait_answers(tb.client, tb.pods[pod], SCHED_PORT, pod)
        self.vip = create_service(tb.api, SCHED_SERVICE, [tb.pods[p] for p in per_request],
                                  ports=(("", SERVICE_PORT, SCHED_PORT),))
        for alg in self.cfg.algorithms:
            for e in COST_BACKENDS:
                name = cost_service(alg, e)
                self.cost_vips[name] = create_service(
                    tb.api, name, [tb.pods[p] for p in tb.target_set[:e]],
                    annotations={ANNOTATION: alg})
        self.log(f"schedulers: {SCHED_SERVICE} {self.vip} over {per_request} (us per request)")
        return per_request

    def interleaved_cost(self, first: str) -> list[dict]:
        """cost_pairs x (for each Service size, each algorithm's Service in turn, rotated to
        start with `first`): kp_connect4/kp_release per run, as
        [{"backends": E, "algorithm": a, "bpf_ns": {...}}] in the order they ran."""
        tb, cfg = self.tb, self.cfg
        algs = cfg.algorithms
        order = round_order(algs, algs.index(first)) if first in algs else algs
        out = []
        for k in range(cfg.cost_pairs):
            for e in COST_BACKENDS:
                for alg in order if k % 2 == 0 else order[::-1]:
                    vip = [self.cost_vips[cost_service(alg, e)]]
                    ns = bpfcost.measure(lambda v=vip: tb.client.run(
                        "crr", v, SERVICE_PORT, duration=cfg.cost_seconds))
                    out.append({"backends": e, "algorithm": alg, "bpf_ns": ns})
        return out

    def one(self, algorithm: str) -> dict:
        """One start of kproxy with the algorithm: M1/M2, the connect cost, the slow case."""
        tb, cfg = self.tb, self.cfg
        mode = ALGORITHMS[algorithm]
        t0 = time.monotonic()
        tb.start_proxy(mode)
        try:
            tb.wait_programmed(60.0)
            target = [tb.vips[TARGET]]
            wait_answers(tb.client, target[0], SERVICE_PORT, None)
            for vip in (self.vip, *self.cost_vips.values()):
                wait_answers(tb.client, vip, SERVICE_PORT, None)
            one = [tb.client.run("crr", target, SERVICE_PORT, duration=cfg.crr_seconds)
                   for _ in range(cfg.m1_runs)]
            two = [tb.client.run("crr", target, SERVICE_PORT, duration=cfg.crr_seconds,
                                 threads=2) for _ in range(cfg.m2_runs)]
            cost = bpfcost.measure(lambda: tb.client.run("crr", target, SERVICE_PORT,
                                                         duration=cfg.crr_seconds))
            interleaved = self.interleaved_cost(algorithm)
            slow = tb.client.run("crr", [self.vip], SERVICE_PORT, duration=cfg.seconds,
                                 threads=cfg.threads, timeout_ms=5000)
        finally:
            tb.stop_proxy()
        out = {"mode": mode, "seconds": round(time.monotonic() - t0, 1),
               "M1": {"connect_us": _us(stats.median_of_runs([r["connect_ns"] for r in one])),
                      "failed": sum(r["failed"] for r in one)},
               "M2": {"rate_1": round(stats.median(r["rate"] for r in one), 1),
                      "rate_2": round(stats.median(r["rate"] for r in two), 1),
                      "failed": sum(r["failed"] for r in one + two)},
               "bpf_ns": cost, "interleaved_cost": interleaved,
               "slow": {"requests": slow["ok"], "failed": slow["failed"],
                        "errors": slow["errors"], "rate": slow["rate"],
                        "latency_ms": {k: round(v / 1e6, 3) for k, v in slow["txn_ns"].items()
                                       if k.startswith("p") or k in ("max", "mean")},
                        "backends": slow["backends"]}}
        s = out["slow"]
        self.log(f"schedulers: {algorithm}: slow case p50 {s['latency_ms'].get('p50')} ms "
                 f"p99 {s['latency_ms'].get('p99')} ms, {s['backends']}; connect "
                 f"{cost.get('kp_connect4', {}).get('ns')} ns")
        return out


def _us(dist: dict) -> dict:
    return {k: round(v / 1000, 2) for k, v in dist.items()}


def run_schedulers(cfg: SchedConfig, log: Callable[[str], None]) -> dict:
    """The whole scheduler bench; returns the results document (report: sched_report.py)."""
    from kproxy_ebpf.dev.lab.binaries import ensure_binaries

    from . import env

    doc: dict = {"kind": "schedulers", "config": asdict(cfg), "service": SCHED_SERVICE,
                 "rounds": []}
    tb = Testbed(cfg.lab_name, cfg.tools_dir, endpoints=cfg.endpoints,
                 live=max(cfg.endpoints, SCHED_BACKENDS), pin=cfg.pin, log=log)
    t_start = time.monotonic()
    tb.up()
    try:
        doc["environment"] = env.collect(ensure_binaries(build=False))
        run = SchedRun(tb, cfg, log)
        doc["delays_us"] = run.setup()
        doc["slow_backend"] = backend_name(SCHED_BACKENDS - 1)
        for rnd in range(cfg.rounds):
            order = round_order(cfg.algorithms, rnd)
            log(f"schedulers: round {rnd + 1}/{cfg.rounds}: {', '.join(order)}")
            doc["rounds"].append({a: run.one(a) for a in order})
    finally:
        tb.down()
    doc["run_seconds"] = round(time.monotonic() - t_start, 1)
    return doc
