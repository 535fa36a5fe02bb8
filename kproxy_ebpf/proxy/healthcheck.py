"""healthCheckNodePort: which Services get a health server on this node, and what it reports.

kube-proxy's semantics (semantics 1.9; pkg/proxy/healthcheck/service_health.go): a server per
Service of type LoadBalancer with externalTrafficPolicy Local and a healthCheckNodePort; it
reports the number of unique IPs of this node's Ready endpoints over all the Service's ports
(terminating endpoints are not Ready, so they do not count), so a cloud load balancer sends
traffic only to nodes that can serve it without leaving the node.
"""
from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from kproxy_ebpf.model.objects import EndpointSlice, Node, Service, ServiceType

from .endpoints import endpoints_by_port
from .families import service_families
from .frontends import is_proxied


@dataclass(frozen=True)
class HealthCheck:
    namespace: str
    name: str
    port: int
    local_endpoints: int


def health_check(svc: Service, slices: Iterable[EndpointSlice], node: Node) -> HealthCheck | None:
    if (svc.type is not ServiceType.LOAD_BALANCER or not svc.external_traffic_local
            or not 0 < svc.health_check_node_port <= 65535 or not is_proxied(svc)):
        return None
    own = [s for s in slices if s.namespace == svc.namespace and s.service_name == svc.name]
    # The primary family's endpoints: a dual-stack pod is one endpoint, listed in both slices.
    ips = {e.ip for eps in endpoints_by_port(own, node.name, service_families(svc)[0]).values()
           for e in eps if e.local and e.ready}
    return HealthCheck(svc.namespace, svc.name, svc.health_check_node_port, len(ips))
