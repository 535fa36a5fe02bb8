"""Writes charts/kproxy-ebpf/dashboards/kproxy-ebpf.json, the Grafana dashboard, from the panel
list below (`make dashboard`; tests/chart/test_dashboard.py checks the file is what this writes
and runs every query against a lab agent's scrape).

Row 1 uses only kube-proxy's own metric names and labels, so those panels work unchanged on
kube-proxy nodes; the rows after are kproxy-ebpf's: map fill, datapath events, API watches and
per-Service traffic. `$instance` selects agents (every one by default).
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

OUT = Path(__file__).resolve().parent.parent / "charts/kproxy-ebpf/dashboards/kproxy-ebpf.json"
SEL = 'instance=~"$instance"'
RATE = "$__rate_interval"


def q(expr: str, legend: str) -> dict:
    return {"expr": expr, "legendFormat": legend}


# (row title, [(panel title, unit, [queries])])
ROWS = [
    ("kube-proxy metrics (the same names and labels as kube-proxy's)", [
        ("Sync duration p99", "s", [
            q(f"histogram_quantile(0.99, sum by (le, instance, ip_family) (rate("
              f"kubeproxy_sync_proxy_rules_duration_seconds_bucket{{{SEL}}}[{RATE}])))",
              "{{instance}} {{ip_family}}")]),
        ("Full and partial sync duration p99", "s", [
            q(f"histogram_quantile(0.99, sum by (le, instance) (rate("
              f"kubeproxy_sync_full_proxy_rules_duration_seconds_bucket{{{SEL}}}[{RATE}])))",
              "{{instance}} full"),
            q(f"histogram_quantile(0.99, sum by (le, instance) (rate("
              f"kubeproxy_sync_partial_proxy_rules_duration_seconds_bucket{{{SEL}}}[{RATE}])))",
              "{{instance}} partial")]),
        ("Network programming latency p99", "s", [
            q(f"histogram_quantile(0.99, sum by (le, instance) (rate("
              f"kubeproxy_network_programming_duration_seconds_bucket{{{SEL}}}[{RATE}])))",
              "{{instance}}")]),
        ("Seconds since the last sync", "s", [
            q(f"time() - max by (instance) (kubeproxy_sync_proxy_rules_last_timestamp_seconds{{{SEL}}})",
              "{{instance}}")]),
        ("Service and endpoint changes", "ops", [
            q(f"sum by (instance) (rate(kubeproxy_sync_proxy_rules_service_changes_total{{{SEL}}}[{RATE}]))",
              "{{instance}} services"),
            q(f"sum by (instance) (rate(kubeproxy_sync_proxy_rules_endpoint_changes_total{{{SEL}}}[{RATE}]))",
              "{{instance}} endpoints")]),
        ("Changes pending", "short", [
            q(f"kubeproxy_sync_proxy_rules_service_changes_pending{{{SEL}}}", "{{instance}} services"),
            q(f"kubeproxy_sync_proxy_rules_endpoint_changes_pending{{{SEL}}}", "{{instance}} endpoints")]),
        ("Services without a local endpoint (Local policies)", "short", [
            q(f"sum by (instance, traffic_policy) (kubeproxy_sync_proxy_rules_no_local_endpoints_total{{{SEL}}})",
              "{{instance}} {{traffic_policy}}")]),
        ("Health checks answered", "ops", [
            q(f"sum by (instance, code) (rate(kubeproxy_proxy_healthz_total{{{SEL}}}[{RATE}]))",
              "{{instance}} healthz {{code}}"),
            q(f"sum by (instance, code) (rate(kubeproxy_proxy_livez_total{{{SEL}}}[{RATE}]))",
              "{{instance}} livez {{code}}")]),
    ]),
    ("kproxy-ebpf: maps and datapath", [
        ("BPF map fill", "percentunit", [
            q(f"max by (instance, map) (kproxy_bpf_map_entries{{{SEL}}} / kproxy_bpf_map_capacity{{{SEL}}})",
              "{{instance}} {{map}}")]),
        ("Frontends and backends programmed", "short", [
            q(f"kproxy_frontends{{{SEL}}}", "{{instance}} frontends"),
            q(f"kproxy_backends{{{SEL}}}", "{{instance}} backends"),
            q(f"kproxy_frontends_unprogrammed{{{SEL}}}", "{{instance}} not programmed")]),
        ("Datapath events", "ops", [
            q(f"sum by (event) (rate(kproxy_datapath_events_total{{{SEL}}}[{RATE}]))", "{{event}}")]),
        ("Sync failures and map errors", "ops", [
            q(f"sum by (instance) (rate(kproxy_sync_proxy_rules_failures_total{{{SEL}}}[{RATE}]))",
              "{{instance}} sync failures"),
            q(f"sum by (instance) (rate(kproxy_bpf_map_errors_total{{{SEL}}}[{RATE}]))",
              "{{instance}} map write errors"),
            q(f"sum by (instance, map) (rate(kproxy_bpf_map_full_total{{{SEL}}}[{RATE}]))",
              "{{instance}} {{map}} full")]),
        ("API watches: relists and restarts", "ops", [
            q(f"sum by (instance, resource) (rate(kproxy_api_relists_total{{{SEL}}}[{RATE}]))",
              "{{instance}} {{resource}} relists"),
            q(f"sum by (instance, resource) (rate(kproxy_api_watch_restarts_total{{{SEL}}}[{RATE}]))",
              "{{instance}} {{resource}} restarts")]),
        ("Stale sockets repaired", "ops", [
            q(f"sum by (instance, protocol, outcome) (rate(kproxy_stale_sockets_total{{{SEL}}}[{RATE}]))",
              "{{instance}} {{protocol}} {{outcome}}")]),
    ]),
    ("kproxy-ebpf: per-Service traffic (serviceMetricsLimit bounds the series)", [
        ("Connections per second, top 10 service ports", "ops", [
            q(f"topk(10, sum by (namespace, name, port) (rate(kproxy_service_connections_total{{{SEL}}}[{RATE}])))",
              "{{namespace}}/{{name}}:{{port}}")]),
        ("Refusals by reason", "ops", [
            q(f"sum by (namespace, name, reason) (rate(kproxy_service_refusals_total{{{SEL}}}[{RATE}])) > 0",
              "{{namespace}}/{{name}} {{reason}}")]),
        ("TC traffic, bytes per second", "Bps", [
            q(f"topk(10, sum by (namespace, name, direction) (rate(kproxy_service_bytes_total{{{SEL}}}[{RATE}])))",
              "{{namespace}}/{{name}} {{direction}}")]),
        ("TC traffic, packets per second", "pps", [
            q(f"topk(10, sum by (namespace, name, direction) (rate(kproxy_service_packets_total{{{SEL}}}[{RATE}])))",
              "{{namespace}}/{{name}} {{direction}}")]),
        ("Service ports without per-Service series", "short", [
            q(f"max by (instance) (kproxy_service_metrics_omitted{{{SEL}}})", "{{instance}}")]),
    ]),
]


def dashboard() -> dict:
    panels, pid, y = [], 1, 0
    for title, row in ROWS:
        panels.append({"type": "row", "title": title, "id": pid, "collapsed": False,
                       "gridPos": {"h": 1, "w": 24, "x": 0, "y": y}})
        pid, y = pid + 1, y + 1
        for i, (ptitle, unit, targets) in enumerate(row):
            panels.append({
                "type": "timeseries", "title": ptitle, "id": pid,
                "datasource": {"type": "prometheus", "uid": "${datasource}"},
                "gridPos": {"h": 8, "w": 12, "x": 12 * (i % 2), "y": y + 8 * (i // 2)},
                "fieldConfig": {"defaults": {"unit": unit}, "overrides": []},
                "options": {"legend": {"displayMode": "list", "placement": "bottom"}},
                "targets": [{**t, "refId": chr(ord("A") + j),
                             "datasource": {"type": "prometheus", "uid": "${datasource}"}}
                            for j, t in enumerate(targets)]})
            pid += 1
        y += 8 * ((len(row) + 1) // 2)
    return {
        "title": "kproxy-ebpf", "uid": "kproxy-ebpf", "schemaVersion": 39, "version": 1,
        "editable": True, "tags": ["kube-proxy", "kproxy-ebpf"], "timezone": "",
        "time": {"from": "now-1h", "to": "now"}, "refresh": "30s",
        "templating": {"list": [
            {"name": "datasource", "type": "datasource", "query": "prometheus",
             "label": "Data source"},
            {"name": "instance", "type": "query", "label": "Agent",
             "datasource": {"type": "prometheus", "uid": "${datasource}"},
             "query": {"query": "label_values(kubeproxy_sync_proxy_rules_last_timestamp_seconds, instance)",
                       "refId": "instance"},
             "includeAll": True, "multi": True, "allValue": ".*", "refresh": 2}]},
        "panels": panels,
    }


def text() -> str:
    return json.dumps(dashboard(), indent=2) + "\n"


if __name__ == "__main__":
    if sys.argv[1:] == ["--check"]:
        sys.exit(0 if OUT.read_text() == text() else f"{OUT} is stale: run `make dashboard`")
    OUT.parent.mkdir(exist_ok=True)
    OUT.write_text(text())
