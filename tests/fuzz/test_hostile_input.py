"""Hostile input, generated (hypothesis): Services and EndpointSlices as the API could hand them
to us, valid and invalid, through conversion (kube/convert/), policy (ProxyState) and the
writer against in-memory maps. What must hold for every case:

* nothing raises;
* every rejection and every Service problem is a reason and a sentence (what the log line and
  the Event carry);
* what the maps hold is exactly the desired table: each frontend whole, with its backends, as
  a fresh writer reads it back from the maps (no half-programmed Service), and a lookup never
  sees a slot naming a freed backend, after any single map operation (fakemaps.consistent);
* deleting every object leaves the maps empty (nothing leaks).

Deterministic (derandomize) so a CI failure reproduces; no example database is written. Not
in `make unit` (about a minute); `make fuzz` runs these alone, `make test` with the rest. The
cases: wrong families (IPv6 slices for IPv4 Services and the reverse), FQDN slices, ports
without numbers or names, duplicate addresses across slices, 1000-endpoint slices, 100-port
Services, unknown protocols and types, names at and past the length limits, unknown nodes
and zones in hints, wrong JSON types anywhere. About 10^4 cases in all (EXAMPLES below).
"""
from __future__ import annotations

import os
import string

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kproxy_ebpf.datapath.maps import layout as L
from kproxy_ebpf.datapath.write.writer import MapWriter
from kproxy_ebpf.kube.convert import Rejection, service_from_api, slice_from_api
from kproxy_ebpf.model.desired import Action
from kproxy_ebpf.model.objects import Node
from kproxy_ebpf.proxy.state import ProxyState

from ..fakemaps import FakeMap, consistent

# KPROXY_FUZZ_SHARE: the share of the cases the fast stage of `make test` runs (derandomized:
# always the same ones); the slow stage runs them all.
_SHARE = float(os.environ.get("KPROXY_FUZZ_SHARE", "1"))
EXAMPLES = {k: max(1, int(n * _SHARE)) for k, n in
            {"service": 4000, "slice": 4000, "cluster": 2500, "big": 40}.items()}
NODE = Node(name="node-a", addresses=("192.168.0.1",), zone="zone-a")
WRITER_MAPS = ("svc", "backend", "meta", "srcrange", "extaddr", "extbe")


def cases(n: int):
    return settings(max_examples=n, deadline=None, derandomize=True, database=None,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])


# -- values, good and bad ---------------------------------------------------------------------
# Each field is usually valid (so that most cases reach policy and the writer with something
# to program) and otherwise anything: a wrong value, a wrong JSON type, or absent.

def mostly(good, bad, bad_in: int = 14):
    """`good`, and one time in `bad_in` `bad` instead."""
    # sampled_from draws uniformly (integers() leans to its ends, where `bad` would sit).
    return st.sampled_from(range(bad_in)).flatmap(lambda i: bad if i == bad_in - 1 else good)


JUNK = st.one_of(st.none(), st.booleans(), st.integers(-5, 70000), st.floats(allow_nan=True),
                 st.text(max_size=8), st.lists(st.integers(), max_size=2),
                 st.dictionaries(st.text(max_size=3), st.integers(), max_size=2))
EMPTY = st.one_of(st.just([]), JUNK)
DNS_CHARS = string.ascii_lowercase + string.digits + "-"
# Names around the limits: 63 (a label), 253 (a DNS subdomain), and past them.
BAD_NAMES = st.one_of(st.integers(0, 300).map(lambda n: "a" * n),
                      st.text(DNS_CHARS + "._", max_size=70), JUNK)
NAMES = mostly(st.sampled_from(["svc", "web", "dns"]), BAD_NAMES)
NAMESPACE = mostly(st.just("ns"), st.sampled_from(["", None, "x" * 64, 7]))
IP4 = st.builds(lambda a, b: f"10.{a}.{b}.{(a * 7 + b) % 250 + 1}", st.integers(0, 3),
                st.integers(0, 5))
IP6 = st.builds(lambda a: f"fd00::{a:x}", st.integers(1, 40))
BAD_IP = st.one_of(st.sampled_from(["", "None", "10.0.0", "10.0.0.256", "::ffff:10.0.0.1",
                                    "0.0.0.0", "127.0.0.1", "169.254.1.1", "224.0.0.1",
                                    "fe80::1", "db.example.org", "10.0.0.1/24", " 10.0.0.1",
                                    "1e3"]), JUNK)
ANY_IP = mostly(mostly(IP4, IP6, 6), BAD_IP)
PROTOCOLS = mostly(st.sampled_from(["TCP", "TCP", "TCP", "UDP"]),
                   st.one_of(st.sampled_from(["SCTP", "tcp", "HTTP", ""]), JUNK))
PORT = mostly(st.sampled_from([53, 80, 443, 8080, 65535, 1]),
              st.one_of(st.integers(-1, 70000), st.none(), st.sampled_from(["80", "http"])))
PORT_NAMES = mostly(st.sampled_from(["", "", "", "http", "dns"]), BAD_NAMES)
CONDITION = mostly(st.one_of(st.none(), st.booleans()), st.sampled_from(["true", 1]))
NODES = st.sampled_from(["node-a", "node-b", "unknown-node", "", None])
ZONES = st.sampled_from(["zone-a", "zone-b", "nowhere", "", None])


def service_port():
    return st.fixed_dictionaries(
        {"port": PORT, "protocol": PROTOCOLS, "name": PORT_NAMES},
        optional={"targetPort": st.one_of(PORT, st.text(max_size=6)),
                  "nodePort": st.one_of(st.integers(30000, 32767), JUNK)})


def services(names=NAMES, max_ports: int = 4):
    spec = st.fixed_dictionaries(
        {"ports": mostly(st.lists(service_port(), min_size=1, max_size=max_ports), EMPTY),
         "clusterIP": mostly(IP4, st.one_of(IP6, BAD_IP, st.just("None")))},
        optional={
            "type": mostly(st.sampled_from(["ClusterIP", "NodePort", "LoadBalancer"]),
                           st.one_of(st.sampled_from(["ExternalName", "Bogus"]), JUNK)),
            "clusterIPs": st.one_of(st.lists(ANY_IP, max_size=3), JUNK),
            "ipFamilies": st.lists(st.sampled_from(["IPv4", "IPv6", "IPv5"]), max_size=3),
            "externalIPs": st.one_of(st.lists(ANY_IP, max_size=3), JUNK),
            "sessionAffinity": st.sampled_from(["None", "ClientIP", "Bogus"]),
            "sessionAffinityConfig": st.one_of(
                st.fixed_dictionaries({"clientIP": st.fixed_dictionaries(
                    {"timeoutSeconds": st.one_of(st.integers(-1, 100000), JUNK)})}), JUNK),
            "externalTrafficPolicy": st.sampled_from(["Cluster", "Local", "Bogus", ""]),
            "internalTrafficPolicy": st.sampled_from(["Cluster", "Local", "Bogus", ""]),
            "loadBalancerSourceRanges": st.lists(st.one_of(
                st.sampled_from(["10.0.0.0/8", "10.1.2.3/32", "fd00::/64", "0.0.0.0/0",
                                 "10.0.0.1/33", "bogus", "10.0.0.1"]), JUNK), max_size=3),
            "trafficDistribution": st.sampled_from(["PreferClose", "PreferSameNode", "Bogus"]),
            "healthCheckNodePort": st.one_of(st.integers(30000, 32767), JUNK),
        })
    status = st.fixed_dictionaries({"loadBalancer": st.fixed_dictionaries(
        {"ingress": st.lists(st.fixed_dictionaries({"ip": ANY_IP},
                                                   optional={"ipMode": st.sampled_from(
                                                       ["VIP", "Proxy", "Bogus"])}),
                             max_size=2)})})
    meta = st.fixed_dictionaries({"name": names, "namespace": NAMESPACE},
                                 optional={"uid": st.text(max_size=6),
                                           "resourceVersion": st.one_of(st.text(max_size=4),
                                                                        JUNK)})
    return st.fixed_dictionaries({"metadata": meta, "spec": mostly(spec, JUNK)},
                                 optional={"status": st.one_of(status, JUNK)})


def endpoint(ips=ANY_IP):
    hints = st.fixed_dictionaries({}, optional={
        "forZones": st.lists(st.fixed_dictionaries({"name": ZONES}), max_size=2),
        "forNodes": st.lists(st.fixed_dictionaries({"name": NODES}), max_size=2)})
    return st.fixed_dictionaries(
        {"addresses": mostly(st.lists(ips, min_size=1, max_size=2), JUNK)},
        optional={"conditions": st.fixed_dictionaries(
                      {}, optional={"ready": CONDITION, "serving": CONDITION,
                                    "terminating": CONDITION}),
                  "nodeName": NODES, "zone": ZONES, "hints": mostly(hints, JUNK)})


def slices(service_names=NAMES, endpoints=None, max_ports: int = 3):
    slice_port = st.fixed_dictionaries({"name": PORT_NAMES, "port": PORT,
                                        "protocol": PROTOCOLS})
    labels = st.fixed_dictionaries({"kubernetes.io/service-name": service_names},
                                   optional={"service.kubernetes.io/headless": st.just("")})
    meta = st.fixed_dictionaries({"name": NAMES, "namespace": NAMESPACE,
                                  "labels": mostly(labels, JUNK)})
    return st.fixed_dictionaries({
        "metadata": meta,
        "addressType": mostly(st.just("IPv4"),
                              st.one_of(st.sampled_from(["IPv6", "FQDN", "bogus"]), JUNK)),
        "ports": mostly(st.lists(slice_port, min_size=1, max_size=max_ports), EMPTY),
        "endpoints": mostly(st.lists(endpoint(), min_size=1, max_size=6) if endpoints is None
                            else endpoints, EMPTY)})


def many_endpoints(n: int):
    """n endpoints with distinct addresses, shaped by one drawn template."""
    def spread(template: dict) -> list[dict]:
        return [{**template, "addresses": [f"10.{8 + i // 62500}.{i // 250 % 250}.{i % 250 + 1}"]}
                for i in range(n)]
    return endpoint().map(spread)


def big_slice(n: int):
    """A slice of n endpoints for the first ports of many_ports()'s Services."""
    ports = [{"name": f"p{i}", "port": 2000 + i, "protocol": "TCP" if i % 3 else "UDP"}
             for i in range(3)]
    return slices(st.sampled_from(["svc", "web"]), endpoints=many_endpoints(n)).map(
        lambda sl: {**sl, "ports": ports})


def many_ports(n: int):
    """A Service with n ports (distinct numbers and names), shaped by one drawn template."""
    def spread(svc: dict) -> dict:
        spec = svc["spec"] if isinstance(svc["spec"], dict) else {}
        spec["ports"] = [{"name": f"p{i}", "port": 1000 + i, "protocol": "TCP" if i % 3 else "UDP",
                          "targetPort": 2000 + i} for i in range(n)]
        return {**svc, "spec": spec}
    return services(st.sampled_from(["svc", "web"])).map(spread)


# -- what must hold ---------------------------------------------------------------------------

def well_formed(rejections: list[Rejection]) -> None:
    for r in rejections:
        assert r.reason and r.reason[0].isupper() and " " not in r.reason, r
        assert isinstance(r.message, str) and len(r.message) > 5, r
        assert "Traceback" not in r.message


@cases(EXAMPLES["service"])
@given(services(max_ports=8))
def test_any_service_converts_or_is_rejected_with_a_reason(obj):
    svc, rejections = service_from_api(obj)
    well_formed(rejections)
    assert svc is not None or rejections


@cases(EXAMPLES["slice"])
@given(slices())
def test_any_endpointslice_converts_or_is_rejected_with_a_reason(obj):
    eps, rejections = slice_from_api(obj)
    well_formed(rejections)
    assert eps is not None or rejections


def checked(maps: dict) -> dict:
    """After every single operation a lookup must find whole rows (while the table is small
    enough for that to be cheap; the end state is checked whole in any case)."""
    def check() -> None:
        if sum(len(m.rows) for m in maps.values()) <= 200:
            consistent(maps)
    for name in WRITER_MAPS:
        maps[name] = FakeMap(L.MAPS[name], max_entries=1_000_000, on_op=check)
    return maps


def programme(service_objs, slice_objs) -> None:
    state = ProxyState(NODE, node_port_addresses=(), external_ip_allowlist=None)
    for obj in service_objs:
        svc, rejections = service_from_api(obj)
        well_formed(rejections)
        if svc is not None:
            state.upsert_service(svc)
    for obj in slice_objs:
        eps, rejections = slice_from_api(obj)
        well_formed(rejections)
        if eps is not None:
            state.upsert_slice(eps)
    changes = state.compute()
    for p in state.problems():
        assert p.reason and isinstance(p.message, str) and len(p.message) > 5, p
    maps = checked({})
    writer = MapWriter(maps)
    result = writer.apply(changes.frontends)
    assert result.ok, result.errors
    consistent(maps)
    # The maps, read back by a writer that never saw the table, are the table.
    fresh = MapWriter(maps)
    fresh.restore()
    assert set(fresh.programmed) == set(changes.frontends)
    for key, fe in changes.frontends.items():
        got = fresh.programmed[key]
        want = {b.key for b in fe.backends} if fe.action is Action.FORWARD else set()
        assert set(got.live()) == want, key
    # Everything gone: nothing left behind.
    for obj in slice_objs:
        eps, _ = slice_from_api(obj)
        if eps is not None:
            state.delete_slice(eps.namespace, eps.name)
    for obj in service_objs:
        svc, _ = service_from_api(obj)
        if svc is not None:
            state.delete_service(svc.namespace, svc.name)
    changes = state.compute()
    assert dict(changes.frontends) == {}
    assert writer.apply(changes.frontends).ok
    leftovers = {name: len(maps[name].rows) for name in WRITER_MAPS if maps[name].rows}
    assert not leftovers, leftovers


SHORT_NAMES = st.sampled_from(["svc", "web", "dns"])


def _one_service(port_names: list[str]) -> tuple[list[dict], list[dict]]:
    ports = [{"port": 53 + i, "protocol": "TCP", "name": n} for i, n in enumerate(port_names)]
    svc = {"metadata": {"name": "svc", "namespace": "ns"},
           "spec": {"ports": ports, "clusterIP": "10.0.0.1"}}
    eps = {"metadata": {"name": "svc", "namespace": "ns",
                        "labels": {"kubernetes.io/service-name": "svc"}},
           "addressType": "IPv4", "endpoints": [{"addresses": ["10.0.0.9"]}],
           "ports": [{"name": n, "port": 8053 + i, "protocol": "TCP"}
                     for i, n in enumerate(port_names)]}
    return [svc], [eps]


@pytest.mark.parametrize("port_names", [
    ["", "\x00"],                                      # found by this suite in CI, 2026-12-07
    ["averylongportname-a", "averylongportname-b"]])   # valid names, alike in 15 bytes
def test_port_names_that_read_back_alike_are_restored_apart(port_names):
    """The maps keep a port name in 15 bytes (a NUL ends it): two names that read back alike
    must not stop the restore (it raised ValueError: "restored with id 2 but already holds 1")."""
    programme(*_one_service(port_names))


@cases(EXAMPLES["cluster"])
@given(st.lists(services(SHORT_NAMES), min_size=1, max_size=3),
       st.lists(slices(SHORT_NAMES), min_size=1, max_size=4))
def test_a_cluster_of_hostile_objects_is_programmed_whole_or_not_at_all(service_objs,
                                                                        slice_objs):
    programme(service_objs, slice_objs)


@cases(EXAMPLES["big"])
@given(st.lists(many_ports(100), min_size=1, max_size=2),
       st.lists(big_slice(1000), min_size=1, max_size=2))
def test_big_objects_100_ports_and_1000_endpoints(service_objs, slice_objs):
    programme(service_objs, slice_objs)
