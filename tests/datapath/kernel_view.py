"""The kernel's own view of a pinned map's rows, for checking what `maps dump` prints: the raw
bytes as `bpftool map dump` reads them, decoded here independently of the CLI's reader,
straight from the field types tools/layoutgen.py read out of bpf/kproxy.h's BTF (kproxy_h.py):
a __be field is big-endian, every other integer little-endian (this machine's order), an
address is struct kp_ip's 16 bytes."""
from __future__ import annotations

import ipaddress
import json
import subprocess

from kproxy_ebpf.datapath.maps import kproxy_h as G

_SIZES = {"u8": 1, "u16": 2, "u32": 4, "u64": 8, "s32": 4, "s64": 8, "be16": 2, "be32": 4,
          "be64": 8, "int": 4, "char": 1}


def bpftool_rows(pin: str) -> list[tuple[bytes, object]]:
    """(key bytes, value bytes or [per-CPU value bytes]) of every row of a pinned map."""
    out = subprocess.run(["bpftool", "-j", "map", "dump", "pinned", pin], capture_output=True,
                         text=True, check=True, timeout=60).stdout
    rows = []
    for e in json.loads(out):
        key = bytes(int(x, 16) for x in e["key"])
        if "values" in e:
            value = [bytes(int(x, 16) for x in v["value"]) for v in e["values"]]
        else:
            value = bytes(int(x, 16) for x in e["value"])
        rows.append((key, value))
    return rows


def _ip(raw: bytes) -> str | None:
    if not any(raw):
        return None
    a = ipaddress.IPv6Address(raw)
    return str(a.ipv4_mapped) if a.ipv4_mapped else a.compressed


def _scalar(spelled: str, raw: bytes) -> int:
    return int.from_bytes(raw, "big" if spelled.startswith("be") else "little",
                          signed=spelled == "int" or spelled.startswith("s"))


def decode(spelled: str, raw: bytes) -> object:
    """A key or value type as KP_MAPS names it (kp_ct_key, __u32, kp_ip) from raw bytes."""
    name = spelled.removeprefix("struct ").removeprefix("__")
    if name == "kp_ip":
        return _ip(raw)
    if name not in G.STRUCTS:
        return _scalar(name, raw)
    out = {}
    for field, off, t in G.STRUCTS[name]["fields"]:
        if field == "pad":
            continue
        if t == "struct kp_ip":
            out[field] = _ip(raw[off:off + 16])
        elif t.startswith("struct "):
            size = G.STRUCTS[t.removeprefix("struct ")]["size"]
            out[field] = decode(t, raw[off:off + size])
        elif t.endswith("]"):
            base, _, count = t[:-1].partition("[")
            width = _SIZES[base]
            items = [raw[off + i * width:off + (i + 1) * width] for i in range(int(count))]
            out[field] = (b"".join(items).split(b"\0", 1)[0].decode(errors="replace")
                          if base == "char" else [_scalar(base, x) for x in items])
        else:
            out[field] = _scalar(t, raw[off:off + _SIZES[t]])
    return out
