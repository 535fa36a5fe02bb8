"""Every listing command prints table, JSON or YAML (-o), the structured two the same data."""
from __future__ import annotations

import json

import yaml
from click.testing import CliRunner

from kproxy_ebpf import cli
from kproxy_ebpf.datapath import reader


def test_json_and_yaml_carry_the_same_rows(monkeypatch):
    monkeypatch.setattr(cli, "_open_maps", lambda d: {"stats": None})
    monkeypatch.setattr(reader, "counters", lambda m: {"forward": 3, "tc_icmp_err": 1})
    as_json = CliRunner().invoke(cli.main, ["stats", "-o", "json"])
    as_yaml = CliRunner().invoke(cli.main, ["stats", "-o", "yaml"])
    assert as_json.exit_code == as_yaml.exit_code == 0, as_json.output + as_yaml.output
    assert json.loads(as_json.output) == yaml.safe_load(as_yaml.output) == {
        "forward": 3, "tc_icmp_err": 1}
    table = CliRunner().invoke(cli.main, ["stats"]).output
    assert table.split() == ["forward", "3", "tc_icmp_err", "1"]


def test_every_listing_command_offers_yaml():
    for name in ("services", "stats", "status"):
        out = CliRunner().invoke(cli.main, [name, "--help"]).output
        assert "table|wide|json|yaml" in out, name
    for group, name in (("maps", "list"), ("maps", "dump"), ("ct", "list")):
        out = CliRunner().invoke(cli.main, [group, name, "--help"]).output
        assert "table|wide|json|yaml" in out, (group, name)
