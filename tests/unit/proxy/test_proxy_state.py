"""ProxyState: dirty tracking, the per-service cache and frontend conflicts.

Conventions: as in test_proxy_frontends.py (node-a, 192.168.0.1, ClusterIPs 172.30.0.x,
externalIPs 203.0.113.x, pods 10.0.<node>.x).
"""
from __future__ import annotations

import dataclasses

import pytest

from kproxy_ebpf.model.desired import Action, FrontendKey
from kproxy_ebpf.model.objects import Node, Protocol, ServicePort
from kproxy_ebpf.proxy import state as state_mod
from kproxy_ebpf.proxy.state import ProxyState

from ...builders import ep, sl, svc

TCP = Protocol.TCP
NODE = Node(name="node-a", addresses=("192.168.0.1",), zone="zone-a")


def slice_of(name, service, *ips, ns="ns", rv=""):
    """Slice `name` of `service`, one endpoint on node-b per ip."""
    return sl(*(ep(ip, "node-b") for ip in ips), name=name, svc=service, ns=ns, rv=rv)


def backends(cs, ip, port=80):
    f = cs.frontends[FrontendKey(ip, port, TCP)]
    return f.action, [b.ip for b in f.backends]


@pytest.fixture
def st():
    s = ProxyState(NODE)
    s.upsert_service(svc("a", "172.30.0.1"))
    s.upsert_service(svc("b", "172.30.0.2"))
    s.upsert_slice(slice_of("a-1", "a", "10.0.2.1"))
    s.upsert_slice(slice_of("b-1", "b", "10.0.2.2"))
    s.compute()
    return s


@pytest.fixture
def calls(monkeypatch):
    """The services that compute() actually recomputed."""
    seen = []
    real = state_mod.service_frontends

    def spy(service, *args, **kw):
        seen.append(service.name)
        return real(service, *args, **kw)
    monkeypatch.setattr(state_mod, "service_frontends", spy)
    return seen


def test_initial_compute(st):
    cs = st.compute(full=True)
    assert backends(cs, "172.30.0.1") == (Action.FORWARD, ["10.0.2.1"])
    assert backends(cs, "172.30.0.2") == (Action.FORWARD, ["10.0.2.2"])
    assert cs.changed_services == frozenset() and cs.changed_keys == frozenset()


# -- dirty tracking -------------------------------------------------------------------------------

@pytest.mark.parametrize("mutate, dirtied, recomputed", [
    pytest.param(lambda s: s.upsert_service(dataclasses.replace(svc("a", "172.30.0.1"),
                                                                resource_version="9")),
                 False, [], id="service-noop-update-new-rv"),
    pytest.param(lambda s: s.upsert_slice(slice_of("a-1", "a", "10.0.2.1", rv="9")),
                 False, [], id="slice-noop-update-new-rv"),
    pytest.param(lambda s: s.upsert_service(svc("a", "172.30.0.1", session_affinity_timeout=5)),
                 True, ["a"], id="service-change-dirties-it"),
    pytest.param(lambda s: s.upsert_slice(slice_of("a-1", "a", "10.0.2.9")),
                 True, ["a"], id="slice-change-dirties-its-service-only"),
    pytest.param(lambda s: s.upsert_slice(slice_of("a-1", "b", "10.0.2.1")),
                 True, ["a", "b"], id="slice-moving-between-services-dirties-both"),
    pytest.param(lambda s: s.upsert_slice(slice_of("x-1", None, "10.0.2.1")),
                 False, [], id="unlabelled-slice-dirties-nothing"),
    pytest.param(lambda s: s.delete_slice("ns", "nope"), False, [], id="delete-unknown-slice"),
    pytest.param(lambda s: s.delete_service("ns", "nope"), False, [],
                 id="delete-unknown-service"),
    pytest.param(lambda s: s.delete_slice("ns", "b-1"), True, ["b"], id="delete-slice"),
    pytest.param(lambda s: s.set_node(dataclasses.replace(NODE, labels=(("x", "y"),))),
                 False, [], id="node-label-change-irrelevant"),
    pytest.param(lambda s: s.set_node(dataclasses.replace(NODE, zone="zone-b")),
                 True, ["a", "b"], id="node-zone-change-dirties-all"),
    pytest.param(lambda s: s.set_node(dataclasses.replace(NODE, addresses=("192.168.0.2",))),
                 True, ["a", "b"], id="node-address-change-dirties-all"),
])
def test_dirty_tracking(st, calls, mutate, dirtied, recomputed):
    assert mutate(st) is dirtied
    st.compute()
    assert sorted(calls) == recomputed


def test_full_recomputes_everything(st, calls):
    cs = st.compute(full=True)
    assert sorted(calls) == ["a", "b"]
    assert cs.changed_services == frozenset()


def test_slice_change_updates_backends(st):
    st.upsert_slice(slice_of("a-2", "a", "10.0.3.1"))
    cs = st.compute()
    assert backends(cs, "172.30.0.1") == (Action.FORWARD, ["10.0.2.1", "10.0.3.1"])
    assert cs.changed_services == {("ns", "a")}
    assert cs.changed_keys == {FrontendKey("172.30.0.1", 80, TCP)}
    assert backends(cs, "172.30.0.2") == (Action.FORWARD, ["10.0.2.2"])


def test_slice_move_between_services(st):
    st.upsert_slice(slice_of("a-1", "b", "10.0.2.1"))
    cs = st.compute()
    assert backends(cs, "172.30.0.1") == (Action.REJECT, [])
    assert backends(cs, "172.30.0.2") == (Action.FORWARD, ["10.0.2.1", "10.0.2.2"])
    assert cs.changed_services == {("ns", "a"), ("ns", "b")}


def test_delete_service_removes_frontends(st):
    assert st.delete_service("ns", "a")
    cs = st.compute()
    assert FrontendKey("172.30.0.1", 80, TCP) not in cs.frontends
    assert cs.changed_keys == {FrontendKey("172.30.0.1", 80, TCP)}
    assert cs.changed_services == {("ns", "a")}


def test_slice_before_service():
    s = ProxyState(NODE)
    s.upsert_slice(slice_of("a-1", "a", "10.0.2.1"))
    assert s.compute().frontends == {}
    s.upsert_service(svc("a", "172.30.0.1"))
    assert backends(s.compute(), "172.30.0.1") == (Action.FORWARD, ["10.0.2.1"])


def test_node_arrives_later_brings_nodeports():
    s = ProxyState()
    s.upsert_service(svc("a", "172.30.0.1", ports=(ServicePort("", TCP, 80, node_port=30080),)))
    s.upsert_slice(slice_of("a-1", "a", "10.0.2.1"))
    assert set(s.compute().frontends) == {FrontendKey("172.30.0.1", 80, TCP)}
    assert s.set_node(NODE)
    cs = s.compute()
    assert set(cs.frontends) == {FrontendKey("172.30.0.1", 80, TCP), FrontendKey("192.168.0.1", 30080, TCP)}
    assert cs.changed_keys == {FrontendKey("192.168.0.1", 30080, TCP)}


def test_changeset_frontends_is_a_read_only_view(st):
    """No copy of the table per compute (that made a fill O(N^2)), and no way to change it."""
    cs = st.compute()
    with pytest.raises(TypeError):
        cs.frontends[FrontendKey("172.30.0.99", 80, TCP)] = None
    assert not hasattr(cs.frontends, "clear")
    st.delete_service("ns", "a")
    st.compute()
    assert set(cs.frontends) == {FrontendKey("172.30.0.2", 80, TCP)}     # it follows the state


# -- conflicts ------------------------------------------------------------------------------------

EXT = FrontendKey("203.0.113.1", 80, TCP)


@pytest.mark.parametrize("order", [["a", "b"], ["b", "a"]], ids=["a-first", "b-first"])
def test_conflict_first_in_name_order_wins(order):
    s = ProxyState(NODE)
    ips = {"a": "172.30.0.1", "b": "172.30.0.2"}
    for name in order:
        s.upsert_service(svc(name, ips[name], external_ips=("203.0.113.1",)))
        s.upsert_slice(slice_of(f"{name}-1", name, "10.0.2.1" if name == "a" else "10.0.2.2"))
        s.compute()
    assert s.compute(full=True).frontends[EXT].service.name == "a"
    assert [(p.name, p.reason) for p in s.problems()] == [("b", "FrontendConflict")]


def test_conflict_loser_takes_over_when_winner_leaves():
    s = ProxyState(NODE)
    s.upsert_service(svc("a", "172.30.0.1", external_ips=("203.0.113.1",)))
    s.upsert_service(svc("b", "172.30.0.2", external_ips=("203.0.113.1",)))
    s.upsert_slice(slice_of("b-1", "b", "10.0.2.2"))
    cs = s.compute()
    assert cs.frontends[EXT].service.name == "a"
    assert cs.frontends[EXT].action is Action.REJECT
    assert [(p.name, p.reason) for p in cs.problems] == [("b", "FrontendConflict")]

    s.delete_service("ns", "a")
    cs = s.compute()
    assert cs.frontends[EXT].service.name == "b"
    assert backends(cs, "203.0.113.1") == (Action.FORWARD, ["10.0.2.2"])
    assert EXT in cs.changed_keys
    assert cs.changed_services == {("ns", "a"), ("ns", "b")}
    assert cs.problems == [] and s.problems() == []


def test_conflict_loser_change_does_not_touch_winner_frontend():
    s = ProxyState(NODE)
    s.upsert_service(svc("a", "172.30.0.1", external_ips=("203.0.113.1",)))
    s.upsert_service(svc("b", "172.30.0.2", external_ips=("203.0.113.1",)))
    s.compute()
    s.upsert_slice(slice_of("b-1", "b", "10.0.2.2"))
    cs = s.compute()
    assert cs.frontends[EXT].service.name == "a"
    assert cs.changed_keys == {FrontendKey("172.30.0.2", 80, TCP)}


def test_conflict_across_namespaces_orders_by_namespace_first():
    s = ProxyState(NODE)
    s.upsert_service(svc("a", "172.30.0.1", ns="zz", external_ips=("203.0.113.1",)))
    s.upsert_service(svc("z", "172.30.0.2", ns="aa", external_ips=("203.0.113.1",)))
    cs = s.compute()
    assert (cs.frontends[EXT].service.namespace, cs.frontends[EXT].service.name) == ("aa", "z")


# -- problems and views ---------------------------------------------------------------------------

def test_problems_reported_on_recompute_and_cleared(st):
    st.upsert_service(svc("a", "172.30.0.1", ports=(ServicePort("x", TCP, 0),
                                                    ServicePort("y", TCP, 80))))
    cs = st.compute()
    assert [(p.name, p.reason) for p in cs.problems] == [("a", "InvalidPort")]
    assert st.compute().problems == []           # nothing recomputed: nothing re-reported
    assert [p.reason for p in st.problems()] == ["InvalidPort"]
    st.upsert_service(svc("a", "172.30.0.1"))
    assert st.compute().problems == [] and st.problems() == []


def test_frontends_by_service_and_port_endpoints(st):
    assert {k: [f.ip for f in v] for k, v in st.frontends_by_service().items()} == {
        ("ns", "a"): ["172.30.0.1"], ("ns", "b"): ["172.30.0.2"]}
    (sets,) = st.port_endpoints("ns", "a").values()
    assert [e.ip for e in sets.cluster] == ["10.0.2.1"]
    assert st.port_endpoints("ns", "nope") == {}
    assert [x.name for x in st.slices_of("ns", "a")] == ["a-1"]
    assert st.dirty == frozenset()
