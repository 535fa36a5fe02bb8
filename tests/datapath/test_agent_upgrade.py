"""An upgrade across a layout version bump, and the downgrade back, under a client loop: the
agent of an older commit (conftest.UPGRADE_FROM, whose kp_srcrange is v2 and which has no kp_nssrc) runs
first, then this checkout's, then the old one again. Each switch loses no new connection and
resets no held one. Going up, the new maps are filled before the programs that read them are
swapped in, and the old version's map is unpinned after; going down, the old agent adopts what
it knows and ignores what it does not."""
from __future__ import annotations

import signal
from pathlib import Path

import pytest

from kproxy_ebpf.datapath.load.bpffs import remove_pins

from .test_agent_restart import assert_no_failure, restart_under_load

pytestmark = pytest.mark.root


def test_upgrade_across_a_layout_bump_and_back_loses_no_connection(lab, tmp_path, old_tree):
    bpffs = Path(lab.node("node1").bpffs)
    try:
        up, log = restart_under_load(lab, tmp_path, signal.SIGTERM, trees=(old_tree, None))
        assert_no_failure(up)
        assert not (bpffs / "kp_srcrange_v2").exists() and (bpffs / "kp_srcrange_v3").exists()
        assert "adopted 1 frontends" in log, log
        # Maps new to this version beside adopted ones: swapped in after the first sync.
        lines = log.splitlines()
        at = [next(i for i, ln in enumerate(lines) if what in ln) for what in (
            "the programs are replaced after the first sync fills them", "first sync:",
            "removed /", )]
        assert at[0] < at[2], log
        assert "kp_srcrange_v2: a map of another layout version" in log, log

        (tmp_path / "down").mkdir()
        down, log = restart_under_load(lab, tmp_path / "down", signal.SIGTERM,
                                       trees=(None, old_tree))
        assert_no_failure(down)
        assert "adopted 1 frontends" in log, log
    finally:
        remove_pins(bpffs)
