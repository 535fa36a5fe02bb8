"""Which scheduler a Service's frontends get (proxy/schedulers.py), through ProxyState."""
from __future__ import annotations

import dataclasses

import pytest

from kproxy_ebpf.model.desired import Scope
from kproxy_ebpf.model.objects import LBAlgorithm, Node, ServicePort
from kproxy_ebpf.proxy.schedulers import shown
from kproxy_ebpf.proxy.state import ProxyState

from ...builders import TCP, ep, sl, svc

NODE = Node("n1", addresses=("192.168.0.1",))


def fronts(service, default=LBAlgorithm.RANDOM):
    st = ProxyState(NODE, node_port_addresses=(), lb_algorithm=default)
    st.load([service], [sl(ep("10.0.0.1", "n1", ready=True), ep("10.0.0.2", "n2", ready=True))])
    return list(st.compute(full=True).frontends.values())


NP = dataclasses.replace(svc(ports=(ServicePort("", TCP, 80, node_port=30080),)), type="NodePort")


@pytest.mark.parametrize("alg", [LBAlgorithm.ROUND_ROBIN, LBAlgorithm.LEAST_CONN])
def test_a_scheduler_applies_to_every_frontend_of_both_scopes(alg):
    fs = fronts(dataclasses.replace(NP, lb_algorithm=alg))
    assert {f.scope for f in fs} == {Scope.SOCK, Scope.EXT}
    assert {(f.algorithm, f.maglev, shown(f)) for f in fs} == {(alg, 0, alg)}


def test_the_annotation_wins_over_the_node_default():
    fs = fronts(dataclasses.replace(NP, lb_algorithm=LBAlgorithm.RANDOM), LBAlgorithm.LEAST_CONN)
    assert {f.algorithm for f in fs} == {LBAlgorithm.RANDOM}
    assert {f.algorithm for f in fronts(NP, LBAlgorithm.LEAST_CONN)} == {LBAlgorithm.LEAST_CONN}


def test_maglev_is_a_table_from_outside_and_random_for_sockets():
    fs = fronts(dataclasses.replace(NP, lb_algorithm=LBAlgorithm.MAGLEV))
    assert {(f.scope, shown(f)) for f in fs} == {(Scope.SOCK, LBAlgorithm.RANDOM),
                                                 (Scope.EXT, LBAlgorithm.MAGLEV)}
