"""The Grafana dashboard: the committed JSON is what tools/dashboard.py writes, every panel query
parses as PromQL, and the chart installs it as a ConfigMap when asked. Whether the queries name
only metrics and labels an agent exports is checked against a real scrape in
tests/integration/test_dashboard.py."""
from __future__ import annotations

import json
import subprocess
import sys

import promql_parser

from kproxy_ebpf.dev.lab import agent_image

from ..dashboard_queries import DASHBOARD, GENERATOR, panel_queries


def test_the_committed_dashboard_is_what_the_generator_writes():
    r = subprocess.run([sys.executable, str(GENERATOR), "--check"], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr


def test_every_panel_query_parses():
    queries = panel_queries()
    assert len(queries) >= 20
    for title, expr in queries:
        try:
            promql_parser.parse(expr)
        except Exception as exc:           # the parser's own error type is not exported
            raise AssertionError(f"{title}: {expr}: {exc}") from exc


def test_the_chart_installs_the_dashboard_only_when_asked(helm):
    assert not [o for o in agent_image.helm_template({}) if o["kind"] == "ConfigMap"
                and o["metadata"]["name"].endswith("-dashboard")]
    objs = agent_image.helm_template({"dashboard": {"enabled": True, "namespace": "monitoring"}})
    (cm,) = [o for o in objs if o["kind"] == "ConfigMap"
             and o["metadata"]["name"].endswith("-dashboard")]
    assert cm["metadata"]["labels"]["grafana_dashboard"] == "1"
    assert cm["metadata"]["namespace"] == "monitoring"
    assert json.loads(cm["data"]["kproxy-ebpf.json"]) == json.loads(DASHBOARD.read_text())
