"""Least-conn's repair of the TC path's flow counts (datapath/flows/flow_fix.py) in a thread of
its own, every REPAIR_PERIOD seconds: the longest a flow that expired or was evicted without a
FIN or RST still counts as open for least-conn. The conntrack walk is paid only while this
node has a least-conn frontend, or counter rows that still read open flows (the frontends
that counted them are gone: the repair takes them back to zero as their rows expire). Its CPU
is counted as periodic work (kproxy_sync_full_cpu_seconds_total), like the drift check's."""
from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping

from kproxy_ebpf.datapath.flows import flow_fix
from kproxy_ebpf.datapath.maps.pinned import PinnedMap
from kproxy_ebpf.serve.metrics import Metrics

from .periodic import every

log = logging.getLogger("kproxy_ebpf.agent")

REPAIR_PERIOD = 5.0


class FlowRepair:
    def __init__(self, maps: Callable[[], Mapping[str, PinnedMap]], metrics: Metrics,
                 least_conn: Callable[[], bool]) -> None:
        """`least_conn`: whether any frontend of this node is least-conn now."""
        self.maps, self.metrics, self.least_conn = maps, metrics, least_conn

    def start(self, stop: threading.Event, period: float = REPAIR_PERIOD) -> threading.Thread:
        return every(period, stop, self.run_once, "flow-repair")

    def run_once(self) -> flow_fix.Repair | None:
        """One repair, or None when none was needed (or the maps have no flow counts)."""
        maps = self.maps()
        if not {"conns", "ct", "flowfix"} <= maps.keys():
            return None
        cpu0 = time.thread_time()
        try:
            if not (self.least_conn() or flow_fix.needed(maps)):
                return None
            res = flow_fix.repair(maps)
        except OSError as exc:      # a map gone under a restart of the datapath: next period
            log.warning("least-conn flow repair failed (%s); retried in %.0f s", exc,
                        REPAIR_PERIOD)
            return None
        finally:
            self.metrics.full_sync_cpu.inc(time.thread_time() - cpu0)
        if res.written:
            log.debug("least-conn flow repair: %d rows walked, %d fixes written, %.1f ms",
                      res.walked, res.written, res.seconds * 1000)
        return res
