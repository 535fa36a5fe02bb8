"""model.Endpoints: a slice's endpoints kept column by column, read as Endpoint records."""
from __future__ import annotations

import pickle

import pytest

from kproxy_ebpf.kube.convert import slice_from_api
from kproxy_ebpf.model.objects import NO_ENDPOINTS, Endpoint, Endpoints, EndpointSlice

A = Endpoint.of("10.0.0.1", ready=True, node_name="n1")
B = Endpoint.of("10.0.0.2", ready=False, serving=True, terminating=True, node_name="n2",
                zone="z1", hint_zones=("z1",))
C = Endpoint.of("10.0.0.3")


def test_reads_back_the_records_it_was_made_of():
    eps = Endpoints.of([A, B, C])
    assert list(eps) == [A, B, C]
    assert (eps[0], eps[1], eps[-1]) == (A, B, C)
    assert eps[1:] == (B, C)
    assert list(eps.rows()) == [tuple(A), tuple(B), tuple(C)]
    assert len(eps) == 3 and eps and not NO_ENDPOINTS


def test_a_column_of_nothing_but_none_is_not_kept():
    eps = Endpoints.of([A, C])
    assert eps.zones is None and eps.hints is None and eps.node_names == ("n1", None)
    assert Endpoints.of([]) is NO_ENDPOINTS


def test_equal_to_the_tuple_of_the_same_endpoints_and_hashed_alike():
    eps = Endpoints.of((A, B))
    assert eps == (A, B) and (A, B) == eps and eps != (B, A) and eps != Endpoints.of((B, A))
    assert hash(eps) == hash((A, B))
    assert pickle.loads(pickle.dumps(eps)) == eps


def test_refuses_mismatched_columns_and_assignment():
    with pytest.raises(ValueError):
        Endpoints(("10.0.0.1",), b"")
    with pytest.raises(ValueError):
        Endpoints(("10.0.0.1",), b"\x00", node_names=("a", "b"))
    with pytest.raises(AttributeError):
        Endpoints.of([A]).addresses = ()


def test_slice_takes_records_or_endpoints():
    sl = EndpointSlice("ns", "s", "svc", endpoints=(A, B))
    assert type(sl.endpoints) is Endpoints
    assert sl == EndpointSlice("ns", "s", "svc", endpoints=Endpoints.of((A, B)))


def test_converted_slice_mixes_short_and_checked_paths_in_order():
    """An entry the short path takes and one that needs the field-by-field checks (hints)
    land in the same columns, in the API's order."""
    obj = {"metadata": {"name": "s", "namespace": "ns",
                        "labels": {"kubernetes.io/service-name": "svc"}},
           "addressType": "IPv4",
           "endpoints": [
               {"addresses": ["10.0.0.1"], "conditions": {"ready": True}, "nodeName": "n1"},
               {"addresses": ["10.0.0.2"], "conditions": {"ready": False, "serving": True,
                                                          "terminating": True},
                "nodeName": "n2", "zone": "z1", "hints": {"forZones": [{"name": "z1"}]}},
               {"addresses": ["10.0.0.3"], "conditions": {}}]}
    sl, rejections = slice_from_api(obj)
    assert rejections == []
    assert sl is not None and sl.endpoints == (A, B, C)


def test_columns_given_directly_are_normalised_as_from_records():
    """A column of nothing but None is dropped however the Endpoints is built, so equal
    endpoints always have equal columns."""
    direct = Endpoints(["10.0.0.3"], [C.conditions], [None], [None], [None])
    assert direct.node_names is None and direct.zones is None and direct.hints is None
    assert direct == Endpoints.of([C]) and direct.addresses == ("10.0.0.3",)
