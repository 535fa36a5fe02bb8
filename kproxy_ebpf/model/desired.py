"""The desired datapath state: what proxy/ computes and datapath/ applies.

A Frontend is one address:port/protocol that the node must translate, with the backends (and the
verdict) that kube-proxy's rules give traffic *originating on this node* (pods and host
processes: the socket hooks). Rule 7 of kube-proxy's semantics short-circuits externally-typed
frontends (NodePort, ExternalIP, LoadBalancer) to the Cluster endpoint set for such traffic, so one
backend list per frontend is enough for the socket path. The per-packet TC path serves packets
from OUTSIDE the node (scope EXT): its frontends follow externalTrafficPolicy (the Cluster set,
or only the Local set under eTP=Local). Both live in one table, keyed by FrontendKey, whose
scope tells them apart.
"""
from __future__ import annotations

import enum
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import NamedTuple, overload

from .objects import Columns, IPFamily, LBAlgorithm, Protocol, family_of, hostport


class FrontendKind(enum.StrEnum):
    CLUSTER_IP = "ClusterIP"
    NODE_PORT = "NodePort"
    EXTERNAL_IP = "ExternalIP"
    LOAD_BALANCER = "LoadBalancer"


class Scope(enum.StrEnum):
    """Which traffic a frontend row serves (kproxy.h enum kp_scope).

    Scopes order as the kernel numbers them (SOCK before EXT), not by their text, so that a
    sorted table lists the socket row of an address before its row for traffic from outside
    (the writer allocates ids in that order)."""
    SOCK = "sock"    # sockets on this node: the cgroup hooks
    EXT = "ext"      # packets arriving from outside the node: the TC programs

    def __lt__(self, other: object) -> bool:
        return _SCOPE_RANK[self] < _SCOPE_RANK[other]      # type: ignore[index]

    def __le__(self, other: object) -> bool:
        return _SCOPE_RANK[self] <= _SCOPE_RANK[other]     # type: ignore[index]

    def __gt__(self, other: object) -> bool:
        return _SCOPE_RANK[self] > _SCOPE_RANK[other]      # type: ignore[index]

    def __ge__(self, other: object) -> bool:
        return _SCOPE_RANK[self] >= _SCOPE_RANK[other]     # type: ignore[index]


_SCOPE_RANK = {scope: rank for rank, scope in enumerate(Scope)}


class FrontendKey(NamedTuple):
    """What names a frontend in the desired table and in the writer: its address, port and
    protocol, the traffic it serves, and the address family. A NamedTuple: one is made per
    frontend per compute, and it is hashed by C code (every field is a str, an int or a str
    enum)."""
    ip: str
    port: int
    protocol: Protocol
    scope: Scope = Scope.SOCK
    family: IPFamily = IPFamily.IPV4

    def __str__(self) -> str:
        """As logs and Events name a frontend: ip:port/protocol ([ip]:port in IPv6)."""
        return f"{hostport(self.ip, self.port)}/{self.protocol.value}"


class Action(enum.StrEnum):
    FORWARD = "forward"   # pick one of the backends
    REJECT = "reject"     # no usable endpoint anywhere: fail fast (ECONNREFUSED)
    DROP = "drop"         # endpoints exist, but none in the applicable Local set


@dataclass(frozen=True, order=True, slots=True)
class ServicePortName:
    """kube-proxy's unit of load balancing: one port of one Service."""
    namespace: str
    name: str
    port: str          # the port's name, "" when unnamed
    protocol: Protocol

    def __str__(self) -> str:
        base = f"{self.namespace}/{self.name}"
        return f"{base}:{self.port}" if self.port else base


BackendKey = tuple[str, int, Protocol]      # (ip, port, protocol): a backend row's identity


class BackendState(enum.IntFlag):
    """An endpoint's conditions as a frontend holds them (Backend.state)."""
    LOCAL = 1              # on this node (the endpoint's nodeName is ours)
    READY = 2
    SERVING = 4
    TERMINATING = 8


_LOCAL, _READY, _SERVING, _TERMINATING = (int(f) for f in BackendState)


def backend_state(local: bool = False, ready: bool = True, serving: bool = True,
                  terminating: bool = False) -> int:
    """The BackendState bits of an endpoint's conditions, as a plain int."""
    return ((_LOCAL if local else 0) | (_READY if ready else 0) | (_SERVING if serving else 0)
            | (_TERMINATING if terminating else 0))


class Backend(NamedTuple):
    """One endpoint a frontend forwards to; ordered by its key. A frontend does not hold these
    (see Backends): they are made when its backends are read one by one. Build one with
    Backend.of."""
    key: BackendKey
    state: int = _READY | _SERVING           # BackendState bits

    @classmethod
    def of(cls, ip: str, port: int, protocol: Protocol, local: bool = False,
           ready: bool = True, serving: bool = True, terminating: bool = False) -> Backend:
        return cls((ip, port, protocol), backend_state(local, ready, serving, terminating))

    @property
    def ip(self) -> str:
        return self.key[0]

    @property
    def port(self) -> int:
        return self.key[1]

    @property
    def protocol(self) -> Protocol:
        return self.key[2]

    @property
    def local(self) -> bool:
        return bool(self.state & _LOCAL)

    @property
    def ready(self) -> bool:
        return bool(self.state & _READY)

    @property
    def serving(self) -> bool:
        return bool(self.state & _SERVING)

    @property
    def terminating(self) -> bool:
        return bool(self.state & _TERMINATING)


class Backends(Columns[Backend]):
    """A frontend's backends, in the order given (key order, as proxy/ makes them): the key
    tuples and one BackendState byte each.

    There is one per endpoint and frontend (500,000 at 50,000 Services x 10), so they are not
    kept as Backend records (64 bytes each): the keys are the objects the writer then holds for
    its ids and slot rows (no copy per endpoint) and the states one byte each. Reading one,
    by index or by iteration, makes its Backend."""
    __slots__ = ("keys", "states")
    keys: tuple[BackendKey, ...]
    states: bytes

    def __init__(self, keys: tuple[BackendKey, ...] = (), states: bytes = b"") -> None:
        if len(keys) != len(states):
            raise ValueError(f"{len(keys)} backend keys but {len(states)} states")
        object.__setattr__(self, "keys", keys)
        object.__setattr__(self, "states", states)

    @classmethod
    def of(cls, backends: Iterable[Backend]) -> Backends:
        """From Backend records, in their order."""
        if isinstance(backends, Backends):
            return backends
        bs = tuple(backends)
        return cls(tuple(b.key for b in bs), bytes(b.state for b in bs))

    @classmethod
    def in_key_order(cls, keys: Iterable[BackendKey], states: Iterable[int]) -> Backends:
        """From parallel keys and states, put in key order."""
        pairs = sorted(zip(keys, states, strict=True))
        return cls(tuple(k for k, _ in pairs), bytes(s for _, s in pairs))

    @overload
    def __getitem__(self, i: int) -> Backend: ...
    @overload
    def __getitem__(self, i: slice) -> Backends: ...

    def __getitem__(self, i: int | slice) -> Backend | Backends:
        if isinstance(i, slice):
            return Backends(self.keys[i], self.states[i])
        return Backend(self.keys[i], self.states[i])

    def __iter__(self) -> Iterator[Backend]:
        return map(Backend, self.keys, self.states)


NO_BACKENDS = Backends()


@dataclass(frozen=True, slots=True)
class ServiceInfo:
    """Service-wide settings shown by the CLI next to each frontend (kp_svc_meta), including
    those the datapath does not act on yet (see docs/design/semantics.md)."""
    external_local: bool = False           # externalTrafficPolicy: Local
    internal_local: bool = False           # internalTrafficPolicy: Local
    health_check_node_port: int = 0
    source_ranges: tuple[str, ...] = ()    # loadBalancerSourceRanges
    traffic_distribution: str | None = None


@dataclass(frozen=True, slots=True)
class Frontend:
    ip: str
    port: int
    protocol: Protocol
    kind: FrontendKind
    service: ServicePortName
    action: Action
    backends: Backends = NO_BACKENDS       # sorted; empty unless action is FORWARD
    affinity_timeout: int = 0              # seconds of ClientIP affinity; 0: none
    scope: Scope = Scope.SOCK
    info: ServiceInfo = ServiceInfo()
    # Scope EXT, LoadBalancer only: the sources a new flow must come from (IPv4 networks,
    # canonical, sorted); () = any. See proxy/external.py lb_source_ranges.
    source_ranges: tuple[str, ...] = ()
    # Scope EXT: serving endpoints the slots do not name (a pod shutting down while others are
    # ready). Their backend rows stay, so the TC path's flows to them keep their backend until
    # the endpoint stops serving, as kube-proxy keeps their conntrack entries.
    draining: Backends = NO_BACKENDS
    # Scope EXT: the entries of its Maglev table (a prime), so that every node picks the same
    # backend for a flow; 0: a backend at random (proxy/external.py lb_algorithm).
    maglev: int = 0
    # The scheduler of a new connection when it is not Maglev's: RANDOM, ROUND_ROBIN or
    # LEAST_CONN (proxy/schedulers.py).
    algorithm: LBAlgorithm = LBAlgorithm.RANDOM

    def __post_init__(self) -> None:
        if type(self.backends) is not Backends:         # Backend records (tests, tools)
            object.__setattr__(self, "backends", Backends.of(self.backends))
        if type(self.draining) is not Backends:
            object.__setattr__(self, "draining", Backends.of(self.draining))

    @property
    def key(self) -> FrontendKey:
        return FrontendKey(self.ip, self.port, self.protocol, self.scope, family_of(self.ip))


@dataclass(frozen=True, slots=True)
class Problem:
    """Input the proxy could not use, reported as a log line, a metric and an Event."""
    namespace: str
    name: str
    kind: str          # "Service" or "EndpointSlice"
    reason: str        # CamelCase, used as the metric label and the Event reason
    message: str


@dataclass(frozen=True)
class ServiceCIDRSet:
    """What the node does with an address that matched no frontend (kube-proxy nftables'
    cluster-ips set and service CIDR rules, semantics 1.2 / nftables proxier.go v1.36).

    An address in cluster_ips (a ClusterIP this proxy programs) on a port the Service does not
    have is refused (ECONNREFUSED, kube-proxy's reject). Any other address inside one of cidrs
    fails at once with EHOSTUNREACH (kube-proxy drops it; see docs/design/semantics.md for why we
    fail fast), except foreign_ips: ClusterIPs of Services another proxy owns (label
    service.kubernetes.io/service-proxy-name), left untouched so that proxy can serve them.
    """
    cidrs: frozenset[str] = frozenset()        # IPv4 networks, canonical ("10.96.0.0/16")
    cluster_ips: frozenset[str] = frozenset()
    foreign_ips: frozenset[str] = frozenset()
