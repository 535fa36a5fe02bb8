"""Carries the TC path's tracked flows over an upgrade that changes the conntrack layout.

Only the programs write kp_ct and kp_rnat, so programs of a new layout version would start
from empty tables: every flow from outside the node that was open at the upgrade would lose
its translation (a SNAT flow's replies would no longer find their client). The agent copies
the old versions' rows into the new maps, converted, as carry.py does (twice, around the
attach).

Older layouts: kp_ct4_v1 and kp_ct4_v2 (IPv4 tuples of __be32 addresses; v1 without the life
word), and kp_rnat4_v1 (the same IPv4 tuple both ways), into kp_ct and kp_rnat, whose tuples
hold either family (struct kp_ip, IPv4-mapped).
"""
from __future__ import annotations

import ctypes
import logging
import struct
from collections.abc import Callable
from pathlib import Path
from typing import NamedTuple, cast

from kproxy_ebpf.datapath.maps import layout as L
from kproxy_ebpf.datapath.maps.pinned import PinnedMap
from kproxy_ebpf.datapath.upgrade.carry import Pair, RowCarry

log = logging.getLogger(__name__)

# Frozen shapes of the older layouts: their rows keep these for good.
_V4_TUPLE = struct.Struct("=IIHHB3x")      # kp_ct4_key: saddr, daddr, sport, dport, proto
# kp_ct4_val v1: expires, be_addr, nat_addr, be_port, nat_port, backend_id, svc_id, state,
# flags, seen_reply; v2: life, be_addr, nat_addr, be_port, nat_port, backend_id, svc_id, isn.
_CT_V1 = struct.Struct("=QIIHHIIBBBx")
_CT_V2 = struct.Struct("=QIIHHIII")


def _ip(be32: int) -> ctypes.Array:
    """An old __be32 address field as struct kp_ip (0, no address, stays all zero)."""
    if not be32:
        return L.IP16()
    return L.IP16.from_buffer_copy(L.ip_bytes("0.0.0.0")[:12] + struct.pack("=I", be32))


def _tuple(raw: bytes) -> bytes:
    saddr, daddr, sport, dport, proto = _V4_TUPLE.unpack(raw)
    return bytes(L.CtKey(saddr=_ip(saddr), daddr=_ip(daddr), sport=sport, dport=dport,
                         proto=proto))


def _ct_v1(value: bytes) -> bytes:
    (expires, be_addr, nat_addr, be_port, nat_port, backend_id, svc_id, state, flags,
     seen) = _CT_V1.unpack(value)
    # No ISN: such a flow's replies are told apart by its state, as version 1 did.
    return bytes(L.CtVal(be_addr=_ip(be_addr), nat_addr=_ip(nat_addr), be_port=be_port,
                         nat_port=nat_port, backend_id=backend_id, svc_id=svc_id,
                         expires=expires, state=state, flags=flags & ~L.const("KP_CT_F_ISN"),
                         seen_reply=seen))


def _ct_v2(value: bytes) -> bytes:
    life, be_addr, nat_addr, be_port, nat_port, backend_id, svc_id, isn = _CT_V2.unpack(value)
    return bytes(L.CtVal(life=life, be_addr=_ip(be_addr), nat_addr=_ip(nat_addr),
                         be_port=be_port, nat_port=nat_port, backend_id=backend_id,
                         svc_id=svc_id, isn=isn))


class OldLayout(NamedTuple):
    target: str                          # the KP_MAPS id its rows go to
    pin: str                             # its pin name
    key_size: int
    value_size: int
    key: Callable[[bytes], bytes]        # old key -> the target's
    value: Callable[[bytes], bytes]


OLD_LAYOUTS = (
    OldLayout("ct", "kp_ct4_v1", _V4_TUPLE.size, _CT_V1.size, _tuple, _ct_v1),
    OldLayout("ct", "kp_ct4_v2", _V4_TUPLE.size, _CT_V2.size, _tuple, _ct_v2),
    OldLayout("rnat", "kp_rnat4_v1", _V4_TUPLE.size, _V4_TUPLE.size, _tuple, _tuple),
)


class _OldSpec:
    """What PinnedMap needs of a map spec, for a layout version layout.py no longer has."""
    percpu = False

    def __init__(self, old: OldLayout):
        self.name = old.pin
        self.key = ctypes.c_uint8 * old.key_size
        self.value = ctypes.c_uint8 * old.value_size


def find(bpffs_dir: Path) -> RowCarry | None:
    """The copy to run when bpffs_dir holds conntrack maps of an older layout, else None."""
    found = [old for old in OLD_LAYOUTS if (Path(bpffs_dir) / old.pin).exists()]
    if not found:
        return None
    targets = {old.target: PinnedMap(Path(bpffs_dir) / L.MAPS[old.target].name,
                                     L.MAPS[old.target]) for old in found}
    # A stand-in MapSpec: RowCarry reads these maps by raw rows, which need no more of it.
    return RowCarry([Pair(PinnedMap(Path(bpffs_dir) / old.pin, cast(L.MapSpec, _OldSpec(old))),
                          targets[old.target], old.key, old.value) for old in found])
