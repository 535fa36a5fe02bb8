"""EndpointSlice ingestion (semantics 1.1), in the spirit of kube-proxy's endpointslicecache tests.

Conventions: this node is "node-a"; pods are 10.0.<node>.<n>; slices belong to ns/svc.
"""
from __future__ import annotations

import itertools

import pytest

from kproxy_ebpf.model.objects import Endpoint, EndpointPort, Protocol
from kproxy_ebpf.proxy.endpoints import endpoints_by_port

from ...builders import ep, sl

TCP, UDP = Protocol.TCP, Protocol.UDP
NODE = "node-a"


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
    (e,), = endpoints_by_port([sl(ep("10.0.1.1", **cond))], NODE).values()
    assert (e.ready, e.serving, e.terminating) == want


def test_an_endpoint_keeps_each_condition_unset_true_or_false_and_its_hints():
    """model.Endpoint packs the three conditions into one int: every combination reads back."""
    values = (None, False, True)
    seen = set()
    for r, s, t in itertools.product(values, values, values):
        e = Endpoint.of("10.0.1.1", ready=r, serving=s, terminating=t)
        assert (e.ready, e.serving, e.terminating) == (r, s, t)
        seen.add(e.conditions)
    assert len(seen) == 27
    hinted = Endpoint.of("10.0.1.1", hint_zones=("z1",), hint_nodes=("node-a",))
    assert (hinted.hint_zones, hinted.hint_nodes) == (("z1",), ("node-a",))
    assert Endpoint.of("10.0.1.1").hints is None and Endpoint.of("10.0.1.1").hint_zones == ()


# -- what is ignored ----------------------------------------------------------------------------

@pytest.mark.parametrize("slices", [
    pytest.param([sl(ep("10.0.1.1"), svc=None)], id="slice-without-service-name-label"),
    pytest.param([sl(ep("fd00::1"), family="IPv6")], id="ipv6-slice"),
    pytest.param([sl(ep("example.com"), family="FQDN")], id="fqdn-slice"),
    pytest.param([sl(ep("10.0.1.1"), ports=[EndpointPort(None, TCP, 8080)])],
                 id="port-name-nil"),
    pytest.param([sl(ep("10.0.1.1"), ports=[EndpointPort("", TCP, None)])],
                 id="port-number-nil"),
    pytest.param([sl(ep("10.0.1.1"), ports=[EndpointPort("", TCP, 0)])],
                 id="port-number-zero"),
    pytest.param([sl(ep("10.0.1.1"), ports=[])], id="slice-without-ports"),
    pytest.param([sl(ep(""))], id="endpoint-without-addresses"),
    pytest.param([], id="no-slices"),
])
def test_ignored_input(slices):
    assert {k: v for k, v in endpoints_by_port(slices, NODE).items() if v} == {}


@pytest.mark.parametrize("slices, want", [
    pytest.param([sl(ep("fd00::1"), family="IPv6", name="v6"), sl(ep("10.0.1.1"), name="v4")],
                 {("", TCP): [("10.0.1.1", 8080, False)]},
                 id="ipv6-slice-ignored-next-to-ipv4-slice"),
])
def test_used_input(slices, want):
    assert flat(endpoints_by_port(slices, NODE)) == want


# -- locality -----------------------------------------------------------------------------------

@pytest.mark.parametrize("node_name, this_node, local", [
    pytest.param("node-a", "node-a", True, id="same-node-is-local"),
    pytest.param("node-b", "node-a", False, id="other-node-is-remote"),
    pytest.param(None, "node-a", False, id="no-nodename-is-remote"),
    pytest.param(None, "", False, id="unknown-node-nothing-local"),
])
def test_is_local(node_name, this_node, local):
    (e,), = endpoints_by_port([sl(ep("10.0.1.1", node_name))], this_node).values()
    assert e.local is local
    assert e.node_name == node_name


# -- ports --------------------------------------------------------------------------------------

@pytest.mark.parametrize("slices, want", [
    # Keyed by name and protocol, not by number.
    pytest.param([sl(ep("10.0.1.1"), ports=[EndpointPort("dns", UDP, 53), EndpointPort("dns", TCP, 53),
                                            EndpointPort("metrics", TCP, 9153)])],
                 {("dns", UDP): [("10.0.1.1", 53, False)], ("dns", TCP): [("10.0.1.1", 53, False)],
                  ("metrics", TCP): [("10.0.1.1", 9153, False)]},
                 id="ports-keyed-by-name-and-protocol-not-number"),
    # A rollout moved the container port: each slice carries its own number for "http".
    pytest.param([sl(ep("10.0.2.1"), ports=[EndpointPort("http", TCP, 9090)], name="b-new"),
                  sl(ep("10.0.1.1"), ports=[EndpointPort("http", TCP, 8080)], name="a-old")],
                 {("http", TCP): [("10.0.1.1", 8080, False), ("10.0.2.1", 9090, False)]},
                 id="named-port-with-different-numbers-across-slices"),
    pytest.param([sl(ep("10.0.1.1", NODE), name="b"), sl(ep("10.0.2.2"), ep("10.0.1.9"), name="a")],
                 {("", TCP): [("10.0.1.1", 8080, True), ("10.0.1.9", 8080, False),
                              ("10.0.2.2", 8080, False)]},
                 id="multiple-slices-merge-and-sort"),
    pytest.param([sl(ep("10.0.1.1"), ports=[EndpointPort("", TCP, 80)], name="a"),
                  sl(ep("10.0.1.1"), ports=[EndpointPort("", TCP, 81)], name="b")],
                 {("", TCP): [("10.0.1.1", 80, False), ("10.0.1.1", 81, False)]},
                 id="same-ip-different-port-is-not-a-duplicate"),
])
def test_ports(slices, want):
    assert flat(endpoints_by_port(slices, NODE)) == want


# -- deduplication ------------------------------------------------------------------------------

@pytest.mark.parametrize("first, second, want_local, want_ready", [
    pytest.param(None, NODE, True, False, id="remote-then-local-local-wins"),
    pytest.param(NODE, None, True, True, id="local-then-remote-local-stays"),
    pytest.param("node-b", "node-c", False, True, id="both-remote-first-slice-by-name-stays"),
])
def test_duplicate_ip_port_across_slices(first, second, want_local, want_ready):
    s1 = sl(ep("10.0.1.1", first, ready=True), name="a")
    s2 = sl(ep("10.0.1.1", second, ready=False), name="b")
    for order in ([s1, s2], [s2, s1]):
        (e,), = endpoints_by_port(order, NODE).values()
        assert (e.local, e.ready) == (want_local, want_ready)


def test_hints_and_zone_carried():
    s = sl(ep("10.0.1.1", "node-b", zone="z1", hint_zones=("z1", "z2"), hint_nodes=("node-b",)))
    (e,), = endpoints_by_port([s], NODE).values()
    assert (e.zone, e.hint_zones, e.hint_nodes) == ("z1", frozenset({"z1", "z2"}),
                                                     frozenset({"node-b"}))
