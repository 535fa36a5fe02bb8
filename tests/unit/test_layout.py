"""layout.py against bpf/kproxy.h as the BPF compiler lays it out (no root needed).

clang compiles the header for the BPF target with BTF; bpftool reads the BTF back. Every size
and field offset of every mirrored struct must agree: bcc hands the kernel our raw buffers with
no size, so a mismatch would corrupt memory silently rather than fail.
"""
import ctypes
import json
import shutil
import subprocess

import pytest

from kproxy_ebpf.datapath import layout
from kproxy_ebpf.datapath.paths import bpf_dir

TOOLS = shutil.which("clang") and shutil.which("bpftool")
pytestmark = pytest.mark.skipif(not TOOLS, reason="needs clang and bpftool (make setup installs them)")


@pytest.fixture(scope="module")
def btf_structs(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("btf")
    src = tmp / "layout.c"
    # Declaring one object of each type makes clang emit its BTF.
    src.write_text('#include "kproxy.h"\n' + "".join(
        f"struct {name} probe_{name};\n" for name in layout.STRUCTS))
    obj = tmp / "layout.o"
    subprocess.run(["clang", "-target", "bpf", "-g", "-O2", "-c", str(src), "-o", str(obj),
                    f"-I{bpf_dir()}", "-I/usr/include/x86_64-linux-gnu"], check=True)
    dump = subprocess.run(["bpftool", "-j", "btf", "dump", "file", str(obj)], check=True,
                          capture_output=True, text=True).stdout
    return {t["name"]: t for t in json.loads(dump)["types"] if t.get("kind") == "STRUCT"}


@pytest.mark.parametrize("cname", sorted(layout.STRUCTS))
def test_struct_matches_btf(btf_structs, cname):
    mirror = layout.STRUCTS[cname]
    btf = btf_structs[cname]
    assert ctypes.sizeof(mirror) == btf["size"], f"{cname}: size"
    members = {m["name"]: m["bits_offset"] // 8 for m in btf["members"]}
    ours = {name: getattr(mirror, name).offset for name, *_ in mirror._fields_}
    assert ours == members, f"{cname}: field names/offsets differ"


def test_constants_come_from_the_header():
    c = layout.constants()
    assert c["KP_ACTION_REJECT"] != c["KP_ACTION_FORWARD"]
    assert c["KP_MAP_SVC4"] == "kp_svc4_v1"
    # Kernel map names are limited to 15 characters.
    assert all(len(str(c[m.macro])) <= 15 for m in layout.MAPS.values())


@pytest.mark.parametrize("ip,port", [("10.96.0.10", 80), ("192.168.255.1", 65535), ("0.0.0.1", 1)])
def test_byte_order_round_trip(ip, port):
    key = layout.svc_key(ip, port, layout.Protocol.UDP, slot=3)
    raw = layout.raw(key)
    # Network order in memory: the address bytes as written, the port big-endian.
    assert raw[0:4] == bytes(int(x) for x in ip.split("."))
    assert raw[4:6] == port.to_bytes(2, "big")
    assert raw[6] == 17 and int.from_bytes(raw[8:10], "little") == 3
    assert layout.key_tuple(key) == (ip, port, layout.Protocol.UDP)
