"""The proxy's view of the cluster and the incremental computation of the desired frontends.

Change tracking follows kube-proxy's ServiceChangeTracker / EndpointSliceCache idea: objects are
stored as they arrive, an update that changes nothing the proxy reads (same value apart from
resourceVersion) is dropped, and only Services touched since the last compute() are recomputed.
The result of each Service is cached, and so are the current problems, so compute() costs
O(changed services): the table goes out as a read-only view, never as a copy, and nothing walks
the Services that did not change. A fill of N Services is therefore O(N), not O(N^2).

Which Service keeps a frontend two of them claim, and the problems, are claims.py's.
"""
from __future__ import annotations

import dataclasses
from collections.abc import Iterable, KeysView, Mapping
from dataclasses import dataclass

from kproxy_ebpf.model import maglev
from kproxy_ebpf.model.desired import Frontend, FrontendKey, Problem, ServiceCIDRSet, ServicePortName
from kproxy_ebpf.model.objects import (
    EndpointSlice,
    IPFamily,
    LBAlgorithm,
    Node,
    Service,
    ServiceCIDR,
    ServiceKey,
)

from .claims import Claims
from .endpoints import endpoints_by_port
from .external import allow_external_ips, service_ext_frontends
from .frontends import service_frontends, service_port_endpoints
from .healthcheck import HealthCheck, health_check
from .schedulers import effective, with_scheduler
from .servicecidr import ServiceCIDRs
from .topology import PortEndpoints

SliceKey = tuple[str, str]                   # (namespace, slice name)


@dataclass(frozen=True)
class ChangeSet:
    """What compute() produced.

    `frontends` is a read-only view of the ENTIRE desired table, not a copy: it follows the
    state, so it holds this compute's result until the next compute() (the agent computes and
    applies on one thread). Readers that keep it longer must copy it.
    """
    frontends: Mapping[FrontendKey, Frontend]
    changed_keys: frozenset[FrontendKey]     # keys added, changed or removed by this compute
    changed_services: frozenset[ServiceKey]  # own frontends changed, or won/lost a key
    problems: list[Problem]                  # current problems of the `reported` services
    # Services whose problems were re-evaluated: one listed here without an entry in
    # `problems` has none any more. Problems of every other Service are as they were.
    reported: frozenset[ServiceKey] = frozenset()
    # The own frontend keys (before and after) of every Service recomputed: its endpoints may
    # have changed where its frontends did not (a terminating endpoint removed), which the
    # stale-socket search must see (established.py).
    recomputed_keys: frozenset[FrontendKey] = frozenset()


def _same(old: object, new: object) -> bool:
    """Equal apart from resourceVersion: a relist or a metadata-only update is a no-op."""
    return old == dataclasses.replace(new, resource_version=old.resource_version)  # type: ignore


def _node_view(node: Node | None) -> tuple:
    # Only what proxy/ reads: locality, zone hints and NodePort addresses.
    return (None,) if node is None else (node.name, node.zone, node.addresses)


class ProxyState:
    """Services, EndpointSlices and the Node, with dirty tracking and the cached result.

    Mutators return True when they made something dirty. Until set_node() is called the node
    is nameless and has no addresses: nothing is local and there are no NodePort frontends.
    """

    def __init__(self, node: Node | None = None, *, prefer_same_node: bool = True,
                 node_port_addresses: tuple[str, ...] | None = None,
                 external_ip_allowlist: tuple[str, ...] | None = None,
                 lb_algorithm: LBAlgorithm = LBAlgorithm.RANDOM,
                 maglev_table_size: int = maglev.DEFAULT_SIZE) -> None:
        self.prefer_same_node = prefer_same_node
        # How frontends pick backends, unless a Service's annotation says otherwise:
        # schedulers.py, and Maglev tables from outside (external.service_ext_frontends).
        self.lb_algorithm, self.maglev_table_size = lb_algorithm, maglev_table_size
        # Not None: ExternalIPs outside these CIDRs are not programmed (CVE-2020-8554).
        self.external_ip_allowlist = external_ip_allowlist
        # Not None: also compute the frontends for traffic from outside the node (scope EXT,
        # the TC path), with NodePorts on these addresses (see external.node_port_ips).
        self.node_port_addresses = node_port_addresses
        self._node = node
        self._services: dict[ServiceKey, Service] = {}
        self._slices: dict[SliceKey, EndpointSlice] = {}
        # A Service's slice names, sorted: a tuple, as most Services have one slice (a set of
        # one was 216 bytes, 10 MiB at 50,000 Services).
        self._slices_by_svc: dict[ServiceKey, tuple[str, ...]] = {}
        self._dirty: set[ServiceKey] = set()
        self._all_dirty = False
        # kube-proxy's change trackers, for its sync_proxy_rules_{service,endpoint}_changes_*
        # metrics: Services with a pending change of each kind, and every change seen.
        self._service_changed: set[ServiceKey] = set()
        self._endpoints_changed: set[ServiceKey] = set()
        self.service_changes_total = 0
        self.endpoint_changes_total = 0
        # Per-service cache of the last compute(): own frontends, the merged table, problems.
        self._claims = Claims()
        # ServiceCIDRs and allocated ClusterIPs (proxy/servicecidr.py), with a cached result.
        self._cidrs = ServiceCIDRs()
        # healthCheckNodePort servers of the Services that need one, kept by compute().
        self._health: dict[ServiceKey, HealthCheck] = {}

    # -- inputs ---------------------------------------------------------------------------------

    @property
    def node(self) -> Node | None:
        return self._node

    @property
    def dirty(self) -> frozenset[ServiceKey]:
        """Services waiting for the next compute() (all known ones after a node change)."""
        if self._all_dirty:
            return frozenset(self._dirty | set(self._services) | set(self._claims.claimants()))
        return frozenset(self._dirty)

    @property
    def pending(self) -> int:
        """len(dirty), in O(1) unless a node change made everything dirty."""
        return len(self.dirty) if self._all_dirty else len(self._dirty)

    @property
    def service_changes_pending(self) -> int:
        return len(self._service_changed)

    @property
    def endpoint_changes_pending(self) -> int:
        """Services whose EndpointSlices changed since the last compute()."""
        return len(self._endpoints_changed)

    def _service_change(self, key: ServiceKey) -> None:
        self._dirty.add(key)
        self._service_changed.add(key)
        self.service_changes_total += 1

    def _endpoints_change(self, key: ServiceKey) -> None:
        """A Service whose slices changed (the caller counts the slice event once)."""
        self._dirty.add(key)
        self._endpoints_changed.add(key)

    def service_keys(self) -> KeysView[ServiceKey]:
        """The Services held (a live view)."""
        return self._services.keys()

    def slice_keys(self) -> KeysView[SliceKey]:
        """The EndpointSlices held (a live view)."""
        return self._slices.keys()

    def service_cidr_keys(self) -> set[tuple[str, str]]:
        """The ServiceCIDRs held, keyed as their model objects are (cluster-scoped)."""
        return {("", name) for name in self._cidrs.names()}

    def set_node(self, node: Node) -> bool:
        changed = _node_view(self._node) != _node_view(node)
        self._node = node
        if changed:
            self._all_dirty = True
        return changed

    def upsert_service(self, svc: Service) -> bool:
        self._cidrs.cluster_ips.update(svc.key, svc)
        old = self._services.get(svc.key)
        self._services[svc.key] = svc
        if old is not None and _same(old, svc):
            return False
        self._service_change(svc.key)
        return True

    def delete_service(self, namespace: str, name: str) -> bool:
        if self._services.pop((namespace, name), None) is None:
            return False
        self._cidrs.cluster_ips.update((namespace, name), None)
        self._service_change((namespace, name))
        return True

    def upsert_slice(self, sl: EndpointSlice) -> bool:
        old = self._slices.get(sl.key)
        self._slices[sl.key] = sl
        if old is not None and _same(old, sl):
            return False
        dirtied = False
        if old is not None:
            dirtied |= self._unindex(old)
        if sl.service_name is not None:
            key = (sl.namespace, sl.service_name)
            names = self._slices_by_svc.get(key, ())
            if sl.name not in names:
                self._slices_by_svc[key] = tuple(sorted((*names, sl.name)))
            self._endpoints_change((sl.namespace, sl.service_name))
            dirtied = True
        if dirtied:
            self.endpoint_changes_total += 1      # one change per slice delivered
        return dirtied

    def delete_slice(self, namespace: str, name: str) -> bool:
        old = self._slices.pop((namespace, name), None)
        if old is None or not self._unindex(old):
            return False
        self.endpoint_changes_total += 1
        return True

    def _unindex(self, sl: EndpointSlice) -> bool:
        if sl.service_name is None:
            return False
        key = (sl.namespace, sl.service_name)
        names = self._slices_by_svc.get(key, ())
        if sl.name in names:
            left = tuple(n for n in names if n != sl.name)
            if left:
                self._slices_by_svc[key] = left
            else:
                del self._slices_by_svc[key]
        self._endpoints_change(key)
        return True

    def upsert_service_cidr(self, sc: ServiceCIDR) -> bool:
        return self._cidrs.upsert(sc)

    def delete_service_cidr(self, name: str) -> bool:
        return self._cidrs.delete(name)

    def service_cidr_changes(self) -> tuple[frozenset[str], dict[str, str | None]]:
        """What a partial sync writes (ServiceCIDRs.changes)."""
        return self._cidrs.changes()

    def service_cidr_set(self) -> ServiceCIDRSet:
        """What a full sync writes (ServiceCIDRs.whole)."""
        return self._cidrs.whole()

    # -- reads ----------------------------------------------------------------------------------

    def service(self, namespace: str, name: str) -> Service | None:
        return self._services.get((namespace, name))

    def slices_of(self, namespace: str, name: str) -> list[EndpointSlice]:
        """The slices labelled for a Service, in slice-name order."""
        return [self._slices[(namespace, n)]
                for n in self._slices_by_svc.get((namespace, name), ())]

    def port_endpoints(self, namespace: str, name: str) -> dict[ServicePortName, PortEndpoints]:
        """Cluster/Local endpoint sets per port (for the TC path and health checks)."""
        svc = self._services.get((namespace, name))
        if svc is None:
            return {}
        return service_port_endpoints(svc, self.slices_of(namespace, name), self._node_or_blank(),
                                      prefer_same_node=self.prefer_same_node)

    def serving_endpoints(self, port: ServicePortName, family: IPFamily
                          ) -> frozenset[tuple[str, int]]:
        """(ip, port) of every serving endpoint of a Service port, whatever its traffic
        policies, topology hints or termination say about new connections: the backends a
        connection made earlier may keep (established.py)."""
        eps = endpoints_by_port(self.slices_of(port.namespace, port.name), "", family)
        return frozenset((e.ip, e.port) for e in eps.get((port.port, port.protocol), ())
                         if e.serving)

    def health_checks(self) -> dict[int, HealthCheck]:
        """healthCheckNodePort -> what its server reports (the first Service in
        namespace/name order keeps a port two Services claim)."""
        out: dict[int, HealthCheck] = {}
        for key in sorted(self._health):      # kept by compute(): O(such Services)
            out.setdefault(self._health[key].port, self._health[key])
        return out

    def frontends_by_service(self) -> dict[ServiceKey, list[Frontend]]:
        """The effective (post-conflict) frontends of the last compute(), per Service."""
        return self._claims.frontends_by_service()

    def problems(self) -> list[Problem]:
        """Every current problem as of the last compute(), in Service order. O(problems)."""
        return self._claims.problems()

    def problem_counts(self) -> Mapping[str, int]:
        """Current problems by reason (a live read-only view). O(1)."""
        return self._claims.problem_counts()

    def _node_or_blank(self) -> Node:
        return self._node if self._node is not None else Node(name="")

    # -- compute --------------------------------------------------------------------------------

    def compute(self, full: bool = False) -> ChangeSet:
        """Recompute the dirty Services (all with full=True) and return the whole table (as a
        read-only view). The work is proportional to the Services recomputed."""
        targets = set(self._dirty)
        if full or self._all_dirty:
            targets |= (set(self._services) | set(self._claims.claimants())
                        | set(self._claims.with_problems()))
        self._dirty.clear()
        self._all_dirty = False
        self._service_changed.clear()
        self._endpoints_changed.clear()
        node = self._node_or_blank()

        changed_services: set[ServiceKey] = set()
        affected: set[FrontendKey] = set()
        recomputed: set[FrontendKey] = set()
        for key in sorted(targets):
            svc = self._services.get(key)
            fronts: list[Frontend] = []
            probs: list[Problem] = []
            slices: list[EndpointSlice] = []
            if svc is not None:
                slices = self.slices_of(*key)
                fronts, probs = service_frontends(svc, slices, node,
                                                  prefer_same_node=self.prefer_same_node)
                if self.node_port_addresses is not None:
                    fronts += service_ext_frontends(
                        svc, slices, node, prefer_same_node=self.prefer_same_node,
                        node_port_addresses=self.node_port_addresses, problems=probs,
                        lb_algorithm=self.lb_algorithm, maglev_table_size=self.maglev_table_size)
                fronts = with_scheduler(fronts, effective(svc, self.lb_algorithm))
            if self.external_ip_allowlist is not None:
                fronts, refused = allow_external_ips(fronts, self.external_ip_allowlist)
                probs = probs + refused
            hc = health_check(svc, slices, node) if svc is not None else None
            if hc is not None:
                self._health[key] = hc
            else:
                self._health.pop(key, None)
            new = {fe.key: fe for fe in fronts}
            recomputed.update(new)
            recomputed.update(self._claims.own(key))
            changed = self._claims.set_own(key, new, probs)
            if changed:
                changed_services.add(key)
                affected |= changed

        changed_keys, owners_changed, claimants = self._claims.merge(affected)
        changed_services |= owners_changed
        report = set(targets) | claimants      # a winner change alters the others' conflicts
        problems = self._claims.report(report)
        return ChangeSet(frontends=self._claims.view, changed_keys=frozenset(changed_keys),
                         changed_services=frozenset(changed_services), problems=problems,
                         reported=frozenset(report), recomputed_keys=frozenset(recomputed))

    def load(self, services: Iterable[Service] = (), slices: Iterable[EndpointSlice] = ()) -> None:
        """Convenience for tests and the CLI: upsert many objects."""
        for svc in services:
            self.upsert_service(svc)
        for sl in slices:
            self.upsert_slice(sl)
