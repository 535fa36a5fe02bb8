"""Generates layout_gen.py from bpf/kproxy.h: `python -m kproxy_ebpf.datapath.layoutgen`.

The header is the one definition. clang compiles it for the BPF target with BTF, and bpftool
reads the BTF back: every struct's size and field offsets, each field's type (the __be
typedefs carry byte order) and every enumerator. The map table (KP_MAPS) comes from the
preprocessor. Nothing is parsed with regular expressions, and the result is a plain table that
layout.py turns into ctypes types. tests/unit/test_layout.py regenerates it and fails when the
committed copy is stale, so changing the header without regenerating cannot go unnoticed.
"""
from __future__ import annotations

import json
import pprint
import subprocess
import sys
import tempfile
from pathlib import Path

from .paths import bpf_dir

OUT = Path(__file__).with_name("layout_gen.py")

_ANCHOR = """#include "kproxy.h"
#define KP_GEN_MAP(id, name, version, type, key, value, size, flags) key id##_key; value id##_value;
#define KP_GEN_ENUM(e) enum e e##_anchor;
#define KP_GEN_STRUCT(s) struct s s##_anchor;
struct kp_layout_anchor {
	KP_MAPS(KP_GEN_MAP) KP_ENUMS(KP_GEN_ENUM) KP_EXTRA_STRUCTS(KP_GEN_STRUCT)
};
struct kp_layout_anchor kp_layout_anchor;
"""

_TABLE = """#include "kproxy.h"
#define KP_GEN_ROW(id, name, version, type, key, value, size, flags) \
	@kpmap|id|name|version|type|key|value|#size|size|flags|
KP_MAPS(KP_GEN_ROW)
"""

def _clang(args: list[str], src: str, tmp: Path) -> str:
    path = tmp / "gen.c"
    path.write_text(src)
    cmd = ["clang", "-target", "bpf", f"-I{bpf_dir()}", "-I/usr/include/x86_64-linux-gnu",
           *args, str(path)]
    return subprocess.run(cmd, check=True, capture_output=True, text=True).stdout


def _btf_types(tmp: Path) -> dict[int, dict]:
    obj = tmp / "gen.o"
    _clang(["-g", "-O2", "-c", "-o", str(obj)], _ANCHOR, tmp)
    dump = subprocess.run(["bpftool", "-j", "btf", "dump", "file", str(obj)], check=True,
                          capture_output=True, text=True).stdout
    return {t["id"]: t for t in json.loads(dump)["types"]}


def _type_name(types: dict[int, dict], tid: int) -> str:
    """A field type as layout.py spells it: u8..u64, be16/be32/be64, char, or T[N]."""
    t = types[tid]
    kind = t["kind"]
    if kind == "TYPEDEF":
        name = t["name"]
        if name.startswith("__be") or name.startswith("__u"):
            return name[2:]
        return _type_name(types, t["type_id"])
    if kind == "INT":
        if t["name"] == "char":
            return "char"
        return f"{'s' if t.get('encoding') == 'SIGNED' else 'u'}{t['size'] * 8}"
    if kind == "ARRAY":
        return f"{_type_name(types, t['type_id'])}[{t['nr_elems']}]"
    if kind == "STRUCT":
        return f"struct {t['name']}"
    if kind == "ENUM":
        return f"u{t['size'] * 8}"
    raise ValueError(f"unsupported BTF kind {kind} in kproxy.h")


def generate() -> str:
    with tempfile.TemporaryDirectory(prefix="kproxy-layoutgen-") as tmpdir:
        tmp = Path(tmpdir)
        types = _btf_types(tmp)
        table = _clang(["-E", "-P"], _TABLE, tmp)

    enums: dict[str, int] = {}
    structs: dict[str, dict] = {}
    for t in types.values():
        if t["kind"] == "ENUM":
            enums.update({v["name"]: v["val"] for v in t["values"]})
        elif t["kind"] == "STRUCT" and t["name"].startswith("kp_") and \
                t["name"] != "kp_layout_anchor":
            structs[t["name"]] = {"size": t["size"], "fields": [
                (m["name"], m["bits_offset"] // 8, _type_name(types, m["type_id"]))
                for m in t["members"]]}

    maps: dict[str, dict] = {}
    for row in table.split("@kpmap|")[1:]:
        mid, name, version, mtype, key, value, knob, size, flags = (
            x.strip() for x in row.split("|")[:9])
        knob = knob.strip('"')
        maps[mid] = {"name": name, "version": int(version), "type": mtype,
                     "key": key.removeprefix("struct ").strip(),
                     "value": value.removeprefix("struct ").strip(),
                     "size_macro": knob if knob.startswith("KP_") and knob.endswith("_SIZE")
                     else None,
                     "size": int(size) if size.isdigit() else enums[size],
                     "flags": int(flags)}

    body = "\n\n".join(f"{name} = {pprint.pformat(value, width=96, sort_dicts=True)}"
                       for name, value in (("ENUMS", enums), ("STRUCTS", structs),
                                           ("MAPS", maps)))
    return ('"""Generated from bpf/kproxy.h by `python -m kproxy_ebpf.datapath.layoutgen`: do '
            'not edit."""\n# flake8: noqa\n\n' + body + "\n")


def main() -> int:
    text = generate()
    OUT.write_text(text)
    print(f"wrote {OUT}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
