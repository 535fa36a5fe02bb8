"""One Service (+ its EndpointSlices + this Node) -> the frontends this node must translate.

The frontends describe traffic ORIGINATING ON THIS NODE (pods and host processes: the socket
path). For that traffic kube-proxy (semantics 1.7, nftables TestInternalExternalMasquerade)
uses internalTrafficPolicy for ClusterIPs and short-circuits externalTrafficPolicy: Local to the
Cluster set for NodePort, ExternalIP and LoadBalancer addresses. So ClusterIP frontends use iTP
and the other kinds always use the Cluster set. The Local set for eTP=Local traffic from outside
the node is exposed through service_port_endpoints() for the TC path and health checks.

Verdicts (semantics 1.5): no usable endpoint anywhere -> REJECT on every frontend of the port;
usable endpoints elsewhere but none in the applicable set -> DROP; otherwise FORWARD.

loadBalancerSourceRanges hold for this traffic too (kube-proxy's firewall chain hooks output as
well as prerouting): the LoadBalancer frontends carry them, and sock_lb.c judges the source
the socket will send from.

Each family is planned apart, from the Service, Node and slices as that family's proxier sees
them (families.py): a dual-stack Service has frontends of both, each with the endpoints of its
own family's slice, and every rule above applies per family as in kube-proxy.
"""
from __future__ import annotations

import ipaddress
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from kproxy_ebpf.model.desired import (
    NO_BACKENDS,
    Action,
    Backends,
    Frontend,
    FrontendKey,
    FrontendKind,
    Problem,
    ServiceInfo,
    ServicePortName,
    backend_state,
)
from kproxy_ebpf.model.objects import (
    EndpointSlice,
    IPFamily,
    LoadBalancerIngress,
    Node,
    Service,
    ServicePort,
    ServiceType,
    hostport,
)

from .endpoints import EndpointInfo, endpoints_by_port
from .families import node_view, service_families, service_view
from .topology import PortEndpoints, categorize


def is_proxied(svc: Service) -> bool:
    """Whether this proxy handles the Service at all (semantics 1.2).

    Not: headless (clusterIP None), ExternalName, a Service claimed by another proxy (label
    service.kubernetes.io/service-proxy-name, any value: we have no name), and a Service
    without a ClusterIP (kube-proxy's ShouldSkipService plus its per-family ClusterIP check:
    no ClusterIP of a family means no NodePort/ExternalIP rules of that family either). kube-proxy v1.36 filters
    the proxy-name label in its Service informer (cmd/kube-proxy/app/server.go); the
    service.kubernetes.io/headless label matters on EndpointSlices only (proxy/endpoints.py).
    """
    return not (svc.headless or svc.type is ServiceType.EXTERNAL_NAME
                or svc.proxy_name is not None or not svc.cluster_ips)


def is_vip_ingress(ing: LoadBalancerIngress) -> bool:
    """A load balancer that delivers packets still addressed to its IP (ipMode VIP or unset).

    Any other ipMode (Proxy, or a value newer than us) means the load balancer proxies the
    traffic itself, so kube-proxy v1.36 programs nothing for that IP (pkg/proxy/util IsVIPMode,
    serviceport.go) and traffic from the node must really go to the load balancer.
    """
    return ing.ip_mode is None or ing.ip_mode == "VIP"


@dataclass(frozen=True)
class ServicePortPlan:
    """One valid port of a proxied Service, with its endpoint sets."""
    port: ServicePort
    name: ServicePortName
    endpoints: PortEndpoints
    node_port_ok: bool = True
    serving: tuple[EndpointInfo, ...] = ()    # every serving endpoint of the port


def _problem(svc: Service, reason: str, message: str) -> Problem:
    return Problem(svc.namespace, svc.name, "Service", reason, message)


def _port_ok(port: int) -> bool:
    return 0 < port <= 65535


def _valid_ports(svc: Service, problems: list[Problem]) -> list[tuple[ServicePort, bool]]:
    """Service ports worth programming, with whether their node port is usable.

    The API server rejects all of this, but objects can also come from files or an apiserver
    with validation bugs, and a bad port must not take the rest of the Service down with it:
    the first of two clashing ports wins, the second is skipped and reported.
    """
    out: list[tuple[ServicePort, bool]] = []
    seen_port: dict[tuple[int, str], ServicePort] = {}
    seen_name: set[tuple[str, str]] = set()
    seen_node_port: set[tuple[int, str]] = set()
    for sp in svc.ports:
        proto = sp.protocol.value
        if not _port_ok(sp.port):
            problems.append(_problem(svc, "InvalidPort",
                                     f"port {sp.name or '(unnamed)'} {sp.port}/{proto} is not in "
                                     "1..65535; port skipped"))
            continue
        if (sp.port, proto) in seen_port:
            problems.append(_problem(svc, "DuplicatePort",
                                     f"port {sp.port}/{proto} is listed twice; the second "
                                     f"({sp.name or '(unnamed)'}) is skipped"))
            continue
        if (sp.name, proto) in seen_name:
            problems.append(_problem(svc, "DuplicatePort",
                                     f"port name {sp.name or '(unnamed)'!r}/{proto} is listed "
                                     f"twice; port {sp.port} is skipped"))
            continue
        node_port_ok = True
        if sp.node_port != 0:
            if not _port_ok(sp.node_port):
                problems.append(_problem(svc, "InvalidPort",
                                         f"nodePort {sp.node_port}/{proto} is not in 1..65535; "
                                         "NodePort skipped"))
                node_port_ok = False
            elif (sp.node_port, proto) in seen_node_port:
                problems.append(_problem(svc, "DuplicatePort",
                                         f"nodePort {sp.node_port}/{proto} is listed twice; "
                                         "the second is skipped"))
                node_port_ok = False
            else:
                seen_node_port.add((sp.node_port, proto))
        seen_port[(sp.port, proto)] = sp
        seen_name.add((sp.name, proto))
        out.append((sp, node_port_ok))
    return out


def _own_slices(svc: Service, slices: Iterable[EndpointSlice]) -> list[EndpointSlice]:
    return [s for s in slices if s.namespace == svc.namespace and s.service_name == svc.name]


def port_plans(svc: Service, slices: Iterable[EndpointSlice], node: Node,
               prefer_same_node: bool, family: IPFamily = IPFamily.IPV4
               ) -> tuple[list[ServicePortPlan], list[Problem]]:
    """The valid ports of a proxied Service with the endpoint sets of `family`'s slices, and
    the problems of its ports (both scopes plan from this)."""
    problems: list[Problem] = []
    if not is_proxied(svc):
        return [], problems
    ports = _valid_ports(svc, problems)
    by_port = endpoints_by_port(_own_slices(svc, slices), node.name, family)
    plans = []
    for sp, node_port_ok in ports:
        eps = by_port.get((sp.name, sp.protocol), ())
        plans.append(ServicePortPlan(
            port=sp,
            name=ServicePortName(svc.namespace, svc.name, sp.name, sp.protocol),
            endpoints=categorize(eps, node.name, node.zone, prefer_same_node=prefer_same_node),
            node_port_ok=node_port_ok,
            serving=tuple(e for e in eps if e.serving),
        ))
    return plans, problems


def service_port_endpoints(svc: Service, slices: Iterable[EndpointSlice], node: Node, *,
                           prefer_same_node: bool = True) -> dict[ServicePortName, PortEndpoints]:
    """The Cluster/Local sets of every valid port in the Service's primary family (its first
    ClusterIP's); {} for a Service we do not proxy."""
    families = service_families(svc)
    if not families:
        return {}
    plans, _ = port_plans(svc, slices, node, prefer_same_node, families[0])
    return {p.name: p.endpoints for p in plans}


def _backends(eps: Iterable[EndpointInfo], sp: ServicePort) -> Backends:
    # Runs once per endpoint and port of every Service: positional calls, no record per
    # endpoint (see Backends).
    proto, state = sp.protocol, backend_state
    eps = tuple(eps)
    return Backends.in_key_order([(e.ip, e.port, proto) for e in eps],
                                 [state(e.local, e.ready, e.serving, e.terminating) for e in eps])


def draining(plan: ServicePortPlan, backends: Backends) -> Backends:
    """The serving endpoints of the port that `backends` leave out."""
    named = {(ip, port) for ip, port, _ in backends.keys}
    left = [e for e in plan.serving if (e.ip, e.port) not in named]
    return _backends(left, plan.port) if left else NO_BACKENDS


def verdict(pe: PortEndpoints, chosen: tuple[EndpointInfo, ...], sp: ServicePort
            ) -> tuple[Action, Backends]:
    """What a frontend of port sp does with the endpoint set `chosen` (semantics 1.5)."""
    if not pe.has_any:
        return Action.REJECT, NO_BACKENDS
    if not chosen:
        return Action.DROP, NO_BACKENDS
    return Action.FORWARD, _backends(chosen, sp)


def service_info(svc: Service) -> ServiceInfo:
    """The Service-wide settings every frontend of it carries (kp_svc_meta, for the CLI)."""
    return ServiceInfo(svc.external_traffic_local, svc.internal_traffic_local,
                       svc.health_check_node_port, svc.load_balancer_source_ranges,
                       svc.traffic_distribution)


def lb_source_ranges(ranges: Sequence[str], node: Node, lb_ips: Sequence[str]) -> tuple[str, ...]:
    """The sources a LoadBalancer IP frontend admits: () when the Service has no (valid IPv4)
    loadBalancerSourceRanges, i.e. every source.

    As kube-proxy v1.36 (pkg/proxy/nftables/proxier.go, `usesFWChain`, and the iptables
    proxier alike): when a range holds the node's primary IP ("allowFromNode"), the Service's
    LB ingress IPs are admitted as sources too, because a VIP-like load balancer that routes
    its VIP to the node loops the node's own requests back with the VIP as their source.
    """
    if not ranges:
        return ()
    nets = [ipaddress.ip_network(r) for r in ranges]
    node_ip = ipaddress.ip_address(node.addresses[0]) if node.addresses else None
    out = set(ranges)
    if node_ip is not None and any(node_ip in n for n in nets):
        out.update(f"{ip}/{ipaddress.ip_address(ip).max_prefixlen}" for ip in lb_ips)
    return tuple(sorted(out, key=lambda c: (ipaddress.ip_network(c).version,
                                             ipaddress.ip_network(c).network_address,
                                             ipaddress.ip_network(c).prefixlen)))


def slice_family_problems(svc: Service, slices: Iterable[EndpointSlice]) -> list[Problem]:
    """An IPv4 or IPv6 slice of a proxied Service that has no ClusterIP of its family: no
    proxier of that family serves the Service, so its endpoints are unused (kube-proxy ignores
    them without a word; an operator wants to know)."""
    families = service_families(svc)
    if not is_proxied(svc):
        return []
    return [_problem(svc, "SliceFamilyNotServed",
                     f"EndpointSlice {s.name} is {s.address_type} but the Service has no "
                     f"{s.address_type} clusterIP (clusterIPs: {', '.join(svc.cluster_ips)}); its "
                     "endpoints are not used")
            for s in _own_slices(svc, slices)
            if s.address_type in (IPFamily.IPV4, IPFamily.IPV6) and s.address_type not in families]


def service_frontends(svc: Service, slices: Iterable[EndpointSlice], node: Node, *,
                      prefer_same_node: bool = True) -> tuple[list[Frontend], list[Problem]]:
    """Frontends of one Service for node-originated traffic, in each of its families (primary
    first), plus problems with its input (each once)."""
    fronts: list[Frontend] = []
    problems: list[Problem] = slice_family_problems(svc, slices)
    for family in service_families(svc):
        f, p = _family_frontends(service_view(svc, family), slices, node_view(node, family),
                                 prefer_same_node, family)
        fronts += f
        problems += p
    return fronts, list(dict.fromkeys(problems))


def _family_frontends(svc: Service, slices: Iterable[EndpointSlice], node: Node,
                      prefer_same_node: bool, family: IPFamily
                      ) -> tuple[list[Frontend], list[Problem]]:
    """The frontends of one family (svc and node are that family's views).

    Order: ports in spec order; per port ClusterIPs, external IPs, LoadBalancer ingress IPs
    (only ipMode VIP or unset: see is_vip_ingress), node addresses
    at the nodePort. A key (ip, port, protocol) produced twice keeps its first frontend: silently
    within one service port (e.g. an IP listed as both externalIP and LB ingress), with a
    FrontendConflict problem across ports.
    """
    plans, problems = port_plans(svc, slices, node, prefer_same_node, family)
    out: dict[FrontendKey, Frontend] = {}
    info = service_info(svc)
    lb_ips = [ing.ip for ing in svc.load_balancer_ingress if is_vip_ingress(ing)]
    for plan in plans:
        sp, pe = plan.port, plan.endpoints
        # Externally-typed addresses reached from this node: the Cluster set (short-circuit).
        external = verdict(pe, pe.cluster, sp)
        # ClusterIP: internalTrafficPolicy only, never eTP.
        internal = verdict(pe, pe.local, sp) if svc.internal_traffic_local else external
        candidates = [(ip, sp.port, FrontendKind.CLUSTER_IP, internal) for ip in svc.cluster_ips]
        candidates += [(ip, sp.port, FrontendKind.EXTERNAL_IP, external) for ip in svc.external_ips]
        candidates += [(ip, sp.port, FrontendKind.LOAD_BALANCER, external) for ip in lb_ips]
        ranges = lb_source_ranges(svc.load_balancer_source_ranges, node, lb_ips)
        if sp.node_port and plan.node_port_ok:
            candidates += [(ip, sp.node_port, FrontendKind.NODE_PORT, external)
                           for ip in node.addresses]
        for ip, port, kind, (action, backends) in candidates:
            fe = Frontend(ip=ip, port=port, protocol=sp.protocol, kind=kind, service=plan.name,
                          action=action, backends=backends,
                          affinity_timeout=svc.session_affinity_timeout, info=info,
                          source_ranges=ranges if kind is FrontendKind.LOAD_BALANCER else ())
            key = fe.key
            prev = out.get(key)
            if prev is None:
                out[key] = fe
            elif prev.service != fe.service:
                problems.append(_problem(
                    svc, "FrontendConflict",
                    f"{kind.value} {hostport(ip, port)}/{sp.protocol.value} of port {plan.name} is "
                    f"already used by port {prev.service} ({prev.kind.value}); skipped"))
    return list(out.values()), problems
