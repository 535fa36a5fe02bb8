"""What the operator is told about the input and the writes: objects the API edge rejected,
Services with current problems, and datapath writes that failed. Each as a log line, a
metric and (with an API server) an Event, and bounded: a problem is told once while it lasts,
write errors are logged one by one only up to ERROR_LINES per sync.
"""
from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from kproxy_ebpf.datapath.write.apply_result import Outcome
from kproxy_ebpf.kube.convert import Rejection
from kproxy_ebpf.model.desired import Problem
from kproxy_ebpf.model.objects import ServiceKey
from kproxy_ebpf.serve.metrics import Metrics

if TYPE_CHECKING:
    from kproxy_ebpf.kube.events import EventRecorder  # imported with the API client only

log = logging.getLogger(__name__)

ERROR_LINES = 5             # write errors logged one by one per sync; the rest are counted


class Reporter:
    def __init__(self, metrics: Metrics) -> None:
        self.metrics = metrics
        self.events: EventRecorder | None = None      # once there is an API server
        # Current problems per Service, already told (only Services that have some).
        self.told: dict[ServiceKey, set[tuple[str, str]]] = {}

    def rejected(self, rejections: list[Rejection]) -> None:
        """Objects (or fields) the API edge (kube/convert/) could not use."""
        for r in rejections:
            log.warning("rejected %s %s/%s: %s (%s)", r.kind, r.namespace, r.name, r.message, r.reason)
            self.metrics.rejected.labels(r.kind, r.reason).inc()
        if self.events:
            self.events.rejected(rejections)

    def problems(self, problems: list[Problem], reported: frozenset[ServiceKey],
                 counts: dict[str, int]) -> None:
        """Current problems by reason as a gauge; each new one once as a log line and Event.
        Only current problems are remembered, so one that goes and comes back is told again.
        O(services re-evaluated): the others' problems did not change."""
        self.metrics.problems.clear()
        for reason, n in counts.items():
            self.metrics.problems.labels(reason).set(n)
        current: dict[ServiceKey, list[Problem]] = {}
        for p in problems:
            current.setdefault((p.namespace, p.name), []).append(p)
        for svc in sorted(reported):
            told = self.told.pop(svc, set())
            now = {(p.reason, p.message): p for p in current.get(svc, ())}
            for key, p in now.items():
                if key not in told:
                    log.warning("service %s/%s: %s (%s)", p.namespace, p.name, p.message, p.reason)
                    if self.events:
                        self.events.warn(p.kind, p.namespace, p.name, p.reason, p.message)
            if now:
                self.told[svc] = set(now)

    def writes(self, result: Outcome) -> None:
        for name in result.full_maps:
            self.metrics.map_full.labels(name).inc()
        for err in result.errors[:ERROR_LINES]:
            log.error("datapath write failed: %s", err)
        if len(result.errors) > ERROR_LINES:
            log.error("datapath writes failed for %d more frontends%s", len(result.errors) - ERROR_LINES,
                      f" (map(s) {', '.join(sorted(result.full_maps))} full: raise their size)"
                      if result.full_maps else "")
        if not result.full_maps:
            self.metrics.map_errors.inc(len(result.errors))
        if self.events and result.full_maps:
            for fkey, spn in result.failed.items():
                if spn is not None:
                    self.events.warn("Service", spn.namespace, spn.name, "BPFMapFull",
                                     f"frontend {fkey} not programmed: "
                                     f"map(s) {', '.join(sorted(result.full_maps))} full")
