"""The writer's rows as the kernel stores them: kp_svc keys and values, kp_backend rows and
their ids, kp_svc_meta rows, from layout.py's formats and types; addresses of either family
as struct kp_ip (layout.ip_bytes).

Rows written per endpoint (slots, backends) are packed straight into bytes: a ctypes object
per row cost more than the syscalls at 100,000 endpoints. Rows written per frontend (slot 0,
the meta row) keep the ctypes types, whose field names say what each value is.
"""
from __future__ import annotations

import struct
import sys
from collections.abc import Callable
from functools import partial

from kproxy_ebpf.datapath.write.programmed import BackendKey, HeldTable
from kproxy_ebpf.model.desired import Frontend, FrontendKey, ServicePortName
from kproxy_ebpf.model.objects import Protocol

from . import layout as L

_SVC_KEY = struct.Struct(L.MAPS["svc"].key_format)
_SVC_VAL = struct.Struct(L.MAPS["svc"].value_format).pack
_ID = struct.Struct(L.MAPS["backend"].key_format).pack
_BACKEND = struct.Struct(L.MAPS["backend"].value_format).pack

# kp_svc_meta's name fields hold a NUL-terminated C string (kproxy.h KP_NAME_LEN, ...).
NAME_MAX = L.const("KP_NAME_LEN") - 1
PORT_NAME_MAX = L.const("KP_PORT_NAME_LEN") - 1

backend_id_key = _ID                  # kp_backend's key: the backend id


def svc_keys(fkey: FrontendKey) -> Callable[[int], bytes]:
    """slot -> the kp_svc key of that row of frontend `fkey` (0: slot 0), packed straight
    from the frontend's fields, encoded once (the same bytes as layout.frontend_svc_key)."""
    return partial(_SVC_KEY.pack, L.ip_bytes(fkey.ip), L.port_be(fkey.port),
                   L.PROTO_NUM[fkey.protocol], L.SCOPE_NUM[fkey.scope])


def slot_value(backend_id: int, be_flags: int) -> bytes:
    """A slot row 1..n: the backend it names and the endpoint's state for this frontend."""
    return _SVC_VAL(backend_id, 0, 0, 0, 0, 0, be_flags, 0, 0)


def backend_row(b: BackendKey) -> bytes:
    """kp_backend of (ip, port, protocol): address and port in network byte order. The
    address leads the row (checked below), so a row is its 16 bytes and the packed rest of
    (port, protocol), which few backends differ in."""
    tail = _BACKEND_TAIL.get((b[1], b[2]))
    if tail is None:
        tail = _BACKEND_TAIL[(b[1], b[2])] = _BACKEND(
            bytes(16), int.from_bytes(b[1].to_bytes(2, "big"), sys.byteorder),
            L.PROTO_NUM[b[2]])[16:]
    return L.ip_bytes(b[0]) + tail


_BACKEND_TAIL: dict[tuple[int, Protocol], bytes] = {}
if L.STRUCT_SPECS["kp_backend"]["fields"][0] != ("addr", 0, "struct kp_ip"):
    raise ImportError("kp_backend no longer starts with its struct kp_ip addr: fix backend_row")


def head_value(fe: Frontend, svc_id: int, count: int, ranges: bool,
               table: HeldTable | None = None, lc_row: int = 0) -> L.SvcVal:
    """Slot 0: the frontend's verdict, kind, affinity and slot count (`ranges`: it has
    kp_srcrange rows the programs must check; `table`: the Maglev table it picks by;
    `lc_row`: a least-conn frontend's kp_lcrow row, in the same field: it has no table)."""
    return L.SvcVal(svc_id=svc_id, affinity_timeout=fe.affinity_timeout, count=count,
                    action=L.ACTION_NUM[fe.action], kind=L.KIND_NUM[fe.kind],
                    fe_flags=(L.FE_F_SRC_RANGES if ranges else 0)
                    | L.SCHED_FLAG.get(fe.algorithm, 0),
                    backend_id=table.table if table else lc_row,
                    maglev_size=table.size if table else 0)


def text_of(raw: bytes) -> str:
    """A fixed-size C string field back to text (meta_value's inverse). A row an older agent
    wrote may end inside a character: never a reason to fail a read."""
    return raw.split(b"\0", 1)[0].decode(errors="replace")


def _cut(text: str, size: int) -> bytes:
    """At most `size` bytes of text's UTF-8, cut between characters (a name from a static
    manifest may hold any; the API server allows ASCII only)."""
    return text.encode()[:size].decode(errors="ignore").encode()


def as_stored(spn: ServicePortName) -> ServicePortName:
    """The service port's names as the meta map gives them back (cut to its fields, ended by
    a NUL): what a read-back is compared with. Nearly every name fits and is returned as it
    is, without a copy: the drift check asks once per frontend."""
    def fits(text: str, size: int) -> bool:
        return len(text) <= size and text.isascii() and "\0" not in text

    def back(text: str, size: int) -> str:
        return text_of(_cut(text, size))
    if (fits(spn.port, PORT_NAME_MAX) and fits(spn.name, NAME_MAX)
            and fits(spn.namespace, NAME_MAX)):
        return spn
    return ServicePortName(back(spn.namespace, NAME_MAX), back(spn.name, NAME_MAX),
                           back(spn.port, PORT_NAME_MAX), spn.protocol)


def meta_value(spn: ServicePortName, view: L.MetaView) -> L.SvcMeta:
    """The service port's names and settings (for the CLI: no program reads them)."""
    flags, hc, ranges, td = view
    return L.SvcMeta(namespace=_cut(spn.namespace, NAME_MAX), name=_cut(spn.name, NAME_MAX),
                     port_name=_cut(spn.port, PORT_NAME_MAX), proto=L.PROTO_NUM[spn.protocol],
                     flags=flags, health_check_node_port=hc, source_ranges=ranges,
                     traffic_distribution=td)
