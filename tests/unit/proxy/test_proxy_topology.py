"""Endpoint categorization (semantics 1.3-1.6), table-driven in the spirit of kube-proxy's
pkg/proxy/topology_test.go TestCategorizeEndpoints (our own cases).

Conventions: this node is "node-a" in zone "zone-a". Endpoint 10.0.<n>.x lives on node <n>;
"L" in a case marks it local (node-a).
"""
from __future__ import annotations

import pytest

from kproxy_ebpf.model.objects import EndpointPort, EndpointSlice, Node, Protocol
from kproxy_ebpf.proxy.endpoints import EndpointInfo
from kproxy_ebpf.proxy.frontends import service_port_endpoints
from kproxy_ebpf.proxy.topology import TopologyMode, categorize, topology_mode

from ... import builders
from ...builders import sl, svc

NODE, ZONE = "node-a", "zone-a"

READY = dict(ready=True, serving=True, terminating=False)
UNREADY = dict(ready=False, serving=False, terminating=False)
SERVING_ONLY = dict(ready=False, serving=True, terminating=False)     # never used
TERMINATING = dict(ready=False, serving=True, terminating=True)       # fallback
GONE = dict(ready=False, serving=False, terminating=True)             # never used


def info(ip, cond=READY, *, local=False, zones=(), nodes=()):
    return EndpointInfo(ip=ip, port=80, node_name=NODE if local else "node-x", zone=None,
                        hint_zones=frozenset(zones), hint_nodes=frozenset(nodes), local=local,
                        **cond)


CASES = [
    # id, endpoints, kwargs, cluster, local, has_any
    ("no-endpoints", [], {}, set(), set(), False),
    ("ready-remote-only", [info("10.0.2.1"), info("10.0.3.1")], {},
     {"10.0.2.1", "10.0.3.1"}, set(), True),
    ("ready-local-and-remote", [info("10.0.1.1", local=True), info("10.0.2.1")], {},
     {"10.0.1.1", "10.0.2.1"}, {"10.0.1.1"}, True),
    ("unready-ignored", [info("10.0.1.1", UNREADY, local=True), info("10.0.2.1")], {},
     {"10.0.2.1"}, set(), True),
    ("all-unready-means-none", [info("10.0.1.1", UNREADY, local=True), info("10.0.2.1", UNREADY)],
     {}, set(), set(), False),
    ("serving-not-terminating-never-used",
     [info("10.0.1.1", SERVING_ONLY, local=True), info("10.0.2.1", SERVING_ONLY)], {},
     set(), set(), False),
    ("terminating-not-serving-never-used",
     [info("10.0.1.1", GONE, local=True), info("10.0.2.1", GONE)], {}, set(), set(), False),
    ("cluster-falls-back-to-serving-terminating-local-and-remote",
     [info("10.0.1.1", TERMINATING, local=True), info("10.0.2.1", TERMINATING),
      info("10.0.3.1", GONE), info("10.0.4.1", SERVING_ONLY)], {},
     {"10.0.1.1", "10.0.2.1"}, {"10.0.1.1"}, True),
    ("ready-preferred-over-terminating",
     [info("10.0.1.1", TERMINATING, local=True), info("10.0.2.1")], {},
     {"10.0.2.1"}, {"10.0.1.1"}, True),
    ("local-falls-back-to-local-terminating",
     [info("10.0.1.1", TERMINATING, local=True), info("10.0.1.2", UNREADY, local=True),
      info("10.0.2.1")], {},
     {"10.0.2.1"}, {"10.0.1.1"}, True),
    ("local-ready-preferred-over-local-terminating",
     [info("10.0.1.1", TERMINATING, local=True), info("10.0.1.2", local=True)], {},
     {"10.0.1.2"}, {"10.0.1.2"}, True),
    ("local-empty-when-local-only-unready",
     [info("10.0.1.1", SERVING_ONLY, local=True), info("10.0.2.1")], {},
     {"10.0.2.1"}, set(), True),
    ("only-remote-terminating-has-any",
     [info("10.0.2.1", TERMINATING)], {}, {"10.0.2.1"}, set(), True),
    # topology: zone hints
    ("zone-hints-filter-cluster-set",
     [info("10.0.1.1", local=True, zones=[ZONE]), info("10.0.2.1", zones=[ZONE]),
      info("10.0.3.1", zones=["zone-b"])], {},
     {"10.0.1.1", "10.0.2.1"}, {"10.0.1.1"}, True),
    ("zone-hints-incomplete-no-filtering",
     [info("10.0.2.1", zones=[ZONE]), info("10.0.3.1")], {},
     {"10.0.2.1", "10.0.3.1"}, set(), True),
    ("zone-hints-none-for-our-zone-no-filtering",
     [info("10.0.2.1", zones=["zone-b"]), info("10.0.3.1", zones=["zone-c"])], {},
     {"10.0.2.1", "10.0.3.1"}, set(), True),
    ("unready-without-hints-ignored-for-completeness",
     [info("10.0.2.1", zones=[ZONE]), info("10.0.3.1", zones=["zone-b"]),
      info("10.0.4.1", UNREADY)], {},
     {"10.0.2.1"}, set(), True),
    ("node-without-zone-no-zone-filtering",
     [info("10.0.2.1", zones=[ZONE]), info("10.0.3.1", zones=["zone-b"])], {"zone": None},
     {"10.0.2.1", "10.0.3.1"}, set(), True),
    ("multi-zone-hint",
     [info("10.0.2.1", zones=["zone-b", ZONE]), info("10.0.3.1", zones=["zone-b"])], {},
     {"10.0.2.1"}, set(), True),
    ("topology-ignored-for-terminating-fallback",
     [info("10.0.2.1", TERMINATING, zones=["zone-b"]), info("10.0.3.1", TERMINATING, zones=[ZONE])],
     {}, {"10.0.2.1", "10.0.3.1"}, set(), True),
    ("topology-ignored-for-local-set",
     [info("10.0.1.1", local=True, zones=["zone-b"]), info("10.0.2.1", zones=[ZONE])], {},
     {"10.0.2.1"}, {"10.0.1.1"}, True),
    # topology: node hints (PreferSameNode)
    ("node-hints-filter-cluster-set",
     [info("10.0.1.1", local=True, zones=[ZONE], nodes=[NODE]),
      info("10.0.2.1", zones=[ZONE], nodes=["node-b"])], {},
     {"10.0.1.1"}, {"10.0.1.1"}, True),
    ("node-hints-gate-off-uses-zone",
     [info("10.0.1.1", local=True, zones=[ZONE], nodes=[NODE]),
      info("10.0.2.1", zones=[ZONE], nodes=["node-b"])], {"prefer_same_node": False},
     {"10.0.1.1", "10.0.2.1"}, {"10.0.1.1"}, True),
    ("node-hints-incomplete-falls-to-zone",
     [info("10.0.1.1", local=True, zones=[ZONE], nodes=[NODE]),
      info("10.0.2.1", zones=[ZONE]), info("10.0.3.1", zones=["zone-b"])], {},
     {"10.0.1.1", "10.0.2.1"}, {"10.0.1.1"}, True),
    ("node-hints-none-for-us-falls-to-zone",
     [info("10.0.2.1", zones=[ZONE], nodes=["node-b"]),
      info("10.0.3.1", zones=["zone-b"], nodes=["node-c"])], {},
     {"10.0.2.1"}, set(), True),
    ("node-hints-none-for-us-no-zone-hints-no-filtering",
     [info("10.0.2.1", nodes=["node-b"]), info("10.0.3.1", nodes=["node-c"])], {},
     {"10.0.2.1", "10.0.3.1"}, set(), True),
    ("node-hints-unready-local-ignored",
     [info("10.0.1.1", UNREADY, local=True, nodes=[NODE]),
      info("10.0.2.1", nodes=["node-b"])], {},
     {"10.0.2.1"}, set(), True),
]


@pytest.mark.parametrize("eps, kwargs, cluster, local, has_any",
                         [pytest.param(*c[1:], id=c[0]) for c in CASES])
def test_categorize(eps, kwargs, cluster, local, has_any):
    kwargs = dict(kwargs)
    zone = kwargs.pop("zone", ZONE)
    got = categorize(eps, NODE, zone, **kwargs)
    assert {e.ip for e in got.cluster} == cluster
    assert {e.ip for e in got.local} == local
    assert got.has_any is has_any


@pytest.mark.parametrize("eps, kwargs, mode", [
    pytest.param([], {}, TopologyMode.NONE, id="empty"),
    pytest.param([info("10.0.2.1")], {}, TopologyMode.NONE, id="no-hints"),
    pytest.param([info("10.0.2.1", zones=[ZONE])], {}, TopologyMode.SAME_ZONE, id="zone"),
    pytest.param([info("10.0.2.1", zones=[ZONE], nodes=[NODE])], {}, TopologyMode.SAME_NODE,
                 id="node"),
    pytest.param([info("10.0.2.1", zones=[ZONE], nodes=[NODE])], {"prefer_same_node": False},
                 TopologyMode.SAME_ZONE, id="node-gate-off"),
    pytest.param([info("10.0.2.1", UNREADY, zones=[ZONE], nodes=[NODE])], {}, TopologyMode.NONE,
                 id="only-unready-hinted"),
])
def test_topology_mode(eps, kwargs, mode):
    assert topology_mode(eps, NODE, ZONE, **kwargs) is mode


# -- trafficDistribution end to end: hints as the v1.36 EndpointSlice controller writes them ----
#
# kube-proxy v1.36 never reads Service.spec.trafficDistribution: the EndpointSlice controller
# (k8s.io/endpointslice trafficdist.go) turns it into hints on Ready endpoints (PreferClose and
# PreferSameZone: forZones = the endpoint's zone; PreferSameNode: that plus forNodes = its
# node), and the proxy reads the hints (pkg/proxy/topology.go; PreferSameTrafficDistribution
# is GA and locked on since 1.35).

PODS = [("10.0.1.1", "node-a", "zone-a"), ("10.0.2.1", "node-b", "zone-a"),
        ("10.0.3.1", "node-c", "zone-b")]


def controller_slice(distribution: str | None, ready=True) -> EndpointSlice:
    node_hints = distribution == "PreferSameNode"
    zone_hints = distribution in ("PreferClose", "PreferSameZone", "PreferSameNode")
    return sl(*(builders.ep(ip, node, ready=ready, zone=zone,
                            hint_zones=(zone,) if zone_hints and ready else (),
                            hint_nodes=(node,) if node_hints and ready else ())
                for ip, node, zone in PODS),
              name="web-1", svc="web", ports=(EndpointPort("", Protocol.TCP, 80),))


def web(distribution: str | None):
    return svc("web", "172.30.0.1", traffic_distribution=distribution)


@pytest.mark.parametrize("distribution, node, gate, want", [
    pytest.param(None, "node-a", True, {"10.0.1.1", "10.0.2.1", "10.0.3.1"}, id="unset"),
    pytest.param("PreferClose", "node-a", True, {"10.0.1.1", "10.0.2.1"}, id="PreferClose"),
    pytest.param("PreferSameZone", "node-a", True, {"10.0.1.1", "10.0.2.1"},
                 id="PreferSameZone-alias"),
    pytest.param("PreferSameNode", "node-a", True, {"10.0.1.1"}, id="PreferSameNode"),
    pytest.param("PreferSameNode", "node-d", True, {"10.0.1.1", "10.0.2.1"},
                 id="PreferSameNode-no-endpoint-here-falls-back-to-zone"),
    pytest.param("PreferSameNode", "node-a", False, {"10.0.1.1", "10.0.2.1"},
                 id="PreferSameNode-gate-off-means-zone"),
    pytest.param("PreferSameZone", "node-e", True, {"10.0.1.1", "10.0.2.1", "10.0.3.1"},
                 id="zone-without-endpoints-no-filtering"),
])
def test_traffic_distribution_through_controller_hints(distribution, node, gate, want):
    zone = {"node-a": "zone-a", "node-d": "zone-a", "node-e": "zone-c"}[node]
    (pe,) = service_port_endpoints(web(distribution), [controller_slice(distribution)], Node(node, zone=zone),
                                   prefer_same_node=gate).values()
    assert {e.ip for e in pe.cluster} == want


@pytest.mark.parametrize("field, hinted_by", [
    pytest.param("PreferSameNode", None, id="field-set-but-no-hints-yet"),
    pytest.param(None, "PreferSameNode", id="hints-left-after-the-field-was-cleared"),
])
def test_the_service_field_is_not_read_only_hints_are(field, hinted_by):
    (pe,) = service_port_endpoints(web(field), [controller_slice(hinted_by)],
                                   Node("node-a", zone="zone-a")).values()
    want = {"10.0.1.1"} if hinted_by else {"10.0.1.1", "10.0.2.1", "10.0.3.1"}
    assert {e.ip for e in pe.cluster} == want
