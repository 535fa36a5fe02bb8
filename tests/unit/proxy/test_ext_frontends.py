"""Service -> scope-EXT frontends (traffic from outside the node, the TC path).

Same conventions as test_proxy_frontends.py: this node is "node-a" with addresses 192.168.0.1
(primary) and 192.168.1.1; externalIPs 203.0.113.x, LoadBalancer IPs 198.51.100.x, pods
10.0.<node>.x (10.0.1.x on node-a). No traffic is sent: these are data.
"""
from __future__ import annotations

import dataclasses
import functools

import pytest

from kproxy_ebpf.model.desired import Action, FrontendKey, FrontendKind, Scope
from kproxy_ebpf.model.objects import (
    EndpointPort,
    LBAlgorithm,
    LoadBalancerIngress,
    Node,
    Protocol,
    ServicePort,
    ServiceType,
)
from kproxy_ebpf.proxy.external import node_port_ips, service_ext_frontends, validate_node_port_addresses
from kproxy_ebpf.proxy.state import ProxyState

from ... import builders
from ...builders import ep, sl

TCP, UDP = Protocol.TCP, Protocol.UDP
NODE = Node(name="node-a", addresses=("192.168.0.1", "192.168.1.1"))
K = FrontendKind
FWD, DROP, REJECT = Action.FORWARD, Action.DROP, Action.REJECT
LOCAL_EP = ("10.0.1.5", "node-a")
REMOTE_EP = ("10.0.2.5", "node-b")


# A LoadBalancer ns/svc with NodePort 30080 (eTP Cluster unless told).
svc = functools.partial(builders.svc, type=ServiceType.LOAD_BALANCER,
                        ports=(ServicePort("", TCP, 80, node_port=30080),))


def slice_of(*eps, ready=True):
    """Slice s1 of svc with one endpoint per (ip, node)."""
    return sl(*(ep(ip, n, ready=ready) for ip, n in eps))


def summary(fronts):
    return {(f.ip, f.port, f.kind): (f.action, [b.ip for b in f.backends]) for f in fronts}


# (eTP Local?, endpoints, expected action, expected backend ips) for a NodePort
POLICY_CASES = [
    pytest.param(False, [LOCAL_EP, REMOTE_EP], FWD, ["10.0.1.5", "10.0.2.5"], id="cluster-any"),
    pytest.param(False, [REMOTE_EP], FWD, ["10.0.2.5"], id="cluster-remote-only"),
    pytest.param(False, [], REJECT, [], id="cluster-none-anywhere-rejects"),
    pytest.param(True, [LOCAL_EP, REMOTE_EP], FWD, ["10.0.1.5"], id="local-only-local"),
    pytest.param(True, [REMOTE_EP], DROP, [], id="local-none-here-drops"),
    pytest.param(True, [], REJECT, [], id="local-none-anywhere-rejects"),
]


@pytest.mark.parametrize("etp_local,eps,action,backends", POLICY_CASES)
def test_external_traffic_policy(etp_local, eps, action, backends):
    fronts = service_ext_frontends(svc(external_traffic_local=etp_local), [slice_of(*eps)] if eps else [], NODE)
    assert summary(fronts) == {("192.168.0.1", 30080, K.NODE_PORT): (action, backends)}
    assert all(f.scope is Scope.EXT for f in fronts)


def test_local_terminating_fallback_is_used_for_etp_local():
    eps = sl(ep("10.0.1.5", "node-a", ready=False, serving=True, terminating=True))
    (fe,) = service_ext_frontends(svc(external_traffic_local=True), [eps], NODE)
    assert (fe.action, [b.ip for b in fe.backends]) == (FWD, ["10.0.1.5"])


def test_a_serving_endpoint_left_out_of_the_slots_is_draining():
    """A pod shutting down while another is ready: the slots name the ready one, the draining
    one is listed so the writer keeps its backend row for the TC path's flows."""
    eps = sl(ep("10.0.1.5", "node-a", ready=True),
             ep("10.0.1.6", "node-b", ready=False, serving=True, terminating=True),
             ep("10.0.1.7", "node-b", ready=False, serving=False, terminating=True))
    (fe,) = service_ext_frontends(svc(), [eps], NODE)
    assert [b.ip for b in fe.backends] == ["10.0.1.5"]
    assert [b.ip for b in fe.draining] == ["10.0.1.6"], "serving only; not the one that stopped"


@pytest.mark.parametrize("addresses,expected", [
    pytest.param((), ("192.168.0.1",), id="default-primary"),
    pytest.param(("primary",), ("192.168.0.1",), id="primary"),
    pytest.param(("192.168.1.0/24",), ("192.168.1.1",), id="cidr"),
    pytest.param(("192.168.0.0/16",), ("192.168.0.1", "192.168.1.1"), id="cidr-both"),
    pytest.param(("10.0.0.0/8",), (), id="cidr-none"),
    pytest.param(("primary", "192.168.1.0/24"), ("192.168.0.1", "192.168.1.1"), id="mixed"),
])
def test_node_port_addresses(addresses, expected):
    assert node_port_ips(NODE, addresses) == expected
    fronts = service_ext_frontends(svc(), [slice_of(REMOTE_EP)], NODE,
                                   node_port_addresses=addresses)
    assert sorted(f.ip for f in fronts if f.kind is K.NODE_PORT) == sorted(expected)


def test_validate_node_port_addresses():
    assert validate_node_port_addresses(["primary", "10.0.0.0/8"]) == []
    assert len(validate_node_port_addresses(["eth0", "10.0.0.300/8"])) == 2


def test_external_and_load_balancer_ips_proxy_mode_skipped_clusterip_absent():
    service = svc(external_ips=("203.0.113.1",),
                  load_balancer_ingress=(LoadBalancerIngress("198.51.100.1"),
                                         LoadBalancerIngress("198.51.100.2", ip_mode="Proxy"),
                                         LoadBalancerIngress("198.51.100.3", ip_mode="VIP")))
    got = summary(service_ext_frontends(service, [slice_of(REMOTE_EP)], NODE))
    assert set(got) == {("203.0.113.1", 80, K.EXTERNAL_IP), ("198.51.100.1", 80, K.LOAD_BALANCER),
                        ("198.51.100.3", 80, K.LOAD_BALANCER), ("192.168.0.1", 30080, K.NODE_PORT)}


def test_no_node_port_no_node_port_frontend_and_tcp_udp_are_two_rows():
    service = svc(type=ServiceType.CLUSTER_IP, external_ips=("203.0.113.1",),
                  ports=(ServicePort("dns", UDP, 53), ServicePort("dnstcp", TCP, 53)))
    dns = sl(ep("10.0.2.5", "node-b"),
             ports=(EndpointPort("dns", UDP, 5353), EndpointPort("dnstcp", TCP, 5353)))
    fronts = service_ext_frontends(service, [dns], NODE)
    assert sorted((f.ip, f.port, f.protocol) for f in fronts) == [
        ("203.0.113.1", 53, TCP), ("203.0.113.1", 53, UDP)]


def test_not_proxied_services_have_none():
    assert service_ext_frontends(svc(headless=True, cluster_ips=()), [], NODE) == []


def test_affinity_is_carried():
    (fe,) = service_ext_frontends(svc(session_affinity_timeout=600), [slice_of(REMOTE_EP)], NODE)
    assert fe.affinity_timeout == 600


def test_proxy_state_keeps_both_scopes_apart():
    state = ProxyState(NODE, node_port_addresses=())
    state.load([svc(external_traffic_local=True)], [slice_of(REMOTE_EP)])
    table = state.compute().frontends
    sock = table[FrontendKey("192.168.0.1", 30080, TCP)]
    ext = table[FrontendKey("192.168.0.1", 30080, TCP, Scope.EXT)]
    # From the node (socket scope) eTP=Local short-circuits to the Cluster set; from outside,
    # the node has no local endpoint, so it drops.
    assert (sock.action, [b.ip for b in sock.backends]) == (FWD, ["10.0.2.5"])
    assert (ext.action, ext.backends) == (DROP, ())
    # Without node_port_addresses the state computes the socket scope only (as before).
    plain = ProxyState(NODE)
    plain.load([svc(external_traffic_local=True)], [slice_of(REMOTE_EP)])
    assert all(k.scope is Scope.SOCK for k in plain.compute().frontends)


def test_conflicts_are_reported_once():
    a = builders.svc("a", "172.30.0.1", external_ips=("203.0.113.9",))
    b = builders.svc("b", "172.30.0.2", external_ips=("203.0.113.9",))
    state = ProxyState(NODE, node_port_addresses=())
    state.load([a, b])
    cs = state.compute()
    assert [p.reason for p in cs.problems] == ["FrontendConflict"]
    assert cs.frontends[FrontendKey("203.0.113.9", 80, TCP, Scope.EXT)].service.name == "a"


def test_external_ip_allowlist_drops_other_external_ips_in_both_scopes():
    service = svc(external_ips=("203.0.113.1", "198.51.100.7"))
    state = ProxyState(NODE, node_port_addresses=(), external_ip_allowlist=("203.0.113.0/24",))
    state.load([service], [slice_of(REMOTE_EP)])
    cs = state.compute()
    eips = sorted(k for k, f in cs.frontends.items() if f.kind is K.EXTERNAL_IP)
    assert eips == [FrontendKey("203.0.113.1", 80, TCP),
                    FrontendKey("203.0.113.1", 80, TCP, Scope.EXT)]
    assert [(p.reason, "198.51.100.7" in p.message) for p in cs.problems] == [
        ("ExternalIPNotAllowed", True)]
    # No allowlist: every ExternalIP is programmed.
    open_state = ProxyState(NODE, node_port_addresses=())
    open_state.load([service], [slice_of(REMOTE_EP)])
    assert sum(f.kind is K.EXTERNAL_IP for f in open_state.compute().frontends.values()) == 4


def test_config_validates_the_new_keys():
    from kproxy_ebpf.config import AgentConfig, ConfigError, load

    cfg = load(None, env={}, overrides={"devices": ("eth0", "eth1"),
                                        "node_port_addresses": ("primary", "10.0.0.0/8"),
                                        "external_ip_allowlist": ("203.0.113.0/24",),
                                        "north_south": "false"})
    assert (cfg.devices, cfg.north_south, cfg.snat_ports) == (["eth0", "eth1"], False,
                                                               (61000, 65535))
    assert cfg.external_ip_allowlist == ["203.0.113.0/24"]
    for bad in ({"node_port_addresses": ["eth0"]}, {"external_ip_allowlist": ["primary"]},
                {"snat_port_range": "70000-80000"}, {"snat_port_range": "61000"}):
        c = AgentConfig(cgroup="/", **bad)
        with pytest.raises(ConfigError):
            c.validate()


def test_sctp_ports_get_no_ext_frontends_and_a_problem():
    """tc_lb.c rewrites TCP and UDP only (SCTP's CRC32c covers the ports): an SCTP NodePort is
    not programmed at TC and says why, while its TCP sibling and the ClusterIPs are."""
    service = svc(ports=(ServicePort("sig", Protocol.SCTP, 3868, node_port=30868),
                         ServicePort("web", TCP, 80, node_port=30080)))
    slice_ = sl(ep("10.0.1.5", "node-a"),
                ports=(EndpointPort("sig", Protocol.SCTP, 3868), EndpointPort("web", TCP, 8080)))
    state = ProxyState(NODE, node_port_addresses=())
    state.load([service], [slice_])
    changes = state.compute()
    ext = {k for k in changes.frontends if k.scope is Scope.EXT}
    assert ext == {FrontendKey("192.168.0.1", 30080, TCP, Scope.EXT)}
    assert FrontendKey("172.30.0.10", 3868, Protocol.SCTP) in changes.frontends
    assert [p.reason for p in changes.problems] == ["SCTPFromOutsideNotServed"]
    assert "3868/SCTP" in changes.problems[0].message


# ---- Maglev (lb_algorithm) -----------------------------------------------------------------

def maglev_sizes(service, slices=None, **kw):
    fronts = service_ext_frontends(service, [slice_of(LOCAL_EP, REMOTE_EP)] if slices is None
                                   else slices, NODE, **kw)
    return {(f.port, f.kind): f.maglev for f in fronts}


def test_maglev_by_annotation_or_node_default():
    lb = svc(load_balancer_ingress=(LoadBalancerIngress("198.51.100.1"),))
    assert set(maglev_sizes(lb).values()) == {0}                     # random by default
    on = dataclasses.replace(lb, lb_algorithm=LBAlgorithm.MAGLEV)
    assert maglev_sizes(on) == {(30080, K.NODE_PORT): 16381, (80, K.LOAD_BALANCER): 16381}
    assert set(maglev_sizes(lb, lb_algorithm=LBAlgorithm.MAGLEV,
                            maglev_table_size=4093).values()) == {4093}
    off = dataclasses.replace(lb, lb_algorithm=LBAlgorithm.RANDOM)   # the Service opts out
    assert set(maglev_sizes(off, lb_algorithm=LBAlgorithm.MAGLEV).values()) == {0}


def test_maglev_table_grows_with_the_backends_and_no_backend_no_table():
    on = svc(lb_algorithm=LBAlgorithm.MAGLEV)
    many = sl(*(ep(f"10.0.2.{i}", "node-b") for i in range(1, 41)))
    assert maglev_sizes(on, [many]) == {(30080, K.NODE_PORT): 40009}   # >= 1000 per backend
    assert maglev_sizes(on, []) == {(30080, K.NODE_PORT): 0}          # REJECT: nothing to pick


def test_maglev_past_its_largest_table_is_reported():
    on = svc(lb_algorithm=LBAlgorithm.MAGLEV)
    huge = [sl(*(ep(f"10.{1 + i // 250}.{i % 250}.1", "node-b") for i in range(k, k + 100)),
               name=f"s{k}") for k in range(0, 700, 100)]
    problems = []
    fronts = service_ext_frontends(on, huge, NODE, problems=problems)
    assert fronts[0].maglev == 65521
    assert [p.reason for p in problems] == ["MaglevTableTooSmall"]
    assert "700 endpoints" in problems[0].message
