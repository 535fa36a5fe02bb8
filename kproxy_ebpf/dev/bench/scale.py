"""The scale run (issue 11): a 2-node lab, one proxy per node, N (10,000) Services x 10
endpoints created through the API while the proxies run; for kproxy, kube-proxy nftables and
kube-proxy iptables in turn, each in a fresh lab:

- CPU seconds per node during the fill (from its first write until the proxy has caught up),
  children included (cgroup cpu.stat, /proc beside it);
- resident memory per node after the fill;
- time from the fill's start until the last Service answers (its EndpointSlice is the fill's
  last API write; the Service itself exists from the start so the client knows its address),
  not counting the per-change measurement at 1k in between;
- CPU seconds during an idle window (default 10 minutes, as the issue says; configurable);
- CPU per single endpoint change at N = 1k and at N: 200 changes (kube-proxy: 40) of one live Service, each
  awaited until a connection sees it and paced so each is its own partial sync, in 8
  sub-windows; an idle reference window of the same length just before, also in 8. The
  proxy's own count of periodic work (kproxy's full-sync CPU) is taken out of every
  sub-window, the median idle rate is subtracted, and the figure is the median over the busy
  sub-windows with min and max beside (per_change_cpu);
- kproxy's cold start at N: both agents stopped and their maps removed, started again against
  the API server holding all N, until every node reports everything programmed (wall time
  and CPU; the program cache is warm, as in the benchmark's M6).
"""
from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field

from kproxy_ebpf.dev.lab import idle_pods

from . import fill
from .procstat import CpuSample, cpu_between
from .rawapi import ApiError
from .testbed import M5_SERVICE, MIN_SYNC_S, PROGRAMMED_METRICS, Testbed, metric

LAST = "kpbench-last"
MIB = 1024 * 1024
NODES = ("node1", "node2")


@dataclass
class ScaleConfig:
    n: int = 10000
    endpoints: int = 10
    idle_seconds: float = 600.0
    change_ns: tuple[int, ...] = (1000, 10000)
    # Enough changes that their CPU stands out of the background, each its own partial sync
    # (spaced above the proxy's minSyncPeriod), measured in sub-windows for a median and a
    # spread.
    changes: int = 200
    # kube-proxy spends 0.2 s (1k) to 5 s (10k) of CPU and wall time on each change: 40 stand
    # far above its background, and 200 would take 17 minutes at 10k.
    kube_proxy_changes: int = 40
    change_window: float = 60.0
    # kube-proxy's changes at N above this are not measured: each waits for a full sync
    # (5 s at 10k; minutes per change past it), and the goal is about kproxy's curve.
    kube_proxy_change_max_n: int = 10000
    sub_windows: int = 8
    catch_up_timeout: float = 600.0
    lab_name: str = "bench-scale"
    # The lab API server's ClusterIP allocator: 1.33's bitmap instead of 1.36's, whose fill
    # is quadratic in N (lab/controlplane.py ControlPlane); the proxies are the same.
    bitmap_ip_allocator: bool = False
    tools_dir: str = "build/bench"
    modes: list[str] | None = None
    pods: int = 50                  # pods on each node, idle ones added (lab/idle_pods.py)
    # M5 across a drift check: one change a second, each awaited, until node1's agent has
    # done a check in the window and this many changes after it.
    m5_drift_after: int = 20
    all_modes: tuple[str, ...] = field(default=("kproxy", "nftables", "iptables",
                                                "iptables-legacy"))


class CatchUpTimeout(Exception):
    """The proxy did not program what was written within catch_up_timeout: recorded as
    "did not finish" for that mode (kube-proxy iptables on the nft backend at 10k x 10;
    kube-proxy nftables' last Service at 50k x 10). `after_s`, when known: the fill's time
    until the wait gave up, without the pauses that measure single changes, a lower bound
    of the mode's time to the last answer."""

    def __init__(self, message: str, after_s: float | None = None):
        super().__init__(message)
        self.after_s = after_s


class ScaleRun:
    def __init__(self, cfg: ScaleConfig, mode: str, log: Callable[[str], None]):
        self.cfg, self.mode, self.log = cfg, mode, log
        self.tb = Testbed(cfg.lab_name, cfg.tools_dir, endpoints=cfg.endpoints, live=2,
                          proxy_nodes=NODES, log=log, max_services=cfg.n,
                          bitmap_ip_allocator=cfg.bitmap_ip_allocator)
        self.out: dict = {"per_change": {}}
        self._t_fill: float | None = None          # when the fill began (monotonic)
        if mode == "kproxy":
            self.out["kproxy_map_sizes"] = self.tb.kproxy_map_sizes()

    def _samples(self) -> dict:
        return {node: self.tb.meter(node).sample() for node in NODES}

    def _periodic_cpu(self) -> dict:
        """CPU seconds so far that are not per-change work, by the proxy's own count: kproxy's
        full syncs (every syncPeriod; the map re-read of every tenth included). kube-proxy
        has no such counter (0): the median over sub-windows stands in for it there."""
        if not self.mode.startswith("kproxy"):
            return dict.fromkeys(NODES, 0.0)
        name = "kproxy_sync_full_cpu_seconds_total"
        return {node: metric(self.tb.metrics(node, (name,)), name)
                for node in NODES}

    def _cpu(self, a: dict, b: dict) -> dict:
        per = {node: cpu_between(a[node], b[node]) for node in NODES}
        return {"cpu_s": {n: round(c["cpu_s"], 3) for n, c in per.items()},
                "cpu_s_proc": {n: round(c["cpu_s_proc"], 3) for n, c in per.items()
                               if c["cpu_s_proc"] is not None},
                "source": per["node1"]["source"],
                "cpu_s_mean": round(sum(c["cpu_s"] for c in per.values()) / len(per), 3),
                "wall_s": round(per["node1"]["wall_s"], 2)}

    def _caught_up(self, since_wall: float) -> float:
        """Monotonic time when every node's proxy holds everything written so far."""
        deadline = time.monotonic() + self.cfg.catch_up_timeout
        while time.monotonic() < deadline:
            if all(self._node_done(node, since_wall) for node in NODES):
                return time.monotonic()
            time.sleep(0.1)
        raise CatchUpTimeout("did not catch up within "
                             f"{self.cfg.catch_up_timeout:.0f}s")

    def _node_done(self, node: str, since_wall: float) -> bool:
        if not self.tb.programmed(node):
            return False
        if self.mode == "kproxy":
            return True
        return metric(self.tb.metrics(node, PROGRAMMED_METRICS),
                      "kubeproxy_sync_proxy_rules_last_timestamp_seconds") > since_wall

    def run(self) -> dict:
        try:
            return self._run()
        except (CatchUpTimeout, ApiError) as e:
            # A mode that cannot finish is a result, not the end of the run: the modes
            # before it keep theirs.
            self.log(f"{self.mode}: {e}")       # the report names the mode itself
            why = str(e) if isinstance(e, CatchUpTimeout) else f"the API server failed: {e}"
            self.out["did_not_finish"] = f"{why}; at {self.tb.filled} services"
            after = e.after_s if isinstance(e, CatchUpTimeout) else None
            if after is None and self._t_fill is not None:
                after = time.monotonic() - self._t_fill
            if after is not None:           # a lower bound of its time to the last answer
                self.out["did_not_finish_after_s"] = round(after, 1)
            return self.out

    def _run(self) -> dict:
        tb, cfg = self.tb, self.cfg
        tb.up()
        try:
            self.out["idle_pods"] = {node: idle_pods.set_pods(tb.cluster.lab, node, cfg.pods,
                                                              self.log) for node in NODES}
            api = tb.api
            # The last Service exists (no endpoints) before the fill, so the client can
            # watch its ClusterIP; its slice is the fill's last write.
            svc = api.create(fill.services_path(), fill.service_obj(LAST))
            last_vip = svc["spec"]["clusterIP"]
            tb.start_proxy(self.mode)
            t0_wall = time.time()
            self._caught_up(t0_wall - 3600)
            self._t_fill = time.monotonic()
            self.out["start_rss_mib"] = self._rss()
            fill_cpu: list[dict] = []
            fill_wall = 0.0
            for stop in sorted({n for n in cfg.change_ns if n < cfg.n} | {cfg.n}):
                a, t_seg, seg_wall = self._samples(), time.monotonic(), time.time()
                tb.fill_to(stop)
                if stop == cfg.n:
                    with tb.client.watch([last_vip], fill.SERVICE_PORT, interval_us=5000,
                                         timeout_ms=100) as w:
                        w.send("*", cfg.catch_up_timeout)
                        t_last_write = time.time_ns()
                        api.create(fill.slices_path(), fill.slice_obj(
                            LAST, [tb.pods[n] for n in tb.target_set]))
                        seen = w.result()
                    if not seen.get("ok"):
                        raise CatchUpTimeout(
                            "the last Service did not answer within "
                            f"{cfg.catch_up_timeout:.0f}s of its slice's write",
                            after_s=fill_wall + time.time() - seg_wall)
                    # fill time so far, without the per-change pauses between segments
                    self.out["last_answer_s"] = round(
                        fill_wall + seen["seen_realtime_ns"] / 1e9 - seg_wall, 2)
                    self.out["last_answer_after_last_write_s"] = round(
                        (seen["seen_realtime_ns"] - t_last_write) / 1e9, 3)
                done = self._caught_up(seg_wall)
                fill_wall += done - t_seg
                fill_cpu.append(self._cpu(a, self._samples()))
                self.log(f"{self.mode}: {stop} services, caught up after {done - t_seg:.1f}s")
                if stop in cfg.change_ns and stop != cfg.n:
                    self.out["per_change"][str(stop)] = self._per_change(stop)
            self.out["fill"] = {
                "services": cfg.n, "endpoints": cfg.endpoints, "wall_s": round(fill_wall, 1),
                "cpu_s": {node: round(sum(c["cpu_s"][node] for c in fill_cpu), 3)
                          for node in NODES},
                "cpu_s_mean": round(sum(c["cpu_s_mean"] for c in fill_cpu), 3),
                "source": fill_cpu[0]["source"], "segments": fill_cpu}
            self.out["rss_mib_after_fill"] = self._rss()
            self.log(f"{self.mode}: idle {cfg.idle_seconds:.0f}s")
            a = self._samples()
            time.sleep(cfg.idle_seconds)        # the measured idle window
            idle = self._cpu(a, self._samples())
            idle["mcpu_mean"] = round(idle["cpu_s_mean"] / max(idle["wall_s"], 1e-9) * 1000, 1)
            self.out["idle"] = idle
            self.out["rss_mib_after_idle"] = self._rss()
            if cfg.n in cfg.change_ns and (self.mode.startswith("kproxy")
                                           or cfg.n <= cfg.kube_proxy_change_max_n):
                self.out["per_change"][str(cfg.n)] = self._per_change(cfg.n)
            elif cfg.n in cfg.change_ns:
                self.out["per_change_skipped"] = (
                    f"N={cfg.n}: kube-proxy's single changes are measured up to "
                    f"N={cfg.kube_proxy_change_max_n} (each waits for a full sync)")
            if self.mode == "kproxy":
                self.out["m5_across_drift"] = self._m5_across_drift()
                self.out["drift_check"] = self._drift_summary()
                self.out["cold_start"] = self._cold_start()
        finally:
            tb.down()
        return self.out

    def _cold_start(self) -> dict:
        """Both agents stopped and cleaned away, then started again with everything in the
        API: seconds until every node has programmed it all, and the CPU that took."""
        tb = self.tb
        tb.stop_proxy()
        self.log(f"{self.mode}: cold start at {tb.filled} services")
        t0, t0_wall = time.monotonic(), time.time()
        # No process to meter yet: the nodes' cgroups from before the start (process CPU 0),
        # as the benchmark's M6 counts it
        a = {node: CpuSample(t0, 0.0, tb.meter_cgroup_usage(node)) for node in NODES}
        tb.start_proxy(self.mode)
        done = self._caught_up(t0_wall)
        cpu = self._cpu(a, self._samples())
        self.log(f"{self.mode}: cold start {done - t0:.2f}s")
        return {"services": tb.filled, "wall_s": round(done - t0, 2),
                "cpu_s": cpu["cpu_s"], "cpu_s_mean": cpu["cpu_s_mean"]}

    def _m5_across_drift(self) -> dict:
        """One change's latency (M5) at N over a window that holds a periodic drift check
        (every 10 syncPeriods, 5 min at the defaults): one change a second, each awaited,
        until node1's agent has done a check since the window began and m5_drift_after
        changes after it (at most 12 minutes)."""
        tb, cfg = self.tb, self.cfg
        name = "kproxy_datapath_drift_checks_total"

        def checks() -> float:
            return metric(tb.metrics("node1", (name,)), name)

        self.log(f"{self.mode}: M5 at {tb.filled} services across a drift check")
        start, lat, missed, after = checks(), [], 0, None
        t0 = time.monotonic()
        with tb.client.watch([tb.vips[M5_SERVICE]], fill.SERVICE_PORT, interval_us=500,
                             timeout_ms=200) as w:
            w.expect(tb.one_endpoint, 60)
            while (after is None or after < cfg.m5_drift_after) and time.monotonic() - t0 < 720:
                ms = tb.timed_move(w)
                if ms is not None:
                    lat.append(ms)
                else:
                    missed += 1
                if after is not None:
                    after += 1
                elif checks() > start:
                    after = 0
                time.sleep(1.0)
        lat.sort()
        return {"changes": len(lat) + missed, "missed": missed,
                "drift_checks": int(checks() - start), "window_s": round(time.monotonic() - t0, 1),
                "p50_ms": round(statistics.median(lat), 2) if lat else None,
                "p99_ms": round(lat[min(len(lat) - 1, int(len(lat) * 0.99))], 2) if lat else None,
                "max_ms": round(lat[-1], 2) if lat else None}

    def _drift_summary(self) -> dict:
        """How many periodic map re-reads the run saw and what one cost (mean over nodes)."""
        per = [self.tb.metrics(node) for node in NODES]
        count = sum(metric(m, "kproxy_datapath_drift_checks_total") for m in per)
        cpu = sum(metric(m, "kproxy_datapath_drift_check_cpu_seconds_total") for m in per)
        return {"checks": int(count), "cpu_s": round(cpu, 3),
                "cpu_s_per_check": round(cpu / count, 3) if count else None}

    def _rss(self) -> dict:
        return {node: round((self.tb.meter(node).rss() or 0) / MIB, 1) for node in NODES}

    def _window(self, seconds: float, subs: int, step=None) -> list[dict]:
        """`subs` consecutive sub-windows of a window: CPU, periodic CPU and wall per node.
        With `step`, each sub-window runs step() until its share of the window is over."""
        out = []
        a, pa = self._samples(), self._periodic_cpu()
        for _ in range(subs):
            t_end = time.monotonic() + seconds / subs
            done = step(t_end) if step else 0
            time.sleep(max(0.0, t_end - time.monotonic()))
            b, pb = self._samples(), self._periodic_cpu()
            out.append({node: Sub(cpu_between(a[node], b[node])["cpu_s"], pb[node] - pa[node],
                                  cpu_between(a[node], b[node])["wall_s"], done)
                        for node in NODES})
            a, pa = b, pb
        return out

    def _per_change(self, n: int) -> dict:
        """CPU per change: K changes paced so each is its own partial sync, in sub-windows;
        an idle reference window of the same length just before, in as many sub-windows.
        See per_change_cpu for the arithmetic."""
        tb, cfg = self.tb, self.cfg
        changes = cfg.changes if self.mode.startswith("kproxy") else min(cfg.changes,
                                                                          cfg.kube_proxy_changes)
        spacing = max(cfg.change_window / changes, MIN_SYNC_S[self.mode] * 1.2)
        window, subs = spacing * changes, min(cfg.sub_windows, changes)
        self.log(f"{self.mode} N={n}: {changes} single changes over {window:.0f}s in "
                 f"{subs} sub-windows (+ the same idle window before)")
        idle = self._window(window, subs)
        state = {"made": 0, "seen": 0}
        with tb.client.watch([tb.vips[M5_SERVICE]], fill.SERVICE_PORT, interval_us=2000,
                             timeout_ms=200) as w:
            w.expect(tb.one_endpoint, 60)

            def step(t_end: float) -> int:
                """This sub-window's share of the changes, each awaited, paced by spacing."""
                k = 0
                while state["made"] < changes * (len(busy_done) + 1) // subs:
                    t_next = time.monotonic() + spacing
                    new, path, ops = tb.move_one_endpoint()
                    w.send(new, 60)
                    tb.api.json_patch(path, ops)
                    state["seen"] += bool(w.result().get("ok"))
                    tb.one_endpoint = new
                    state["made"] += 1
                    k += 1
                    time.sleep(max(0.0, min(t_next, t_end) - time.monotonic()))
                busy_done.append(k)
                return k

            busy_done: list[int] = []
            busy = self._window(window, subs, step)
        per_node = {node: per_change_cpu([s[node] for s in idle], [s[node] for s in busy])
                    for node in NODES}
        mean = statistics.fmean(r["ms_per_change"] for r in per_node.values())
        return {"changes": state["made"], "seen": state["seen"], "window_s": round(window, 1),
                "sub_windows": subs, "per_node": per_node,
                "cpu_ms_per_change_node": {k: r["ms_per_change"] for k, r in per_node.items()},
                "cpu_ms_per_change": round(mean, 3),
                "cpu_ms_per_change_min": min(r["ms_min"] for r in per_node.values()),
                "cpu_ms_per_change_max": max(r["ms_max"] for r in per_node.values())}


@dataclass(frozen=True)
class Sub:
    """One sub-window on one node: process CPU (children included), the part the proxy counts
    as periodic work (its full syncs), wall seconds, changes made in it (0: idle)."""
    cpu_s: float
    periodic_s: float
    wall_s: float
    changes: int


def per_change_cpu(idle: list[Sub], busy: list[Sub]) -> dict:
    """CPU milliseconds per change from idle and busy sub-windows of one node.

    The idle rate is the median over the idle sub-windows of (CPU - periodic) / wall: the
    background that is neither a change nor a counted full sync (health probes, metrics
    scrapes, watch bookmarks). Each busy sub-window gives (CPU - periodic - idle rate x wall)
    / changes; the figure is their median, with min and max as the stated noise. Periodic
    work the proxy does not count (kube-proxy's syncPeriod resyncs) lands in one or two
    sub-windows and moves the median by at most one rank."""
    if not idle or not busy or not all(s.changes > 0 for s in busy):
        raise ValueError("per_change_cpu needs idle sub-windows and busy ones with changes")
    rate = statistics.median((s.cpu_s - s.periodic_s) / s.wall_s for s in idle)
    per = [(s.cpu_s - s.periodic_s - rate * s.wall_s) / s.changes * 1000 for s in busy]
    return {"ms_per_change": round(statistics.median(per), 3),
            "ms_min": round(min(per), 3), "ms_max": round(max(per), 3),
            "ms_sub_windows": [round(x, 3) for x in per],
            "idle_rate_ms_per_s": round(rate * 1000, 3),
            "periodic_s_excluded": {"idle": round(sum(s.periodic_s for s in idle), 3),
                                    "changes": round(sum(s.periodic_s for s in busy), 3)}}


def run_scale(cfg: ScaleConfig, log: Callable[[str], None]) -> dict:
    from kproxy_ebpf.dev.lab.binaries import ensure_binaries

    from . import env

    modes = [m for m in cfg.all_modes if m in (cfg.modes or cfg.all_modes)]
    doc: dict = {"kind": "scale", "config": asdict(cfg),
                 "environment": env.collect(ensure_binaries(build=False)), "results": {}}
    t0 = time.monotonic()
    for mode in modes:
        log(f"scale: {mode}, {cfg.n} services x {cfg.endpoints} endpoints")
        t = time.monotonic()
        doc["results"][mode] = ScaleRun(cfg, mode, log).run()
        doc["results"][mode]["mode_seconds"] = round(time.monotonic() - t, 1)
    doc["run_seconds"] = round(time.monotonic() - t0, 1)
    return doc
