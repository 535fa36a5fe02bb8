"""The Python mirror of bpf/kproxy.h: ctypes structures and the constants.

Constants are read from the header itself, so they have one definition. Structures must be
written twice (ctypes cannot read C); tests/unit/test_layout.py compares every size and field
offset with the BTF that clang emits for the header, and Datapath checks the kernel's view of
each loaded map (key and value sizes) before it writes a byte.

All byte-order conversion lives in the encode/decode helpers here: __be fields hold the integer
whose in-memory bytes are network order, exactly what the kernel stores.
"""
from __future__ import annotations

import ctypes
import re
import socket
import struct
from functools import lru_cache

from ..model import Protocol
from .paths import bpf_dir

_DEFINE = re.compile(r"^#define\s+(KP_[A-Z0-9_]+)\s+(\S+)", re.M)


@lru_cache(maxsize=1)
def constants() -> dict[str, int | str]:
    """Every `#define KP_*` of kproxy.h: numbers as ints, map names as strings."""
    text = (bpf_dir() / "kproxy.h").read_text()
    out: dict[str, int | str] = {}
    for name, value in _DEFINE.findall(text):
        try:
            out[name] = int(value, 0)
        except ValueError:
            out[name] = value
    return out


def const(name: str) -> int:
    value = constants()[name]
    assert isinstance(value, int), name
    return value


class SvcKey(ctypes.Structure):
    """struct kp_svc4_key"""
    _fields_ = [("addr", ctypes.c_uint32), ("port", ctypes.c_uint16), ("proto", ctypes.c_uint8),
                ("scope", ctypes.c_uint8), ("slot", ctypes.c_uint16), ("pad", ctypes.c_uint8 * 2)]


class SvcVal(ctypes.Structure):
    """struct kp_svc_val"""
    _fields_ = [("backend_id", ctypes.c_uint32), ("svc_id", ctypes.c_uint32),
                ("affinity_timeout", ctypes.c_uint32), ("count", ctypes.c_uint16),
                ("action", ctypes.c_uint8), ("kind", ctypes.c_uint8)]


class Backend4(ctypes.Structure):
    """struct kp_backend4"""
    _fields_ = [("addr", ctypes.c_uint32), ("port", ctypes.c_uint16), ("proto", ctypes.c_uint8),
                ("flags", ctypes.c_uint8)]


class SknatKey(ctypes.Structure):
    """struct kp_sknat4_key"""
    _fields_ = [("cookie", ctypes.c_uint64), ("addr", ctypes.c_uint32), ("port", ctypes.c_uint16),
                ("pad", ctypes.c_uint8 * 2)]


class SknatVal(ctypes.Structure):
    """struct kp_sknat4_val"""
    _fields_ = [("addr", ctypes.c_uint32), ("port", ctypes.c_uint16), ("pad", ctypes.c_uint8 * 2),
                ("svc_id", ctypes.c_uint32)]


class AffKey(ctypes.Structure):
    """struct kp_aff_key"""
    _fields_ = [("client", ctypes.c_uint64), ("svc_id", ctypes.c_uint32), ("type", ctypes.c_uint8),
                ("pad", ctypes.c_uint8 * 3)]


class AffVal(ctypes.Structure):
    """struct kp_aff_val"""
    _fields_ = [("last_used", ctypes.c_uint64), ("backend_id", ctypes.c_uint32),
                ("slot", ctypes.c_uint16), ("pad", ctypes.c_uint8 * 2)]


class SvcMeta(ctypes.Structure):
    """struct kp_svc_meta"""
    _fields_ = [("namespace", ctypes.c_char * 64), ("name", ctypes.c_char * 64),
                ("port_name", ctypes.c_char * 16), ("proto", ctypes.c_uint8),
                ("pad", ctypes.c_uint8 * 7)]


class CipVal(ctypes.Structure):
    """struct kp_cip4_val"""
    _fields_ = [("action", ctypes.c_uint8), ("pad", ctypes.c_uint8 * 3)]


class Cidr4Key(ctypes.Structure):
    """struct kp_cidr4_key (LPM trie key)"""
    _fields_ = [("prefixlen", ctypes.c_uint32), ("addr", ctypes.c_uint32)]


# C struct name -> mirror; the layout test walks this table.
STRUCTS: dict[str, type[ctypes.Structure]] = {
    "kp_svc4_key": SvcKey, "kp_svc_val": SvcVal, "kp_backend4": Backend4,
    "kp_sknat4_key": SknatKey, "kp_sknat4_val": SknatVal, "kp_aff_key": AffKey,
    "kp_aff_val": AffVal, "kp_svc_meta": SvcMeta, "kp_cip4_val": CipVal,
    "kp_cidr4_key": Cidr4Key,
}

U32 = ctypes.c_uint32
U64 = ctypes.c_uint64


class MapSpec:
    """A pinned map: its pin name (from kproxy.h), key and value types, and the size knob."""

    def __init__(self, macro: str, key: type, value: type, size_macro: str | None,
                 lru: bool = False, percpu: bool = False):
        self.macro, self.key, self.value = macro, key, value
        self.size_macro, self.lru, self.percpu = size_macro, lru, percpu

    @property
    def name(self) -> str:
        return str(constants()[self.macro])


MAPS: dict[str, MapSpec] = {
    "svc": MapSpec("KP_MAP_SVC4", SvcKey, SvcVal, "KP_SVC4_SIZE"),
    "backend": MapSpec("KP_MAP_BE4", U32, Backend4, "KP_BE4_SIZE"),
    "sknat": MapSpec("KP_MAP_SKNAT4", SknatKey, SknatVal, "KP_SKNAT4_SIZE", lru=True),
    "affinity": MapSpec("KP_MAP_AFF", AffKey, AffVal, "KP_AFF_SIZE", lru=True),
    "flow": MapSpec("KP_MAP_FLOW", AffKey, AffVal, "KP_FLOW_SIZE", lru=True),
    "meta": MapSpec("KP_MAP_META", U32, SvcMeta, "KP_META_SIZE"),
    "stats": MapSpec("KP_MAP_STATS", U32, U64, None, percpu=True),
    # Addresses no frontend matched (datapath/cidr_writer.py): allocated ClusterIPs, ServiceCIDRs.
    "clusterip": MapSpec("KP_MAP_CIP4", U32, CipVal, "KP_CIP4_SIZE"),
    "servicecidr": MapSpec("KP_MAP_SVCCIDR4", Cidr4Key, U32, "KP_SVCCIDR4_SIZE"),
}

# IANA protocol numbers, the kernel's sk_protocol.
PROTO_NUM = {Protocol.TCP: socket.IPPROTO_TCP, Protocol.UDP: socket.IPPROTO_UDP,
             Protocol.SCTP: 132}
PROTO_BY_NUM = {v: k for k, v in PROTO_NUM.items()}


def ip_be(ip: str) -> int:
    """Dotted IPv4 -> the u32 whose native bytes are network order."""
    return struct.unpack("=I", socket.inet_aton(ip))[0]


def ip_str(value: int) -> str:
    return socket.inet_ntoa(struct.pack("=I", value))


def port_be(port: int) -> int:
    return struct.unpack("=H", struct.pack("!H", port))[0]


def port_host(value: int) -> int:
    return struct.unpack("!H", struct.pack("=H", value))[0]


def svc_key(ip: str, port: int, proto: Protocol, slot: int = 0, scope: int = 0) -> SvcKey:
    return SvcKey(addr=ip_be(ip), port=port_be(port), proto=PROTO_NUM[proto], scope=scope,
                  slot=slot)


def backend_val(ip: str, port: int, proto: Protocol, flags: int) -> Backend4:
    return Backend4(addr=ip_be(ip), port=port_be(port), proto=PROTO_NUM[proto], flags=flags)


def key_tuple(key: SvcKey) -> tuple[str, int, Protocol]:
    return (ip_str(key.addr), port_host(key.port), PROTO_BY_NUM.get(key.proto, Protocol.TCP))


def raw(obj: ctypes.Structure | ctypes._SimpleCData) -> bytes:
    return bytes(memoryview(obj).cast("B"))
