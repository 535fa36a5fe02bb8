"""Which backends keep the connections made to them (established.py): kube-proxy's rule for
UDP flows (a serving endpoint of the Service port keeps them, whatever policies, topology or
termination say about new connections), on a real ProxyState and MapWriter (fake maps)."""
from __future__ import annotations

import pytest

from kproxy_ebpf.agent.established import Established, KeptBackends
from kproxy_ebpf.datapath.write.writer import MapWriter
from kproxy_ebpf.model.desired import FrontendKey
from kproxy_ebpf.model.objects import Node, Protocol
from kproxy_ebpf.proxy.state import ProxyState

from ...builders import CLUSTER_IP, ep, sl, svc
from ...fakemaps import checked_maps

TCP = Protocol.TCP
KEY = FrontendKey(CLUSTER_IP, 80, TCP)
READY, DRAINING, FAILING = "10.0.2.1", "10.0.2.2", "10.0.2.3"


def established(*eps, **service_fields) -> Established:
    state = ProxyState(Node(name="node-a", addresses=("192.168.0.1",)))
    state.upsert_service(svc(**service_fields))
    state.upsert_slice(sl(*eps))
    changes = state.compute()
    writer = MapWriter(checked_maps())
    assert writer.apply(changes.frontends).ok
    return Established(writer.held, changes.frontends, state.serving_endpoints)


def three_endpoints():
    return (ep(READY, "node-b"),
            ep(DRAINING, "node-b", ready=False, serving=True, terminating=True),
            ep(FAILING, "node-b", ready=False, serving=False))


@pytest.mark.parametrize("ip,kept", [(READY, True), (DRAINING, True), (FAILING, False),
                                     ("10.0.9.9", False)])
def test_a_serving_endpoint_keeps_its_connections_even_when_new_ones_go_elsewhere(ip, kept):
    e = established(*three_endpoints())
    assert e.keeps(KEY, (ip, 8080, TCP)) is kept
    assert e.keeps(KEY, (ip, 9999, TCP)) is False          # another port of the pod


def test_a_local_policy_without_a_local_endpoint_breaks_no_connection():
    # internalTrafficPolicy Local on a node without endpoints: new connections are dropped,
    # the ones made before (to a remote endpoint) stay, as kube-proxy's flows do.
    e = established(*three_endpoints(), internal_traffic_local=True)
    assert e.keeps(KEY, (READY, 8080, TCP))


def test_a_frontend_that_is_gone_keeps_nothing():
    e = established(*three_endpoints())
    assert not e.keeps(FrontendKey("172.30.0.99", 80, TCP), (READY, 8080, TCP))


def test_a_draining_backend_is_remembered_until_it_stops_serving():
    """Ready, then terminating (out of the slots, still serving), then gone: its sockets are
    lost in the last sync, not in the one where it left the slots."""
    state = ProxyState(Node(name="node-a", addresses=("192.168.0.1",)))
    state.upsert_service(svc())
    writer, kept = MapWriter(checked_maps()), KeptBackends()

    def sync(*eps) -> set:
        state.upsert_slice(sl(*eps))
        changes = state.compute()
        before = kept.before(writer.held, changes.recomputed_keys)
        assert writer.apply(changes.frontends, changes.changed_keys).ok
        return kept.settle(before, Established(writer.held, changes.frontends, state.serving_endpoints))

    assert sync(ep(READY, "node-b"), ep(DRAINING, "node-b")) == set()
    assert len(kept) == 0, "backends in the slots are the writer's to tell, not copied"
    assert sync(ep(READY, "node-b"),
                ep(DRAINING, "node-b", ready=False, serving=True, terminating=True)) == set()
    assert len(kept) == 1
    assert sync(ep(READY, "node-b")) == {(DRAINING, 8080, TCP)}
    assert len(kept) == 0
    assert sync(ep(READY, "node-b")) == set()
