"""One Service -> the frontends for packets arriving from OUTSIDE the node (scope EXT, the TC path).

These are the externally reachable addresses only: NodePort on the node's NodePort addresses,
spec.externalIPs and status.loadBalancer.ingress IPs (ipMode Proxy skipped, semantics 1.2).
Which endpoints they use is externalTrafficPolicy's business (semantics 1.5, 1.7):

- Cluster: the Cluster set; the datapath masquerades (SNAT to the node address) when the chosen
  backend is on another node, so the reply comes back through this node.
- Local: the Local set only and no SNAT, so the backend sees the client's own address; DROP
  when endpoints exist only on other nodes, REJECT when there are none anywhere.

Traffic from pods and from the node itself never takes this path (the socket hooks serve it, with
rule 1.7's short-circuit to the Cluster set): see frontends.py.

nodePortAddresses follows kube-proxy: empty or "primary" means the node's primary address (its
first InternalIP), otherwise the node addresses inside any of the listed CIDRs.

loadBalancerSourceRanges restrict the LoadBalancer ingress IP frontends only (see
frontends.lb_source_ranges), here as in the socket scope; NodePorts and ExternalIPs of the same
Service stay open, as in kube-proxy.

Per family, as frontends.py: tc_lb.c translates IPv4 and IPv6 packets alike, each family's
frontends with that family's endpoints and node addresses.

A frontend picks a backend for a new flow at random, or by a Maglev table (Frontend.maglev,
the table's size) when the Service's annotation kproxy-ebpf.io/lb-algorithm, or else the
node's lbAlgorithm, says maglev: then every node with the same endpoints sends a flow to the
same backend, which ECMP in front of the nodes needs.
"""
from __future__ import annotations

import ipaddress
from collections.abc import Iterable, Sequence

from kproxy_ebpf.model import maglev
from kproxy_ebpf.model.desired import Action, Frontend, FrontendKey, FrontendKind, Problem, Scope
from kproxy_ebpf.model.objects import EndpointSlice, IPFamily, LBAlgorithm, Node, Protocol, Service

from .families import node_view, service_families, service_view
from .frontends import draining, lb_source_ranges, port_plans, service_info, verdict

PRIMARY = "primary"


def node_port_ips(node: Node, node_port_addresses: Sequence[str] = ()) -> tuple[str, ...]:
    """The node addresses NodePorts answer on (kube-proxy's nodePortAddresses semantics)."""
    if not node_port_addresses or list(node_port_addresses) == [PRIMARY]:
        return tuple(node.addresses[:1])
    nets: list[ipaddress.IPv4Network | ipaddress.IPv6Network] = []
    for cidr in node_port_addresses:
        if cidr == PRIMARY:
            nets.extend(ipaddress.ip_network(f"{ip}/32") for ip in node.addresses[:1])
        else:
            nets.append(ipaddress.ip_network(cidr, strict=False))
    return tuple(ip for ip in node.addresses
                 if any(ipaddress.ip_address(ip) in net for net in nets))


def validate_cidrs(values: Iterable[str], what: str, primary_ok: bool = False) -> list[str]:
    """Error messages for entries that are not CIDRs (or "primary" where that is allowed)."""
    errors = []
    for v in values:
        if primary_ok and v == PRIMARY:
            continue
        try:
            ipaddress.ip_network(v, strict=False)
        except ValueError:
            errors.append(f"{what}: {v!r} is not a CIDR" + (' nor "primary"' if primary_ok else ""))
    return errors


def validate_node_port_addresses(values: Iterable[str]) -> list[str]:
    return validate_cidrs(values, "nodePortAddresses", primary_ok=True)


def service_ext_frontends(svc: Service, slices: Iterable[EndpointSlice], node: Node, *,
                          node_port_addresses: Sequence[str] = (),
                          prefer_same_node: bool = True,
                          problems: list[Problem] | None = None,
                          lb_algorithm: LBAlgorithm = LBAlgorithm.RANDOM,
                          maglev_table_size: int = maglev.DEFAULT_SIZE) -> list[Frontend]:
    """Scope-EXT frontends of one Service, in each of its families. Input problems are not
    reported here: the socket scope (service_frontends) reads the same fields and reports each
    once. What only this scope refuses (an SCTP port: tc_lb.c rewrites TCP and UDP; SCTP's
    CRC32c covers the ports and no BPF helper recomputes it) goes into `problems`.
    `lb_algorithm` is the node's default, `maglev_table_size` its configured table size."""
    out: list[Frontend] = []
    table = maglev_table_size if (svc.lb_algorithm or lb_algorithm) is LBAlgorithm.MAGLEV else 0
    for family in service_families(svc):
        out += _family_ext_frontends(service_view(svc, family), slices, node_view(node, family),
                                     family, node_port_addresses, prefer_same_node, problems,
                                     table)
    return out


def _family_ext_frontends(svc: Service, slices: Iterable[EndpointSlice], node: Node,
                          family: IPFamily, node_port_addresses: Sequence[str],
                          prefer_same_node: bool, problems: list[Problem] | None,
                          table: int) -> list[Frontend]:
    ext_ips = svc.external_ips
    lb_ips = [ing.ip for ing in svc.load_balancer_ingress if ing.ip_mode != "Proxy"]
    np_ips = node_port_ips(node, node_port_addresses)
    if not ext_ips and not lb_ips and not (np_ips and any(p.node_port for p in svc.ports)):
        return []       # not reachable from outside (a plain ClusterIP): nothing to plan
    plans, _ = port_plans(svc, slices, node, prefer_same_node, family)
    info = service_info(svc)
    ranges = lb_source_ranges(svc.load_balancer_source_ranges, node, lb_ips)
    out: dict[FrontendKey, Frontend] = {}
    for plan in plans:
        sp, pe = plan.port, plan.endpoints
        if sp.protocol is Protocol.SCTP:
            if problems is not None:
                problems.append(Problem(
                    svc.namespace, svc.name, "Service", "SCTPFromOutsideNotServed",
                    f"port {sp.name or '(unnamed)'} {sp.port}/SCTP: NodePort, externalIPs and "
                    "LoadBalancer traffic from outside the node is not translated for SCTP "
                    "(TCP and UDP only); ClusterIP clients are not affected"))
            continue
        chosen = pe.local if svc.external_traffic_local else pe.cluster
        action, backends = verdict(pe, chosen, sp)
        drain = draining(plan, backends)
        size = maglev.table_size(table, len(backends)) if table and action is Action.FORWARD \
            else 0
        if size and len(backends) * maglev.MIN_PER_BACKEND > size and problems is not None:
            problems.append(Problem(
                svc.namespace, svc.name, "Service", "MaglevTableTooSmall",
                f"port {sp.name or '(unnamed)'} {sp.port}/{sp.protocol.value}: {len(backends)} "
                f"endpoints for a Maglev table of at most {maglev.MAX_SIZE} entries leave each "
                f"fewer than {maglev.MIN_PER_BACKEND}, so their shares of new flows differ by "
                f"more than 1 %; flows are still balanced over all of them"))
        candidates = [(ip, sp.port, FrontendKind.EXTERNAL_IP) for ip in ext_ips]
        candidates += [(ip, sp.port, FrontendKind.LOAD_BALANCER) for ip in lb_ips]
        if sp.node_port and plan.node_port_ok:
            candidates += [(ip, sp.node_port, FrontendKind.NODE_PORT) for ip in np_ips]
        for ip, port, kind in candidates:
            fe = Frontend(ip=ip, port=port, protocol=sp.protocol, kind=kind, service=plan.name,
                          action=action, backends=backends,
                          affinity_timeout=svc.session_affinity_timeout, scope=Scope.EXT,
                          info=info,
                          source_ranges=ranges if kind is FrontendKind.LOAD_BALANCER else (),
                          draining=drain, maglev=size)
            out.setdefault(fe.key, fe)     # clashes are reported by the socket scope
    return list(out.values())


def allow_external_ips(fronts: list[Frontend], allowlist: Sequence[str]
                       ) -> tuple[list[Frontend], list[Problem]]:
    """Drops ExternalIP frontends (both scopes) outside `allowlist` (CIDRs), the mitigation of
    CVE-2020-8554: without it any user who may create a Service can capture traffic to any
    address by naming it in spec.externalIPs. Each refused IP is one problem."""
    nets = [ipaddress.ip_network(c, strict=False) for c in allowlist]
    kept, refused = [], {}
    for fe in fronts:
        if fe.kind is FrontendKind.EXTERNAL_IP and not any(
                ipaddress.ip_address(fe.ip) in n for n in nets):
            refused[(fe.service.namespace, fe.service.name, fe.ip)] = fe
            continue
        kept.append(fe)
    problems = [Problem(ns, name, "Service", "ExternalIPNotAllowed",
                        f"externalIP {ip} is outside externalIpAllowlist; not programmed")
                for ns, name, ip in sorted(refused)]
    return kept, problems
