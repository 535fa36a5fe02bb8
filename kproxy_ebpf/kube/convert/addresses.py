"""Addresses and CIDRs in API text: parsed tolerantly, written canonically (dotted quad; RFC 5952
for IPv6). An IPv4-mapped IPv6 address is refused everywhere: the datapath holds IPv4 in exactly
that form (bpf/lib/ip.h), so such an "IPv6" address would alias an IPv4 one."""
from __future__ import annotations

import ipaddress
import socket
from typing import Any

from .fields import _short


def _ipv4(value: Any) -> str | None:
    """The canonical IPv4 text of `value`, or None when it is not an IPv4 address string."""
    if not isinstance(value, str):
        return None
    try:
        # Fast path (an endpoint address is parsed 100,000 times at 10k Services): inet_pton
        # takes only a canonical dotted quad (no leading zeros, no blanks), so it is returned
        # as it is; anything else gets ipaddress's slower, lenient parse below.
        socket.inet_pton(socket.AF_INET, value)
        return value
    except (OSError, ValueError):      # ValueError: a NUL in the text (found by fuzzing)
        pass
    try:
        return str(ipaddress.IPv4Address(value.strip()))
    except ValueError:
        return None


def _ipv6(value: Any) -> str | None:
    """The canonical (RFC 5952) text of an IPv6 address string, or None: also for an
    IPv4-mapped one (see the module docstring) and one with a zone (fe80::1%eth0)."""
    if not isinstance(value, str):
        return None
    try:
        addr = ipaddress.IPv6Address(value.strip())
    except ValueError:
        return None
    if addr.ipv4_mapped is not None or addr.scope_id is not None:
        return None
    return addr.compressed


def _ip(value: Any) -> str | None:
    """The canonical text of an address of either family, or None."""
    return _ipv4(value) or _ipv6(value)


def _is_mapped(value: Any) -> bool:
    try:
        return isinstance(value, str) and ipaddress.IPv6Address(value.strip()).ipv4_mapped is not None
    except ValueError:
        return False


def _not_an_ip(value: Any) -> str:
    """Why `value` is refused as an address, for a rejection message."""
    if _is_mapped(value):
        return f"{_short(value)} is an IPv4-mapped IPv6 address (write the IPv4 address)"
    return f"{_short(value)} is not an IP address"


# Endpoint addresses kube's EndpointSlice validation refuses (ValidateEndpointIP, v1.36
# pkg/apis/discovery/validation: unspecified, loopback, link-local, link-local multicast): no
# proxy may send a Service's traffic there, whatever wrote the slice.
def _endpoint_ip_refused(ip: str) -> bool:
    if ":" not in ip:       # canonical dotted quad: prefixes, at the cost of a string compare
        return ip == "0.0.0.0" or ip.startswith(_REFUSED_V4)
    addr = ipaddress.IPv6Address(ip)
    return addr.is_unspecified or addr.is_loopback or addr.is_link_local or ip.startswith("ff02:")


_REFUSED_V4 = ("127.", "169.254.", "224.0.0.")


def _network(value: Any) -> ipaddress.IPv4Network | ipaddress.IPv6Network | None:
    """A CIDR string as a network (host bits tolerated: "10.0.0.1/8" is 10.0.0.0/8), or None."""
    text = value.strip() if isinstance(value, str) else None
    try:
        return ipaddress.ip_network(text, strict=False) if text else None
    except ValueError:
        return None


_MAPPED = ipaddress.IPv6Network("::ffff:0:0/96")


def _mapped_net(net: ipaddress.IPv4Network | ipaddress.IPv6Network) -> bool:
    """An IPv6 range reaching into IPv4-mapped space (see the module docstring)."""
    return net.version == 6 and net.overlaps(_MAPPED)


def cidr_sloppy(value: Any) -> ipaddress.IPv4Network | ipaddress.IPv6Network | None:
    """A CIDR as kube-proxy parses loadBalancerSourceRanges (v1.36 pkg/proxy/util
    MapCIDRsByIPFamily: strings.TrimSpace, then netutils.ParseCIDRSloppy): surrounding
    whitespace trimmed, the "/bits" required (a bare address is no CIDR), IPv4 octets with
    leading zeros read as decimal, host bits tolerated ("10.0.0.1/8" is 10.0.0.0/8)."""
    if not isinstance(value, str):
        return None
    addr, sep, bits = value.strip().partition("/")
    if not sep or not bits.isdigit():
        return None
    octets = addr.split(".")
    if len(octets) == 4 and all(o.isdigit() for o in octets):
        addr = ".".join(str(int(o)) for o in octets)
    try:
        return ipaddress.ip_network(f"{addr}/{int(bits)}", strict=False)
    except ValueError:
        return None
