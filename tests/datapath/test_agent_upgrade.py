"""An upgrade across a layout version bump, and the downgrade back, under a client loop: the
agent of an older commit (UPGRADE_FROM, whose kp_srcrange is v2 and which has no kp_nssrc) runs
first, then this checkout's, then the old one again. Each switch loses no new connection and
resets no held one. Going up, the new maps are filled before the programs that read them are
swapped in, and the old version's map is unpinned after; going down, the old agent adopts what
it knows and ignores what it does not."""
from __future__ import annotations

import signal
import subprocess
from pathlib import Path

import pytest

from kproxy_ebpf.datapath.bpffs import remove_pins

from .test_agent_restart import assert_no_failure, restart_under_load

pytestmark = pytest.mark.root

ROOT = Path(__file__).resolve().parents[2]
# The last commit before kp_srcrange_v3 (the scope in its key) and kp_nssrc/kp_nsmiss.
UPGRADE_FROM = "d691322"


@pytest.fixture(scope="module")
def old_tree(tmp_path_factory):
    path = tmp_path_factory.mktemp("upgrade") / "old"
    r = subprocess.run(["git", "-C", str(ROOT), "worktree", "add", "--detach", str(path),
                        UPGRADE_FROM], capture_output=True, text=True)
    if r.returncode != 0:
        pytest.skip(f"commit {UPGRADE_FROM} is not in this clone (a shallow one?): {r.stderr}")
    try:
        yield path
    finally:
        subprocess.run(["git", "-C", str(ROOT), "worktree", "remove", "--force", str(path)],
                       check=False)


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
