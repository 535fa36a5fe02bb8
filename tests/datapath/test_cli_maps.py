"""`kproxy-ebpf maps` on an agent's real pinned maps (node1's socket datapath)."""
import json

import pytest
from click.testing import CliRunner

from kproxy_ebpf import cli

pytestmark = pytest.mark.root


def test_maps_list_shows_socket_storage_without_a_count(lab, node1):
    """Socket storage has no rows the map syscalls list: `maps list` shows it without a count and
    `maps dump` says why instead of failing on the kernel's EOPNOTSUPP."""
    runner = CliRunner()
    out = runner.invoke(cli.main, ["maps", "list", "--bpffs-dir", str(node1.bpffs), "-o", "json"])
    assert out.exit_code == 0, out.output
    rows = {r["map"]: r for r in json.loads(out.output)}
    assert rows["sksvc"]["entries"] is None and rows["sknat"]["entries"] == 0
    out = runner.invoke(cli.main, ["maps", "list", "--bpffs-dir", str(node1.bpffs)])
    assert out.exit_code == 0 and "one row per TCP socket" in out.output
    out = runner.invoke(cli.main, ["maps", "dump", "sksvc", "--bpffs-dir", str(node1.bpffs)])
    assert out.exit_code != 0 and "socket storage" in out.output
