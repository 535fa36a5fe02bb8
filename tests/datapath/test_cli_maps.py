"""`kproxy-ebpf maps` on an agent's real pinned maps (node1's socket datapath)."""
import json

import pytest
from click.testing import CliRunner

from kproxy_ebpf.cli import main as cli

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
    from kproxy_ebpf.model.objects import Protocol, Service, ServicePort

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


def test_services_by_name_as_kubectl_finds_them_and_a_missing_one_is_an_error(lab, node1):
    """A bare NAME is in the default namespace (or -n's); a Service with no frontend in the
    maps is an error sentence and exit 1, for `services`, `ct list` and `watch` alike; the
    table says whom each frontend serves; -o wide puts the counters on a line of the Service
    port's own, over all its frontends."""
    from .dplab import endpoints, service

    node1.program(service("web", "10.96.0.80", ("http", "TCP", 80)),
                  endpoints(lab, "web", ["b1"], ("http", "TCP", 8080)))
    runner = CliRunner()
    bpffs = ["--bpffs-dir", str(node1.bpffs)]
    for args in (["services", "--service", "web"], ["services", "--service", "default/web"],
                 ["services", "--service", "web", "-n", "default"]):
        out = runner.invoke(cli.main, [*args, *bpffs, "-o", "json"])
        assert out.exit_code == 0, (args, out.output)
        assert {r["service"] for r in json.loads(out.output)} == {"default/web:http"}
        assert {r["from"] for r in json.loads(out.output)} == {"node"}
    for args in (["services", "--service", "nope"], ["services", "--service", "web", "-n", "x"],
                 ["ct", "list", "--service", "default/nope"],
                 ["watch", "--service", "nope", "--duration", "5"]):
        out = runner.invoke(cli.main, [*args, *bpffs])
        assert out.exit_code == 1, (args, out.output)
        assert "is not programmed on this node" in out.output and "Traceback" not in out.output
    out = runner.invoke(cli.main, ["services", "--service", "default/wbe", *bpffs])
    assert 'Did you mean "default/web"?' in out.output
    table = runner.invoke(cli.main, ["services", *bpffs, "-o", "wide"]).output
    assert "FROM" in table.splitlines()[0] and "(all from the node)" in table, table
    assert runner.invoke(cli.main, ["services", *bpffs, "-o", "name"]).output == \
        "default/web:http\n"
    assert "svc\n" in runner.invoke(cli.main, ["maps", "list", *bpffs, "-o", "name"]).output
