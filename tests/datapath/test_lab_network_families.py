"""The lab network in IPv6 and dual-stack (`lab up --ip-family ipv6|dual`, lab/addressing.py):
every family's addresses, routes and reachability are those of the IPv4 lab
(test_lab_network.py), and an IPv6 packet for an outside address ends at the lab router as an
IPv4 one does, never reaching the host's namespace.

Conventions: lab "labfam-t", nodes fd00:250::11/::12 (and 10.250.0.11/.12), pods a (node1) and
b (node2) at host number 10 of their node's pod range in every family.
"""
from __future__ import annotations

import pytest

from kproxy_ebpf.dev.lab import nsutil
from kproxy_ebpf.dev.lab.addressing import PLANS, families
from kproxy_ebpf.model.objects import IPFamily

from ..support import fresh_lab
from .sniff import Sniffer

pytestmark = pytest.mark.root

LAB = "labfam-t"
OUTSIDE6 = "2001:db8::7"     # the documentation prefix (RFC 3849): never routed anywhere


@pytest.fixture(scope="module", params=["ipv6", "dual"])
def lab(request):
    with fresh_lab(LAB, nodes=2, families=families(request.param)) as lab:
        lab.create_pod("a", "node1")
        lab.create_pod("b", "node2")
        yield lab


def _ip(lab, target: str, *args: str) -> str:
    return lab.exec(target, ["ip", *args], capture_output=True, text=True, check=True).stdout


def test_every_object_has_an_address_of_each_family(lab):
    fams = lab.families
    n1, a, b, ext = lab.node("node1"), lab.pod("a"), lab.pod("b"), lab.external()
    assert n1.ips == tuple(PLANS[f].node_ip(1) for f in fams) and n1.ip == n1.ips[0]
    assert n1.underlay_ip == "10.250.0.11", "the control plane's link, in every lab"
    assert a.ips == tuple(PLANS[f].pod_ip(1, 10) for f in fams) and a.ip == a.ips[0]
    assert b.ips == tuple(PLANS[f].pod_ip(2, 10) for f in fams)
    assert ext.ips == tuple(PLANS[f].external for f in fams)
    pod_addrs = _ip(lab, "a", "addr", "show", "eth0")
    assert ("inet " in pod_addrs) == (IPFamily.IPV4 in fams), "a pod has only the lab's families"
    assert "fd00:244:1::10/128" in pod_addrs
    pod6 = _ip(lab, "a", "-6", "route")
    assert "default via fe80::1 dev eth0" in pod6
    node6 = _ip(lab, "node1", "-6", "route")
    assert f"fd00:244:1::10 dev {a.veth}" in node6 and "src fd00:250::11" in node6
    assert "fd00:244:2::/64 via fd00:250::12 dev eth0" in node6
    assert "default via fd00:250::254 dev eth0" in node6
    ext6 = _ip(lab, "ext", "-6", "route")
    assert "fd00:96::/112 via fd00:250::11 dev eth0" in ext6
    assert "unreachable fd00:244::/32" in ext6
    assert "default" not in _ip(lab, "rtr", "-6", "route")


def test_pods_nodes_and_the_client_reach_what_they_reach_in_ipv4(lab):
    for fam in lab.families:
        a, b = lab.pod("a").ip_of(fam), lab.pod("b").ip_of(fam)
        node1 = lab.node("node1").ip_of(fam)
        host = (lambda ip: f"[{ip}]") if fam is IPFamily.IPV6 else (lambda ip: ip)
        res = lab.probe("a", b, 8080, count=3)
        assert all(r.startswith(f"b {host(a)}:") for r in res), res
        assert lab.probe("b", a, 5353, udp=True)[0].startswith(f"a {host(b)}:")
        # Node processes reach pods from the node's address of the family.
        assert lab.probe("node1", b, 8080)[0].startswith(f"b {host(node1)}:")
        assert lab.probe("a", b, 9999, udp=True, count=10) == ["REFUSED"] * 10
        assert lab.probe("ext", a, 8080) == ["ERROR EHOSTUNREACH"]
        assert lab.probe("ext", node1, 8080) == ["REFUSED"], "nodes are reachable"


def test_outside_ipv6_addresses_end_at_the_lab_router(lab):
    """The IPv6 default routes lead to the lab router, which has no route on: it answers
    "no route" (ICMPv6, which TCP takes as a soft error and reports after its first SYN
    retransmit, ~1 s) and nothing reaches the host's namespace."""
    host = Sniffer(OUTSIDE6)
    in_router = Sniffer(OUTSIDE6, lambda f: nsutil.run_in_thread(lab.rtr_netns, f))
    try:
        results = [lab.probe(src, OUTSIDE6, 80, timeout=3) for src in ("a", "node1", "ext")]
        results += [lab.probe(src, OUTSIDE6, 53, udp=True, timeout=3) for src in ("b", "node2")]
    finally:
        on_host, on_router = host.close(), in_router.close()
    assert results == [["ERROR ENETUNREACH"]] * 3 + [["ERROR ENETUNREACH"]] * 2, results
    assert on_router and set(on_router) == {"eth0"}, on_router
    assert on_host == [], f"lab packets to {OUTSIDE6} showed up on host links {set(on_host)}"
