"""datapath/downgrade.py on real maps: at a graceful stop the previous release's kp_srcrange_v2
is made from kp_srcrange_v3 (the TC path's rows, the scope byte zeroed), pinned only once
filled, and never over an existing pin (an older agent beside us owns that one)."""
from __future__ import annotations

import ctypes
import os
from pathlib import Path

import pytest

from kproxy_ebpf.datapath.load import libbpf
from kproxy_ebpf.datapath.load.bpffs import remove_pins
from kproxy_ebpf.datapath.maps import layout as L
from kproxy_ebpf.datapath.maps.pinned import PinnedMap
from kproxy_ebpf.datapath.upgrade import downgrade
from kproxy_ebpf.model.desired import FrontendKey, Scope
from kproxy_ebpf.model.objects import IPFamily, Protocol

pytestmark = pytest.mark.root

BPFFS = Path("/sys/fs/bpf/kproxy-downgrade")
LPM_TRIE, NO_PREALLOC = 11, 1


@pytest.fixture
def srcrange():
    """An empty kp_srcrange_v3 pinned in BPFFS, as the load child makes it."""
    if BPFFS.exists():                   # a run killed hard
        remove_pins(BPFFS)
    BPFFS.mkdir(parents=True)
    spec = L.MAPS["srcrange"]
    fd = libbpf.map_create(LPM_TRIE, "kp_srcrange", ctypes.sizeof(spec.key),
                           ctypes.sizeof(spec.value), 64, NO_PREALLOC)
    try:
        libbpf.obj_pin(fd, str(BPFFS / spec.name))
    finally:
        os.close(fd)
    try:
        with PinnedMap(BPFFS / spec.name, spec) as m:
            yield m
    finally:
        remove_pins(BPFFS)


def rows_of(path: Path) -> dict[bytes, bytes]:
    with PinnedMap(path, L.MAPS["srcrange"]) as m:
        return dict(m.raw_items())


def test_the_previous_layout_gets_the_tc_rows_without_the_scope(srcrange):
    lb = ("10.250.100.5", 80, Protocol.TCP)
    ext = L.srcrange_key(FrontendKey(*lb, Scope.EXT, IPFamily.IPV4), "10.250.0.250/32")
    sock = L.srcrange_key(FrontendKey(*lb, Scope.SOCK, IPFamily.IPV4), "10.250.0.250/32")
    other = L.srcrange_key(FrontendKey(*lb, Scope.EXT, IPFamily.IPV4), "192.0.2.0/24")
    for key in (ext, sock, other):
        srcrange.put(key, L.MAPS["srcrange"].value(1))
    assert downgrade.write_previous(BPFFS) == {"kp_srcrange_v2": 2}
    old = rows_of(BPFFS / "kp_srcrange_v2")
    ext.scope = other.scope = 0
    assert set(old) == {bytes(ext), bytes(other)}
    # The same size, type and flags as the current map: only the key's meaning changed.
    with PinnedMap(BPFFS / "kp_srcrange_v2", L.MAPS["srcrange"]) as v2:
        a, b = libbpf.map_info(v2.fd), libbpf.map_info(srcrange.fd)
        assert (a.type, a.key_size, a.value_size, a.max_entries, a.map_flags, a.name) == \
            (b.type, b.key_size, b.value_size, b.max_entries, b.map_flags, b.name)

    # A pin that exists is someone else's: left as it is.
    srcrange.delete(other)
    assert downgrade.write_previous(BPFFS) == {}
    assert len(rows_of(BPFFS / "kp_srcrange_v2")) == 2


def test_nothing_is_made_for_a_map_without_rows(srcrange):
    srcrange.put(L.srcrange_key(FrontendKey("10.250.100.5", 80, Protocol.TCP, Scope.SOCK,
                                            IPFamily.IPV4), "10.250.0.250/32"),
                 L.MAPS["srcrange"].value(1))
    assert downgrade.write_previous(BPFFS) == {}
    assert not (BPFFS / "kp_srcrange_v2").exists()
