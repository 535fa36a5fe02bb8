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


def test_ipv6_frontends_and_backends_read_in_canonical_form(lab, node1):
    """What the kernel holds for a dual-stack Service, as `services` and `maps dump` print it:
    each family's frontend with its own backends, IPv6 in RFC 5952 form, [v6]:port in tables."""
    from kproxy_ebpf.model import Service, ServicePort, Protocol

    from .dplab import Fam

    v4, v6 = Fam("IPv4"), Fam("IPv6")
    svc = Service("default", "dual", cluster_ips=("10.96.0.80", "fd00:96::80"),
                  ports=(ServicePort("http", Protocol.TCP, 80),))
    node1.program(svc, v4.endpoints(lab, "dual", ["b1"], ("http", "TCP", 8080)),
                  v6.endpoints(lab, "dual", ["b1"], ("http", "TCP", 8080)))
    runner = CliRunner()
    out = runner.invoke(cli.main, ["services", "--bpffs-dir", str(node1.bpffs), "-o", "json"])
    assert out.exit_code == 0, out.output
    rows = {r["address"]: r for r in json.loads(out.output)}
    b1 = v6.ip(lab, "b1")
    assert set(rows) == {"10.96.0.80", "fd00:96::80"}, rows.keys()
    assert [b["address"] for b in rows["fd00:96::80"]["backends"]] == [b1]
    assert [b["address"] for b in rows["10.96.0.80"]["backends"]] == [v4.ip(lab, "b1")]
    table = runner.invoke(cli.main, ["services", "--bpffs-dir", str(node1.bpffs)]).output
    assert "[fd00:96::80]:80/TCP" in table and f"[{b1}]:8080" in table, table
    dump = runner.invoke(cli.main, ["maps", "dump", "backend", "--bpffs-dir", str(node1.bpffs),
                                    "-o", "json"])
    assert b1 in {r["value"]["addr"] for r in json.loads(dump.output)}
