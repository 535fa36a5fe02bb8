"""layout.py against bpf/kproxy.h as the BPF compiler lays it out (no root needed).

The header is the one definition: tools/layoutgen.py compiles it for the BPF target with BTF
and writes datapath/kproxy_h.py; layout.py builds its ctypes types from that table. These tests
regenerate the table (a stale committed copy fails here), and check what the Python side
derives from it.
"""
import ctypes
import importlib.util
import ipaddress
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from kproxy_ebpf.datapath.load.paths import bpf_dir
from kproxy_ebpf.datapath.maps import kproxy_h, layout, row_format

_GEN = Path(__file__).resolve().parents[3] / "tools" / "layoutgen.py"
_spec = importlib.util.spec_from_file_location("layoutgen", _GEN)
layoutgen = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(layoutgen)

TOOLS = shutil.which("clang") and shutil.which("bpftool")


@pytest.fixture(scope="module")
def generated() -> str:
    if not TOOLS:
        pytest.fail("needs clang and bpftool (make setup installs them)")
    return layoutgen.generate()


def test_committed_table_is_current(generated):
    assert layoutgen.OUT.read_text() == generated, (
        "bpf/kproxy.h changed: run `make layout`")


@pytest.mark.parametrize("cname", sorted(kproxy_h.STRUCTS))
def test_ctypes_types_follow_the_table(cname):
    spec, cls = kproxy_h.STRUCTS[cname], layout.STRUCTS[cname]
    assert ctypes.sizeof(cls) == spec["size"]
    assert [(f, getattr(cls, f).offset) for f, _, _ in spec["fields"]] == \
        [(f, off) for f, off, _ in spec["fields"]]


def test_byte_order_is_read_from_the_typedefs():
    fields = {f: t for f, _, t in kproxy_h.STRUCTS["kp_svc_key"]["fields"]}
    assert fields["addr"] == "struct kp_ip" and fields["port"] == "be16" and fields["slot"] == "u16"
    assert {f: t for f, _, t in kproxy_h.STRUCTS["kp_ip"]["fields"]} == {"w": "be32[4]"}


def test_maps_and_constants_come_from_the_header():
    assert layout.const("KP_ACTION_REJECT") != layout.const("KP_ACTION_FORWARD")
    assert layout.MAPS["svc"].name == f"kp_svc_v{kproxy_h.MAPS['svc']['version']}"
    assert layout.MAPS["stats"].percpu and layout.MAPS["sknat"].lru
    assert layout.MAPS["stats"].default_size == layout.const("KP_STAT_MAX")
    # Kernel map names are limited to 15 characters (pin names are not, but stay short).
    assert all(len(m.name) <= 15 for m in layout.MAPS.values())
    assert set(layout.ACTION_NUM) == set(layout.Action)
    assert set(layout.KIND_NUM) == set(layout.FrontendKind)


def test_a_version_bump_is_one_edit(tmp_path, monkeypatch):
    """Bumping a map's version in KP_MAPS renames its pin everywhere, with nothing else."""
    if not TOOLS:
        pytest.fail("needs clang and bpftool")
    src = bpf_dir()
    copy = tmp_path / "bpf"
    shutil.copytree(src, copy)
    header = copy / "kproxy.h"
    text = header.read_text()
    version = kproxy_h.MAPS["backend"]["version"]
    row = next(line for line in text.splitlines() if line.strip().startswith("X(backend,"))
    bumped = row.replace(f"kp_be,{row.split('kp_be,')[1].split(',')[0]},",
                         f"kp_be,{row.split('kp_be,')[1].split(',')[0].replace(str(version), str(version + 1))},")
    assert bumped != row
    header.write_text(text.replace(row, bumped))
    monkeypatch.setattr(layoutgen, "bpf_dir", lambda: copy)
    table = {}
    exec(layoutgen.generate(), table)
    assert table["MAPS"]["backend"]["version"] == version + 1
    # bcc's declaration (lib/maps.h) derives the pin path from the same row.
    out = subprocess.run(["clang", "-E", "-P", f"-I{copy}", "-DKP_PIN_DIR=\"/x\"",
                          "-DBPF_TABLE_PINNED(t,k,v,n,s,p,f)=@pin p@", str(copy / "lib/maps.h")],
                         check=True, capture_output=True, text=True).stdout
    assert f'"/x" "/" "kp_be" "_v" "{version + 1}"' in out


@pytest.mark.parametrize("ip,port", [("10.96.0.10", 80), ("192.168.255.1", 65535), ("0.0.0.1", 1),
                                     ("fd00:96::a", 53), ("2001:db8::ffff:0:1", 1)])
def test_byte_order_round_trip(ip, port):
    key = layout.svc_key(ip, port, layout.Protocol.UDP, slot=3)
    raw = layout.raw(key)
    # Network order in memory: the address as 16 bytes (IPv4 IPv4-mapped), the port big-endian.
    assert raw[0:16] == ipaddress.IPv6Address(f"::ffff:{ip}" if "." in ip else ip).packed
    assert raw[16:18] == port.to_bytes(2, "big")
    assert raw[18] == 17 and int.from_bytes(raw[20:22], sys.byteorder) == 3
    # Back in canonical text: an IPv6 address is never shown as IPv4 unless it is IPv4-mapped.
    assert layout.key_tuple(key) == (str(ipaddress.ip_address(ip)), port, layout.Protocol.UDP)


@pytest.mark.parametrize("ip", ["10.96.0.10", "fd00:96::a"])
def test_the_writers_packed_keys_are_the_ctypes_keys(ip):
    """encode.svc_keys, which the writer packs every kp_svc key with, gives the bytes of the
    ctypes key the readers and the CLI build (layout.frontend_svc_key)."""
    from kproxy_ebpf.datapath.maps import encode
    from kproxy_ebpf.model.desired import FrontendKey, IPFamily, Scope

    for scope in Scope:
        fkey = FrontendKey(ip, 53, layout.Protocol.UDP, scope,
                           IPFamily.IPV6 if ":" in ip else IPFamily.IPV4)
        for slot in (0, 1, 300):
            assert encode.svc_keys(fkey)(slot) == layout.raw(layout.frontend_svc_key(fkey, slot))

def test_the_mapped_form_is_what_lib_ip_h_writes():
    assert layout.ip_bytes("10.1.2.3") == bytes(10) + b"\xff\xff" + bytes([10, 1, 2, 3])
    assert layout.ip_text(layout.ip_bytes("::ffff:10.1.2.3")) == "10.1.2.3"
    assert layout.ip_text(layout.ip_bytes("fd00:0:0::0:1")) == "fd00::1"
    assert layout.prefix_bits("10.0.0.0", 8) == 104 and layout.prefix_bits("fd00::", 8) == 8


def test_the_source_range_prefix_is_the_headers():
    """kp_srcrange_key's frontend part, which rows match in full (lib/srcrange.h looks up
    that plus a whole address): one constant in kproxy.h, the bits between prefixlen and saddr."""
    key = layout.SrcRangeKey
    assert layout.const("KP_SRCRANGE_FE_BITS") == 8 * (key.saddr.offset - key.fe_addr.offset)


def test_hand_written_row_formats_are_the_headers():
    """The socket modules read a few rows with struct formats of their own (a port as the
    kernel's bytes, a value in network order): each has the generated layout's offsets and
    size, so no field of bpf/kproxy.h is copied by hand unchecked."""
    from kproxy_ebpf.datapath.sockets import sock_where, stale_sockets

    def same(fmt, cname: str, port_fields=0) -> None:
        gen = row_format.struct_format(cname)
        # the port fields a module reads as bytes ("2s") are u16s ("H") in the generated one
        mine = fmt.format.replace("2s", "H", port_fields) if port_fields else fmt.format
        assert mine[1:] == gen[1:], (cname, fmt.format, gen)
        assert fmt.size == kproxy_h.STRUCTS[cname]["size"]

    same(sock_where._KEY, "kp_skwhere_key", port_fields=1)
    same(sock_where._VAL, "kp_skwhere_val")
    same(stale_sockets._SKSVC, "kp_sksvc_val")
