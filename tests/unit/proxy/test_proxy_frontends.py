"""Service -> frontends for node-originated traffic (semantics 1.2, 1.5, 1.7 on top of 1.1-1.6).

Conventions: this node is "node-a" (zone-a) with addresses 192.168.0.1 and 192.168.1.1; ClusterIPs
are 172.30.0.x, externalIPs 203.0.113.x, LoadBalancer IPs 198.51.100.x, pods 10.0.<node>.x
(10.0.1.x local to node-a). No traffic is sent: these are data.
"""
from __future__ import annotations

import dataclasses
import functools

import pytest

from kproxy_ebpf.kube.convert import service_from_api
from kproxy_ebpf.model.desired import Action, FrontendKind, ServicePortName
from kproxy_ebpf.model.objects import (
    EndpointPort,
    LoadBalancerIngress,
    Node,
    Protocol,
    ServicePort,
    ServiceType,
)
from kproxy_ebpf.proxy.external import service_ext_frontends
from kproxy_ebpf.proxy.frontends import is_proxied, service_frontends, service_port_endpoints

from ... import builders
from ...builders import sl, svc

TCP, UDP, SCTP = Protocol.TCP, Protocol.UDP, Protocol.SCTP
NODE = Node(name="node-a", addresses=("192.168.0.1", "192.168.1.1"), zone="zone-a")
CIP = builders.CLUSTER_IP
K = FrontendKind

TERMINATING = dict(ready=False, serving=True, terminating=True)
SERVING_ONLY = dict(ready=False, serving=True, terminating=False)


# ep(ip, node=..., **conditions): ready on node-b unless told
ep = functools.partial(builders.ep, node="node-b", ready=True)


def run(service, *slices, node=NODE, **kw):
    fronts, problems = service_frontends(service, list(slices), node, **kw)
    return {(f.ip, f.port, f.protocol, f.kind): f for f in fronts}, problems


def summary(fronts):
    """{(ip, port, kind): (action, [backend ips])}"""
    return {(ip, port, kind): (f.action, [b.ip for b in f.backends])
            for (ip, port, _proto, kind), f in fronts.items()}


# -- 1.2 service filtering ------------------------------------------------------------------------

@pytest.mark.parametrize("service", [
    pytest.param(svc(headless=True, cluster_ips=()), id="headless-clusterip-none"),
    pytest.param(svc(type=ServiceType.EXTERNAL_NAME), id="externalname-even-with-clusterip"),
    pytest.param(svc(proxy_name="other-proxy"), id="service-proxy-name-label"),
    pytest.param(svc(proxy_name=""), id="service-proxy-name-label-empty"),
    pytest.param(svc(cluster_ips=(), external_ips=("203.0.113.1",)), id="no-ipv4-clusterip"),
])
def test_skipped_services(service):
    assert not is_proxied(service)
    assert service_frontends(service, [sl(ep("10.0.2.1"))], NODE) == ([], [])
    assert service_port_endpoints(service, [sl(ep("10.0.2.1"))], NODE) == {}


@pytest.mark.parametrize("service, slices, want", [
    # kube-proxy v1.36 reads service.kubernetes.io/headless on EndpointSlices only (its Service
    # informer filters the proxy-name label and clusterIP None, nothing else).
    pytest.param(svc(), [sl(ep("10.0.2.1"))], {(CIP, 80, K.CLUSTER_IP): (Action.FORWARD, ["10.0.2.1"])},
                 id="headless-label-on-the-service-is-not-a-filter"),
    pytest.param(svc(), [sl(ep("10.0.2.1")), sl(ep("10.0.9.9"), name="other", svc="other")],
                 {(CIP, 80, K.CLUSTER_IP): (Action.FORWARD, ["10.0.2.1"])},
                 id="slices-of-other-services-are-ignored"),
    pytest.param(svc(ports=(ServicePort("http", TCP, 80),)),
                 [sl(ep("10.0.2.1"), ports=[EndpointPort("web", TCP, 8080)])],
                 {(CIP, 80, K.CLUSTER_IP): (Action.REJECT, [])}, id="port-name-mismatch-means-no-endpoints"),
    pytest.param(svc(ports=(ServicePort("", UDP, 53),)), [sl(ep("10.0.2.1"), ports=[EndpointPort("", TCP, 53)])],
                 {(CIP, 53, K.CLUSTER_IP): (Action.REJECT, [])}, id="protocol-mismatch-means-no-endpoints"),
])
def test_frontends_of_one_service(service, slices, want):
    fronts, _ = run(service, *slices)
    assert is_proxied(service) and summary(fronts) == want


def test_slice_with_the_headless_label_is_ignored():
    """e2e "should implement service.kubernetes.io/headless": the label on the slice takes its
    endpoints away; with no other slice the Service has no endpoints and is rejected."""
    labelled = dataclasses.replace(sl(ep("10.0.2.1")), headless_label=True)
    fronts, _ = run(svc(), labelled)
    assert summary(fronts) == {(CIP, 80, K.CLUSTER_IP): (Action.REJECT, [])}
    other = dataclasses.replace(sl(ep("10.0.2.2")), name="svc-2")
    fronts, _ = run(svc(), labelled, other)
    assert summary(fronts) == {(CIP, 80, K.CLUSTER_IP): (Action.FORWARD, ["10.0.2.2"])}


@pytest.mark.parametrize("ip_mode,programmed", [
    pytest.param(None, True, id="unset-means-VIP"),
    pytest.param("VIP", True, id="VIP"),
    pytest.param("Proxy", False, id="Proxy"),
    pytest.param("Tunnel", False, id="unknown-mode-is-not-VIP"),
])
def test_load_balancer_ip_mode(ip_mode, programmed):
    """kube-proxy v1.36 IsVIPMode: only unset or VIP gets rules; otherwise traffic from the
    node to that IP goes to the load balancer itself (no short-circuit)."""
    s = svc(type=ServiceType.LOAD_BALANCER,
            load_balancer_ingress=(LoadBalancerIngress("198.51.100.7", ip_mode=ip_mode),))
    fronts, problems = run(s, sl(ep("10.0.2.1")))
    assert problems == []
    assert (("198.51.100.7", 80, K.LOAD_BALANCER) in summary(fronts)) is programmed
    assert (CIP, 80, K.CLUSTER_IP) in summary(fronts)


# -- basic shape ----------------------------------------------------------------------------------

def test_clusterip_forward_with_target_port_from_slice():
    fronts, problems = run(svc(session_affinity_timeout=10800),
                           sl(ep("10.0.2.2"), ep("10.0.2.1", node="node-a")))
    assert problems == []
    (f,) = fronts.values()
    assert (f.ip, f.port, f.protocol, f.kind, f.action) == (CIP, 80, TCP, K.CLUSTER_IP,
                                                            Action.FORWARD)
    assert f.service == ServicePortName("ns", "svc", "", TCP)
    assert f.affinity_timeout == 10800
    assert [(b.ip, b.port, b.protocol, b.local) for b in f.backends] == [
        ("10.0.2.1", 8080, TCP, True), ("10.0.2.2", 8080, TCP, False)]
    assert list(f.backends) == sorted(f.backends)


def test_every_frontend_kind():
    s = svc(type=ServiceType.LOAD_BALANCER, ports=(ServicePort("", TCP, 80, node_port=30080),),
            external_ips=("203.0.113.1",),
            load_balancer_ingress=(LoadBalancerIngress("198.51.100.1"),
                                   LoadBalancerIngress("198.51.100.2", ip_mode="VIP"),
                                   LoadBalancerIngress("198.51.100.3", ip_mode="Proxy")))
    fronts, problems = run(s, sl(ep("10.0.2.1")))
    assert problems == []
    fwd = (Action.FORWARD, ["10.0.2.1"])
    assert summary(fronts) == {
        (CIP, 80, K.CLUSTER_IP): fwd,
        ("203.0.113.1", 80, K.EXTERNAL_IP): fwd,
        ("198.51.100.1", 80, K.LOAD_BALANCER): fwd,
        ("198.51.100.2", 80, K.LOAD_BALANCER): fwd,
        ("192.168.0.1", 30080, K.NODE_PORT): fwd,
        ("192.168.1.1", 30080, K.NODE_PORT): fwd,
    }


def test_ipv6_external_ip_skipped_quietly_and_garbage_reported():
    """Addresses are validated once, at the API edge (kube/convert/): an IPv6 externalIP or
    LB ingress IP is left out quietly there, garbage is a rejection, and the policy programs
    what remains, in either scope."""
    s, rejections = service_from_api(builders.api_service(
        clusterIP=CIP, type="LoadBalancer", ports=[{"port": 80, "nodePort": 30080}],
        externalIPs=["2001:db8::1", "203.0.113.1", "not-an-ip"],
        status={"loadBalancer": {"ingress": [{"ip": "2001:db8::2"}, {"ip": "nope"},
                                             {"ip": "198.51.100.1"}]}}))
    fronts, problems = run(s, sl(ep("10.0.2.1")))
    assert {k[:2] for k in fronts} == {(CIP, 80), ("203.0.113.1", 80), ("198.51.100.1", 80),
                                       ("192.168.0.1", 30080), ("192.168.1.1", 30080)}
    assert problems == []
    assert [r.reason for r in rejections] == ["InvalidIP", "InvalidIP"]
    ext = service_ext_frontends(s, [sl(ep("10.0.2.1"))], NODE)
    assert {(f.ip, f.port) for f in ext} == {("203.0.113.1", 80), ("198.51.100.1", 80),
                                             ("192.168.0.1", 30080)}


# -- 1.5 verdicts, 1.7 which policy applies ---------------------------------------------------------

NP = ServicePort("", TCP, 80, node_port=30080)
FULL = dict(ports=(NP,), external_ips=("203.0.113.1",),
            load_balancer_ingress=(LoadBalancerIngress("198.51.100.1"),),
            type=ServiceType.LOAD_BALANCER)
LOCAL, REMOTE = "10.0.1.1", "10.0.2.1"


def by_kind(fronts):
    """{kind: (action, backend ips)}, asserting that all frontends of one kind agree."""
    out = {}
    for (_ip, _port, _proto, kind), f in fronts.items():
        got = (f.action, sorted(b.ip for b in f.backends))
        assert out.setdefault(kind, got) == got
    return out


def everything(action, ips=()):
    return {k: (action, sorted(ips)) for k in K}


@pytest.mark.parametrize("policy, eps, want", [
    pytest.param({}, [], everything(Action.REJECT), id="no-endpoints-reject-all"),
    pytest.param({}, [ep(REMOTE, **SERVING_ONLY)], everything(Action.REJECT),
                 id="serving-not-terminating-never-used-reject"),
    pytest.param({"internal_traffic_local": True, "external_traffic_local": True}, [],
                 everything(Action.REJECT), id="local-policies-no-endpoints-reject-not-drop"),
    pytest.param({}, [ep(LOCAL, node="node-a"), ep(REMOTE)], everything(Action.FORWARD,
                 [LOCAL, REMOTE]), id="cluster-policies-all-ready"),
    pytest.param({}, [ep(REMOTE, **TERMINATING), ep(LOCAL, node="node-a", **TERMINATING)],
                 everything(Action.FORWARD, [LOCAL, REMOTE]), id="cluster-terminating-fallback"),
    pytest.param({"internal_traffic_local": True}, [ep(LOCAL, node="node-a"), ep(REMOTE)],
                 {K.CLUSTER_IP: (Action.FORWARD, [LOCAL]),
                  **{k: (Action.FORWARD, [LOCAL, REMOTE])
                     for k in (K.NODE_PORT, K.EXTERNAL_IP, K.LOAD_BALANCER)}},
                 id="itp-local-clusterip-local-only-external-kinds-ignore-itp"),
    pytest.param({"internal_traffic_local": True}, [ep(REMOTE)],
                 {K.CLUSTER_IP: (Action.DROP, []),
                  **{k: (Action.FORWARD, [REMOTE])
                     for k in (K.NODE_PORT, K.EXTERNAL_IP, K.LOAD_BALANCER)}},
                 id="itp-local-no-local-endpoint-drop"),
    pytest.param({"internal_traffic_local": True},
                 [ep(LOCAL, node="node-a", **TERMINATING), ep(REMOTE)],
                 {K.CLUSTER_IP: (Action.FORWARD, [LOCAL]),
                  **{k: (Action.FORWARD, [REMOTE])
                     for k in (K.NODE_PORT, K.EXTERNAL_IP, K.LOAD_BALANCER)}},
                 id="itp-local-falls-back-to-local-terminating"),
    pytest.param({"internal_traffic_local": True}, [ep(REMOTE, **TERMINATING)],
                 {K.CLUSTER_IP: (Action.DROP, []),
                  **{k: (Action.FORWARD, [REMOTE])
                     for k in (K.NODE_PORT, K.EXTERNAL_IP, K.LOAD_BALANCER)}},
                 id="itp-local-only-remote-terminating-drop"),
    pytest.param({"external_traffic_local": True}, [ep(REMOTE)],
                 everything(Action.FORWARD, [REMOTE]),
                 id="etp-local-short-circuited-to-cluster-set-for-local-traffic"),
    pytest.param({"external_traffic_local": True}, [ep(LOCAL, node="node-a"), ep(REMOTE)],
                 everything(Action.FORWARD, [LOCAL, REMOTE]),
                 id="etp-local-ignored-even-with-local-endpoints"),
])
def test_policies_and_verdicts(policy, eps, want):
    fronts, problems = run(svc(**FULL, **policy), sl(*eps))
    assert problems == []
    assert by_kind(fronts) == want


def test_port_endpoints_expose_local_set_for_etp_local():
    s = svc(**FULL, external_traffic_local=True)
    pe = service_port_endpoints(s, [sl(ep(LOCAL, node="node-a"), ep(REMOTE))], NODE)
    (spn, sets), = pe.items()
    assert spn == ServicePortName("ns", "svc", "", TCP)
    assert [e.ip for e in sets.local] == [LOCAL]
    assert [e.ip for e in sets.cluster] == [LOCAL, REMOTE]
    assert sets.has_any


def test_topology_hints_apply_to_clusterip():
    s = svc()
    fronts, _ = run(s, sl(ep("10.0.2.1", hint_zones=("zone-a",)),
                          ep("10.0.3.1", hint_zones=("zone-b",))))
    assert summary(fronts) == {(CIP, 80, K.CLUSTER_IP): (Action.FORWARD, ["10.0.2.1"])}
    fronts, _ = run(s, sl(ep("10.0.2.1", hint_zones=("zone-a",)),
                          ep("10.0.3.1", hint_zones=("zone-b",))), prefer_same_node=False,
                    node=Node("node-a", zone="zone-b"))
    assert summary(fronts) == {(CIP, 80, K.CLUSTER_IP): (Action.FORWARD, ["10.0.3.1"])}


# -- ports ----------------------------------------------------------------------------------------

def test_multi_port_named_ports_matched_by_name_across_slices():
    s = svc(ports=(ServicePort("http", TCP, 80), ServicePort("https", TCP, 443)))
    a = sl(ep("10.0.2.1"), name="a", ports=[EndpointPort("http", TCP, 8080),
                                            EndpointPort("https", TCP, 8443)])
    b = sl(ep("10.0.3.1"), name="b", ports=[EndpointPort("https", TCP, 9443)])
    fronts, problems = run(s, a, b)
    assert problems == []
    got = {(f.port, f.service.port): [(x.ip, x.port) for x in f.backends]
           for f in fronts.values()}
    assert got == {(80, "http"): [("10.0.2.1", 8080)],
                   (443, "https"): [("10.0.2.1", 8443), ("10.0.3.1", 9443)]}


def test_same_port_different_protocols():
    s = svc(ports=(ServicePort("dns-udp", UDP, 53, node_port=30053),
                   ServicePort("dns-tcp", TCP, 53, node_port=30053),
                   ServicePort("dns-sctp", SCTP, 53)))
    slice_ = sl(ep("10.0.2.1"), ports=[EndpointPort("dns-udp", UDP, 5353),
                                       EndpointPort("dns-tcp", TCP, 5354)])
    fronts, problems = run(s, slice_)
    assert problems == []
    got = {(ip, port, proto): (f.action, [(b.port, b.protocol) for b in f.backends])
           for (ip, port, proto, _k), f in fronts.items()}
    assert got == {
        (CIP, 53, UDP): (Action.FORWARD, [(5353, UDP)]),
        (CIP, 53, TCP): (Action.FORWARD, [(5354, TCP)]),
        (CIP, 53, SCTP): (Action.REJECT, []),
        ("192.168.0.1", 30053, UDP): (Action.FORWARD, [(5353, UDP)]),
        ("192.168.1.1", 30053, UDP): (Action.FORWARD, [(5353, UDP)]),
        ("192.168.0.1", 30053, TCP): (Action.FORWARD, [(5354, TCP)]),
        ("192.168.1.1", 30053, TCP): (Action.FORWARD, [(5354, TCP)]),
    }


@pytest.mark.parametrize("ports, want_ports, reasons", [
    pytest.param((ServicePort("a", TCP, 0), ServicePort("b", TCP, 81)), {81}, ["InvalidPort"],
                 id="port-zero-skipped-rest-programs"),
    pytest.param((ServicePort("a", TCP, 70000), ServicePort("b", TCP, 81)), {81},
                 ["InvalidPort"], id="port-out-of-range"),
    pytest.param((ServicePort("a", TCP, 80), ServicePort("b", TCP, 80)), {80},
                 ["DuplicatePort"], id="duplicate-port-protocol-second-skipped"),
    pytest.param((ServicePort("a", TCP, 80), ServicePort("a", TCP, 81)), {80},
                 ["DuplicatePort"], id="duplicate-name-protocol-second-skipped"),
    pytest.param((ServicePort("a", TCP, 80), ServicePort("b", UDP, 80)), {80}, [],
                 id="same-port-other-protocol-is-fine"),
    pytest.param((ServicePort("a", TCP, 80, node_port=99999), ServicePort("b", TCP, 81)),
                 {80, 81}, ["InvalidPort"], id="bad-nodeport-only-nodeport-skipped"),
    pytest.param((ServicePort("a", TCP, 80, node_port=30000),
                  ServicePort("b", TCP, 81, node_port=30000)),
                 {80, 81, 30000}, ["DuplicatePort"], id="duplicate-nodeport"),
])
def test_bad_ports(ports, want_ports, reasons):
    fronts, problems = run(svc(ports=ports), sl(ep("10.0.2.1")))
    assert {port for (_ip, port, _p, _k) in fronts} == want_ports
    assert [p.reason for p in problems] == reasons
    assert all((p.namespace, p.name, p.kind) == ("ns", "svc", "Service") for p in problems)


def test_bad_nodeport_keeps_clusterip_frontend():
    fronts, _ = run(svc(ports=(ServicePort("a", TCP, 80, node_port=-1),)), sl(ep("10.0.2.1")))
    assert set(summary(fronts)) == {(CIP, 80, K.CLUSTER_IP)}


def test_same_ip_twice_in_one_port_deduplicated_quietly():
    s = svc(external_ips=("203.0.113.1",),
            load_balancer_ingress=(LoadBalancerIngress("203.0.113.1"),))
    fronts, problems = run(s, sl(ep("10.0.2.1")))
    assert problems == []
    assert set(summary(fronts)) == {(CIP, 80, K.CLUSTER_IP), ("203.0.113.1", 80, K.EXTERNAL_IP)}


def test_conflict_between_ports_of_one_service():
    # externalIP == a node address, and port b's number == port a's nodePort.
    s = svc(ports=(ServicePort("a", TCP, 80, node_port=30080), ServicePort("b", TCP, 30080)),
            external_ips=("192.168.0.1",))
    fronts, problems = run(s, sl(ep("10.0.2.1")))
    assert fronts[("192.168.0.1", 30080, TCP, K.NODE_PORT)].service.port == "a"
    assert ("192.168.0.1", 30080, TCP, K.EXTERNAL_IP) not in fronts
    assert [p.reason for p in problems] == ["FrontendConflict"]
