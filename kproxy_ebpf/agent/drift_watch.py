"""The agent's periodic drift check (datapath/drift.py) in a thread of its own, every
KERNEL_CHECK_EVERY syncPeriods (5 min by default). The sync thread gives it two short holds
of the sync lock; the map read-back in between (~5 s of CPU at 50,000 Services) runs while
changes keep reaching the datapath. Drift found goes to `on_drift`, which makes the next sync
re-read and rewrite. Its CPU is counted as the drift check's and as periodic work (the
benchmarks take kproxy_sync_full_cpu_seconds_total out of their per-change figures)."""
from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

from kproxy_ebpf.datapath.write.drift import DriftCheck
from kproxy_ebpf.serve.metrics import Metrics

from .periodic import every
from .process_tuning import collector_paused, release_heap, sharing_the_gil

log = logging.getLogger("kproxy_ebpf.agent")


class DriftWatch:
    def __init__(self, check: DriftCheck, sync_lock: threading.Lock, metrics: Metrics,
                 on_drift: Callable[[list[str]], None],
                 under_lock: Callable[[], None] = lambda: None) -> None:
        """`under_lock`: more upkeep done while the sync lock is held anyway (the
        per-Service counters of freed ids)."""
        self.check, self.sync_lock, self.metrics = check, sync_lock, metrics
        self.on_drift, self.under_lock = on_drift, under_lock

    def start(self, period: float, stop: threading.Event) -> threading.Thread:
        return every(period, stop, self.run_once, "drift-check")

    def run_once(self) -> list[str]:
        """One check; returns the drift found (one line each)."""
        cpu0 = time.thread_time()
        snap = None
        try:
            with self.sync_lock:
                self.check.begin()
            # Its tuples would trigger full collections; its Python would keep the GIL from
            # the sync thread for up to 5 ms at each of the sync's syscalls. The collector
            # comes back only once the read-back is freed: its millions of objects would
            # otherwise be the young generation of the next collection (94 ms of GIL at
            # 50,000 Services), and they are freed piece by piece for the same reason.
            with collector_paused(), sharing_the_gil():
                try:
                    snap = self.check.read()
                    suspects = self.check.suspects(snap)
                    with self.sync_lock:
                        drift = self.check.confirm(snap, *suspects)
                        self.under_lock()
                    frontends = len(snap.ledger.frontends)
                finally:
                    if snap is not None:
                        snap.release()
        except Exception:  # a check that fails is logged; syncs go on
            log.exception("the drift check failed")
            with self.sync_lock:
                self.check.writer.journal = self.check.cidrs.journal = None
            return []
        finally:
            cpu = time.thread_time() - cpu0
            self.metrics.drift_checks.inc()
            self.metrics.drift_check_cpu.inc(cpu)
            self.metrics.full_sync_cpu.inc(cpu)
        release_heap()
        if not drift:
            log.info("drift check: the maps hold what was written (%d frontends, %.0f ms of "
                     "CPU)", frontends, cpu * 1000)
        else:
            log.warning("the maps differ from what was written (%d: %s%s); the next sync "
                        "re-reads them and rewrites the difference", len(drift),
                        "; ".join(drift[:3]), ", ..." if len(drift) > 3 else "")
            self.on_drift(drift)
        return drift
