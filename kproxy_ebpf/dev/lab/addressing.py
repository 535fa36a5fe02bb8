"""The lab's address plan, per IP family: underlay, router, external client, pod and Service
ranges. A lab serves the cluster families of `--ip-family` (ipv4, ipv6 or dual: IPv4 primary,
as kind's and kubeadm's dual-stack default); every address comes from here.

IPv6 uses unique local addresses (fd00::/8, RFC 4193), which are never routed on the
Internet, and the lab has no link out anyway. The host part of a node or pod is the same in
both families (node1 is 10.250.0.11 and fd00:250::11, a pod 10.244.1.12 and fd00:244:1::12),
so a dual-stack lab's addresses read alike.

The IPv4 underlay (10.250.0.0/24) exists in every lab, IPv6-only ones included: it carries the
agents' and kube-proxy's API connection through the relay (controlplane.py), an
infrastructure link as a management network is on real nodes. Nothing of the cluster's uses
it there: Node objects, pods and Services hold only the lab's families.
"""
from __future__ import annotations

import ipaddress
from dataclasses import dataclass

from kproxy_ebpf.model.objects import IPFamily

# `lab up --ip-family` values and the cluster families they mean, primary first.
IP_FAMILY_CHOICES = {"ipv4": (IPFamily.IPV4,), "ipv6": (IPFamily.IPV6,),
                     "dual": (IPFamily.IPV4, IPFamily.IPV6)}


@dataclass(frozen=True)
class FamilyPlan:
    family: IPFamily
    underlay_prefixlen: int
    control_plane: str           # the underlay's own address: the API server as lab nodes see it
    router: str
    external: str                # the external client
    external_extra: tuple[str, ...]   # its extra source addresses (add_external_address)
    pod_supernet: str
    service_cidr: str
    pod_gateway: str             # the pods' next hop: an address of every pod veth's host end
    pod_gateway_prefixlen: int   # as it is set there (IPv6: the link-local /64)
    host_prefixlen: int          # a pod's own address (/32, /128)
    default: str                 # the default route's destination
    _underlay: str               # address prefix text the host part is appended to
    _pods: str

    def node_ip(self, index: int) -> str:
        return f"{self._underlay}{10 + index}"

    def pod_cidr(self, index: int) -> str:
        return self._pods.format(index=index) + ("0/24" if self.family is IPFamily.IPV4 else "/64")

    def pod_ip(self, index: int, host: int) -> str:
        return self._pods.format(index=index) + str(host)

    @property
    def underlay_cidr(self) -> str:
        return str(ipaddress.ip_interface(f"{self.control_plane}/{self.underlay_prefixlen}").network)


PLANS = {
    IPFamily.IPV4: FamilyPlan(
        IPFamily.IPV4, 24, "10.250.0.1", "10.250.0.254", "10.250.0.250",
        ("10.250.0.251", "10.250.0.252", "10.250.0.253"), "10.244.0.0/16", "10.96.0.0/16",
        "169.254.1.1", 32, 32, "0.0.0.0/0", "10.250.0.", "10.244.{index}."),
    # /112 for Services, as kind's IPv6 default (the API server refuses ranges of more than
    # 2^20 addresses: cmd/kube-apiserver/app/options/validation.go, "the mask must be >= 108").
    # The pod gateway is link-local: every pod veth's host end has it, each on its own link.
    IPFamily.IPV6: FamilyPlan(
        IPFamily.IPV6, 64, "fd00:250::1", "fd00:250::254", "fd00:250::250",
        ("fd00:250::251", "fd00:250::252", "fd00:250::253"), "fd00:244::/32", "fd00:96::/112",
        "fe80::1", 64, 128, "::/0", "fd00:250::", "fd00:244:{index}::"),
}


def families(choice: str) -> tuple[IPFamily, ...]:
    """The cluster families of an `--ip-family` value."""
    try:
        return IP_FAMILY_CHOICES[choice]
    except KeyError:
        raise ValueError(f"--ip-family must be one of {', '.join(IP_FAMILY_CHOICES)}, "
                         f"not {choice!r}") from None


def choice_of(fams: tuple[IPFamily, ...] | list[str]) -> str:
    """The `--ip-family` value of a lab's families (the inverse of families())."""
    fams = tuple(IPFamily(f) for f in fams)
    for choice, value in IP_FAMILY_CHOICES.items():
        if value == fams:
            return choice
    raise ValueError(f"no --ip-family serves {fams}")

