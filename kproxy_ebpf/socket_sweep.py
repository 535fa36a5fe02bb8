"""After each sync, the sockets whose backend may no longer keep them are ended: the agent's
part of docs/architecture.md "Stale sockets".

A sync tells the sweep what it is about to write (before(): the backends sockets of those
frontends may be talking to) and, once written, what may keep its connections now (after():
established.Established). The backends that lost them are searched for in every network
namespace of the node (datapath/stale_sockets.py); every socket is searched on the first sync
(what changed while no agent ran is not in `before`) and on full syncs (a connect() whose hook
read a row just before the write may finish after the search). A search that fails is logged,
never the sync's failure: the maps are written already.
"""
from __future__ import annotations

import logging
from collections.abc import Iterable

from .datapath.stale_sockets import StaleSockets, peer_of
from .datapath.writer import MapWriter
from .desired import FrontendKey
from .established import Established, KeptBackends, Snapshot
from .metrics import Metrics

log = logging.getLogger("kproxy_ebpf.agent")


class SocketSweep:
    def __init__(self, stale: StaleSockets, metrics: Metrics) -> None:
        self.stale, self.metrics = stale, metrics
        self.kept = KeptBackends()
        self._every = True                  # the next search looks at every socket of ours
        metrics.socket_destroy_supported.set(int(stale.supported))

    def before(self, writer: MapWriter, keys: Iterable[FrontendKey] | None) -> Snapshot:
        """Taken before a sync writes the frontends among `keys` (None: all of them)."""
        return self.kept.before(writer, keys)

    def after(self, before: Snapshot, keeps: Established, full: bool) -> None:
        gone = {peer_of(be) for be in self.kept.settle(before, keeps)}
        every = self._every or full
        if not gone and not every:
            return
        try:
            res = self.stale.reap(keeps.keeps, None if every else gone)
        except Exception:  # never the sync's failure: the maps are written already
            log.exception("the search for stale sockets failed")
            return
        self._every = False
        self.metrics.stale_socket_scan.observe(res.seconds)
        for (proto, outcome), n in res.counts.items():
            self.metrics.stale_sockets.labels(proto, outcome).inc(n)
        if res.counts:
            log.info("sockets connected to backends that left their Service: %s (%d network "
                     "namespaces, %.0f ms), e.g. %s",
                     ", ".join(f"{n} {proto} {outcome}"
                               for (proto, outcome), n in sorted(res.counts.items())),
                     res.namespaces, res.seconds * 1000, "; ".join(res.examples))
