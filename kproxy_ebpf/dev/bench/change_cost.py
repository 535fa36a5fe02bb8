"""The cost of a change (issue 42): CPU of node1's proxy per endpoint change, kproxy beside
kube-proxy, at each N, with few and with many pods on the node, for changes arriving one at a
time and in bursts.

One lab of two nodes (the benchmark's testbed: its live pods on node2, its client pod on
node1) filled to each N in turn. Per N, pod density and mode: the proxy starts on node1 and
programs everything, then three windows of the same length follow, each cut into
sub-windows: idle (the background), paced (changes at `rate` per second, one at a time) and
bursts (`burst` changes at once every burst / rate seconds: the same number in the same
time). A change moves one endpoint of a filler Service to an address never used before: one
backend removed and one added, as a rolling update does. The figure per pattern is
scale.per_change_cpu's: the proxy's own periodic work (kproxy's full syncs) and the median
idle rate taken out of each busy sub-window, the median over those, min and max beside.
Densities are pods on node1 in all, idle ones added (idle_pods.py) before the proxy starts.
"""
from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field

from kproxy_ebpf.dev.lab import idle_pods

from . import bpfcost
from .fill import SERVICE_PORT
from .procstat import cpu_between
from .scale import Sub, per_change_cpu
from .testbed import KPROXY_MODES, TARGET, Testbed, metric

NODE = "node1"


@dataclass
class ChangeCostConfig:
    sizes: list[int] = field(default_factory=lambda: [100, 1000, 10000])
    densities: list[int] = field(default_factory=lambda: [5, 100])
    modes: list[str] = field(default_factory=lambda: ["kproxy", "nftables"])
    changes: int = 100          # per busy window
    rate: float = 4.0           # changes per second (the paced window's; bursts' average)
    burst: int = 10
    sub_windows: int = 5
    endpoints: int = 10
    cold_timeout: float = 120.0
    settle_s: float = 3.0       # after programming: the start's own work done
    connect_s: float = 2.0      # the crr run whose connects the hooks' cost is read over
    lab_name: str = "bench-changes"
    tools_dir: str = "build/bench"

    @property
    def window_s(self) -> float:
        return self.changes / self.rate


class ChangeCost:
    def __init__(self, cfg: ChangeCostConfig, log: Callable[[str], None]) -> None:
        self.cfg, self.log = cfg, log
        self.tb = Testbed(cfg.lab_name, cfg.tools_dir, endpoints=cfg.endpoints, live=2,
                          log=log, max_services=max(cfg.sizes))
        self.seq = 0

    def _sample(self):
        return self.tb.meter(NODE).sample()

    def _periodic(self) -> float:
        if not self.tb.mode.startswith("kproxy"):
            return 0.0
        name = "kproxy_sync_full_cpu_seconds_total"
        return metric(self.tb.metrics(NODE, (name,)), name)

    def _window(self, step: Callable[[int, float], int] | None) -> list[Sub]:
        """The window's sub-windows; step(i, t_end) makes sub-window i's changes."""
        subs, cfg = [], self.cfg
        a, pa = self._sample(), self._periodic()
        for i in range(cfg.sub_windows):
            t_end = time.monotonic() + cfg.window_s / cfg.sub_windows
            made = step(i, t_end) if step else 0
            time.sleep(max(0.0, t_end - time.monotonic()))
            b, pb = self._sample(), self._periodic()
            cpu = cpu_between(a, b)
            subs.append(Sub(cpu["cpu_s"], pb - pa, cpu["wall_s"], made))
            a, pa = b, pb
        return subs

    def _change(self) -> None:
        path, ops = self.tb.filler_change(self.seq)
        self.seq += 1
        self.tb.api.json_patch(path, ops)

    def _paced(self, i: int, t_end: float) -> int:
        per = self.cfg.changes // self.cfg.sub_windows
        start = time.monotonic()
        for k in range(per):
            time.sleep(max(0.0, start + k / self.cfg.rate - time.monotonic()))
            self._change()
        return per

    def _bursts(self, i: int, t_end: float) -> int:
        cfg = self.cfg
        per = cfg.changes // cfg.sub_windows
        start, made = time.monotonic(), 0
        with ThreadPoolExecutor(max_workers=cfg.burst) as pool:
            while made < per:
                time.sleep(max(0.0, start + made / cfg.rate - time.monotonic()))
                n = min(cfg.burst, per - made)
                list(pool.map(lambda _: self._change(), range(n)))
                made += n
        return made

    def measure(self, mode: str) -> dict:
        tb, cfg = self.tb, self.cfg
        tb.start_proxy(mode)
        try:
            t0 = time.monotonic()
            tb.wait_programmed(cfg.cold_timeout)
            programmed_s = time.monotonic() - t0
            time.sleep(cfg.settle_s)
            out: dict = {"programmed_s": round(programmed_s, 2)}
            if mode in KPROXY_MODES:
                # What a connect costs in the hooks (kp_skwhere's note is in it), per run.
                out["connect"] = bpfcost.measure(lambda: tb.client.run(
                    "crr", [tb.vips[TARGET]], SERVICE_PORT, duration=cfg.connect_s))
            idle = self._window(None)
            for name, step in (("paced", self._paced), ("bursts", self._bursts)):
                busy = self._window(step)
                tb.wait_programmed(cfg.cold_timeout)
                out[name] = per_change_cpu(idle, busy)
                out[name]["changes"] = sum(s.changes for s in busy)
            out["idle_mcpu"] = round(statistics.median(s.cpu_s / s.wall_s for s in idle) * 1000, 1)
            out["rss_mib"] = round((tb.meter(NODE).rss() or 0) / 2**20, 1)
            return out
        finally:
            tb.stop_proxy()

    def run(self) -> dict:
        tb, cfg = self.tb, self.cfg
        results: dict = {}
        tb.up()
        try:
            for n in cfg.sizes:
                tb.fill_to(n)
                for density in cfg.densities:
                    idle = idle_pods.set_pods(tb.cluster.lab, NODE, density, self.log)
                    for mode in cfg.modes:
                        self.log(f"{mode} N={n}, {density} pods on {NODE}: {cfg.changes} "
                                 f"changes paced at {cfg.rate}/s, then in bursts of {cfg.burst}")
                        r = self.measure(mode)
                        r["idle_pods"] = idle
                        results.setdefault(mode, {}).setdefault(str(n), {})[str(density)] = r
                        self.log(f"{mode} N={n} pods={density}: "
                                 f"{r['paced']['ms_per_change']} ms/change paced, "
                                 f"{r['bursts']['ms_per_change']} in bursts")
        finally:
            tb.down()
        return results


def run_change_cost(cfg: ChangeCostConfig, log: Callable[[str], None]) -> dict:
    from kproxy_ebpf.dev.lab.binaries import ensure_binaries

    from . import env

    t0 = time.monotonic()
    doc = {"kind": "change-cost", "config": asdict(cfg),
           "environment": env.collect(ensure_binaries(build=False))}
    doc["results"] = ChangeCost(cfg, log).run()
    doc["run_seconds"] = round(time.monotonic() - t0, 1)
    return doc
