"""The struct-module format of each map row ('=': native order, no alignment), from the
generated layout (kproxy_h.py), so bulk reads decode rows without a ctypes object each."""
from __future__ import annotations

import struct
from typing import TypedDict, cast

from . import kproxy_h as G

IP_STRUCT = "struct kp_ip"   # either family, IPv4 as IPv4-mapped: 16 raw bytes


class StructSpec(TypedDict):
    """A struct of kproxy_h.STRUCTS: (field, offset, type as spelled) rows and the size."""
    fields: list[tuple[str, int, str]]
    size: int


# kproxy_h.py is a plain literal (mypy would see dict[str, object] rows); this is its shape.
STRUCT_SPECS = cast(dict[str, StructSpec], G.STRUCTS)

_FORMAT = {"u8": "B", "u16": "H", "u32": "I", "u64": "Q", "s64": "q", "be16": "H", "be32": "I",
           "be64": "Q", "char": "c", "int": "i"}


def struct_format(spelled: str) -> str:
    """A struct module format ('=' native order, no alignment) for a map key or value type,
    so bulk reads decode rows without a ctypes object each. Pad fields are skipped; char[]
    reads as bytes. __be fields come out as the same integers the ctypes types hold."""
    name = spelled.removeprefix("struct ")
    if name == "kp_ip":
        return "=16s"
    if name not in STRUCT_SPECS:
        return "=" + _FORMAT[name.removeprefix("__")]
    out = []
    for field_name, _, t in STRUCT_SPECS[name]["fields"]:
        if t == IP_STRUCT:
            out.append("16s")
            continue
        base, _, count = t.partition("[")
        count = count.rstrip("]")
        if field_name == "pad":
            out.append(f"{count or 1}x" if base == "u8" else f"{int(count or 1) * struct.calcsize(_FORMAT[base])}x")
        elif base == "char":
            out.append(f"{count}s")
        else:
            out.append(f"{count}{_FORMAT[base]}" if count else _FORMAT[base])
    return "=" + "".join(out)
