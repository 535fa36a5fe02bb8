"""Every listing command prints table, JSON or YAML (-o), the structured two the same data."""
from __future__ import annotations

import json

import yaml
from click.testing import CliRunner

from kproxy_ebpf.cli import main as cli
from kproxy_ebpf.cli import node
from kproxy_ebpf.datapath.maps import reader


def test_json_and_yaml_carry_the_same_rows(monkeypatch):
    monkeypatch.setattr(node, "open_maps", lambda d: {"stats": None})
    monkeypatch.setattr(reader, "counters", lambda m: {"forward": 3, "tc_icmp_err": 1})
    as_json = CliRunner().invoke(cli.main, ["stats", "-o", "json"])
    as_yaml = CliRunner().invoke(cli.main, ["stats", "-o", "yaml"])
    assert as_json.exit_code == as_yaml.exit_code == 0, as_json.output + as_yaml.output
    assert json.loads(as_json.output) == yaml.safe_load(as_yaml.output) == {
        "forward": 3, "tc_icmp_err": 1}
    table = CliRunner().invoke(cli.main, ["stats"]).output
    assert table.split() == ["forward", "3", "tc_icmp_err", "1"]


def test_every_listing_command_offers_yaml_and_wide_only_where_it_shows_more():
    want = {("services",): "table|wide|json|yaml|name", ("maps", "list"): "table|json|yaml|name"}
    for args in (["services"], ["stats"], ["status"], ["maps", "list"], ["maps", "dump"],
                 ["ct", "list"], ["trace"], ["check"]):
        out = CliRunner().invoke(cli.main, [*args, "--help"]).output
        assert want.get(tuple(args), "table|json|yaml]") in out, args
        assert "Output format:" in out, args
    out = CliRunner().invoke(cli.main, ["stats", "-o", "wide"])
    assert out.exit_code == 2 and "'wide' is not one of" in out.output


def test_a_mistyped_command_gets_a_suggestion():
    out = CliRunner().invoke(cli.main, ["service"])
    assert out.exit_code == 2 and 'No such command "service". Did you mean "services"?' \
        in out.output


def test_services_wide_shows_the_scheduler_and_each_backends_connections():
    from kproxy_ebpf.cli.services import _services_table

    row = {"service": "ns/web:http", "type": "ClusterIP", "address": "10.96.0.10", "port": 80,
           "protocol": "TCP", "from": "node", "action": "forward", "affinity_timeout": 0,
           "policy": {}, "algorithm": "least-conn", "service_id": 1, "scope": 0,
           "counters": dict.fromkeys(("conns", "packets", "reply_packets", "bytes", "reply_bytes",
                                       "refused", "dropped", "denied"), 0),
           "backends": [{"slot": 1, "id": 7, "address": "10.244.1.5", "port": 8080,
                         "state": "ready", "active": 3, "inactive": 1}]}
    header, lines = _services_table([row], wide=True)
    first = dict(zip(header, lines[0], strict=True))
    assert first["POLICY"] == "lb=least-conn"
    assert first["BACKENDS"] == "1) 10.244.1.5:8080 (ready) 3/1"
    header, lines = _services_table([{**row, "algorithm": "random"}], wide=False)
    assert dict(zip(header, lines[0], strict=True))["POLICY"] == "-", "random: the default"
