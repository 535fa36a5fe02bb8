"""The Grafana dashboard's panel queries, and what each names, for the dashboard tests."""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

import promql_parser as P

ROOT = Path(__file__).resolve().parent.parent
DASHBOARD = ROOT / "charts/kproxy-ebpf/dashboards/kproxy-ebpf.json"
GENERATOR = ROOT / "tools/dashboard.py"
# Grafana's variables, as Grafana would substitute them.
VARIABLES = {"$__rate_interval": "1m", "$instance": ".*", "${datasource}": "prometheus"}
# Labels Prometheus adds at scrape time, not the exporter.
TARGET_LABELS = {"instance", "job"}


def panel_queries() -> list[tuple[str, str]]:
    """(panel title, query with the variables substituted) for every target of every panel."""
    out = []
    for panel in json.loads(DASHBOARD.read_text())["panels"]:
        for target in panel.get("targets", ()):
            expr = target["expr"]
            for var, value in VARIABLES.items():
                expr = expr.replace(var, value)
            out.append((panel["title"], expr))
    return out


@dataclass
class Names:
    """The metrics one query selects, and the labels it matches or groups each by."""
    labels: dict[str, set[str]] = field(default_factory=dict)     # metric -> labels used

    def add(self, metric: str, labels: set[str]) -> None:
        self.labels.setdefault(metric, set()).update(labels)


def names(expr: str) -> Names:
    out = Names()
    _walk(P.parse(expr), set(), out)
    return out


def _walk(node, grouping: set[str], out: Names) -> None:
    """Every vector selector, with the matchers' labels and those of the enclosing by()s."""
    if isinstance(node, P.VectorSelector):
        matched = {m.name for m in node.matchers.matchers} - {"__name__"}
        out.add(node.name, matched | grouping)
    elif isinstance(node, P.MatrixSelector):
        _walk(node.vector_selector, grouping, out)
    elif isinstance(node, P.AggregateExpr):
        mod = node.modifier
        by = set(mod.labels) if mod is not None and mod.type == P.AggModifierType.By else set()
        _walk(node.expr, grouping | by, out)
        if node.param is not None:
            _walk(node.param, grouping, out)
    elif isinstance(node, P.Call):
        # histogram_quantile's grouping must carry le, which the buckets have: kept.
        for arg in node.args:
            _walk(arg, grouping, out)
    elif isinstance(node, P.BinaryExpr):
        _walk(node.lhs, grouping, out)
        _walk(node.rhs, grouping, out)
    elif isinstance(node, (P.ParenExpr, P.UnaryExpr, P.SubqueryExpr)):
        _walk(node.expr, grouping, out)
