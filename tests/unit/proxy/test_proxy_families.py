"""Both families of one Service, each planned as kube-proxy's proxier of that family would
(proxy/families.py): its own ClusterIP, external and LB addresses, node addresses and slice.

Conventions: node-a has 192.168.0.1 and fd00:250::1; the dual-stack Service "svc" has
ClusterIPs 172.30.0.10 and fd00:96::10 (IPv4 primary unless a test says otherwise); pods are
10.0.1.x / fd00:244:1::x on node-a and 10.0.2.x / fd00:244:2::x on node-b.
"""
from __future__ import annotations

import functools
import ipaddress

import pytest

from kproxy_ebpf.model.desired import Action, FrontendKind, Scope
from kproxy_ebpf.model.objects import IPFamily, LoadBalancerIngress, Node, Protocol, ServicePort, ServiceType
from kproxy_ebpf.proxy.external import service_ext_frontends
from kproxy_ebpf.proxy.families import service_view
from kproxy_ebpf.proxy.frontends import service_frontends
from kproxy_ebpf.proxy.healthcheck import health_check

from ... import builders
from ...builders import sl

TCP = Protocol.TCP
NODE = Node(name="node-a", addresses=("192.168.0.1", "fd00:250::1"), zone="zone-a")
DUAL = ("172.30.0.10", "fd00:96::10")
ep = functools.partial(builders.ep, ready=True)
svc = functools.partial(builders.svc, ip=DUAL)
V4 = sl(ep("10.0.1.5", "node-a"), ep("10.0.2.5", "node-b"), name="s-v4")
V6 = sl(ep("fd00:244:1::5", "node-a"), ep("fd00:244:2::5", "node-b"), name="s-v6", family="IPv6")


def frontends(service, *slices, node=NODE):
    fronts, problems = service_frontends(service, list(slices), node)
    return {(f.ip, f.port): f for f in fronts}, problems


def backends(fe):
    return sorted(b.ip for b in fe.backends)


def test_each_family_gets_its_own_slice():
    fronts, problems = frontends(svc(), V4, V6)
    assert problems == []
    assert list(fronts) == [("172.30.0.10", 80), ("fd00:96::10", 80)], "primary family first"
    assert backends(fronts[("172.30.0.10", 80)]) == ["10.0.1.5", "10.0.2.5"]
    assert backends(fronts[("fd00:96::10", 80)]) == ["fd00:244:1::5", "fd00:244:2::5"]
    assert [f.key.family for f in fronts.values()] == [IPFamily.IPV4, IPFamily.IPV6]


def test_a_family_without_endpoints_rejects_on_its_own():
    """kube-proxy's proxiers judge each family alone: the IPv6 one has no endpoints and
    rejects, while the IPv4 one forwards."""
    fronts, _ = frontends(svc(), V4, sl(name="s-v6", family="IPv6"))
    assert fronts[("172.30.0.10", 80)].action is Action.FORWARD
    assert fronts[("fd00:96::10", 80)].action is Action.REJECT


def test_policies_apply_per_family():
    fronts, _ = frontends(svc(internal_traffic_local=True), V4, V6)
    assert backends(fronts[("172.30.0.10", 80)]) == ["10.0.1.5"]
    assert backends(fronts[("fd00:96::10", 80)]) == ["fd00:244:1::5"]


def test_addresses_of_every_kind_stay_in_their_family():
    service = svc(type=ServiceType.LOAD_BALANCER, ports=(ServicePort("", TCP, 80, 30080),),
                  external_ips=("203.0.113.1", "2001:db8::1"),
                  load_balancer_ingress=(LoadBalancerIngress("198.51.100.1"),
                                         LoadBalancerIngress("2001:db8:1::1")))
    fronts, _ = frontends(service, V4, V6)
    kinds = {(ip, fe.kind): backends(fe)[0][:4] for (ip, _), fe in fronts.items()}
    assert kinds == {
        ("172.30.0.10", FrontendKind.CLUSTER_IP): "10.0", ("fd00:96::10", FrontendKind.CLUSTER_IP): "fd00",
        ("203.0.113.1", FrontendKind.EXTERNAL_IP): "10.0", ("2001:db8::1", FrontendKind.EXTERNAL_IP): "fd00",
        ("198.51.100.1", FrontendKind.LOAD_BALANCER): "10.0",
        ("2001:db8:1::1", FrontendKind.LOAD_BALANCER): "fd00",
        ("192.168.0.1", FrontendKind.NODE_PORT): "10.0", ("fd00:250::1", FrontendKind.NODE_PORT): "fd00",
    }


def test_an_ipv6_only_service():
    fronts, problems = frontends(svc(ip="fd00:96::10"), V6)
    assert list(fronts) == [("fd00:96::10", 80)] and problems == []


def test_a_slice_of_a_family_the_service_does_not_have_is_reported_and_unused():
    fronts, problems = frontends(svc(ip="172.30.0.10"), V4, V6)
    assert list(fronts) == [("172.30.0.10", 80)]
    assert [p.reason for p in problems] == ["SliceFamilyNotServed"]
    assert "s-v6 is IPv6" in problems[0].message


def test_a_port_problem_of_a_dual_stack_service_is_reported_once():
    service = svc(ports=(ServicePort("", TCP, 80), ServicePort("x", TCP, 80)))
    _, problems = frontends(service, V4, V6)
    assert [p.reason for p in problems] == ["DuplicatePort"]


def test_source_ranges_of_the_other_family_do_not_filter():
    """kube-proxy's per-family proxier reads its family's ranges only: an IPv4 frontend of a
    Service whose ranges are all IPv6 admits every IPv4 source (pkg/proxy/util
    MapCIDRsByIPFamily)."""
    service = svc(ip="172.30.0.10", type=ServiceType.LOAD_BALANCER,
                  load_balancer_ingress=(LoadBalancerIngress("198.51.100.1"),),
                  load_balancer_source_ranges=("2001:db8::/32",))
    assert service_view(service, IPFamily.IPV4).load_balancer_source_ranges == ()
    fronts = service_ext_frontends(service, [V4], NODE)
    assert [f.source_ranges for f in fronts if f.kind is FrontendKind.LOAD_BALANCER] == [()]


def test_a_dual_stack_nodeport_has_a_frontend_from_outside_per_family():
    """Each family's NodePort answers on that family's node address, with that family's
    endpoints, and nothing is reported."""
    service = svc(type=ServiceType.NODE_PORT, ports=(ServicePort("", TCP, 80, 30080),))
    problems = []
    fronts = service_ext_frontends(service, [V4, V6], NODE, problems=problems)
    assert {(f.ip, f.scope) for f in fronts} == {("192.168.0.1", Scope.EXT),
                                                ("fd00:250::1", Scope.EXT)}
    for f in fronts:
        assert {ipaddress.ip_address(b.ip).version for b in f.backends} == \
            {ipaddress.ip_address(f.ip).version}
    assert problems == []


@pytest.mark.parametrize("primary,count", [(DUAL, 1), (DUAL[::-1], 1)])
def test_health_check_counts_one_family(primary, count):
    """A dual-stack pod is in both slices: the health check counts it once (the primary
    family's slice), not twice."""
    service = svc(ip=primary, type=ServiceType.LOAD_BALANCER, external_traffic_local=True,
                  health_check_node_port=32000)
    assert health_check(service, [V4, V6], NODE).local_endpoints == count
