"""After each sync, the sockets whose backend may no longer keep them are moved or ended: the
agent's part of docs/design/stale-sockets.md.

A sync tells the sweep what it is about to write (before(): the backends sockets of those
frontends may be talking to) and, once written, what may keep its connections now (after():
established.Established). The backends that lost them are searched for where kp_skwhere says
sockets to them live (datapath/stale_sockets.py). The first sync (what changed while no agent
ran is not in `before`) and full syncs (a connect() whose hook read a row just before the
write may finish after the search) search the rows of every backend no frontend holds; the
first sync of a node whose kp_skwhere is new searches every namespace, once. A search that
fails is logged, never the sync's failure: the maps are written already.
"""
from __future__ import annotations

import logging
from collections.abc import Iterable

from kproxy_ebpf.datapath.sockets.sock_where import Held
from kproxy_ebpf.datapath.sockets.stale_sockets import StaleSockets, peer_of
from kproxy_ebpf.datapath.write.programmed import Ledger
from kproxy_ebpf.model.desired import FrontendKey
from kproxy_ebpf.serve.metrics import Metrics

from .established import Established, KeptBackends, Snapshot

log = logging.getLogger("kproxy_ebpf.agent")


class SocketSweep:
    def __init__(self, stale: StaleSockets, metrics: Metrics, new_where: bool = False) -> None:
        """`new_where`: kp_skwhere was made by this start (sockets connected before it have
        no rows): the first search looks into every namespace."""
        self.stale, self.metrics = stale, metrics
        self.kept = KeptBackends()
        self._every = True                  # the next search: every backend no frontend holds
        self._everywhere = new_where
        metrics.socket_destroy_supported.set(int(stale.supported))

    def before(self, ledger: Ledger, keys: Iterable[FrontendKey] | None) -> Snapshot:
        """Taken from the writer's `ledger` before a sync writes the frontends among `keys`
        (None: all of them)."""
        return self.kept.before(ledger, keys)

    def after(self, before: Snapshot, keeps: Established, full: bool,
              held: Held) -> None:
        """`held`: whether some frontend still names a backend (its rows in kp_skwhere stay)."""
        gone = {peer_of(be) for be in self.kept.settle(before, keeps)}
        every = self._every or full
        if not gone and not every:
            return
        try:
            res = self.stale.reap(keeps.keeps, held, None if every else gone,
                                  everywhere=self._everywhere)
        except Exception:  # never the sync's failure: the maps are written already
            log.exception("the search for stale sockets failed")
            return
        self._every = self._everywhere = False
        self.metrics.stale_socket_scan.observe(res.seconds)
        self.metrics.stale_socket_namespaces.inc(res.namespaces)
        self.metrics.stale_socket_dumps.inc(res.dumps)
        for (proto, outcome), n in res.counts.items():
            self.metrics.stale_sockets.labels(proto, outcome).inc(n)
        if res.counts:
            log.info("sockets connected to backends that left their Service: %s (%d network "
                     "namespaces, %d dumps, %.0f ms), e.g. %s",
                     ", ".join(f"{n} {proto} {outcome}"
                               for (proto, outcome), n in sorted(res.counts.items())),
                     res.namespaces, res.dumps, res.seconds * 1000, "; ".join(res.examples))
        if res.walks:
            log.info("stale sockets: %d namespaces looked for by trying every one (the "
                     "processes that connected from them are gone)", res.walks)
