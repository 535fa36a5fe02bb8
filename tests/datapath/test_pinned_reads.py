"""Reading whole maps in batches (what `status`, `maps dump`, `check` and restore do) for every
map type the agent pins, with keys longer than the 8 bytes a hash map's batch position takes:
an LPM trie's batch position is its last key, and a buffer sized for a hash map was overrun."""
import ipaddress
import os
import tempfile
from pathlib import Path

import pytest

from kproxy_ebpf.datapath.load import libbpf
from kproxy_ebpf.datapath.load.bpffs import ensure_bpffs
from kproxy_ebpf.datapath.maps import layout as L
from kproxy_ebpf.datapath.maps.pinned import PinnedMap
from kproxy_ebpf.model.desired import FrontendKey, Scope
from kproxy_ebpf.model.objects import IPFamily, Protocol

pytestmark = pytest.mark.root

BPF_MAP_TYPE_LPM_TRIE = 11
BPF_F_NO_PREALLOC = 1
ROWS = 2500             # more than two batches of PinnedMap._BATCH


@pytest.fixture
def bpffs():
    ensure_bpffs(Path("/sys/fs/bpf/kproxy-test"))
    with tempfile.TemporaryDirectory(dir="/sys/fs/bpf/kproxy-test", prefix="kproxy-test-pinned-") as d:
        yield Path(d)
    Path("/sys/fs/bpf/kproxy-test").rmdir()


@pytest.mark.parametrize("family", [IPFamily.IPV4, IPFamily.IPV6])
def test_an_lpm_trie_with_long_keys_is_read_whole_in_batches(bpffs, family):
    spec = L.MAPS["srcrange"]
    key_size, value_size = (len(bytes(t())) for t in (spec.key, spec.value))
    assert key_size > 8, "the case that overran the batch position"
    fd = libbpf.map_create(BPF_MAP_TYPE_LPM_TRIE, spec.base, key_size, value_size, ROWS,
                           flags=BPF_F_NO_PREALLOC)
    try:
        libbpf.obj_pin(fd, str(bpffs / spec.name))
    finally:
        os.close(fd)
    fe = "10.96.0.1" if family is IPFamily.IPV4 else "fd00::1"
    fkey = FrontendKey(fe, 80, Protocol.TCP, Scope.EXT, family)
    cidrs = ([f"10.{i // 256}.{i % 256}.0/24" for i in range(ROWS)] if family is IPFamily.IPV4
             else [str(ipaddress.ip_network(f"2001:db8:{i:x}::/48")) for i in range(ROWS)])
    with PinnedMap(bpffs / spec.name, spec) as m:
        m.put_batch([L.srcrange_key(fkey, c) for c in cidrs], [spec.value()] * ROWS)
        read = [L.srcrange_of(k)[1] for k, _ in m.items()]
        assert sorted(read) == sorted(cidrs)
        assert len(m.raw_items()) == ROWS
        assert len(m) == ROWS
    (bpffs / spec.name).unlink()
