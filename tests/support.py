"""Helpers shared by the root test suites: root and control-plane gates, polling, lab clusters."""
from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Iterator
from typing import TYPE_CHECKING

import pytest

from kproxy_ebpf.dev.lab.binaries import k8s_bin_dir, missing_binaries

if TYPE_CHECKING:       # imported where used: the suite-wide conftest imports this module
    from kproxy_ebpf.dev.lab import Lab
    from kproxy_ebpf.dev.lab.cluster import Cluster


def require_root() -> None:
    """Skips when not root, or fails when KPROXY_REQUIRE_ROOT=1 (make test, CI)."""
    if os.geteuid() != 0:
        if os.environ.get("KPROXY_REQUIRE_ROOT") == "1":
            pytest.fail("needs root (KPROXY_REQUIRE_ROOT=1 forbids skipping)")
        pytest.skip("needs root")


def require_controlplane() -> None:
    """Skips without the control-plane binaries, or fails when KPROXY_REQUIRE_CONTROLPLANE=1
    (make test, CI), where a skip would hide a broken setup."""
    require_root()
    missing = missing_binaries(k8s_bin_dir())
    if missing:
        if os.environ.get("KPROXY_REQUIRE_CONTROLPLANE") == "1":
            pytest.fail(f"control-plane binaries missing in {k8s_bin_dir()} ({missing}): "
                        "run `make setup`")
        pytest.skip("control-plane binaries not built (make setup)")


def wait_until(pred, timeout: float, what, step: float = 0.05):
    """Polls pred() until it returns something truthy (returned), or fails after timeout;
    `what` may be a callable, told at the failure (what was seen instead)."""
    deadline = time.monotonic() + timeout
    while True:
        value = pred()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for "
                                 f"{what() if callable(what) else what}")
        time.sleep(step)


@contextlib.contextmanager
def fresh_lab(name: str, **up) -> Iterator[Lab]:
    """Lab `name` brought up anew (`up`: Lab.up's arguments; a run killed hard may have left
    pieces of an earlier one); taken down after, and it must have left nothing behind."""
    from kproxy_ebpf.dev.lab import Lab

    require_root()
    lab = Lab(name)
    lab.down()
    try:
        lab.up(**up)
        yield lab
    finally:
        report = lab.down()
    assert report.ok, report.problems


@contextlib.contextmanager
def lab_cluster(name: str, proxy: str, agent: str = "process",
                client_pod: bool = False, ip_family: str = "ipv4") -> Iterator[Cluster]:
    """A 2-node lab cluster of `ip_family` running `proxy` (our agent as a "process" or from
    the "image"), with the client pod on node1 (tcp:8080) when asked; removed after, unless
    KPROXY_KEEP_LAB=1 keeps it to debug (`lab down --lab <name>` then)."""
    from kproxy_ebpf.dev.lab.cluster import Cluster

    require_controlplane()
    c = Cluster(name)
    c.down()
    c.up(nodes=2, proxy=proxy, agent=agent, ip_family=ip_family)
    try:
        if client_pod:
            c.create_pod("client", "node1", ports=(("tcp", 8080),))
        yield c
    finally:
        if os.environ.get("KPROXY_KEEP_LAB") != "1":
            problems = c.down()
            assert not problems, problems
