"""The churn soak, two minutes of it (`make soak` runs the long one and commits its report):
1000 Services under endpoint, Service and membership churn, probed from a pod on each node
(kproxy_ebpf/dev/bench/soak.py says what runs and what is checked)."""
from __future__ import annotations

import pytest

from kproxy_ebpf.dev.bench.soak import WINDOW, SoakConfig, run_soak, soak_passed

from ..support import require_controlplane

pytestmark = [pytest.mark.root, pytest.mark.controlplane, pytest.mark.timeout(600)]


def test_two_minutes_of_churn_at_1000_services(capsys):
    require_controlplane()
    doc = run_soak(SoakConfig(minutes=2, lab_name="it-soak"), lambda msg: None)
    v = doc["verdict"]
    assert all(p["attempts"] > 1000 for p in doc["probes"].values()), doc["probes"]
    assert doc["changes"]["member_flips"] >= 100 and doc["changes"]["errors"] == 0, doc["changes"]
    assert v["wrong_connections"] == 0, doc["probes"]
    assert v["unexpected_failures"] == 0 and v["churned_failures"] == 0, doc["probes"]
    assert doc["propagation_window_s"] < WINDOW
    assert v["rss_flat"], doc["agents"]
    assert soak_passed(doc)
