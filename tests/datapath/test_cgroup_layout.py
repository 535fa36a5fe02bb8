"""The agent finds the node's cgroup v2 hierarchy in the layouts hosts really have, on real
mounts: a cgroup2 mount taken as it is (unified hosts, or a node given its own cgroup2 mount
as `make kind-up` does), the hybrid layout (cgroup v1 at the root, cgroup2 at `unified` below
it: this machine, and what the chart's hostPath of /sys/fs/cgroup carries there), and a v1-only
directory refused by `kproxy-ebpf run` with one sentence that names the setting. The mounts are
only looked at (statfs): nothing attaches to them."""
from __future__ import annotations

import subprocess
import sys
from contextlib import contextmanager
from pathlib import Path

import pytest

from kproxy_ebpf.config import ConfigError, load

from ..support import require_root


@contextmanager
def mounted(*mounts: tuple[str, Path]):
    """mount -t FSTYPE none DIR for each (FSTYPE, DIR), in order; unmounted in reverse."""
    done = []
    try:
        for fstype, where in mounts:
            where.mkdir(parents=True, exist_ok=True)
            subprocess.run(["mount", "-t", fstype, "none", str(where)], check=True)
            done.append(where)
        yield
    finally:
        for where in reversed(done):
            subprocess.run(["umount", str(where)], check=False)


@pytest.fixture(autouse=True)
def _root():
    require_root()


def resolved(path: Path) -> str:
    cfg = load(None, env={})
    cfg.cgroup = str(path)
    cfg.validate()
    return cfg.cgroup


def test_a_cgroup2_mount_is_the_hook_target(tmp_path):
    root = tmp_path / "kproxy-cg2"
    with mounted(("cgroup2", root)):
        assert resolved(root) == str(root)


def test_the_hybrid_layout_is_found_below_the_v1_root(tmp_path):
    root = tmp_path / "kproxy-hybrid"
    with mounted(("tmpfs", root), ("cgroup2", root / "unified")):
        assert resolved(root) == str(root / "unified")


def test_a_v1_only_root_stops_the_agent_with_the_value_to_set(tmp_path):
    root = tmp_path / "kproxy-v1"
    with mounted(("tmpfs", root)):
        (root / "cpu").mkdir()                 # what a v1 root holds: controller hierarchies
        with pytest.raises(ConfigError, match="hostPaths.cgroupRoot"):
            resolved(root)
        r = subprocess.run([sys.executable, "-m", "kproxy_ebpf.cli.main", "run", "--cgroup", str(root),
                            "--manifests", "/dev/null"], capture_output=True, text=True, timeout=60)
    assert r.returncode == 1
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"Error: cgroup {root} is cgroup v1"), r.stderr
    assert "Traceback" not in r.stderr
