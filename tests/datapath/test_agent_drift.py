"""The periodic drift check of the real agent (datapath/drift.py, drift_watch.py): with
syncPeriod 1 s it checks every 10 s in its own thread, finds nothing while the maps hold what
it wrote, and finds a slot row deleted behind its back, which the next sync rewrites."""
from __future__ import annotations

from pathlib import Path

import pytest

from kproxy_ebpf.datapath.load.bpffs import open_pinned_maps

from ..support import wait_until
from .agent_proc import log_of, programmed

pytestmark = [pytest.mark.root]


def slot_keys(bpffs: str) -> list:
    maps = open_pinned_maps(Path(bpffs))
    try:
        return [k for k, _ in maps["svc"].items() if k.slot > 0]
    finally:
        for m in maps.values():
            m.close()


def test_a_row_deleted_behind_the_agent_is_found_and_rewritten(lab, agents):
    agents("drift-agent", "--sync-period", "1s")
    bpffs = lab.node("node1").bpffs
    wait_until(lambda: programmed(bpffs), 10, "web programmed")
    wait_until(lambda: "drift check: the maps hold what was written" in
               log_of(lab, "drift-agent"), 25, "a first drift check")
    assert "the maps differ" not in log_of(lab, "drift-agent")
    before = slot_keys(bpffs)
    maps = open_pinned_maps(Path(bpffs))
    try:
        assert maps["svc"].delete(before[0])
    finally:
        for m in maps.values():
            m.close()
    wait_until(lambda: "the maps differ" in log_of(lab, "drift-agent"), 25,
               "the drift check to find the deleted row")
    wait_until(lambda: sorted(map(bytes, slot_keys(bpffs))) == sorted(map(bytes, before)), 10,
               "the row rewritten")

