"""kube-proxy's `sync_proxy_rules_no_local_endpoints_total`, kept from each sync's changed
frontends in O(changes).

kube-proxy counts, per proxier (family) and sync, the Service ports whose traffic policy is
Local while every endpoint is on another node (pkg/proxy/nftables/proxier.go: a port without
any endpoint is rejected and not counted): "internal" for internalTrafficPolicy Local (its
ClusterIP traffic is dropped), "external" for externalTrafficPolicy Local (its NodePort,
ExternalIP and LoadBalancer traffic from outside is dropped). Here those are exactly the
frontends whose verdict is DROP: a ClusterIP frontend under internalTrafficPolicy Local, and a
scope-EXT frontend under externalTrafficPolicy Local (proxy/frontends.py verdict).
"""
from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping

from kproxy_ebpf.model.desired import Action, Frontend, FrontendKey, FrontendKind, Scope, ServicePortName
from kproxy_ebpf.model.objects import IPFamily, family_of

INTERNAL, EXTERNAL = "internal", "external"      # kube-proxy's traffic_policy label values

_Entry = tuple[str, ServicePortName, IPFamily]


def _entry(fe: Frontend) -> _Entry | None:
    if fe.action is not Action.DROP:
        return None
    if fe.scope is Scope.SOCK and fe.kind is FrontendKind.CLUSTER_IP and fe.info.internal_local:
        return INTERNAL, fe.service, family_of(fe.ip)
    if fe.scope is Scope.EXT and fe.info.external_local:
        return EXTERNAL, fe.service, family_of(fe.ip)
    return None


class NoLocalEndpoints:
    """The DROP frontends of Local policies, by key; counted per service port."""

    def __init__(self) -> None:
        self._by_key: dict[FrontendKey, _Entry] = {}

    def update(self, frontends: Mapping[FrontendKey, Frontend],
               changed: Iterable[FrontendKey] | None) -> None:
        """`frontends`: the whole desired table; `changed`: the keys a partial sync changed
        (None: a full sync, every key)."""
        if changed is None:
            self._by_key.clear()
            changed = frontends.keys()
        for key in changed:
            fe = frontends.get(key)
            entry = _entry(fe) if fe is not None else None
            if entry is None:
                self._by_key.pop(key, None)
            else:
                self._by_key[key] = entry

    def counts(self) -> dict[tuple[str, IPFamily], int]:
        """(traffic_policy, family) -> service ports, every pair present (0 when none), as
        kube-proxy sets both policies of its family at each sync."""
        got = Counter((policy, family) for policy, _, family in set(self._by_key.values()))
        return {(p, f): got.get((p, f), 0) for p in (INTERNAL, EXTERNAL) for f in IPFamily}
