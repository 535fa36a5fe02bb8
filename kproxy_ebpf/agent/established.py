"""Which backend a connection made earlier may keep: the rule of the stale-socket search
(datapath/stale_sockets.py) and of the TC conntrack purge (datapath/conntrack.py).

kube-proxy keeps a UDP flow while its endpoint is a serving endpoint of the Service port,
whatever the traffic policies, topology or termination say about new connections ("changes to
the service should not affect existing flows", pkg/proxy/conntrack/cleanup.go,
CleanStaleEntries, v1.36): a pod that is shutting down but still serving drains its flows. So
here a backend keeps its sockets while lookups can still pick it (its slots, Ledger.backends_of) or, failing
that, while it is a serving endpoint of the frontend's Service port in the API's view. A
frontend that is gone keeps nothing, a deliberate difference: kube-proxy clears the flows of
Service IPs that still exist only, so a deleted UDP Service's flows reach their old backend
until they idle out.
"""
from __future__ import annotations

from collections.abc import Callable, Collection, Iterable, Mapping

from kproxy_ebpf.datapath.write.programmed import BackendKey, Ledger
from kproxy_ebpf.model.desired import Frontend, FrontendKey, ServicePortName
from kproxy_ebpf.model.objects import IPFamily

# A Service port's serving endpoints (address, port) of one family, in the API's view; the
# agent's lock is taken inside (the reflector threads mutate the state).
Serving = Callable[[ServicePortName, IPFamily], frozenset[tuple[str, int]]]


class Established:
    """`ledger`: the writer's, after the write; `frontends`: the desired table of the sync that
    just wrote (ChangeSet.frontends). One per sync: the serving sets are cached for its
    duration."""

    def __init__(self, ledger: Ledger, frontends: Mapping[FrontendKey, Frontend],
                 serving: Serving) -> None:
        self.ledger, self.frontends, self.serving = ledger, frontends, serving
        self._serving: dict[tuple[ServicePortName, IPFamily], frozenset[tuple[str, int]]] = {}
        # Each frontend's slots, read once: a full sync asks about every backend of every
        # frontend, and reading them rebuilds the frontend's slot table.
        self._live: dict[FrontendKey, frozenset[BackendKey]] = {}

    def picks(self, key: FrontendKey) -> frozenset[BackendKey]:
        """The backends lookups of `key` can pick now, not cached: settle() asks once for every
        frontend of a full sync, and 50,000 cached sets were ~36 MiB for the sync's length."""
        live = self._live.get(key)
        return live if live is not None else self.ledger.backends_of(key)

    def keeps(self, key: FrontendKey, backend: BackendKey) -> bool:
        live = self._live.get(key)
        if live is None:
            live = self._live[key] = self.ledger.backends_of(key)
        if backend in live:
            return True
        fe = self.frontends.get(key)
        if fe is None:
            return False
        cached = (fe.service, key.family)
        serving = self._serving.get(cached)
        if serving is None:
            serving = self._serving[cached] = self.serving(fe.service, key.family)
        return (backend[0], backend[1]) in serving


# Per frontend, the backends its sockets may be talking to before a write.
Snapshot = dict[FrontendKey, Collection[BackendKey]]


class KeptBackends:
    """Per scope-SOCK frontend, the backends that sockets made through it may still be
    talking to: those lookups can pick now (the writer's slots) and those that left the slots
    but kept their connections since (a pod shutting down, still serving), so the sync where
    it stops serving finds its sockets. Only the second kind is remembered here, for the few
    frontends that have one: a copy of every frontend's slots was ~36 MiB at 50,000
    Services. Only what this agent saw: after a restart, the first sync (and every full one)
    searches every socket."""

    def __init__(self) -> None:
        self._held: dict[FrontendKey, frozenset[BackendKey]] = {}

    def __len__(self) -> int:
        """Frontends with a backend remembered beyond their slots."""
        return len(self._held)

    def before(self, ledger: Ledger, keys: Iterable[FrontendKey] | None) -> Snapshot:
        """Taken from the writer's `ledger` before a sync writes the frontends among `keys`
        (None: all)."""
        out: Snapshot = ledger.sock_backends(keys)
        held = self._held
        mine = held.keys() if keys is None else [k for k in keys if k in held]
        for k in mine:
            out[k] = frozenset(out.get(k, ())) | held[k]
        return out

    def settle(self, before: Snapshot, now: Established) -> set[BackendKey]:
        """After the write: remembers the backends outside the slots that still keep their
        sockets, returns the backends that lost them (through some frontend)."""
        lost: set[BackendKey] = set()
        for key, backends in before.items():
            live = now.picks(key)
            left = [b for b in backends if b not in live]
            stay = frozenset(b for b in left if now.keeps(key, b))
            lost.update(b for b in left if b not in stay)
            if stay:
                self._held[key] = stay
            else:
                self._held.pop(key, None)
        return lost
