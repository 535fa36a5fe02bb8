"""Every query of the Grafana dashboard (charts/kproxy-ebpf/dashboards) against a real scrape
of a lab agent: each metric it selects is exported, with samples, and carries every label the
query matches or groups by. A panel naming a metric we do not export fails here."""
from __future__ import annotations

import pytest
from kubernetes import client
from prometheus_client.parser import text_string_to_metric_families

from ..dashboard_queries import TARGET_LABELS, names, panel_queries
from ..support import lab_cluster, wait_until
from .lab_services import make_service, served_by

pytestmark = [pytest.mark.root, pytest.mark.controlplane]


@pytest.fixture(scope="module")
def scrape():
    """{sample name: the label names its samples carry} from node1's agent, after a Service
    got traffic (so the per-Service series exist)."""
    with lab_cluster("it-dash", "kproxy", client_pod=True) as c:
        c.create_pod("dash-1", "node2", labels={"app": "dash"})
        ip = make_service(c, "dash", "dash")
        wait_until(lambda: served_by(c, ip), 20, "the Service to answer")
        c.lab.probe("pod/client", ip, 81)          # a refused port: datapath events move
        client.CoreV1Api(c.api()).read_namespaced_service("dash", "default")
        out: dict[str, set[str]] = {}
        for fam in text_string_to_metric_families(c.agent_metrics("node1")):
            for s in fam.samples:
                out.setdefault(s.name, set()).update(s.labels)
        yield out


def test_every_panel_names_only_what_the_agent_exports(scrape):
    problems = []
    for title, expr in panel_queries():
        for metric, labels in names(expr).labels.items():
            if metric not in scrape:
                problems.append(f"{title}: {metric} has no samples in the scrape")
                continue
            missing = labels - TARGET_LABELS - scrape[metric]
            if missing:
                problems.append(f"{title}: {metric} has no label {sorted(missing)}")
    assert not problems, "\n".join(problems)
