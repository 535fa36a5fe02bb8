"""Builders of the proxy's model objects for the tests: one Service, endpoint, slice or
frontend per call, with the conventions most tests share (namespace "ns", Service "svc" on
ClusterIP 172.30.0.10 port 80/TCP, slice "s1" with target port 8080/TCP). A module that needs
other defaults binds them once with functools.partial; every field is a keyword."""
from __future__ import annotations

from collections.abc import Iterable

from kproxy_ebpf.model.desired import Action, Backend, Frontend, FrontendKind, Scope, ServicePortName
from kproxy_ebpf.model.objects import Endpoint, EndpointPort, EndpointSlice, Protocol, Service, ServicePort

TCP, UDP = Protocol.TCP, Protocol.UDP
CLUSTER_IP = "172.30.0.10"
PORT_80 = (ServicePort("", TCP, 80),)
TARGET_8080 = (EndpointPort("", TCP, 8080),)


def svc(name: str = "svc", ip: str | Iterable[str] = CLUSTER_IP, *, ns: str = "ns",
        ports: Iterable[ServicePort] = PORT_80, **fields) -> Service:
    """Service ns/name on ClusterIP `ip` (several: a tuple; none: ()); `fields` are Service's."""
    ips = (ip,) if isinstance(ip, str) else tuple(ip)
    fields.setdefault("cluster_ips", ips)
    return Service(namespace=ns, name=name, ports=tuple(ports), **fields)


def ep(ip: str | None, node: str | None = None, **fields) -> Endpoint:
    """One endpoint on `node`; a falsy `ip` makes one without addresses. Conditions unset
    unless given (ready=..., serving=..., terminating=...)."""
    return Endpoint.of(ip or None, node_name=node, **fields)


def sl(*eps: Endpoint, name: str = "s1", svc: str | None = "svc", ns: str = "ns",
       ports: Iterable[EndpointPort] = TARGET_8080, family: str = "IPv4",
       rv: str = "") -> EndpointSlice:
    """EndpointSlice ns/name of Service `svc` (None: without the label) holding `eps`."""
    return EndpointSlice(namespace=ns, name=name, service_name=svc, address_type=family,
                         ports=tuple(ports), endpoints=tuple(eps), resource_version=rv)


def fe(ip: str = "10.96.0.10", port: int = 80, backends: Iterable[str | Backend] = (),
       action: Action = Action.FORWARD, *, kind: FrontendKind = FrontendKind.CLUSTER_IP,
       name: str = "web", service: ServicePortName | None = None, affinity: int = 0,
       scope: Scope = Scope.SOCK, ranges: Iterable[str] = ()) -> Frontend:
    """A TCP frontend of `service` (default/<name>:http unless given); backends are addresses
    (target port 8080) or Backends, kept sorted as the proxy hands them to the writer."""
    service = service or ServicePortName("default", name, "http", TCP)
    bs = tuple(sorted(Backend.of(b, 8080, TCP) if isinstance(b, str) else b for b in backends))
    return Frontend(ip, port, TCP, kind, service, action, bs, affinity, scope,
                    source_ranges=tuple(ranges))


def table(*fes: Frontend) -> dict:
    """Frontends by key, as MapWriter.apply takes them."""
    return {f.key: f for f in fes}
