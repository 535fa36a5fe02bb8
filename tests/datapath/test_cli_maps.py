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
    assert rows["sksvc"]["entries"] is None and rows["sksvc"]["max_entries"] is None
    assert rows["sknat"]["entries"] == 0 and rows["stats"]["entries"] is None
    out = runner.invoke(cli.main, ["maps", "list", "--bpffs-dir", str(node1.bpffs)])
    assert out.exit_code == 0 and "one row per TCP socket" in out.output
    out = runner.invoke(cli.main, ["maps", "dump", "sksvc", "--bpffs-dir", str(node1.bpffs)])
    assert out.exit_code != 0 and "socket storage" in out.output


def test_status_shows_every_map_socket_storage_included(lab, node1):
    runner = CliRunner()
    out = runner.invoke(cli.main, ["status", "--bpffs-dir", str(node1.bpffs), "-o", "json"])
    assert out.exit_code == 0, out.output
    maps = json.loads(out.output)["maps"]
    assert maps["sksvc"] == {"entries": None, "max_entries": None}
    assert maps["svc"]["entries"] == 0 and maps["svc"]["max_entries"] > 0
    out = runner.invoke(cli.main, ["status", "--bpffs-dir", str(node1.bpffs)])
    assert out.exit_code == 0 and "per socket" in out.output, out.output
