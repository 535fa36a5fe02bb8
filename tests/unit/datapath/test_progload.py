"""The load child's failures reach the agent as one clear exception, and its staging directory
never outlives the load. (The successful load is covered by every datapath test.)"""
import pytest

from kproxy_ebpf.datapath.load import bpffs, progload
from kproxy_ebpf.datapath.maps.map_sizes import MapSizes


def test_a_failed_compile_is_raised_with_the_childs_message_and_the_stage_is_removed(tmp_path):
    # tmp_path is no bpffs: the child refuses before compiling, as on a node without bpffs.
    job = progload.LoadJob(tmp_path, [progload.Program("sock_lb.c", "kp_connect4",
                                                       progload.CGROUP_SOCK_ADDR, 10)], MapSizes())
    with pytest.raises(progload.LoadError, match="is not on a bpffs mount"):
        job.result()
    assert list(tmp_path.iterdir()) == []


def test_cancel_stops_the_child_and_removes_the_stage(tmp_path):
    job = progload.LoadJob(tmp_path, [progload.Program("sock_lb.c", "kp_connect4",
                                                       progload.CGROUP_SOCK_ADDR, 10)], MapSizes())
    job.cancel()
    assert job._proc.returncode is not None
    assert list(tmp_path.iterdir()) == []


def test_stages_of_dead_agents_are_removed_and_live_ones_kept(tmp_path):
    import os

    dead, live = tmp_path / "stage_99999999_1", tmp_path / f"stage_{os.getpid()}_1"
    for stage in (dead, live):
        stage.mkdir()
        (stage / "kp_connect4").write_text("")
    assert bpffs.remove_stale_stages(tmp_path) == [str(dead)]
    assert live.is_dir() and not dead.exists()
    assert bpffs.remove_stale_stages(tmp_path, keep_live=False) == [str(live)]
    assert list(tmp_path.iterdir()) == []


def test_release_closes_only_the_named_programs_fds(tmp_path):
    # An agent whose TC programs were loaded for a device it then did not find gives them back.
    import os

    job = progload.LoadJob(tmp_path, [], MapSizes())
    job.cancel()
    r1, w1 = os.pipe()
    r2, w2 = os.pipe()
    job._fds = {"kp_from_outside": r1, "kp_connect4": r2}
    job.release(["kp_from_outside", "kp_to_outside"])
    assert job._fds == {"kp_connect4": r2}
    with pytest.raises(OSError):
        os.fstat(r1)
    os.fstat(r2)
    for fd in (w1, r2, w2):
        os.close(fd)
