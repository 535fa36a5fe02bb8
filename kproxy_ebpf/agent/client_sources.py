"""Keeps kp_nssrc (datapath/netns_sources.py) in step with the Services that need it.

The sync calls before_apply() with the frontends it is about to write: while one socket-scope
LoadBalancer frontend has loadBalancerSourceRanges, every network namespace of the node's
clients has its source address in the map before that frontend's flag is written. A thread polls
for namespaces the hook met unknown and for new ones (netns_sources.POLL_S, RESCAN_S).
"""
from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterable, Mapping

from kproxy_ebpf.datapath.sockets.netns_sources import POLL_S, NetnsSources, Refresh, is_range_limited
from kproxy_ebpf.model.desired import Frontend, FrontendKey
from kproxy_ebpf.model.objects import IPFamily
from kproxy_ebpf.serve.metrics import Metrics

from .periodic import every

log = logging.getLogger(__name__)


class ClientSources:
    def __init__(self, sources: NetnsSources, metrics: Metrics) -> None:
        self.sources = sources
        self.metrics = metrics
        self._ranged: set[FrontendKey] = set()
        self._lock = threading.Lock()        # the sync and the poll thread share `sources`

    def before_apply(self, frontends: Mapping[FrontendKey, Frontend],
                     keys: Iterable[FrontendKey] | None) -> None:
        """`keys`: the frontends this sync may change (None: all of them)."""
        if keys is None:
            self._ranged = {k for k, fe in frontends.items() if is_range_limited(fe)}
        else:
            for k in keys:
                fe = frontends.get(k)
                if fe is not None and is_range_limited(fe):
                    self._ranged.add(k)
                else:
                    self._ranged.discard(k)
        targets: dict[IPFamily, str] = {}
        for k in sorted(self._ranged):
            targets.setdefault(k.family, k.ip)
        self._run(lambda: self.sources.want(targets))

    def poll(self) -> None:
        try:
            self._run(self.sources.poll)
        except Exception:
            log.exception("looking for network namespaces' source addresses failed")

    def start(self, stop: threading.Event) -> None:
        """The poll (a daemon thread) every POLL_S until `stop` is set."""
        every(POLL_S, stop, self.poll, "netns-sources")

    def _run(self, step) -> None:
        with self._lock:
            t0 = time.monotonic()
            res: Refresh | None = step()
            if res is not None:
                self.metrics.source_scan.observe(time.monotonic() - t0)
                if res.learnt or res.removed:
                    log.info("source addresses of %d network namespaces for "
                             "loadBalancerSourceRanges checks (%d new, %d gone)",
                             len(self.sources.known), res.learnt, res.removed)
            self.metrics.source_namespaces.set(len(self.sources.known))
