"""ServiceCIDRs and allocated ClusterIPs -> the ServiceCIDRSet for addresses no frontend matched.

Reference: kube-proxy v1.36 pkg/proxy/nftables/proxier.go. Its `cluster-ips` set holds the
ClusterIP of every Service port it programs, and chain `cluster-ips-check` (filter output and
forward, after DNAT) rejects new connections still addressed to one of them (a port the Service
does not have) and drops those to any other address of the ServiceCIDRs, which it learns from
networking.k8s.io/v1 ServiceCIDR objects (OnServiceCIDRsChanged; MultiCIDRServiceAllocator is
GA and locked on since 1.34), not from --service-cluster-ip-range.

Services of another proxy (label service.kubernetes.io/service-proxy-name) are not in
kube-proxy's cluster-ips set; their ClusterIPs are kept apart here so the socket hooks leave
them alone (see desired.ServiceCIDRSet).
"""
from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, KeysView

from kproxy_ebpf.model.desired import ServiceCIDRSet
from kproxy_ebpf.model.objects import Service, ServiceCIDR, ServiceKey

from .frontends import is_proxied


def _claims(svc: Service) -> tuple[tuple[str, ...], bool]:
    """(ClusterIPs, foreign) a Service claims: ours when we program at least one port of it,
    foreign when another proxy owns it; nothing otherwise (headless, ExternalName)."""
    if is_proxied(svc) and svc.ports:
        return svc.cluster_ips, False
    if svc.proxy_name is not None and not svc.headless:
        return svc.cluster_ips, True
    return (), False


class ClusterIPIndex:
    """The allocated ClusterIPs, updated per Service in O(its IPs)."""

    def __init__(self) -> None:
        self._by_service: dict[ServiceKey, tuple[tuple[str, ...], bool]] = {}
        self._ours: Counter[str] = Counter()
        self._foreign: Counter[str] = Counter()
        self.version = 0          # bumped whenever ours() or foreign() may have changed
        self._touched: set[str] = set()   # addresses whose action may have changed since drain()

    def update(self, key: ServiceKey, svc: Service | None) -> bool:
        new = _claims(svc) if svc is not None else ((), False)
        old = self._by_service.get(key, ((), False))
        if new == old:
            return False
        for counts, ips, sign in ((self._foreign if old[1] else self._ours, old[0], -1),
                                  (self._foreign if new[1] else self._ours, new[0], 1)):
            self._touched.update(ips)
            for ip in ips:
                counts[ip] += sign
                if counts[ip] <= 0:
                    del counts[ip]
        if new[0]:
            self._by_service[key] = new
        else:
            self._by_service.pop(key, None)
        self.version += 1
        return True

    def action(self, ip: str) -> str | None:
        """"reject" (ours: a port it lacks is refused), "pass" (another proxy's), or None."""
        if ip in self._ours:
            return "reject"
        return "pass" if ip in self._foreign else None

    def drain(self) -> dict[str, str | None]:
        """The addresses touched since the last drain, with their action now: O(changes)."""
        touched, self._touched = self._touched, set()
        return {ip: self.action(ip) for ip in touched}

    def ours(self) -> frozenset[str]:
        return frozenset(self._ours)

    def foreign(self) -> frozenset[str]:
        # An address claimed both ways (two Services racing for one IP) stays ours.
        return frozenset(self._foreign) - frozenset(self._ours)


def service_cidr_set(cidrs: Iterable[ServiceCIDR], index: ClusterIPIndex) -> ServiceCIDRSet:
    return ServiceCIDRSet(cidrs=frozenset(c for sc in cidrs for c in sc.cidrs),
                          cluster_ips=index.ours(), foreign_ips=index.foreign())


class ServiceCIDRs:
    """ProxyState's part for addresses no frontend matched: the ServiceCIDR objects by name,
    the allocated ClusterIPs (`cluster_ips`, which ProxyState updates per Service), and the
    ServiceCIDRSet they make, cached until either changes."""

    def __init__(self) -> None:
        self._objects: dict[str, ServiceCIDR] = {}
        self.cluster_ips = ClusterIPIndex()
        self._version = 0           # bumped whenever the ranges may have changed
        self._whole: tuple[tuple[int, int], ServiceCIDRSet] | None = None

    def names(self) -> KeysView[str]:
        return self._objects.keys()

    def upsert(self, sc: ServiceCIDR) -> bool:
        old = self._objects.get(sc.name)
        self._objects[sc.name] = sc
        if old is not None and old.cidrs == sc.cidrs:
            return False
        self._version += 1
        return True

    def delete(self, name: str) -> bool:
        if self._objects.pop(name, None) is None:
            return False
        self._version += 1
        return True

    def changes(self) -> tuple[frozenset[str], dict[str, str | None]]:
        """The ranges, and the ClusterIPs whose action ("reject", "pass" or None: gone) may
        have changed since the last call: what a partial sync writes, in O(changes)."""
        cidrs = frozenset(c for sc in self._objects.values() for c in sc.cidrs)
        return cidrs, self.cluster_ips.drain()

    def whole(self) -> ServiceCIDRSet:
        """Service ranges and allocated ClusterIPs, for addresses no frontend matched."""
        self.cluster_ips.drain()          # a whole set covers whatever was touched
        version = (self._version, self.cluster_ips.version)
        if self._whole is None or self._whole[0] != version:
            self._whole = (version, service_cidr_set(self._objects.values(), self.cluster_ips))
        return self._whole[1]
