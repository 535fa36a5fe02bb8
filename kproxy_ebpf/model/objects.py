"""Lean, immutable model of the Kubernetes objects the proxy needs.

kube/ builds these from API objects (or YAML files); proxy/ reads only these. kube/convert/ is
the one validator: every address the proxy may program (ClusterIPs, external and load balancer
IPs, node addresses, the endpoints of an IPv4 slice) is canonical IPv4 text and every CIDR a
canonical IPv4 network, so proxy/ uses them without parsing them again. Fields keep the
API's "unset" (None) where kube-proxy gives unset a meaning of its own (endpoint conditions,
port names), so the defaults live in one place: proxy/endpoints.py.
"""
from __future__ import annotations

import enum
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from itertools import repeat, starmap
from typing import Any, NamedTuple, TypeVar, overload


class Protocol(enum.StrEnum):
    TCP = "TCP"
    UDP = "UDP"
    SCTP = "SCTP"


class IPFamily(enum.StrEnum):
    """An address family, spelled as the API spells it (EndpointSlice addressType,
    ipFamilies). A str enum: it hashes as its string, at C speed, inside the keys of the
    desired table."""
    IPV4 = "IPv4"
    IPV6 = "IPv6"


def family_of(ip: str) -> IPFamily:
    """The family of a canonical address (kube/convert/ writes IPv6 with a colon, IPv4
    never)."""
    return IPFamily.IPV6 if ":" in ip else IPFamily.IPV4


def hostport(ip: str, port: int | str) -> str:
    """An address and port as text: a.b.c.d:port, and [v6]:port (RFC 3986) so that the port
    never reads as the address's last group."""
    return f"[{ip}]:{port}" if ":" in ip else f"{ip}:{port}"


class Kind(enum.StrEnum):
    """The API objects the sources deliver (kube/sources.py) to the agent's sink."""
    SERVICE = "Service"
    ENDPOINT_SLICE = "EndpointSlice"
    NODE = "Node"
    SERVICE_CIDR = "ServiceCIDR"


class LBAlgorithm(enum.StrEnum):
    """How a frontend picks a backend for a new connection (annotation
    kproxy-ebpf.io/lb-algorithm, node default lbAlgorithm; bpf/lib/sched.h, lib/maglev.h)."""
    RANDOM = "random"      # uniformly at random, per node
    MAGLEV = "maglev"      # by a Maglev table: every node picks the same backend for a flow
    #                        (frontends for traffic from outside; the others pick at random)
    ROUND_ROBIN = "round-robin"  # each backend in turn, per frontend and node (IPVS rr)
    LEAST_CONN = "least-conn"    # the backend with the fewest connections from this node (lc)


class ServiceType(enum.StrEnum):
    CLUSTER_IP = "ClusterIP"
    NODE_PORT = "NodePort"
    LOAD_BALANCER = "LoadBalancer"
    EXTERNAL_NAME = "ExternalName"


@dataclass(frozen=True, slots=True)
class ServicePort:
    name: str                 # "" for an unnamed port
    protocol: Protocol
    port: int
    node_port: int = 0        # 0: none allocated


@dataclass(frozen=True, slots=True)
class LoadBalancerIngress:
    ip: str                      # never "" (a hostname-only ingress is left out)
    ip_mode: str | None = None   # "VIP", "Proxy" or None (unset means VIP)


ServiceKey = tuple[str, str]        # a Service's (namespace, name), everywhere it is a key


@dataclass(frozen=True, slots=True)
class Service:
    namespace: str
    name: str
    type: ServiceType = ServiceType.CLUSTER_IP
    cluster_ips: tuple[str, ...] = ()      # one per family, primary first; () when headless/none
    headless: bool = False                 # spec.clusterIP == "None"
    ports: tuple[ServicePort, ...] = ()
    external_ips: tuple[str, ...] = ()
    load_balancer_ingress: tuple[LoadBalancerIngress, ...] = ()
    session_affinity_timeout: int = 0      # seconds; 0: sessionAffinity None
    external_traffic_local: bool = False   # externalTrafficPolicy: Local
    internal_traffic_local: bool = False   # internalTrafficPolicy: Local
    health_check_node_port: int = 0
    load_balancer_source_ranges: tuple[str, ...] = ()
    traffic_distribution: str | None = None
    proxy_name: str | None = None          # label service.kubernetes.io/service-proxy-name
    resource_version: str = ""
    lb_algorithm: LBAlgorithm | None = None  # annotation kproxy-ebpf.io/lb-algorithm; None: the
                                             # node's default

    @property
    def key(self) -> tuple[str, str]:
        return (self.namespace, self.name)


@dataclass(frozen=True, slots=True)
class EndpointPort:
    name: str | None          # None: unset (such a port is ignored, as kube-proxy does)
    protocol: Protocol
    port: int | None          # None or 0: unset (ignored)


# Endpoint.conditions: ready, serving and terminating, each two bits: 0 unset, 1 false, 2 true.
_TRISTATE = {None: 0, False: 1, True: 2}
_FROM_TRI = (None, False, True, None)
_READY_SHIFT, _SERVING_SHIFT, _TERMINATING_SHIFT = 0, 2, 4


def conditions(ready: bool | None = None, serving: bool | None = None,
               terminating: bool | None = None) -> int:
    """Endpoint.conditions of the three conditions (None: unset)."""
    tri = _TRISTATE
    return (tri[ready] << _READY_SHIFT | tri[serving] << _SERVING_SHIFT
            | tri[terminating] << _TERMINATING_SHIFT)


class EndpointHints(NamedTuple):
    zones: tuple[str, ...] = ()        # hints.forZones[].name
    nodes: tuple[str, ...] = ()        # hints.forNodes[].name


class Endpoint(NamedTuple):
    """One endpoints[] entry. A NamedTuple: 100,000 are made per LIST at 10k Services x 10,
    and a frozen dataclass's __init__ (one object.__setattr__ per field) cost 3x as much.
    Five fields, one held per endpoint (500,000 at 50,000 Services): only the first address,
    which kube-proxy uses alone (the API allows one per endpoint today); the three conditions
    in one small int; the hints, rare, in one field. Build one with Endpoint.of."""
    address: str | None                # endpoints[].addresses[0]; None: the list is empty
    conditions: int = 0                # conditions(ready, serving, terminating)
    node_name: str | None = None
    zone: str | None = None
    hints: EndpointHints | None = None

    @classmethod
    def of(cls, address: str | None, ready: bool | None = None, serving: bool | None = None,
           terminating: bool | None = None, node_name: str | None = None,
           zone: str | None = None, hint_zones: tuple[str, ...] = (),
           hint_nodes: tuple[str, ...] = ()) -> Endpoint:
        hints = EndpointHints(hint_zones, hint_nodes) if hint_zones or hint_nodes else None
        return cls(address, conditions(ready, serving, terminating), node_name, zone, hints)

    @property
    def ready(self) -> bool | None:
        return _FROM_TRI[self.conditions >> _READY_SHIFT & 3]

    @property
    def serving(self) -> bool | None:
        return _FROM_TRI[self.conditions >> _SERVING_SHIFT & 3]

    @property
    def terminating(self) -> bool | None:
        return _FROM_TRI[self.conditions >> _TERMINATING_SHIFT & 3]

    @property
    def hint_zones(self) -> tuple[str, ...]:
        return self.hints.zones if self.hints is not None else ()

    @property
    def hint_nodes(self) -> tuple[str, ...]:
        return self.hints.nodes if self.hints is not None else ()


_Row = TypeVar("_Row")


class Columns(Sequence[_Row]):
    """An immutable sequence of records kept column by column (Endpoints, desired.Backends):
    where one record per endpoint would be held, a column holds a pointer or a byte. A
    subclass names its columns in __slots__, in its constructor's order, the first one as
    long as the sequence, and makes a record in __getitem__ and __iter__. Equal to a tuple of
    the same records (and hashed as it), so that a test can write either."""
    __slots__: tuple[str, ...] = ()

    def _columns(self) -> tuple:
        return tuple(getattr(self, name) for name in self.__slots__)

    def __setattr__(self, name: str, value: object) -> None:
        raise AttributeError(f"{type(self).__name__} is immutable")

    def __len__(self) -> int:
        return len(getattr(self, self.__slots__[0]))

    def __eq__(self, other: object) -> bool:
        if type(other) is type(self):
            return self._columns() == other._columns()
        if isinstance(other, tuple):
            return tuple(self) == other
        return NotImplemented

    def __hash__(self) -> int:
        return hash(tuple(self))        # as the equal tuple's

    def __repr__(self) -> str:
        return f"{type(self).__name__}({list(self)!r})"

    def __reduce__(self) -> tuple:
        return (type(self), self._columns())


EndpointRow = tuple[str | None, int, str | None, str | None, EndpointHints | None]


def _column(values: Sequence[Any] | None) -> tuple | None:
    """A column of Endpoints; None when every value is None (zones, hints: most slices)."""
    return None if values is None or all(v is None for v in values) else tuple(values)


class Endpoints(Columns[Endpoint]):
    """A slice's endpoints, column by column: their addresses, one conditions byte each, and
    their node names, zones and hints (None for a column that is all None).

    One Endpoint record per endpoint (500,000 at 50,000 Services x 10, 80 bytes each) is what
    this saves: per endpoint a column holds a pointer to a shared string, or nothing. rows()
    gives the fields to the per-endpoint loops; reading one by index or iteration makes its
    Endpoint. Build one from its columns or with Endpoints.of (records)."""
    __slots__ = ("addresses", "conditions", "node_names", "zones", "hints")
    addresses: tuple[str | None, ...]
    conditions: bytes
    node_names: tuple[str | None, ...] | None
    zones: tuple[str | None, ...] | None
    hints: tuple[EndpointHints | None, ...] | None

    def __init__(self, addresses: Sequence[str | None] = (), conditions: Sequence[int] = b"",
                 node_names: Sequence[str | None] | None = None,
                 zones: Sequence[str | None] | None = None,
                 hints: Sequence[EndpointHints | None] | None = None) -> None:
        # Every way in (convert's lists, records, pickling) comes through here, so a column
        # of nothing but None is always None and equal Endpoints have equal columns.
        addresses, conditions = tuple(addresses), bytes(conditions)
        n = len(addresses)
        for name, col in (("conditions", conditions), ("node_names", node_names),
                          ("zones", zones), ("hints", hints)):
            if col is not None and len(col) != n:
                raise ValueError(f"{n} endpoint addresses but {len(col)} {name}")
        set_ = object.__setattr__
        set_(self, "addresses", addresses)
        set_(self, "conditions", conditions)
        set_(self, "node_names", _column(node_names))
        set_(self, "zones", _column(zones))
        set_(self, "hints", _column(hints))

    @classmethod
    def of(cls, endpoints: Iterable[Endpoint]) -> Endpoints:
        """From Endpoint records, in their order."""
        if isinstance(endpoints, Endpoints):
            return endpoints
        eps = tuple(endpoints)
        if not eps:
            return NO_ENDPOINTS
        return cls(*zip(*eps, strict=True))

    def rows(self) -> Iterator[EndpointRow]:
        """(address, conditions, node_name, zone, hints) of each endpoint, with no record."""
        n = len(self.addresses)
        return zip(self.addresses, self.conditions,
                   self.node_names or repeat(None, n), self.zones or repeat(None, n),
                   self.hints or repeat(None, n), strict=True)

    @overload
    def __getitem__(self, i: int) -> Endpoint: ...
    @overload
    def __getitem__(self, i: slice) -> Endpoints: ...

    def __getitem__(self, i: int | slice) -> Endpoint | Endpoints:
        if isinstance(i, slice):
            return Endpoints.of(list(self)[i])
        node_names, zones, hints = self.node_names, self.zones, self.hints
        return Endpoint(self.addresses[i], self.conditions[i],
                        node_names[i] if node_names is not None else None,
                        zones[i] if zones is not None else None,
                        hints[i] if hints is not None else None)

    def __iter__(self) -> Iterator[Endpoint]:
        return starmap(Endpoint, self.rows())


NO_ENDPOINTS = Endpoints()


@dataclass(frozen=True, slots=True)
class EndpointSlice:
    namespace: str
    name: str
    service_name: str | None           # label kubernetes.io/service-name; None: unset
    address_type: str = "IPv4"         # "IPv4", "IPv6" or "FQDN"
    ports: tuple[EndpointPort, ...] = ()
    endpoints: Endpoints = NO_ENDPOINTS
    resource_version: str = ""
    # label service.kubernetes.io/headless present: the slice belongs to a headless Service (or
    # was marked so by hand), and kube-proxy's EndpointSlice informer never sees it.
    headless_label: bool = False
    # annotation endpoints.kubernetes.io/last-change-trigger-time (epoch seconds): when the
    # change this slice carries began (a pod or Service change), for programming latency.
    trigger_time: float | None = field(default=None, compare=False)

    def __post_init__(self) -> None:
        if type(self.endpoints) is not Endpoints:       # Endpoint records (tests, manifests)
            object.__setattr__(self, "endpoints", Endpoints.of(self.endpoints))

    @property
    def key(self) -> tuple[str, str]:
        return (self.namespace, self.name)


@dataclass(frozen=True, slots=True)
class Node:
    name: str
    addresses: tuple[str, ...] = ()    # IPv4 InternalIPs (then ExternalIPs), in API order
    zone: str | None = None            # label topology.kubernetes.io/zone
    labels: tuple[tuple[str, str], ...] = field(default=())
    # deletionTimestamp set, or tainted ToBeDeletedByClusterAutoscaler: /healthz turns 503 so
    # load balancers drain the node first (kube-proxy's nodeEligible).
    deleting: bool = False


@dataclass(frozen=True)
class ServiceCIDR:
    """networking.k8s.io/v1 ServiceCIDR: a range ClusterIPs are allocated from (GA in 1.33).

    kube-proxy (nftables) rejects traffic to an allocated ClusterIP on a port the Service does
    not have and drops traffic to any other address inside these ranges.
    """
    name: str
    cidrs: tuple[str, ...] = ()        # IPv4 ranges of spec.cidrs, canonical (network address)
    resource_version: str = ""

    @property
    def key(self) -> tuple[str, str]:
        return ("", self.name)          # cluster-scoped
