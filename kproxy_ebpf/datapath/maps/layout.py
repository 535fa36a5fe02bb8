"""The Python view of bpf/kproxy.h: ctypes types, constants and the decode tables.

Nothing here is written by hand twice: kproxy_h.py (generated from the header's BTF by
tools/layoutgen.py) gives every struct's fields, offsets and sizes, every enum constant and the map
table, and the ctypes types are built from it at import (and checked against its offsets).
tests/unit/datapath/test_layout.py regenerates the table and fails when it is stale; the agent also
compares the types with bcc's view of the compiled maps and the kernel's key/value sizes of
each pinned map before it writes a byte.

All byte-order conversion lives in the encode/decode helpers here: __be fields hold the
integer whose in-memory bytes are network order, exactly what the kernel stores.
"""
from __future__ import annotations

import ctypes
import ipaddress
import socket
import struct
from typing import TYPE_CHECKING, Any, TypeAlias

from kproxy_ebpf.model.desired import Action, Backend, FrontendKey, FrontendKind, Scope, ServiceInfo
from kproxy_ebpf.model.objects import IPFamily, LBAlgorithm, Protocol

from . import kproxy_h as G
from .row_format import IP_STRUCT, STRUCT_SPECS, struct_format

# A map key's, value's or field's ctypes type (a string: _SimpleCData takes no [] at run time).
CType: TypeAlias = "type[ctypes._SimpleCData[Any]] | type[ctypes.Structure] | type[ctypes.Array[Any]]"

_SCALARS: dict[str, type[ctypes._SimpleCData[Any]]] = {
    "u8": ctypes.c_uint8, "u16": ctypes.c_uint16, "u32": ctypes.c_uint32,
    "u64": ctypes.c_uint64, "s64": ctypes.c_int64, "be16": ctypes.c_uint16, "be32": ctypes.c_uint32,
    "be64": ctypes.c_uint64, "char": ctypes.c_char,
    "int": ctypes.c_int32}        # socket storage's key (the kernel wants a BTF int)

STRUCTS: dict[str, type[ctypes.Structure]] = {}


# struct kp_ip (either family, IPv4 as IPv4-mapped) as 16 raw bytes: `bytes(row.addr)` is the
# address in network order, which ip_text/ip16 convert; "16s" in bulk reads.
IP16 = ctypes.c_uint8 * 16


def _ctype(spelled: str) -> CType:
    """A field type as tools/layoutgen.py spells it (u32, be16, char[64], struct x, u8[2])."""
    if spelled.endswith("]"):
        base, _, count = spelled[:-1].partition("[")
        return _ctype(base) * int(count)
    if spelled in (IP_STRUCT, "kp_ip"):    # a field's type, or a map's key as KP_MAPS names it
        return IP16
    name = spelled.removeprefix("struct ")
    if name in STRUCT_SPECS:
        return _struct(name)
    return _SCALARS[spelled.removeprefix("__")]


def _struct(cname: str) -> type[ctypes.Structure]:
    if cname not in STRUCTS:
        spec = STRUCT_SPECS[cname]
        cls = type(cname, (ctypes.Structure,), {
            "_fields_": [(f, _ctype(t)) for f, _, t in spec["fields"]], "__doc__": f"struct {cname}"})
        # ctypes lays fields out by natural alignment, as clang does for these types; a
        # difference would mean a type ctypes aligns otherwise (refuse rather than guess).
        for f, off, _ in spec["fields"]:
            if getattr(cls, f).offset != off:
                raise ImportError(f"{cname}.{f}: ctypes offset {getattr(cls, f).offset} != {off}")
        if ctypes.sizeof(cls) != spec["size"]:
            raise ImportError(f"{cname}: ctypes size {ctypes.sizeof(cls)} != {spec['size']}")
        STRUCTS[cname] = cls
    return STRUCTS[cname]


for _name in STRUCT_SPECS:
    _struct(_name)

# The row types by name. Their fields come from kproxy_h.py at import, so mypy knows each
# only as a ctypes.Structure (whose field attributes are Any).
if TYPE_CHECKING:
    class SvcKey(ctypes.Structure): ...
    class SvcVal(ctypes.Structure): ...
    class BackendRow(ctypes.Structure): ...
    class SknatKey(ctypes.Structure): ...
    class SknatVal(ctypes.Structure): ...
    class AffKey(ctypes.Structure): ...
    class AffVal(ctypes.Structure): ...
    class SvcMeta(ctypes.Structure): ...
    class CipVal(ctypes.Structure): ...
    class CidrKey(ctypes.Structure): ...
    class LbReq(ctypes.Structure): ...
    class LbRes(ctypes.Structure): ...
    class CtKey(ctypes.Structure): ...
    class CtVal(ctypes.Structure): ...
    class TcCfg(ctypes.Structure): ...
    class SrcRangeKey(ctypes.Structure): ...
    class NssrcKey(ctypes.Structure): ...
else:
    SvcKey = STRUCTS["kp_svc_key"]
    SvcVal = STRUCTS["kp_svc_val"]
    BackendRow = STRUCTS["kp_backend"]
    SknatKey = STRUCTS["kp_sknat_key"]
    SknatVal = STRUCTS["kp_sknat_val"]
    AffKey = STRUCTS["kp_aff_key"]
    AffVal = STRUCTS["kp_aff_val"]
    SvcMeta = STRUCTS["kp_svc_meta"]
    CipVal = STRUCTS["kp_cip_val"]
    CidrKey = STRUCTS["kp_cidr_key"]
    LbReq = STRUCTS["kp_lb_req"]
    LbRes = STRUCTS["kp_lb_res"]
    CtKey = STRUCTS["kp_ct_key"]
    CtVal = STRUCTS["kp_ct_val"]
    TcCfg = STRUCTS["kp_tc_cfg"]
    SrcRangeKey = STRUCTS["kp_srcrange_key"]
    NssrcKey = STRUCTS["kp_nssrc_key"]


def const(name: str) -> int:
    return G.ENUMS[name]


def enum_names(prefix: str) -> dict[int, str]:
    """value -> lower-case name without the prefix, e.g. enum_names("KP_STAT_")."""
    return {v: k.removeprefix(prefix).lower() for k, v in G.ENUMS.items() if k.startswith(prefix)}


U32 = ctypes.c_uint32
U64 = ctypes.c_uint64


class MapSpec:
    """A pinned map of KP_MAPS: pin name (<name>_v<version>), key and value types, size knob."""

    def __init__(self, mid: str, row: dict):
        self.id, self.base, self.version = mid, row["name"], row["version"]
        self.type = row["type"]
        self.key, self.value = _ctype(row["key"]), _ctype(row["value"])
        self.by_addr = row["key"] == "kp_ip"        # keyed by a bare address (struct kp_ip)
        self.key_format, self.value_format = struct_format(row["key"]), struct_format(row["value"])
        self.size_macro, self.default_size = row["size_macro"], row["size"]
        self.lru = self.type.startswith("lru_")
        # One row per socket, reached through the socket: no size, nothing to list or write.
        self.per_socket = self.type == "sk_storage"
        self.percpu = self.type.startswith("percpu_")

    @property
    def name(self) -> str:
        return f"{self.base}_v{self.version}"


MAPS: dict[str, MapSpec] = {mid: MapSpec(mid, row) for mid, row in G.MAPS.items()}

# IANA protocol numbers, the kernel's sk_protocol.
PROTO_NUM = {Protocol.TCP: socket.IPPROTO_TCP, Protocol.UDP: socket.IPPROTO_UDP,
             Protocol.SCTP: 132}
PROTO_BY_NUM = {v: k for k, v in PROTO_NUM.items()}

# Decode tables between the desired state's enums and the header's.
ACTION_NUM = {a: const(f"KP_ACTION_{a.name}") for a in Action}
ACTION_BY_NUM = {v: k for k, v in ACTION_NUM.items()}
KIND_NUM = {k: const(f"KP_KIND_{k.name}") for k in FrontendKind}
KIND_BY_NUM = {v: k for k, v in KIND_NUM.items()}
F_LOCAL, F_TERMINATING, F_NOT_READY = (const("KP_BE_F_LOCAL"), const("KP_BE_F_TERMINATING"),
                                       const("KP_BE_F_NOT_READY"))
STAT_NAMES = {v: n for v, n in enum_names("KP_STAT_").items() if n != "max"}
CT_STATE_NAMES = {const(f"KP_CT_{n.upper()}"): n for n in ("new", "established", "closing",
                                                          "closed")}
_LIFE_TIME = const("KP_CT_LIFE_TIME_SHIFT")
_LIFE_FIELDS = {"flags": (0, const("KP_CT_LIFE_FLAGS")),
                "state": (const("KP_CT_LIFE_STATE_SHIFT"), const("KP_CT_LIFE_STATE")),
                "seen_reply": (const("KP_CT_LIFE_SEEN_REPLY").bit_length() - 1, 1),
                "expires": (_LIFE_TIME, (1 << (64 - _LIFE_TIME)) - 1)}


def _life_property(name: str) -> property:
    """A field of kp_ct_val.life (kproxy.h enum kp_ct_life) by name; expires in ns, as the
    programs compare it (its low KP_CT_LIFE_TIME_SHIFT bits cleared)."""
    shift, mask = _LIFE_FIELDS[name]
    scale = _LIFE_TIME if name == "expires" else 0

    def get(self) -> int:
        return ((self.life >> shift) & mask) << scale

    def put(self, value: int) -> None:
        self.life = (self.life & ~(mask << shift)) | (((value >> scale) & mask) << shift)

    return property(get, put, doc=f"{name}, from kp_ct_val.life")


# The fields packed into `life`, by name as well (`ct list`, tests, CtVal(state=...)).
for _name in _LIFE_FIELDS:
    setattr(CtVal, _name, _life_property(_name))

CT_F_POD, CT_F_SNAT = const("KP_CT_F_POD"), const("KP_CT_F_SNAT")


def ct_key(src: str, sport: int, dst: str, dport: int, proto: int) -> CtKey:
    """A kp_ct/kp_rnat tuple of either family (ports in host order)."""
    return CtKey(saddr=ip16(src), daddr=ip16(dst), sport=port_be(sport), dport=port_be(dport),
                 proto=proto)


def ct_scope(flags: int) -> Scope:
    """The scope of the frontend a TC flow was balanced by: tc_lb.c marks the flows of the
    per-packet ClusterIP path (scope SOCK) KP_CT_F_POD, those from outside not."""
    return Scope.SOCK if flags & CT_F_POD else Scope.EXT


def ct_keeps_backend(proto: int) -> bool:
    """Whether a tracked flow keeps its backend whatever the frontend now lists: a TCP
    connection, like a connect() the socket path translated once, until it ends (lib/ct_pkt.h
    kp_ct_usable, where a SYN on such a flow still re-balances: a question about a packet,
    which the agent's purge never asks)."""
    return proto == PROTO_NUM[Protocol.TCP]


FE_F_SRC_RANGES = const("KP_FE_F_SRC_RANGES")
# slot 0's scheduler flag (bpf/lib/sched.h); neither: at random, or by its Maglev table
SCHED_FLAG = {LBAlgorithm.ROUND_ROBIN: const("KP_FE_F_ROUND_ROBIN"),
              LBAlgorithm.LEAST_CONN: const("KP_FE_F_LEAST_CONN")}


SCHED_ANY = sum(SCHED_FLAG.values())


def scheduler_of(fe_flags: int) -> LBAlgorithm:
    """The scheduler slot 0's flags name (RANDOM when none: Maglev is told by its table)."""
    return next((a for a, f in SCHED_FLAG.items() if fe_flags & f), LBAlgorithm.RANDOM)
_SRCRANGE_FE_BITS = const("KP_SRCRANGE_FE_BITS")     # kp_srcrange_key's frontend part
SCOPE_SOCK = const("KP_SCOPE_SOCK")
SCOPE_EXT = const("KP_SCOPE_EXT")
SCOPE_NUM = {Scope.SOCK: SCOPE_SOCK, Scope.EXT: SCOPE_EXT}
SCOPE_BY_NUM = {v: k for k, v in SCOPE_NUM.items()}


def backend_flags(b: Backend) -> int:
    """The endpoint's state as a frontend uses it (kept in that frontend's slot row)."""
    return ((F_LOCAL if b.local else 0) | (F_TERMINATING if b.terminating else 0)
            | (0 if b.ready else F_NOT_READY))


TRAFFIC_DISTRIBUTION = {None: const("KP_TD_NONE"), "PreferClose": const("KP_TD_PREFER_CLOSE"),
                        "PreferSameZone": const("KP_TD_PREFER_SAME_ZONE"),
                        "PreferSameNode": const("KP_TD_PREFER_SAME_NODE")}
TRAFFIC_DISTRIBUTION_BY_NUM = {v: k for k, v in TRAFFIC_DISTRIBUTION.items()}
MetaView = tuple[int, int, int, int]     # flags, healthCheckNodePort, source ranges, distribution


_META_ETP_LOCAL, _META_ITP_LOCAL, _TD_OTHER = (const("KP_META_F_ETP_LOCAL"),
                                               const("KP_META_F_ITP_LOCAL"), const("KP_TD_OTHER"))


def meta_view(info: ServiceInfo) -> MetaView:
    """What kp_svc_meta holds of a Service's settings."""
    flags = ((_META_ETP_LOCAL if info.external_local else 0)
             | (_META_ITP_LOCAL if info.internal_local else 0))
    return (flags, info.health_check_node_port, min(len(info.source_ranges), 255),
            TRAFFIC_DISTRIBUTION.get(info.traffic_distribution, _TD_OTHER))


def policy_of(view: MetaView) -> dict:
    """A meta row's settings for the CLI."""
    flags, hc, ranges, td = view
    return {"externalTrafficPolicy": "Local" if flags & const("KP_META_F_ETP_LOCAL") else "Cluster",
            "internalTrafficPolicy": "Local" if flags & const("KP_META_F_ITP_LOCAL") else "Cluster",
            "healthCheckNodePort": hc, "loadBalancerSourceRanges": ranges,
            "trafficDistribution": TRAFFIC_DISTRIBUTION_BY_NUM.get(td, "other")}


def backend_state(flags: int) -> str:
    state = "terminating" if flags & F_TERMINATING else "ready"
    if flags & F_NOT_READY:
        state += ",serving" if flags & F_TERMINATING else ",not-ready"
    return state + (",local" if flags & F_LOCAL else "")


def ip_be(ip: str) -> int:
    """Dotted IPv4 -> the u32 whose native bytes are network order (a __be32 field)."""
    return struct.unpack("=I", socket.inet_aton(ip))[0]


_V4_MAPPED = bytes(10) + b"\xff\xff"       # RFC 4291 2.5.5.2; lib/ip.h's kp_ip_from4


def ip_bytes(ip: str) -> bytes:
    """An address of either family as struct kp_ip holds it: 16 bytes in network order, an
    IPv4 address IPv4-mapped. Raises ValueError for text that is no address."""
    if ":" in ip:
        return socket.inet_pton(socket.AF_INET6, ip)
    return _V4_MAPPED + socket.inet_aton(ip)


def ip_text(raw16: bytes | ctypes.Array) -> str:
    """A struct kp_ip in its canonical text form (RFC 5952 for IPv6, dotted for IPv4-mapped)."""
    b = bytes(raw16)
    if b[:12] == _V4_MAPPED:
        return socket.inet_ntoa(b[12:])
    return ipaddress.IPv6Address(b).compressed


def ip_is4(raw16: bytes | ctypes.Array) -> bool:
    return bytes(raw16)[:12] == _V4_MAPPED


def ip16(ip: str) -> ctypes.Array:
    """A struct kp_ip field value for the ctypes rows."""
    return IP16.from_buffer_copy(ip_bytes(ip))


ip_str = ip_text           # an address field of any row in text


addr_key = ip_bytes         # the key of a map keyed by a bare struct kp_ip (kp_cip, kp_extaddr, ...)


def port_be(port: int) -> int:
    return struct.unpack("=H", struct.pack("!H", port))[0]


def port_host(value: int) -> int:
    return struct.unpack("!H", struct.pack("=H", value))[0]


def svc_key(ip: str, port: int, proto: Protocol, slot: int = 0, scope: int = 0) -> SvcKey:
    return SvcKey(addr=ip16(ip), port=port_be(port), proto=PROTO_NUM[proto], scope=scope,
                  slot=slot)


def backend_val(ip: str, port: int, proto: Protocol) -> BackendRow:
    return BackendRow(addr=ip16(ip), port=port_be(port), proto=PROTO_NUM[proto])


def key_tuple(key: SvcKey) -> tuple[str, int, Protocol]:
    return (ip_str(key.addr), port_host(key.port), PROTO_BY_NUM.get(key.proto, Protocol.TCP))


def frontend_svc_key(fkey: FrontendKey, slot: int = 0) -> SvcKey:
    """The map key of slot `slot` of a desired-state frontend (kp_svc, either family)."""
    return svc_key(fkey.ip, fkey.port, fkey.protocol, slot=slot, scope=SCOPE_NUM[fkey.scope])


def frontend_key(key: SvcKey) -> FrontendKey:
    """The desired-state frontend key of a map row (the inverse of frontend_svc_key)."""
    ip, port, proto = key_tuple(key)
    return FrontendKey(ip, port, proto, SCOPE_BY_NUM.get(key.scope, Scope.SOCK),
                       IPFamily.IPV4 if ip_is4(key.addr) else IPFamily.IPV6)


def srcrange_key(fkey: FrontendKey, cidr: str) -> SrcRangeKey:
    """The kp_srcrange row of source range `cidr` (canonical, the frontend's family) of
    frontend `fkey`."""
    addr, _, bits = cidr.partition("/")
    return SrcRangeKey(prefixlen=_SRCRANGE_FE_BITS + prefix_bits(addr, int(bits)),
                       fe_addr=ip16(fkey.ip), fe_port=port_be(fkey.port),
                       proto=PROTO_NUM[fkey.protocol], scope=SCOPE_NUM[fkey.scope],
                       saddr=ip16(addr))


def srcrange_of(key: SrcRangeKey) -> tuple[FrontendKey, str]:
    """(frontend key, source range) of a kp_srcrange row."""
    ip = ip_text(key.fe_addr)
    fkey = FrontendKey(ip, port_host(key.fe_port), PROTO_BY_NUM.get(key.proto, Protocol.TCP),
                       SCOPE_BY_NUM.get(key.scope, Scope.EXT),
                       IPFamily.IPV4 if ip_is4(key.fe_addr) else IPFamily.IPV6)
    return fkey, f"{ip_text(key.saddr)}/{prefix_len(key.saddr, key.prefixlen - _SRCRANGE_FE_BITS)}"


def prefix_bits(addr: str, length: int) -> int:
    """A prefix length as an LPM trie over struct kp_ip counts it: an IPv4 prefix covers the
    96 bits of its IPv4-mapped prefix too."""
    return length if ":" in addr else 96 + length


def prefix_len(raw16: bytes | ctypes.Array, bits: int) -> int:
    """The inverse of prefix_bits for a trie row's address and prefix length."""
    return bits - 96 if ip_is4(raw16) else bits


def raw(obj: ctypes.Structure | ctypes._SimpleCData | bytes) -> bytes:
    """A row's bytes as the kernel keys it (rows the writer packed itself are bytes already)."""
    return obj if isinstance(obj, bytes) else bytes(memoryview(obj).cast("B"))
