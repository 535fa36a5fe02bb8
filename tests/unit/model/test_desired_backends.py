"""desired.Backends: a frontend's backends as keys and state bytes, read as Backend records."""
from __future__ import annotations

import pickle

import pytest

from kproxy_ebpf.datapath.maps import layout as L
from kproxy_ebpf.datapath.write.plan import wanted_slots
from kproxy_ebpf.model.desired import (
    NO_BACKENDS,
    Action,
    Backend,
    Backends,
    BackendState,
    Frontend,
    FrontendKind,
    ServicePortName,
    backend_state,
)
from kproxy_ebpf.model.objects import Protocol

TCP = Protocol.TCP
A = Backend.of("10.0.0.1", 80, TCP)
B = Backend.of("10.0.0.2", 80, TCP, local=True, ready=False, serving=True, terminating=True)
C = Backend.of("10.0.0.3", 8080, TCP, serving=False)


def test_reads_back_the_records_it_was_made_of():
    bs = Backends.of([A, B, C])
    assert list(bs) == [A, B, C]
    assert (bs[0], bs[1], bs[-1]) == (A, B, C)
    assert bs[1:] == Backends.of([B, C])
    assert len(bs) == 3 and bs and not NO_BACKENDS
    assert bs.keys == (A.key, B.key, C.key)
    assert B.local and B.terminating and not B.ready and bs[1].state == B.state


def test_equal_to_the_tuple_of_the_same_backends_and_hashed_alike():
    bs = Backends.of((A, B))
    assert bs == (A, B) and (A, B) == bs
    assert bs != (B, A) and bs != Backends.of((B, A)) and bs != (A,)
    assert hash(bs) == hash((A, B))
    assert Backends.of(()) == () == NO_BACKENDS


def test_keeps_the_key_objects_it_is_given():
    key = ("10.0.0.9", 80, TCP)
    bs = Backends((key,), bytes([backend_state()]))
    assert bs.keys[0] is key and bs[0].key is key


def test_in_key_order_sorts_keys_with_their_states():
    bs = Backends.in_key_order([C.key, A.key, B.key], [C.state, A.state, B.state])
    assert list(bs) == [A, B, C]


def test_refuses_mismatched_lengths_and_assignment():
    with pytest.raises(ValueError):
        Backends((A.key,), b"")
    bs = Backends.of([A])
    with pytest.raises(AttributeError):
        bs.keys = ()
    assert pickle.loads(pickle.dumps(bs)) == bs


def test_backend_state_matches_the_flags():
    assert backend_state(local=True, ready=True, serving=False, terminating=True) == (
        BackendState.LOCAL | BackendState.READY | BackendState.TERMINATING)


def _frontend(backends) -> Frontend:
    return Frontend("10.96.0.1", 80, TCP, FrontendKind.CLUSTER_IP,
                    ServicePortName("ns", "svc", "", TCP), Action.FORWARD, backends=backends)


def test_frontend_takes_records_or_backends_and_compares_equal():
    from_records = _frontend((A, B, C))
    assert type(from_records.backends) is Backends
    assert from_records == _frontend(Backends.of((A, B, C)))
    assert type(from_records.draining) is Backends and from_records.draining == ()


@pytest.mark.parametrize("state", range(16))
def test_wanted_slots_gives_each_state_its_be_flags(state):
    b = Backend(("10.0.0.1", 80, TCP), state)
    fe = _frontend((b,))
    wanted = wanted_slots(fe)
    assert wanted == {b.key: L.backend_flags(b)}
    assert next(iter(wanted)) is fe.backends.keys[0]
