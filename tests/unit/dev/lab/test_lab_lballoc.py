"""The lab's LoadBalancer allocator (lab/lballoc.py): the pool and the decision per Service.
The API side runs in tests/integration/test_lb_cluster.py against a real API server."""
from __future__ import annotations

from kproxy_ebpf.dev.lab.lballoc import Pool, decide, wants_address


def svc_obj(name, type_="LoadBalancer", ips=(), lb_ip=None, lb_class=None, families=None):
    spec = {"type": type_}
    if lb_ip:
        spec["loadBalancerIP"] = lb_ip
    if lb_class:
        spec["loadBalancerClass"] = lb_class
    if families:
        spec["ipFamilies"] = families
    return {"metadata": {"namespace": "default", "name": name}, "spec": spec,
            "status": {"loadBalancer": {"ingress": [{"ip": ip} for ip in ips]}}}


def test_pool_leaves_out_network_and_broadcast_and_hands_out_the_lowest_free():
    pool = Pool("10.250.200.0/30")
    assert pool.free == ["10.250.200.1", "10.250.200.2"]
    assert pool.take(("d", "a")) == "10.250.200.1"
    assert pool.take(("d", "a")) == "10.250.200.1", "a holder keeps its address"
    assert pool.take(("d", "b")) == "10.250.200.2"
    assert pool.take(("d", "c")) is None, "exhausted"
    assert pool.release(("d", "a")) == "10.250.200.1"
    assert pool.take(("d", "c")) == "10.250.200.1"
    assert "10.250.200.0" not in pool and "10.250.201.1" not in pool and "junk" not in pool


def test_which_services_get_an_address():
    assert wants_address(svc_obj("a"))
    assert not wants_address(svc_obj("a", type_="NodePort"))
    assert not wants_address(svc_obj("a", lb_class="example.com/other"))
    assert not wants_address(svc_obj("a", families=["IPv6"]))
    assert wants_address(svc_obj("a", families=["IPv6", "IPv4"]))


def test_an_ipv6_pool_serves_the_services_of_its_family():
    from kproxy_ebpf.dev.lab.lballoc import DEFAULT_POOL6

    pool = Pool(DEFAULT_POOL6)
    assert pool.family == "IPv6"
    assert decide(pool, svc_obj("v6", families=["IPv6"])).ips == ["fd00:250:200::1"]
    assert decide(pool, svc_obj("v4", families=["IPv4"])).ips is None, "not its family"
    assert "fd00:250:200::1" in pool and "10.250.200.1" not in pool


def test_new_service_gets_an_address_without_ip_mode():
    pool = Pool("10.250.200.0/24")
    d = decide(pool, svc_obj("a"))
    assert d.ips == ["10.250.200.1"]
    # Once the status holds it, nothing more to write.
    assert decide(pool, svc_obj("a", ips=["10.250.200.1"])).ips is None


def test_requested_address_is_honoured_in_the_pool_only_and_when_free():
    pool = Pool("10.250.200.0/24")
    assert decide(pool, svc_obj("a", lb_ip="10.250.200.50")).ips == ["10.250.200.50"]
    taken = decide(pool, svc_obj("b", lb_ip="10.250.200.50"))
    assert taken.ips is None and "held by default/a" in taken.reason
    outside = decide(pool, svc_obj("c", lb_ip="192.0.2.1"))
    assert outside.ips is None and "outside the pool" in outside.reason
    # A Service that asks for another address moves there and frees the old one.
    assert decide(pool, svc_obj("a", ips=["10.250.200.50"], lb_ip="10.250.200.60")).ips == [
        "10.250.200.60"]
    assert "10.250.200.50" in pool.free


def test_release_on_type_change_clears_the_status_and_on_delete_frees():
    pool = Pool("10.250.200.0/24")
    decide(pool, svc_obj("a"))
    d = decide(pool, svc_obj("a", type_="ClusterIP", ips=["10.250.200.1"]))
    assert d.ips == [] and pool.held == {}
    assert decide(pool, svc_obj("a", type_="ClusterIP")).ips is None, "nothing left to clear"
    # A Service of another class keeps whatever its own controller wrote.
    assert decide(pool, svc_obj("x", lb_class="other", ips=["10.250.200.9"])).ips is None


def test_a_restarted_allocator_keeps_the_addresses_in_the_statuses():
    pool = Pool("10.250.200.0/24")
    # As Allocator.resync: first the addresses already written, then everything else.
    pool.claim(("default", "b"), "10.250.200.7")
    assert decide(pool, svc_obj("b", ips=["10.250.200.7"])).ips is None
    assert decide(pool, svc_obj("a")).ips == ["10.250.200.1"]
    assert pool.held[("default", "b")] == "10.250.200.7"


def test_external_routes_and_pools_stay_clear_of_the_lab_own_routes():
    import pytest

    from kproxy_ebpf.dev.lab.namespaces import external_cidr
    from kproxy_ebpf.dev.lab.nsutil import LabError

    assert external_cidr("10.250.200.7/24") == "10.250.200.0/24"
    assert external_cidr("2001:db8:1::7/64") == "2001:db8:1::/64"
    for bad in ("10.250.0.0/16", "10.244.3.0/24", "10.96.1.0/24", "0.0.0.0/0", "junk",
                "fd00:250::/48", "fd00:244:3::/64", "fd00:96::/120", "::/0"):
        with pytest.raises(LabError):
            external_cidr(bad)
