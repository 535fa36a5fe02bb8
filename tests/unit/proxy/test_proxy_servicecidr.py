"""ServiceCIDRs and allocated ClusterIPs -> ServiceCIDRSet (kube-proxy nftables' cluster-ips set
and service-CIDR drop rule, pkg/proxy/nftables/proxier.go v1.36). No traffic: data only."""
from __future__ import annotations

import functools

import pytest

from kproxy_ebpf.model.desired import ServiceCIDRSet
from kproxy_ebpf.model.objects import ServiceCIDR, ServiceType
from kproxy_ebpf.proxy.servicecidr import ClusterIPIndex, service_cidr_set
from kproxy_ebpf.proxy.state import ProxyState

from ...builders import svc

# Service ns/web on 10.96.0.10:80, inside the default ServiceCIDR.
web = functools.partial(svc, "web", "10.96.0.10")


@pytest.mark.parametrize("service,ours,foreign", [
    pytest.param(web(), {"10.96.0.10"}, set(), id="proxied"),
    pytest.param(web(proxy_name="other"), set(), {"10.96.0.10"}, id="service-proxy-name"),
    pytest.param(web(cluster_ips=(), headless=True), set(), set(), id="headless"),
    pytest.param(web(type=ServiceType.EXTERNAL_NAME), set(), set(), id="externalname"),
    pytest.param(web(ports=()), set(), set(), id="no-ports-no-rules"),
])
def test_which_cluster_ips_are_allocated(service, ours, foreign):
    index = ClusterIPIndex()
    index.update(service.key, service)
    assert (index.ours(), index.foreign()) == (ours, foreign)


def test_index_follows_updates_and_deletes():
    index = ClusterIPIndex()
    assert index.update(("ns", "a"), svc("a", "10.96.0.1"))
    assert not index.update(("ns", "a"), svc("a", "10.96.0.1"))      # nothing new
    index.update(("ns", "b"), svc("b", "10.96.0.2", proxy_name="x"))
    assert index.ours() == {"10.96.0.1"} and index.foreign() == {"10.96.0.2"}
    # The label moves the Service from one proxy to the other, and back.
    index.update(("ns", "a"), svc("a", "10.96.0.1", proxy_name="x"))
    index.update(("ns", "b"), svc("b", "10.96.0.2"))
    assert index.ours() == {"10.96.0.2"} and index.foreign() == {"10.96.0.1"}
    index.update(("ns", "a"), None)
    index.update(("ns", "b"), None)
    assert index.ours() == frozenset() == index.foreign()


def test_set_unions_every_service_cidr():
    index = ClusterIPIndex()
    index.update(("ns", "web"), web())
    got = service_cidr_set([ServiceCIDR("kubernetes", ("10.96.0.0/16",)),
                            ServiceCIDR("extra", ("10.97.0.0/24", "10.96.0.0/16"))], index)
    assert got == ServiceCIDRSet(cidrs=frozenset({"10.96.0.0/16", "10.97.0.0/24"}),
                                 cluster_ips=frozenset({"10.96.0.10"}))


def test_proxy_state_reports_cidr_changes_and_caches():
    state = ProxyState()
    assert state.service_cidr_set() == ServiceCIDRSet()
    assert state.upsert_service_cidr(ServiceCIDR("kubernetes", ("10.96.0.0/16",), "1"))
    assert not state.upsert_service_cidr(ServiceCIDR("kubernetes", ("10.96.0.0/16",), "2"))
    state.upsert_service(web())
    first = state.service_cidr_set()
    assert first.cidrs == {"10.96.0.0/16"} and first.cluster_ips == {"10.96.0.10"}
    assert state.service_cidr_set() is first                    # nothing changed: cached
    assert state.delete_service("ns", "web")
    assert state.service_cidr_set().cluster_ips == frozenset()
    assert state.delete_service_cidr("kubernetes") and not state.delete_service_cidr("kubernetes")
    assert state.service_cidr_set() == ServiceCIDRSet()
