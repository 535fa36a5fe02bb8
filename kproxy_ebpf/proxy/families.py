"""A Service and a Node seen by one address family (EndpointSlices: proxy/endpoints.py).

kube-proxy runs one proxier per family (v1.36 pkg/proxy/metaproxier for dual-stack): each sees
only the ClusterIP, externalIPs, LoadBalancer ingress IPs, loadBalancerSourceRanges and node
addresses of its family, and only the EndpointSlices whose addressType is that family; a
Service without a ClusterIP of the family does not exist for that proxier (ShouldSkipService
plus its per-family ClusterIP check). The planners in this package take the same view, one
family at a time, from these functions, so every rule they encode holds for IPv6 unchanged.

A single-family Service (the common case) is its own view: nothing is copied for it.
"""
from __future__ import annotations

import functools
from collections.abc import Iterable
from dataclasses import replace

from kproxy_ebpf.model.objects import IPFamily, Node, Service, family_of


def _of(ips: Iterable[str], family: IPFamily) -> tuple[str, ...]:
    return tuple(ip for ip in ips if family_of(ip) is family)


def service_families(svc: Service) -> tuple[IPFamily, ...]:
    """The families a Service is served in, primary first: those of its ClusterIPs."""
    return tuple(family_of(ip) for ip in svc.cluster_ips)


def _single_family(svc: Service, family: IPFamily) -> bool:
    return (all(family_of(ip) is family for ip in svc.cluster_ips)
            and all(family_of(ip) is family for ip in svc.external_ips)
            and all(family_of(i.ip) is family for i in svc.load_balancer_ingress)
            and all(family_of(r) is family for r in svc.load_balancer_source_ranges))


def service_view(svc: Service, family: IPFamily) -> Service:
    """The Service as the proxier of `family` sees it."""
    if _single_family(svc, family):
        return svc
    return replace(
        svc, cluster_ips=_of(svc.cluster_ips, family), external_ips=_of(svc.external_ips, family),
        load_balancer_ingress=tuple(i for i in svc.load_balancer_ingress
                                    if family_of(i.ip) is family),
        load_balancer_source_ranges=_of(svc.load_balancer_source_ranges, family))


@functools.lru_cache(maxsize=64)
def node_view(node: Node, family: IPFamily) -> Node:
    """The Node with the addresses of `family` only (its NodePort addresses in that family)."""
    ips = _of(node.addresses, family)
    return node if ips == node.addresses else replace(node, addresses=ips)

