"""Control-plane faults under probes, a short version (`make faults` runs the long one and
commits its report): an API server restart, a forced 410 relist, a blackholed and a stalled
watch, and an API outage, each followed by a change that must reach the datapath
(kproxy_ebpf/dev/bench/faults.py says what runs and what is checked)."""
from __future__ import annotations

import pytest

from kproxy_ebpf.dev.bench.faults import FAULTS, FaultConfig, faults_passed, report_markdown, run_faults

from ..support import require_controlplane

pytestmark = [pytest.mark.root, pytest.mark.controlplane, pytest.mark.timeout(900)]


def test_control_plane_faults_lose_no_connection_and_recover():
    require_controlplane()
    doc = run_faults(FaultConfig(outage_s=20, progress_timeout_s=8, lab_name="it-faults"),
                     lambda msg: None)
    by = {f["fault"]: f for f in doc["faults"]}
    assert list(by) == list(FAULTS)
    for f in doc["faults"]:
        assert all(p["attempts"] > 20 for p in f["probes"].values()), f
    v = doc["verdict"]
    assert v["failed_connections"] == 0 and v["wrong_connections"] == 0, doc["faults"]
    assert v["unrecovered"] == [] and v["rows_lost_during_outage"] == [], doc["faults"]
    # Each fault did what it says: a relist after the 410, a stall for the blackhole.
    assert by["etcd-compaction-410"]["counters"]["node1"]["relists"] >= 1, by
    assert by["watch-blackholed"]["counters"]["node1"]["watch_stalls"] >= 1, by
    assert by["watch-blackholed"]["notes"]["connections_blackholed"] >= 1, by
    # The change reached node1 once the stall was seen: the timeout, a backoff, a new watch.
    assert by["watch-blackholed"]["recovery_s"]["node1"] < 8 + 15, by
    assert all(by["watch-stalled"]["counters"][n]["watch_stalls"] >= 1 for n in ("node1", "node2"))
    assert all(t < 8 + 15 for t in by["watch-stalled"]["recovery_s"].values()), by
    assert faults_passed(doc)
    assert "| api-unreachable |" in report_markdown(doc)
