"""The agent refuses a pinned map whose layout differs from layout.py (a map left by an agent of
another version): bcc would adopt it silently and every write would corrupt it."""
import ctypes
import os
from pathlib import Path

import pytest

from kproxy_ebpf.datapath.load import libbpf
from kproxy_ebpf.datapath.load.bpffs import remove_pins
from kproxy_ebpf.datapath.load.sock_hooks import SockDatapath
from kproxy_ebpf.datapath.maps import layout as L
from kproxy_ebpf.datapath.maps.pinned import LayoutMismatch

pytestmark = pytest.mark.root

BPF_MAP_TYPE_HASH = 1


def test_a_pinned_map_with_another_layout_is_refused(lab):
    node = lab.node("node2")
    bpffs = Path(node.bpffs)
    bpffs.mkdir(exist_ok=True)
    lib = ctypes.CDLL("libbpf.so.1", use_errno=True)
    lib.bpf_map_create.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_uint, ctypes.c_uint,
                                   ctypes.c_uint, ctypes.c_void_p]
    spec = L.MAPS["svc"]
    key, value = ctypes.sizeof(spec.key), ctypes.sizeof(spec.value)
    # The same pin name with a value 4 bytes longer: a map no agent of this version wrote.
    fd = lib.bpf_map_create(BPF_MAP_TYPE_HASH, spec.base.encode(), key, value + 4, 64, None)
    assert fd >= 0
    try:
        libbpf.obj_pin(fd, str(bpffs / spec.name))
        dp = SockDatapath(bpffs, Path(node.cgroup))
        with pytest.raises(LayoutMismatch,
                           match=f"{key}/{value + 4} bytes, layout.py expects {key}/{value}"):
            dp.load()
        assert not (bpffs / "links").exists(), "nothing was attached"
    finally:
        os.close(fd)
        remove_pins(bpffs)


def test_maps_of_an_older_layout_are_unpinned_once_the_new_programs_are_attached(lab):
    """An upgrade to a new map version leaves the old maps pinned; they are read by the old
    programs until ours replace them in the links, and removed right after."""
    node = lab.node("node2")
    bpffs = Path(node.bpffs)
    bpffs.mkdir(exist_ok=True)
    spec = L.MAPS["svc"]
    old = f"{spec.base}_v{spec.version - 1}" if spec.version > 1 else f"{spec.base}_v0"
    lib = ctypes.CDLL("libbpf.so.1", use_errno=True)
    lib.bpf_map_create.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_uint, ctypes.c_uint,
                                   ctypes.c_uint, ctypes.c_void_p]
    fd = lib.bpf_map_create(BPF_MAP_TYPE_HASH, spec.base.encode(), 12, 16, 64, None)
    assert fd >= 0
    dp = SockDatapath(bpffs, Path(node.cgroup))
    try:
        libbpf.obj_pin(fd, str(bpffs / old))
        dp.load()
        assert (bpffs / old).exists(), "loading alone keeps it: old programs may still run"
        dp.attach()
        assert not (bpffs / old).exists()
        assert (bpffs / spec.name).exists()
    finally:
        os.close(fd)
        dp.close()
        remove_pins(bpffs)


def test_this_kernel_passes_the_start_up_probe(lab):
    from kproxy_ebpf.datapath.load import kernel

    assert kernel.missing() == []
    kernel.require(lab.node("node1").cgroup)
