"""EndpointSlice ingestion (semantics 1.1), in the spirit of kube-proxy's endpointslicecache tests.

Conventions: this node is "node-a"; pods are 10.0.<node>.<n>; slices belong to ns/svc.
"""
from __future__ import annotations

import pytest

from kproxy_ebpf.model import Endpoint, EndpointPort, EndpointSlice, Protocol
from kproxy_ebpf.proxy.endpoints import endpoints_by_port

TCP, UDP = Protocol.TCP, Protocol.UDP
NODE = "node-a"


def sl(name="s1", *, ports=(EndpointPort("", TCP, 8080),), eps=(), svc="svc", family="IPv4"):
    return EndpointSlice(namespace="ns", name=name, service_name=svc, address_type=family,
                         ports=tuple(ports), endpoints=tuple(eps))


def ep(ip, node=None, **kw):
    return Endpoint(addresses=(ip,) if ip else (), node_name=node, **kw)


def flat(result):
    """{(name, proto): [(ip, port, local), ...]} for compact expectations."""
    return {k: [(e.ip, e.port, e.local) for e in v] for k, v in result.items()}


# -- conditions ---------------------------------------------------------------------------------

@pytest.mark.parametrize("cond, want", [
    pytest.param({}, (True, True, False), id="nil-conditions-default-ready-serving-not-terminating"),
    pytest.param({"ready": False}, (False, True, False), id="ready-false-serving-nil-is-serving"),
    pytest.param({"ready": True, "serving": True, "terminating": False}, (True, True, False),
                 id="explicit-ready"),
    pytest.param({"ready": False, "serving": True, "terminating": True}, (False, True, True),
                 id="serving-terminating"),
    pytest.param({"ready": False, "serving": False, "terminating": True}, (False, False, True),
                 id="terminating-not-serving"),
    pytest.param({"terminating": None}, (True, True, False), id="terminating-nil-is-false"),
    pytest.param({"serving": None, "ready": False}, (False, True, False),
                 id="serving-nil-is-true"),
])
def test_condition_defaults(cond, want):
    (e,), = endpoints_by_port([sl(eps=[ep("10.0.1.1", **cond)])], NODE).values()
    assert (e.ready, e.serving, e.terminating) == want


# -- what is ignored ----------------------------------------------------------------------------

@pytest.mark.parametrize("slices", [
    pytest.param([sl(svc=None, eps=[ep("10.0.1.1")])], id="slice-without-service-name-label"),
    pytest.param([sl(family="IPv6", eps=[ep("fd00::1")])], id="ipv6-slice"),
    pytest.param([sl(family="FQDN", eps=[ep("example.com")])], id="fqdn-slice"),
    pytest.param([sl(ports=[EndpointPort(None, TCP, 8080)], eps=[ep("10.0.1.1")])],
                 id="port-name-nil"),
    pytest.param([sl(ports=[EndpointPort("", TCP, None)], eps=[ep("10.0.1.1")])],
                 id="port-number-nil"),
    pytest.param([sl(ports=[EndpointPort("", TCP, 0)], eps=[ep("10.0.1.1")])],
                 id="port-number-zero"),
    pytest.param([sl(ports=[], eps=[ep("10.0.1.1")])], id="slice-without-ports"),
    pytest.param([sl(eps=[ep("")])], id="endpoint-without-addresses"),
    pytest.param([], id="no-slices"),
])
def test_ignored_input(slices):
    assert {k: v for k, v in endpoints_by_port(slices, NODE).items() if v} == {}


def test_only_first_address_is_used():
    s = sl(eps=[Endpoint(addresses=("10.0.1.1", "10.0.1.2"))])
    assert flat(endpoints_by_port([s], NODE)) == {("", TCP): [("10.0.1.1", 8080, False)]}


def test_ipv6_slice_ignored_next_to_ipv4_slice():
    v4 = sl("v4", eps=[ep("10.0.1.1")])
    v6 = sl("v6", family="IPv6", eps=[ep("fd00::1")])
    assert flat(endpoints_by_port([v6, v4], NODE)) == {("", TCP): [("10.0.1.1", 8080, False)]}


# -- locality -----------------------------------------------------------------------------------

@pytest.mark.parametrize("node_name, this_node, local", [
    pytest.param("node-a", "node-a", True, id="same-node-is-local"),
    pytest.param("node-b", "node-a", False, id="other-node-is-remote"),
    pytest.param(None, "node-a", False, id="no-nodename-is-remote"),
    pytest.param(None, "", False, id="unknown-node-nothing-local"),
])
def test_is_local(node_name, this_node, local):
    (e,), = endpoints_by_port([sl(eps=[ep("10.0.1.1", node_name)])], this_node).values()
    assert e.local is local
    assert e.node_name == node_name


# -- ports --------------------------------------------------------------------------------------

def test_ports_keyed_by_name_and_protocol_not_number():
    s = sl(ports=[EndpointPort("dns", UDP, 53), EndpointPort("dns", TCP, 53),
                  EndpointPort("metrics", TCP, 9153)], eps=[ep("10.0.1.1")])
    assert flat(endpoints_by_port([s], NODE)) == {
        ("dns", UDP): [("10.0.1.1", 53, False)],
        ("dns", TCP): [("10.0.1.1", 53, False)],
        ("metrics", TCP): [("10.0.1.1", 9153, False)],
    }


def test_named_port_with_different_numbers_across_slices():
    # A rollout moved the container port: each slice carries its own number for "http".
    old = sl("a-old", ports=[EndpointPort("http", TCP, 8080)], eps=[ep("10.0.1.1")])
    new = sl("b-new", ports=[EndpointPort("http", TCP, 9090)], eps=[ep("10.0.2.1")])
    assert flat(endpoints_by_port([new, old], NODE)) == {
        ("http", TCP): [("10.0.1.1", 8080, False), ("10.0.2.1", 9090, False)]}


def test_multiple_slices_merge_and_sort():
    a = sl("a", eps=[ep("10.0.2.2"), ep("10.0.1.9")])
    b = sl("b", eps=[ep("10.0.1.1", NODE)])
    assert flat(endpoints_by_port([b, a], NODE)) == {("", TCP): [
        ("10.0.1.1", 8080, True), ("10.0.1.9", 8080, False), ("10.0.2.2", 8080, False)]}


# -- deduplication ------------------------------------------------------------------------------

@pytest.mark.parametrize("first, second, want_local, want_ready", [
    pytest.param(None, NODE, True, False, id="remote-then-local-local-wins"),
    pytest.param(NODE, None, True, True, id="local-then-remote-local-stays"),
    pytest.param("node-b", "node-c", False, True, id="both-remote-first-slice-by-name-stays"),
])
def test_duplicate_ip_port_across_slices(first, second, want_local, want_ready):
    s1 = sl("a", eps=[ep("10.0.1.1", first, ready=True)])
    s2 = sl("b", eps=[ep("10.0.1.1", second, ready=False)])
    for order in ([s1, s2], [s2, s1]):
        (e,), = endpoints_by_port(order, NODE).values()
        assert (e.local, e.ready) == (want_local, want_ready)


def test_same_ip_different_port_is_not_a_duplicate():
    s1 = sl("a", ports=[EndpointPort("", TCP, 80)], eps=[ep("10.0.1.1")])
    s2 = sl("b", ports=[EndpointPort("", TCP, 81)], eps=[ep("10.0.1.1")])
    assert flat(endpoints_by_port([s1, s2], NODE)) == {
        ("", TCP): [("10.0.1.1", 80, False), ("10.0.1.1", 81, False)]}


def test_hints_and_zone_carried():
    s = sl(eps=[ep("10.0.1.1", "node-b", zone="z1", hint_zones=("z1", "z2"),
                   hint_nodes=("node-b",))])
    (e,), = endpoints_by_port([s], NODE).values()
    assert (e.zone, e.hint_zones, e.hint_nodes) == ("z1", frozenset({"z1", "z2"}),
                                                     frozenset({"node-b"}))
