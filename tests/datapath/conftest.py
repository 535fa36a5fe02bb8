"""Fixtures of the datapath suite: the lab "dp" (conventions and helpers in dplab.py), node1's
datapath programmed in-process (`node1`, on the ClusterIP path `lb_path`), agent processes on
node1 (`agents`) and tc_lb.c under BPF_PROG_TEST_RUN (`harness`, tcrun.py)."""
from __future__ import annotations

import contextlib
import subprocess
from pathlib import Path

import pytest

from kproxy_ebpf.datapath.load import tc
from kproxy_ebpf.datapath.load.bpffs import remove_pins
from kproxy_ebpf.dev.lab import LabError, nsutil

from ..support import fresh_lab, wait_until
from . import tcrun
from .agent_proc import log_of, start_agent, web_manifest
from .dplab import LAB, LAB_FAMILIES, PODS, PORTS, Fam, NodeProxy


@pytest.fixture(scope="session")
def lab():
    with fresh_lab(LAB, nodes=2, external=False, families=LAB_FAMILIES) as lab:
        for pod, node in PODS.items():
            lab.create_pod(pod, node, ports=PORTS)
        yield lab


ROOT = Path(__file__).resolve().parents[2]
# The previous release for the upgrade and rollback tests: the last commit before
# kp_srcrange_v3 (the scope in its key) and kp_nssrc/kp_nsmiss.
UPGRADE_FROM = "d691322"


@pytest.fixture(scope="module")
def old_tree(tmp_path_factory):
    """A checkout of UPGRADE_FROM, removed after the module."""
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


@pytest.fixture
def lb_path(request) -> str:
    """The ClusterIP path node1 uses: "socket" unless the test is parametrised (LB_PATHS)."""
    return getattr(request, "param", "socket")


@pytest.fixture(params=LAB_FAMILIES)
def fam(request) -> Fam:
    """The family a test's Services and endpoints are of (dplab.Fam)."""
    return Fam(request.param)


@pytest.fixture
def node1(lab, lb_path):
    proxy = NodeProxy(lab, "node1", lb_path)
    try:
        yield proxy
    finally:
        proxy.close()


@pytest.fixture
def agents(lab, tmp_path):
    """Starts agents (name, extra flags); stops them and removes what they left on node1."""
    manifest = tmp_path / "web.yaml"
    manifest.write_text(web_manifest(lab))
    node = lab.node("node1")
    started = []

    def start(name: str, *flags: str):
        rec = start_agent(lab, manifest, name, flags)
        started.append(rec)
        wait_until(lambda: "first sync:" in log_of(lab, name), 30, f"{name}'s first sync")
        return rec

    try:
        yield start
    finally:
        for rec in started:
            with contextlib.suppress(LabError):      # the test stopped it already
                lab.kill(rec.pid)
        nsutil.run_in_thread(node.netns, tc.detach_all)
        remove_pins(Path(node.bpffs))


@pytest.fixture(scope="module")
def harness():
    """tc_lb.c loaded for BPF_PROG_TEST_RUN in a netns of its own (tcrun.py), once per module."""
    with tcrun.open_harness() as h:
        yield h
