"""status.loadBalancer.ingress ipMode with real packets from a pod of node1 (lab "dp"): a VIP
ingress IP is short-circuited to the Service's backends on the node, an ipMode Proxy one is not
(kube-proxy v1.36 IsVIPMode): such traffic must reach the load balancer itself."""
from __future__ import annotations

import dataclasses

import pytest

from kproxy_ebpf.model.objects import LoadBalancerIngress, ServiceType

from .dplab import assert_untouched, endpoints, pod_of, service

pytestmark = pytest.mark.root


def test_ip_mode_proxy_is_not_short_circuited(lab, node1):
    svc = dataclasses.replace(
        service("lb", "10.96.0.40", ("http", "TCP", 80)), type=ServiceType.LOAD_BALANCER,
        load_balancer_ingress=(LoadBalancerIngress("198.51.100.7"),
                               LoadBalancerIngress("198.51.100.8", ip_mode="Proxy")))
    node1.program(svc, endpoints(lab, "lb", ["b1"], ("http", "TCP", 8080)))
    assert pod_of(lab.probe("client", "198.51.100.7", 80)[0]) == "b1"
    assert_untouched(lab, node1, "198.51.100.8", 80)
    node1.program(dataclasses.replace(svc, load_balancer_ingress=(
        LoadBalancerIngress("198.51.100.8", ip_mode="VIP"),)),
        endpoints(lab, "lb", ["b1"], ("http", "TCP", 8080)))
    assert pod_of(lab.probe("client", "198.51.100.8", 80)[0]) == "b1"
