"""A cgroup's processes by its id (datapath/cgroup_procs.py), on the real cgroup2 tree: by a
file handle at once, and by a walk of the tree where handles are refused; a cgroup gone is
no process, not an error."""
from __future__ import annotations

import os
import subprocess

import pytest

from kproxy_ebpf.datapath.sockets.cgroup_procs import CgroupProcs
from kproxy_ebpf.dev.lab import cgroups

pytestmark = pytest.mark.root


@pytest.fixture
def sleeper_cgroup():
    parent = os.path.join(cgroups.ROOT, f"kproxy-cgp-{os.getpid()}")
    path = os.path.join(parent, "pod")
    os.makedirs(path)
    p = subprocess.Popen(["sleep", "60"])
    try:
        cgroups.move(p.pid, path)
        yield parent, os.stat(path).st_ino, p.pid
    finally:
        p.kill()
        p.wait()
        assert cgroups.remove_tree(parent) == []


@pytest.mark.parametrize("handles", [True, False], ids=["by-handle", "by-walk"])
def test_the_processes_of_a_cgroup_by_its_id(sleeper_cgroup, handles):
    parent, cgroup_id, pid = sleeper_cgroup
    procs = CgroupProcs(parent)
    procs._handles = handles
    assert procs.procs(cgroup_id) == [pid]
    assert procs.walks == (0 if handles else 1)
    assert procs.procs(cgroup_id + 10**9) == []            # no such cgroup
