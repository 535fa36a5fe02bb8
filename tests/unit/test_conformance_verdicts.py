"""The differential suite's verdict helper (tests/conformance/verdicts.py): how probe lines
become cells, what each proxy must give, and how the table judges kproxy against nftables."""
from __future__ import annotations

import pytest

from tests.conformance import verdicts
from tests.conformance.verdicts import Divergence, cell, compare_row, expected, http_cell, sticky_cell

ROLES = {"10.244.1.10": "pod", "10.250.0.11": "node"}


@pytest.mark.parametrize("lines, want", [
    (["b 10.244.1.10:4000", "a 10.244.1.10:4001", "b 10.244.1.10:4002"], "a,b from pod"),
    (["a 10.250.0.11:1"], "a from node"),
    (["a 10.244.9.9:1"], "a from 10.244.9.9"),
    (["REFUSED", "REFUSED"], "REFUSED"),
    (["a 10.244.1.10:1", "TIMEOUT", "ERROR ENETUNREACH"], "a from pod + ERROR ENETUNREACH + TIMEOUT"),
    (["WRONG-SOURCE 10.244.2.10:5353 b 10.244.1.10:9"], "WRONG-SOURCE 10.244.2.10:5353 b 10.244.1.10:9"),
    ([], "-"),
])
def test_cell(lines, want):
    assert cell(lines, ROLES) == want


def test_sticky_cell_counts_backends():
    assert sticky_cell(["c 10.244.1.10:1"] * 3, ROLES) == "1 backend from pod"
    assert sticky_cell(["c 10.244.1.10:1", "d 10.244.1.10:2"], ROLES) == "2 backends from pod"
    assert sticky_cell(["c 10.244.1.10:1", "TIMEOUT"], ROLES) == "c from pod + TIMEOUT"


def test_http_cell_shows_the_status_and_every_body_field():
    body = '{"service": {"namespace": "default", "name": "lb"}, "localEndpoints": 1, ' \
           '"serviceProxyHealthy": true}'
    assert http_cell(f"200 {body}\n") == ("200 localEndpoints=1 service.name=lb "
                                          "service.namespace=default serviceProxyHealthy=true")
    # A field only one proxy sends makes the cells differ.
    assert http_cell('503 {"localEndpoints": 0, "extra": null}') == "503 extra=null localEndpoints=0"
    assert http_cell("TIMEOUT\n") == "TIMEOUT"
    assert http_cell("") == "-"


def test_expected_follows_nftables_unless_listed(monkeypatch):
    monkeypatch.setattr(verdicts, "DIVERGENCES", {("s", "x"): Divergence("ERROR EHOSTUNREACH", "why")})
    per_mode = {"nftables": "TIMEOUT", "iptables": "ERROR ENETUNREACH"}
    assert expected("s", "y", "kproxy", per_mode) == {"TIMEOUT"}
    assert expected("s", "y", "iptables", per_mode) == {"ERROR ENETUNREACH"}
    assert expected("s", "x", "kproxy", "TIMEOUT") == {"ERROR EHOSTUNREACH"}
    assert expected("s", "x", "nftables", "TIMEOUT") == {"TIMEOUT"}


def test_pending_divergence_accepts_either(monkeypatch):
    monkeypatch.setattr(verdicts, "DIVERGENCES", {
        ("s", "x"): Divergence("ERROR ENETUNREACH", "why", until="other work")})
    assert expected("s", "x", "kproxy", "TIMEOUT") == {"ERROR ENETUNREACH", "TIMEOUT"}
    assert compare_row({"kproxy": "ERROR ENETUNREACH", "nftables": "TIMEOUT"}, ("s", "x")) == "pending"
    assert compare_row({"kproxy": "TIMEOUT", "nftables": "TIMEOUT"}, ("s", "x")) == "="


def test_compare_row(monkeypatch):
    monkeypatch.setattr(verdicts, "DIVERGENCES", {("s", "x"): Divergence("ERROR EHOSTUNREACH", "why")})
    assert compare_row({"kproxy": "a", "nftables": "a"}, ("s", "y")) == "="
    assert compare_row({"kproxy": "a", "nftables": "b"}, ("s", "y")) == "MISMATCH"
    assert compare_row({"kproxy": "ERROR EHOSTUNREACH", "nftables": "TIMEOUT"}, ("s", "x")) == "listed"
    assert compare_row({"kproxy": "REFUSED", "nftables": "TIMEOUT"}, ("s", "x")) == "MISMATCH"
    assert compare_row({"kproxy": "a"}, ("s", "y")) == ""


def test_table_counts_mismatches(monkeypatch):
    monkeypatch.setattr(verdicts, "RESULTS", {("s", "y"): {"kproxy": "a", "nftables": "b"},
                                              ("s", "z"): {"kproxy": "a", "nftables": "a",
                                                           "iptables": "a"}})
    lines, mismatches = verdicts.table()
    assert mismatches == 1
    assert lines[0].split() == ["scenario", "check", "kproxy", "nftables", "iptables", "kproxy",
                                "vs", "nftables"]
    assert lines[2].split()[-1] == "MISMATCH" and lines[3].split()[-1] == "="
