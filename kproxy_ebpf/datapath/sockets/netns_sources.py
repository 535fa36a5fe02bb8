"""The address each network namespace of this node's clients sends from (kp_nssrc), for the
socket path's loadBalancerSourceRanges check.

A connect() on an unbound socket has no source address when our hook runs: the route picks it
afterwards. kube-proxy judges the packet, whose source is that route's choice, so we learn the
choice ahead: for every network namespace the hooks can see (netns_scope.py) the preferred
source of its route towards a range-limited LoadBalancer address of each family (RTM_GETROUTE,
which sends nothing), keyed by the namespace's cookie (SO_NETNS_COOKIE, the value
bpf_get_netns_cookie() gives the hook). A namespace with no such route gets its first global
address. One address per namespace and family: a namespace whose source depends on which LB
address it reaches is judged by the first one's route.

Only while some socket-scope frontend has ranges (want()); the rows land before the sync that
sets the first such flag, so a client inside the ranges is never refused for want of them. New
namespaces are looked for every RESCAN_S, and at once when the hook met one it did not know
(it refused that connect, fail closed, and noted the cookie in kp_nsmiss).
"""
from __future__ import annotations

import logging
import os
import socket
import time
from collections.abc import Mapping
from dataclasses import dataclass, field

from kproxy_ebpf.datapath.maps import layout as L
from kproxy_ebpf.datapath.maps.pinned import MapFull, PinnedMap
from kproxy_ebpf.model.desired import Frontend, FrontendKind, Scope
from kproxy_ebpf.model.objects import IPFamily

from . import netns_scope

log = logging.getLogger(__name__)

RESCAN_S = 2.0                # how often new namespaces are looked for while active
POLL_S = 0.25                 # how often kp_nsmiss is read while active
_AF = {IPFamily.IPV4: socket.AF_INET, IPFamily.IPV6: socket.AF_INET6}
_FAMILY_NUM = {IPFamily.IPV4: 4, IPFamily.IPV6: 6}


def _sources(targets: Mapping[IPFamily, str]) -> dict[IPFamily, str]:
    """In the calling thread's namespace: the source towards each family's target."""
    from pyroute2 import IPRoute  # the agent's netlink library (tc.py); loaded on use

    out: dict[IPFamily, str] = {}
    with IPRoute() as ipr:
        for family, dst in targets.items():
            try:
                src = ipr.route("get", dst=dst)[0].get_attr("RTA_PREFSRC")
            except Exception:           # noqa: BLE001 - no route there (ENETUNREACH, ...)
                src = None
            if not src:
                src = next((a.get_attr("IFA_ADDRESS") for a in ipr.get_addr(family=_AF[family])
                            if a["scope"] == 0), None)        # RT_SCOPE_UNIVERSE
            if src:
                out[family] = src
    return out


def _resolve(path: str, targets: Mapping[IPFamily, str]) -> tuple[int, dict[IPFamily, str]]:
    def body() -> tuple[int, dict[IPFamily, str]]:
        return netns_scope.netns_cookie(), _sources(targets)

    return netns_scope.in_netns(path, body)


def cookie_of(ip: str, cgroup_root: str) -> int | None:
    """The cookie of the network namespace (among those the hooks can see) that holds address
    `ip`, for `trace --from` (a pod's ClientIP affinity row is keyed by it)."""
    def holds() -> bool:
        from pyroute2 import IPRoute

        with IPRoute() as ipr:
            return any(a.get_attr("IFA_ADDRESS") == ip for a in ipr.get_addr())

    for path in netns_scope.scope(cgroup_root).netns:
        try:
            if netns_scope.in_netns(path, holds):
                return netns_scope.in_netns(path, netns_scope.netns_cookie)
        except OSError:
            continue
    return None


def is_range_limited(fe: Frontend) -> bool:
    """Whether the hook checks a source for fe (so kp_nssrc must be filled)."""
    return fe.scope is Scope.SOCK and fe.kind is FrontendKind.LOAD_BALANCER and \
        bool(fe.source_ranges)


@dataclass
class Refresh:
    """What one pass did (counted in kproxy_netns_sources_*)."""
    namespaces: int = 0
    learnt: int = 0
    removed: int = 0
    failed: int = 0


@dataclass
class NetnsSources:
    rows: PinnedMap                       # kp_nssrc
    misses: PinnedMap                     # kp_nsmiss
    cgroup_root: str
    netns_dirs: tuple[str, ...] = netns_scope.RUNTIME_NETNS_DIRS
    targets: dict[IPFamily, str] = field(default_factory=dict)
    # namespace (st_dev, st_ino) -> (cookie, the rows written for it)
    known: dict[tuple[int, int], tuple[int, dict[IPFamily, str]]] = field(default_factory=dict)
    last_scan: float = 0.0
    _full_warned: bool = False

    @classmethod
    def of(cls, maps: Mapping[str, PinnedMap], cgroup_root: str) -> NetnsSources:
        return cls(maps["nssrc"], maps["nsmiss"], str(cgroup_root))

    @property
    def active(self) -> bool:
        return bool(self.targets)

    def want(self, targets: dict[IPFamily, str]) -> Refresh | None:
        """Called by the sync before it writes: the namespaces are learnt for new targets
        before any flag needs them, and forgotten when no frontend has ranges any more."""
        if targets == self.targets:
            return None
        self.targets = dict(targets)
        if not targets:
            for cookie, sources in self.known.values():
                self._delete(cookie, sources)
            self.known.clear()
            return None
        return self.refresh(full=True)

    def poll(self) -> Refresh | None:
        """One tick of the agent's loop: a full pass when the hook met an unknown namespace,
        a pass for new ones every RESCAN_S."""
        if not self.active:
            return None
        missed = self.misses.keys()
        if missed:
            res = self.refresh(full=True)
            for k in missed:
                self.misses.delete(k)
            return res
        if time.monotonic() - self.last_scan >= RESCAN_S:
            return self.refresh()
        return None

    def refresh(self, full: bool = False) -> Refresh:
        """Learns the namespaces not seen yet (all of them when `full`: a namespace inode can
        be reused by a new namespace, whose cookie differs) and forgets those gone."""
        self.last_scan = time.monotonic()
        res = Refresh()
        seen: dict[tuple[int, int], str] = {}
        for path in netns_scope.scope(self.cgroup_root, self.netns_dirs).netns:
            try:
                st = os.stat(path)
            except OSError:
                continue
            seen[(st.st_dev, st.st_ino)] = path
        res.namespaces = len(seen)
        for ns in [ns for ns in self.known if ns not in seen]:
            self._delete(*self.known.pop(ns))
            res.removed += 1
        for ns, path in seen.items():
            if ns in self.known and not full:
                continue
            try:
                cookie, sources = _resolve(path, self.targets)
            except OSError as exc:
                log.debug("netns %s: %s", path, exc)      # gone while we looked
                res.failed += 1
                continue
            old = self.known.get(ns)
            if old is not None and old != (cookie, sources):
                self._delete(*old)
            if self._write(cookie, sources):
                self.known[ns] = (cookie, sources)
                res.learnt += old is None or old != (cookie, sources)
            else:
                res.failed += 1
        return res

    def _write(self, cookie: int, sources: dict[IPFamily, str]) -> bool:
        try:
            for family, addr in sources.items():
                self.rows.put(self._key(cookie, family), self.rows.spec.value.from_buffer_copy(
                    L.ip_bytes(addr)))
        except MapFull:
            if not self._full_warned:
                log.warning("kp_nssrc is full: clients in namespaces beyond %d are refused by "
                            "loadBalancerSourceRanges checks", self.rows.max_entries)
                self._full_warned = True
            return False
        return True

    def _delete(self, cookie: int, sources: dict[IPFamily, str]) -> None:
        for family in sources:
            self.rows.delete(self._key(cookie, family))

    @staticmethod
    def _key(cookie: int, family: IPFamily):
        return L.NssrcKey(netns=cookie, family=_FAMILY_NUM[family])
