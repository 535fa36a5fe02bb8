"""The lab's address plan (lab/addressing.py): both families read alike, and the ranges of
one family never overlap."""
import ipaddress
import itertools

import pytest

from kproxy_ebpf.dev.lab.addressing import PLANS, choice_of, families
from kproxy_ebpf.model.objects import IPFamily


def test_nodes_and_pods_share_their_host_number_across_families():
    v4, v6 = PLANS[IPFamily.IPV4], PLANS[IPFamily.IPV6]
    assert (v4.node_ip(1), v6.node_ip(1)) == ("10.250.0.11", "fd00:250::11")
    assert (v4.pod_cidr(2), v6.pod_cidr(2)) == ("10.244.2.0/24", "fd00:244:2::/64")
    assert (v4.pod_ip(2, 12), v6.pod_ip(2, 12)) == ("10.244.2.12", "fd00:244:2::12")
    assert v6.underlay_cidr == "fd00:250::/64"


@pytest.mark.parametrize("family", list(PLANS))
def test_every_address_falls_in_its_range_and_the_ranges_are_apart(family):
    p = PLANS[family]
    net = ipaddress.ip_network
    for index in (1, 2, 239):
        assert ipaddress.ip_address(p.node_ip(index)) in net(p.underlay_cidr)
        assert net(p.pod_cidr(index)).subnet_of(net(p.pod_supernet))
        assert ipaddress.ip_address(p.pod_ip(index, 254)) in net(p.pod_cidr(index))
    for addr in (p.control_plane, p.router, p.external, *p.external_extra):
        assert ipaddress.ip_address(addr) in net(p.underlay_cidr)
    for a, b in itertools.combinations((p.underlay_cidr, p.pod_supernet, p.service_cidr), 2):
        assert not net(a).overlaps(net(b)), (a, b)
    if family is IPFamily.IPV6:
        assert all(ipaddress.ip_network(c).subnet_of(net("fd00::/8"))
                   for c in (p.underlay_cidr, p.pod_supernet, p.service_cidr)), "ULA only"


def test_choices_round_trip():
    for choice in ("ipv4", "ipv6", "dual"):
        assert choice_of(families(choice)) == choice
    assert families("dual") == (IPFamily.IPV4, IPFamily.IPV6)
    with pytest.raises(ValueError, match="ipv4, ipv6, dual"):
        families("ipv5")
