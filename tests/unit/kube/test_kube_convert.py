"""Conversion of API objects (JSON dicts) into model objects, and rejection of bad input.

Conventions (as in kube-proxy's tests): Service ClusterIPs 172.30.0.0/16, pod IPs 10.0.0.0/8,
node IPs 192.168.0.0/24, IPv6 fd00::/8. These are only data here; nothing is sent anywhere.
"""
from __future__ import annotations

import copy
from typing import Any

import pytest

from kproxy_ebpf.kube.convert import (
    DEFAULT_AFFINITY_TIMEOUT,
    Rejection,
    node_from_api,
    service_cidr_from_api,
    service_from_api,
    slice_from_api,
)
from kproxy_ebpf.model.objects import (
    Endpoint,
    EndpointPort,
    LBAlgorithm,
    LoadBalancerIngress,
    Node,
    Protocol,
    ServiceCIDR,
    ServicePort,
    ServiceType,
)

from ...builders import api_ep, api_service, api_slice


def svc_obj(spec: dict[str, Any] | None = None, *, status: dict | None = None, labels: dict | None = None,
        name: str = "web", namespace: str = "ns1", annotations: dict | None = None) -> dict[str, Any]:
    # the namespace as given, None too (api_service would leave a None out)
    meta: dict[str, Any] = {"namespace": namespace, "uid": "u-1", "resourceVersion": "42"}
    if labels is not None:
        meta["labels"] = labels
    if annotations is not None:
        meta["annotations"] = annotations
    return api_service(name, None, typed=True, meta=meta, status=status, **{
        "type": "ClusterIP", "clusterIP": "172.30.0.10", "clusterIPs": ["172.30.0.10"],
        "ports": [{"name": "http", "protocol": "TCP", "port": 80, "targetPort": 8080}],
        **(spec or {})})


def reasons(rejections: list[Rejection]) -> list[str]:
    return [r.reason for r in rejections]


# ----------------------------------------------------------------------------------------------
# Services: table of (id, API object, expected fields of the Service, expected rejection reasons)

SERVICE_CASES = [
    ("clusterip", svc_obj(), dict(
        namespace="ns1", name="web", type=ServiceType.CLUSTER_IP, cluster_ips=("172.30.0.10",),
        headless=False, ports=(ServicePort("http", Protocol.TCP, 80),), session_affinity_timeout=0,
        external_traffic_local=False, internal_traffic_local=False, resource_version="42"), []),
    ("dual-stack keeps both, primary first", svc_obj({"clusterIP": "fd00::10",
                                                      "clusterIPs": ["fd00::10", "172.30.0.10"],
                                                      "ipFamilies": ["IPv6", "IPv4"]}),
     dict(cluster_ips=("fd00::10", "172.30.0.10"), headless=False), []),
    ("IPv6-only, canonical text", svc_obj({"clusterIP": "FD00:0::10", "clusterIPs": ["FD00:0::10"]}),
     dict(cluster_ips=("fd00::10",), headless=False), []),
    ("ipFamilies disagreeing with clusterIPs", svc_obj({"clusterIPs": ["172.30.0.10"], "ipFamilies": ["IPv6"]}),
     dict(cluster_ips=("172.30.0.10",)), ["IPFamilyMismatch"]),
    ("two ClusterIPs of one family", svc_obj({"clusterIPs": ["172.30.0.10", "172.30.0.11"]}),
     dict(cluster_ips=("172.30.0.10",)), ["InvalidClusterIP"]),
    ("IPv4-mapped ClusterIP refused", svc_obj({"clusterIPs": ["::ffff:172.30.0.10"]}),
     dict(cluster_ips=()), ["InvalidClusterIP", "NoClusterIP"]),
    ("clusterIP without clusterIPs", svc_obj({"clusterIPs": None, "clusterIP": "172.30.0.11"}),
     dict(cluster_ips=("172.30.0.11",)), []),
    ("headless", svc_obj({"clusterIP": "None", "clusterIPs": ["None"]}), dict(cluster_ips=(), headless=True), []),
    ("headless IPv6 family", svc_obj({"clusterIP": "None", "clusterIPs": ["None"], "ipFamilies": ["IPv6"]}),
     dict(headless=True), []),
    ("ExternalName", svc_obj({"type": "ExternalName", "externalName": "example.com", "clusterIP": None,
                          "clusterIPs": None}),
     dict(type=ServiceType.EXTERNAL_NAME, cluster_ips=(), headless=False), []),
    ("NodePort", svc_obj({"type": "NodePort", "ports": [
        {"name": "http", "port": 80, "nodePort": 30080, "protocol": "TCP"},
        {"name": "dns", "port": 53, "nodePort": 30053, "protocol": "UDP"},
        {"name": "sctp", "port": 9999, "nodePort": 30099, "protocol": "SCTP"}]}),
     dict(type=ServiceType.NODE_PORT, ports=(ServicePort("http", Protocol.TCP, 80, 30080),
                                             ServicePort("dns", Protocol.UDP, 53, 30053),
                                             ServicePort("sctp", Protocol.SCTP, 9999, 30099))), []),
    ("protocol defaults to TCP, unnamed port", svc_obj({"ports": [{"port": 8080}]}),
     dict(ports=(ServicePort("", Protocol.TCP, 8080),)), []),
    ("LoadBalancer", svc_obj(
        {"type": "LoadBalancer", "externalTrafficPolicy": "Local", "healthCheckNodePort": 32000,
         "loadBalancerSourceRanges": ["203.0.113.0/24", " 198.51.100.7/16", "2001:db8::/32"],
         "ports": [{"port": 80, "nodePort": 30080}]},
        status={"loadBalancer": {"ingress": [
            {"ip": "192.0.2.1"},
            {"hostname": "lb.example.com"},
            {"ip": "192.0.2.2", "ipMode": "Proxy"},
            {"ip": "2001:db8::1"},
            {"ip": "192.0.2.3", "ipMode": "VIP", "hostname": "x"}]}}),
     dict(type=ServiceType.LOAD_BALANCER, external_traffic_local=True, health_check_node_port=32000,
          load_balancer_source_ranges=("203.0.113.0/24", "198.51.0.0/16", "2001:db8::/32"),
          load_balancer_ingress=(LoadBalancerIngress("192.0.2.1"), LoadBalancerIngress("192.0.2.2", "Proxy"),
                                 LoadBalancerIngress("2001:db8::1"), LoadBalancerIngress("192.0.2.3", "VIP")),
          ports=(ServicePort("", Protocol.TCP, 80, 30080),)), []),
    ("externalIPs of both families", svc_obj({"externalIPs": ["198.51.100.1", "2001:db8::5", "198.51.100.2"]}),
     dict(external_ips=("198.51.100.1", "2001:db8::5", "198.51.100.2")), []),
    ("IPv4-mapped externalIP and source range refused",
     svc_obj({"externalIPs": ["::ffff:198.51.100.1"], "loadBalancerSourceRanges": ["::ffff:0:0/104"]}),
     dict(external_ips=(), load_balancer_source_ranges=()), ["InvalidIP", "InvalidSourceRange"]),
    ("affinity ClientIP default timeout", svc_obj({"sessionAffinity": "ClientIP"}),
     dict(session_affinity_timeout=DEFAULT_AFFINITY_TIMEOUT), []),
    ("affinity ClientIP explicit timeout", svc_obj({"sessionAffinity": "ClientIP",
                                                "sessionAffinityConfig": {"clientIP": {"timeoutSeconds": 60}}}),
     dict(session_affinity_timeout=60), []),
    ("affinity None", svc_obj({"sessionAffinity": "None"}), dict(session_affinity_timeout=0), []),
    ("affinity bad timeout falls back to default", svc_obj({"sessionAffinity": "ClientIP",
                                                       "sessionAffinityConfig": {"clientIP": {"timeoutSeconds": 0}}}),
     dict(session_affinity_timeout=DEFAULT_AFFINITY_TIMEOUT), ["InvalidSessionAffinity"]),
    ("eTP Cluster explicit, iTP Local", svc_obj({"externalTrafficPolicy": "Cluster", "internalTrafficPolicy": "Local"}),
     dict(external_traffic_local=False, internal_traffic_local=True), []),
    ("unknown traffic policy", svc_obj({"externalTrafficPolicy": "Nearby"}),
     dict(external_traffic_local=False), ["InvalidTrafficPolicy"]),
    ("trafficDistribution", svc_obj({"trafficDistribution": "PreferClose"}),
     dict(traffic_distribution="PreferClose"), []),
    ("labels", svc_obj(labels={"service.kubernetes.io/service-proxy-name": "other",
                           "service.kubernetes.io/headless": ""}),
     dict(proxy_name="other"), []),
    ("lb-algorithm maglev", svc_obj(annotations={"kproxy-ebpf.io/lb-algorithm": "maglev"}),
     dict(lb_algorithm=LBAlgorithm.MAGLEV), []),
    ("lb-algorithm random", svc_obj(annotations={"kproxy-ebpf.io/lb-algorithm": "random"}),
     dict(lb_algorithm=LBAlgorithm.RANDOM), []),
    ("lb-algorithm round-robin", svc_obj(annotations={"kproxy-ebpf.io/lb-algorithm": "round-robin"}),
     dict(lb_algorithm=LBAlgorithm.ROUND_ROBIN), []),
    ("lb-algorithm least-conn", svc_obj(annotations={"kproxy-ebpf.io/lb-algorithm": "least-conn"}),
     dict(lb_algorithm=LBAlgorithm.LEAST_CONN), []),
    ("no lb-algorithm: the node's", svc_obj(annotations={}), dict(lb_algorithm=None), []),
    ("unknown lb-algorithm: the node's, reported",
     svc_obj(annotations={"kproxy-ebpf.io/lb-algorithm": "ring-hash"}),
     dict(lb_algorithm=None), ["InvalidLBAlgorithm"]),
    ("port 0 dropped, others kept", svc_obj({"ports": [{"name": "a", "port": 0}, {"name": "b", "port": 81}]}),
     dict(ports=(ServicePort("b", Protocol.TCP, 81),)), ["InvalidPort"]),
    ("port 70000 dropped", svc_obj({"ports": [{"name": "a", "port": 70000}, {"name": "b", "port": 81}]}),
     dict(ports=(ServicePort("b", Protocol.TCP, 81),)), ["InvalidPort"]),
    ('port "abc" dropped', svc_obj({"ports": [{"name": "a", "port": "abc"}, {"name": "b", "port": 81}]}),
     dict(ports=(ServicePort("b", Protocol.TCP, 81),)), ["InvalidPort"]),
    ("port true is not a number", svc_obj({"ports": [{"port": True}]}), dict(ports=()), ["InvalidPort"]),
    ("unknown protocol dropped", svc_obj({"ports": [{"port": 80, "protocol": "QUIC"}, {"port": 81}]}),
     dict(ports=(ServicePort("", Protocol.TCP, 81),)), ["InvalidProtocol"]),
    ("port entry not an object", svc_obj({"ports": ["80", None, {"port": 81}]}),
     dict(ports=(ServicePort("", Protocol.TCP, 81),)), ["InvalidPort", "InvalidPort"]),
    ("ports not a list", svc_obj({"ports": {"port": 80}}), dict(ports=()), ["InvalidPort"]),
    ("bad nodePort ignored, port kept", svc_obj({"type": "NodePort", "ports": [{"port": 80, "nodePort": -1}]}),
     dict(ports=(ServicePort("", Protocol.TCP, 80, 0),)), ["InvalidPort"]),
    ("garbage clusterIP", svc_obj({"clusterIP": "not-an-ip", "clusterIPs": ["not-an-ip"]}),
     dict(cluster_ips=()), ["InvalidClusterIP", "NoClusterIP"]),
    ("garbage externalIP", svc_obj({"externalIPs": ["1.2.3", 7]}), dict(external_ips=()), ["InvalidIP", "InvalidIP"]),
    ("garbage source range", svc_obj({"loadBalancerSourceRanges": ["10.0.0.0/33"]}),
     dict(load_balancer_source_ranges=()), ["InvalidSourceRange"]),
    ("garbage LB ingress", svc_obj(status={"loadBalancer": {"ingress": ["x", {"ip": "nope"}]}}),
     dict(load_balancer_ingress=()), ["InvalidIP", "InvalidIP"]),
    ("garbage types in status and labels", svc_obj(status="weird", labels={"a": 1, 2: "b"}),
     dict(load_balancer_ingress=(), proxy_name=None), []),
    ("namespace defaults like kubectl", svc_obj(namespace=None), dict(namespace="default"), []),
]


@pytest.mark.parametrize("obj,expected,want_reasons",
                         [c[1:] for c in SERVICE_CASES], ids=[c[0] for c in SERVICE_CASES])
def test_service_from_api(obj, expected, want_reasons):
    before = copy.deepcopy(obj)
    service, rejections = service_from_api(obj)
    assert obj == before, "conversion must not modify its input"
    assert service is not None
    for field_name, value in expected.items():
        assert getattr(service, field_name) == value, field_name
    assert reasons(rejections) == want_reasons
    for r in rejections:
        assert (r.kind, r.namespace, r.name, r.uid) == ("Service", service.namespace, "web", "u-1")
        assert r.message


def test_rejection_messages_name_the_field_and_value():
    _, rejections = service_from_api(svc_obj({"ports": [{"name": "a", "port": "abc"}]}))
    assert len(rejections) == 1
    assert "spec.ports[0].port" in rejections[0].message and "'abc'" in rejections[0].message
    assert str(rejections[0]).startswith("Service ns1/web: InvalidPort: ")


REJECTED_SERVICES = [
    ("not an object", ["svc"], "InvalidObject"),
    ("missing metadata", {"spec": {"clusterIP": "172.30.0.1"}}, "InvalidMetadata"),
    ("metadata not an object", {"metadata": "web", "spec": {}}, "InvalidMetadata"),
    ("missing name", {"metadata": {"namespace": "ns1"}, "spec": {}}, "InvalidMetadata"),
    ("name not a string", {"metadata": {"name": 5}, "spec": {}}, "InvalidMetadata"),
    ("missing spec", {"metadata": {"name": "web"}}, "InvalidSpec"),
    ("spec not an object", {"metadata": {"name": "web"}, "spec": [1, 2]}, "InvalidSpec"),
    ("unknown type", svc_obj({"type": "Magic"}), "InvalidServiceType"),
    ("unhashable type", svc_obj({"type": {"a": 1}}), "InvalidServiceType"),
]


@pytest.mark.parametrize("obj,reason", [c[1:] for c in REJECTED_SERVICES], ids=[c[0] for c in REJECTED_SERVICES])
def test_service_rejected_whole(obj, reason):
    service, rejections = service_from_api(obj)
    assert service is None
    assert reasons(rejections) == [reason]


# ----------------------------------------------------------------------------------------------
# EndpointSlices

def slice_obj(endpoints: list | None = None, ports: list | None = None, *, address_type: str = "IPv4",
        labels: dict | None = None) -> dict[str, Any]:
    """Slice ns1/web-abc12 of Service web (`labels`: instead of the service-name label)."""
    return api_slice("web-abc12", "web" if labels is None else None, "ns1", typed=True,
                     meta={"resourceVersion": "7", "uid": "s-1"}, labels=labels,
                     address_type=address_type,
                     ports=[{"name": "http", "protocol": "TCP", "port": 8080}] if ports is None else ports,
                     endpoints=[api_ep("10.0.1.5", "node-a", {"ready": True, "serving": True,
                                                              "terminating": False}, zone="zone-1")]
                     if endpoints is None else endpoints)


SLICE_CASES = [
    ("normal", slice_obj(), dict(
        namespace="ns1", name="web-abc12", service_name="web", address_type="IPv4", resource_version="7",
        ports=(EndpointPort("http", Protocol.TCP, 8080),),
        endpoints=(Endpoint.of("10.0.1.5", ready=True, serving=True, terminating=False, node_name="node-a",
                            zone="zone-1"),)), []),
    ("no service-name label", slice_obj(labels={}), dict(service_name=None), []),
    ("headless label", slice_obj(labels={"kubernetes.io/service-name": "web",
                                   "service.kubernetes.io/headless": ""}),
     dict(service_name="web", headless_label=True), []),
    ("unnamed port keeps name None, protocol defaults", slice_obj(ports=[{"port": 8080}]),
     dict(ports=(EndpointPort(None, Protocol.TCP, 8080),)), []),
    ("named and unnamed ports", slice_obj(ports=[{"name": "", "port": 80, "protocol": "UDP"},
                                           {"name": "metrics", "port": 9090}]),
     dict(ports=(EndpointPort("", Protocol.UDP, 80), EndpointPort("metrics", Protocol.TCP, 9090))), []),
    ("port absent stays None", slice_obj(ports=[{"name": "http"}]),
     dict(ports=(EndpointPort("http", Protocol.TCP, None),)), []),
    ("ports null", slice_obj(ports=None) | {"ports": None}, dict(ports=()), []),
    ("bad port dropped", slice_obj(ports=[{"name": "a", "port": "x"}, {"name": "b", "port": 99999},
                                    {"name": "c", "port": 81, "protocol": "ICMP"}, {"name": "d", "port": 82}]),
     dict(ports=(EndpointPort("d", Protocol.TCP, 82),)), ["InvalidPort", "InvalidPort", "InvalidProtocol"]),
    ("unset conditions stay None",
     slice_obj([{"addresses": ["10.0.1.6"]}, {"addresses": ["10.0.1.7"], "conditions": {}},
                {"addresses": ["10.0.1.8"], "conditions": {"ready": False}}]),
     dict(endpoints=(Endpoint.of("10.0.1.6"), Endpoint.of("10.0.1.7"), Endpoint.of("10.0.1.8", ready=False))), []),
    ("serving-terminating", slice_obj([{"addresses": ["10.0.1.6"],
                                  "conditions": {"ready": False, "serving": True, "terminating": True}}]),
     dict(endpoints=(Endpoint.of("10.0.1.6", ready=False, serving=True, terminating=True),)), []),
    ("hints", slice_obj([{"addresses": ["10.0.1.6"], "hints": {"forZones": [{"name": "zone-1"}, {"name": "zone-2"}],
                                                         "forNodes": [{"name": "node-a"}]}}]),
     dict(endpoints=(Endpoint.of("10.0.1.6", hint_zones=("zone-1", "zone-2"), hint_nodes=("node-a",)),)), []),
    ("IPv6 slice converts without rejection", slice_obj([{"addresses": ["fd00::5"], "conditions": {"ready": True}}],
                                                 address_type="IPv6"),
     dict(address_type="IPv6", endpoints=(Endpoint.of("fd00::5", ready=True),)), []),
    ("IPv6 addresses in canonical form", slice_obj([{"addresses": ["FD00::0:5"]}], address_type="IPv6"),
     dict(endpoints=(Endpoint.of("fd00::5"),)), []),
    ("IPv4-mapped address in an IPv6 slice drops the endpoint",
     slice_obj([{"addresses": ["::ffff:10.0.1.5"]}, {"addresses": ["fd00::6"]}], address_type="IPv6"),
     dict(endpoints=(Endpoint.of("fd00::6"),)), ["InvalidEndpoint"]),
    ("link-local and loopback endpoints are dropped (kube's ValidateEndpointIP)",
     slice_obj([{"addresses": ["fe80::1"]}, {"addresses": ["::1"]}, {"addresses": ["fd00::7"]}],
               address_type="IPv6"),
     dict(endpoints=(Endpoint.of("fd00::7"),)), ["InvalidEndpoint", "InvalidEndpoint"]),
    ("loopback and link-local in an IPv4 slice are dropped",
     slice_obj([{"addresses": ["127.0.0.1"]}, {"addresses": ["169.254.1.1"]}, {"addresses": ["10.0.1.9"]}]),
     dict(endpoints=(Endpoint.of("10.0.1.9"),)), ["InvalidEndpoint", "InvalidEndpoint"]),
    ("IPv4 address in an IPv6 slice drops the endpoint",
     slice_obj([{"addresses": ["10.0.1.5"]}, {"addresses": ["fd00::8"]}], address_type="IPv6"),
     dict(endpoints=(Endpoint.of("fd00::8"),)), ["InvalidEndpoint"]),
    ("FQDN slice", slice_obj([{"addresses": ["db.example.com"]}], address_type="FQDN"),
     dict(address_type="FQDN", endpoints=(Endpoint.of("db.example.com"),)), []),
    ("bad address in IPv4 slice drops the endpoint",
     slice_obj([{"addresses": ["fd00::5"]}, {"addresses": ["10.0.1.9"]}]),
     dict(endpoints=(Endpoint.of("10.0.1.9"),)), ["InvalidEndpoint"]),
    ("garbage endpoints", slice_obj(["x", {"addresses": "10.0.0.1"}, {"addresses": [1]},
                               {"addresses": ["10.0.1.9"], "conditions": {"ready": "yes"}, "hints": "no",
                                "nodeName": 3}]),
     dict(endpoints=(Endpoint.of("10.0.1.9"),)), ["InvalidEndpoint"] * 4),
    ("no endpoints", slice_obj([]) | {"endpoints": None}, dict(endpoints=()), []),
    ("only the first address is kept, as kube-proxy uses only it",
     slice_obj([{"addresses": ["10.0.1.1", "10.0.1.2"]}, {"addresses": []}]),
     dict(endpoints=(Endpoint.of("10.0.1.1"), Endpoint.of(None))), []),
    ("a bad second address still drops the endpoint",
     slice_obj([{"addresses": ["10.0.1.1", "fd00::1"]}]), dict(endpoints=()), ["InvalidEndpoint"]),
]


@pytest.mark.parametrize("obj,expected,want_reasons", [c[1:] for c in SLICE_CASES], ids=[c[0] for c in SLICE_CASES])
def test_slice_from_api(obj, expected, want_reasons):
    before = copy.deepcopy(obj)
    eps_obj, rejections = slice_from_api(obj)
    assert obj == before
    assert eps_obj is not None
    for field_name, value in expected.items():
        assert getattr(eps_obj, field_name) == value, field_name
    assert reasons(rejections) == want_reasons
    assert all(r.kind == "EndpointSlice" and r.name == "web-abc12" for r in rejections)


@pytest.mark.parametrize("obj,reason", [
    ({"addressType": "IPv4"}, "InvalidMetadata"),
    ({"metadata": {"name": "s"}}, "InvalidAddressType"),
    ({"metadata": {"name": "s"}, "addressType": 4}, "InvalidAddressType"),
    (None, "InvalidObject"),
], ids=["missing metadata", "missing addressType", "addressType not a string", "null"])
def test_slice_rejected_whole(obj, reason):
    eps_obj, rejections = slice_from_api(obj)
    assert eps_obj is None
    assert reasons(rejections) == [reason]


# ----------------------------------------------------------------------------------------------
# Nodes

NODE_CASES = [
    ("addresses: InternalIPs first, both families in API order",
     {"metadata": {"name": "node-a", "labels": {"topology.kubernetes.io/zone": "zone-1", "kubernetes.io/os": "linux"}},
      "status": {"addresses": [{"type": "Hostname", "address": "node-a"},
                               {"type": "ExternalIP", "address": "203.0.113.9"},
                               {"type": "InternalIP", "address": "fd00::a"},
                               {"type": "InternalIP", "address": "192.168.0.2"},
                               {"type": "InternalIP", "address": "192.168.0.3"}]}},
     Node("node-a", ("fd00::a", "192.168.0.2", "192.168.0.3", "203.0.113.9"), "zone-1",
          (("kubernetes.io/os", "linux"), ("topology.kubernetes.io/zone", "zone-1")))),
    ("no zone, no addresses", {"metadata": {"name": "node-b"}}, Node("node-b")),
    ("garbage", {"metadata": {"name": 1, "labels": "x"}, "status": {"addresses": [None, {"type": "InternalIP"}]}},
     Node("")),
    ("not an object", "node", Node("")),
]


@pytest.mark.parametrize("obj,expected", [c[1:] for c in NODE_CASES], ids=[c[0] for c in NODE_CASES])
def test_node_from_api(obj, expected):
    assert node_from_api(obj) == expected


# ----------------------------------------------------------------------------------------------
# Robustness: no input may make conversion raise.

GARBAGE = [None, 0, -1, 1.5, True, "", "x", [], [None], {}, {"a": None}, [[[]]], {"name": {}}]


def _mutations(obj: Any, path: tuple = ()):
    """Yield (path, copy of obj with the value at path replaced by each garbage value)."""
    if isinstance(obj, dict):
        items = list(obj.items())
    elif isinstance(obj, list):
        items = list(enumerate(obj))
    else:
        return
    for key, value in items:
        for junk in GARBAGE:
            mutated = copy.deepcopy(obj)
            mutated[key] = junk
            yield path + (key,), mutated
        for sub_path, sub in _mutations(value, path + (key,)):
            mutated = copy.deepcopy(obj)
            mutated[key] = sub
            yield sub_path, mutated


@pytest.mark.parametrize("convert,template", [
    (service_from_api, svc_obj({"type": "LoadBalancer", "sessionAffinity": "ClientIP",
                            "sessionAffinityConfig": {"clientIP": {"timeoutSeconds": 30}},
                            "externalIPs": ["198.51.100.1"], "loadBalancerSourceRanges": ["10.0.0.0/8"],
                            "ports": [{"name": "a", "port": 80, "nodePort": 30000, "protocol": "UDP"}]},
                           status={"loadBalancer": {"ingress": [{"ip": "192.0.2.1", "ipMode": "VIP"}]}},
                           labels={"service.kubernetes.io/headless": ""})),
    (slice_from_api, slice_obj([{"addresses": ["10.0.1.5"], "conditions": {"ready": True}, "nodeName": "n",
                           "zone": "z", "hints": {"forZones": [{"name": "z"}], "forNodes": [{"name": "n"}]}}])),
    (node_from_api, {"metadata": {"name": "n", "labels": {"a": "b"}},
                     "status": {"addresses": [{"type": "InternalIP", "address": "192.168.0.2"}]}}),
    (service_cidr_from_api, {"metadata": {"name": "kubernetes", "resourceVersion": "1"},
                             "spec": {"cidrs": ["10.96.0.0/16", "fd00::/108", "10.97.0.0/24"]},
                             "status": {"conditions": [{"type": "Ready", "status": "True"}]}}),
], ids=["service", "slice", "node", "servicecidr"])
def test_garbage_anywhere_never_raises(convert, template):
    count = 0
    for path, mutated in _mutations(template):
        result = convert(mutated)   # must not raise
        if convert is not node_from_api:
            obj, rejections = result
            assert obj is not None or rejections, f"{path}: None without a reason"
            assert all(isinstance(r, Rejection) and r.reason and r.message for r in rejections)
        count += 1
    assert count > 100


def test_slice_trigger_time_annotation():
    from kproxy_ebpf.kube.convert import slice_from_api
    sl, rej = slice_from_api({"metadata": {"name": "s", "namespace": "d", "annotations": {
        "endpoints.kubernetes.io/last-change-trigger-time": "2026-11-29T15:00:00Z"}},
        "addressType": "IPv4"})
    assert not rej and sl.trigger_time == 1795964400.0
    sl, _ = slice_from_api({"metadata": {"name": "s", "annotations": {
        "endpoints.kubernetes.io/last-change-trigger-time": "yesterday"}}, "addressType": "IPv4"})
    assert sl.trigger_time is None


def test_node_being_deleted():
    from kproxy_ebpf.kube.convert import node_from_api
    assert not node_from_api({"metadata": {"name": "n"}}).deleting
    assert node_from_api({"metadata": {"name": "n", "deletionTimestamp": "2026-01-01T00:00:00Z"}}).deleting
    assert node_from_api({"metadata": {"name": "n"}, "spec": {"taints": [
        {"key": "ToBeDeletedByClusterAutoscaler", "effect": "NoSchedule"}]}}).deleting


SERVICE_CIDR_CASES = [
    ("default object of a dual-stack API server",
     {"metadata": {"name": "kubernetes", "resourceVersion": "3"},
      "spec": {"cidrs": ["10.96.0.0/16", "fd00:10:96::/108"]},
      "status": {"conditions": [{"type": "Ready", "status": "True"}]}},
     ServiceCIDR("kubernetes", ("10.96.0.0/16", "fd00:10:96::/108"), "3"), []),
    ("host bits tolerated, duplicates dropped",
     {"metadata": {"name": "extra"}, "spec": {"cidrs": ["10.97.0.9/24", "10.97.0.0/24"]}},
     ServiceCIDR("extra", ("10.97.0.0/24",)), []),
    ("a range being deleted still counts (kube-proxy reads spec only)",
     {"metadata": {"name": "old", "deletionTimestamp": "2026-01-01T00:00:00Z"},
      "spec": {"cidrs": ["10.98.0.0/16"]}},
     ServiceCIDR("old", ("10.98.0.0/16",)), []),
    ("garbage range reported, good one kept",
     {"metadata": {"name": "x"}, "spec": {"cidrs": ["10.99.0.0/33", 7, "10.99.0.0/16"]}},
     ServiceCIDR("x", ("10.99.0.0/16",)), ["InvalidCIDR", "InvalidCIDR"]),
    ("no spec", {"metadata": {"name": "x"}}, ServiceCIDR("x"), []),
]


@pytest.mark.parametrize("obj,expected,want_reasons", [c[1:] for c in SERVICE_CIDR_CASES],
                         ids=[c[0] for c in SERVICE_CIDR_CASES])
def test_service_cidr_from_api(obj, expected, want_reasons):
    got, rejections = service_cidr_from_api(obj)
    assert got == expected
    assert reasons(rejections) == want_reasons
    assert all(r.kind == "ServiceCIDR" and r.namespace == "" for r in rejections)


def test_service_cidr_without_a_name_is_rejected():
    got, rejections = service_cidr_from_api({"metadata": {}, "spec": {"cidrs": ["10.96.0.0/16"]}})
    assert got is None and reasons(rejections) == ["InvalidMetadata"]


@pytest.mark.parametrize("entry", [
    {"addresses": ["10.0.0.1"], "conditions": {"ready": True}},
    {"addresses": ["10.0.0.1"], "conditions": {"ready": False, "serving": True, "terminating": True},
     "nodeName": "n1", "zone": "z1", "targetRef": {"kind": "Pod", "name": "p"}},
    {"addresses": ["10.0.0.1"], "conditions": {}, "nodeName": "", "zone": None},
    {"addresses": ["010.0.0.1"], "conditions": {"ready": True}},     # lenient parse
    {"addresses": [" 10.0.0.1 "], "conditions": {"ready": True}},
    {"addresses": ["fe80::1"], "conditions": {"ready": True}},       # not IPv4: rejected
    {"addresses": ["10.0.0.1"], "conditions": {"ready": 1}},         # not a boolean
    {"addresses": ["10.0.0.1"], "conditions": {"ready": "true"}},
    {"addresses": ["10.0.0.1"], "conditions": None},
    {"addresses": ["10.0.0.1"]},
    {"addresses": ["10.0.0.1", "10.0.0.2"], "conditions": {"ready": True}},
    {"addresses": [], "conditions": {"ready": True}},
    {"addresses": [7], "conditions": {"ready": True}},
    {"addresses": "10.0.0.1", "conditions": {"ready": True}},
    {"addresses": ["10.0.0.1"], "conditions": {"ready": True}, "nodeName": 5, "zone": ["z"]},
    {"addresses": ["10.0.0.1"], "conditions": {"ready": True},
     "hints": {"forZones": [{"name": "z1"}], "forNodes": [{"name": "n1"}]}},
    {"addresses": ["10.0.0.1"], "conditions": {"ready": True}, "hints": {}},
    ["not", "an", "object"],
])
@pytest.mark.parametrize("address_type", ["IPv4", "FQDN"])
def test_the_short_endpoint_path_gives_what_the_checked_one_gives(entry, address_type):
    """_endpoints' short path (entries as the API server writes them) and _endpoint's field by
    field checks agree on every entry: the same Endpoint, the same rejections."""
    from kproxy_ebpf.kube.convert.endpointslice import _endpoint, _endpoints
    from kproxy_ebpf.kube.convert.fields import _Collector

    short, checked = _Collector("EndpointSlice", "ns", "s", ""), _Collector("EndpointSlice", "ns", "s", "")
    got = _endpoints([entry], address_type, short)
    want = _endpoint("endpoints[0]", entry, address_type, checked)
    assert got == ((want,) if want is not None else ())
    assert short.items == checked.items


def test_an_address_with_a_nul_is_rejected_not_raised():
    """Found by tests/fuzz: inet_pton raises ValueError, not OSError, for an embedded NUL."""
    from kproxy_ebpf.kube.convert import slice_from_api
    eps, rejections = slice_from_api({
        "metadata": {"name": "s", "namespace": "ns"}, "addressType": "IPv4",
        "endpoints": [{"addresses": ["\x00"]}, {"addresses": ["10.0.0.1"]}]})
    assert [e.address for e in eps.endpoints] == ["10.0.0.1"]
    assert [r.reason for r in rejections] == ["InvalidEndpoint"]
