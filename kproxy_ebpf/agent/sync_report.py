"""What one sync tells the operator once the datapath is written: health, metrics, the log
line, and the frontends that wait for a retry. Only what the sync computed and the Outcome of
its apply are read here; nothing is written to the kernel."""
from __future__ import annotations

import logging
import time
from collections.abc import Callable

from kproxy_ebpf.datapath.write.apply_result import Outcome
from kproxy_ebpf.serve.health import ProxyHealth
from kproxy_ebpf.serve.metrics import Metrics

log = logging.getLogger("kproxy_ebpf.agent")   # the agent's lines under one name, as before the split

ROW_COUNT_EVERY = 5.0       # seconds between two refreshes of the map row gauges (O(frontends))

# (time a change was seen, its IP family) per change the sync programmed
Triggers = list[tuple[float, str]]


class SyncReport:
    def __init__(self, metrics: Metrics, health: ProxyHealth) -> None:
        self.metrics, self.health = metrics, health
        self._full_maps: set[str] = set()      # maps found full since the last full retry
        self._rows_counted = 0.0               # monotonic time of the last row gauge refresh

    def unprogrammed(self, waiting: int, outcome: Outcome) -> None:
        """How many frontends wait for a retry (they did not fit or their write failed), and
        which maps were full: a gauge, and the /healthz body `status` shows."""
        if outcome.full_maps:
            self._full_maps = set(outcome.full_maps)
        elif not waiting:
            self._full_maps = set()
        self.metrics.unprogrammed.set(waiting)
        self.health.set_unprogrammed(waiting, sorted(self._full_maps))

    def programmed(self, outcome: Outcome, started: float, triggers: Triggers) -> bool:
        """Health and the programming latency of every change this sync carried; False when
        some write failed (the caller keeps the triggers for the sync that gets them in)."""
        if not outcome.ok:
            self.metrics.sync_failures.inc()
            return False
        self.health.updated(started)
        done = time.time()
        self.metrics.sync_last.set(done)
        for t, family in triggers:
            self.metrics.observe_programming(family, max(0.0, done - t))
        return True

    def record(self, full: bool, first: bool, elapsed: float, desired: int, outcome: Outcome,
               stats: dict[str, int], row_counts: Callable[[], dict[str, tuple[int, int]]]
               ) -> None:
        """Metrics and the log line of one sync (`full`: it diffed everything; `first`: the
        agent's first)."""
        self.metrics.observe_sync(full, elapsed)
        self.metrics.frontends.set(stats["frontends"])
        self.metrics.backends.set(stats["backends"])
        now = time.monotonic()
        if full or now - self._rows_counted >= ROW_COUNT_EVERY:
            self._rows_counted = now
            for name, (count, capacity) in row_counts().items():
                self.metrics.map_entries.labels(name).set(count)
                self.metrics.map_capacity.labels(name).set(capacity)
        if outcome.updated or outcome.deleted or not outcome.ok or first:
            log.info("%s sync: %d frontends desired, %d written, %d removed, %d map writes "
                     "in %.1f ms%s", "first" if first else "full" if full else "partial",
                     desired, outcome.updated, outcome.deleted, outcome.writes, elapsed * 1000,
                     "" if outcome.ok else " (with errors)")
