"""Fixtures of the chart suite (no root)."""
from __future__ import annotations

import os

import pytest

from kproxy_ebpf.dev.lab.binaries import k8s_bin_dir, missing_binaries


@pytest.fixture(scope="module")
def helm() -> str:
    """The pinned helm (tools/k8s); skips without it, unless KPROXY_REQUIRE_CONTROLPLANE=1."""
    if missing_binaries(k8s_bin_dir(), ("helm",)):
        if os.environ.get("KPROXY_REQUIRE_CONTROLPLANE") == "1":
            pytest.fail(f"helm missing in {k8s_bin_dir()}: run `make setup`")
        pytest.skip("helm not built (make setup)")
    return str(k8s_bin_dir() / "helm")
