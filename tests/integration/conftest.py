"""Fixtures for tests against a real control plane (etcd + kube-apiserver + EndpointSlice KCM).

One control plane per test session (starting it costs about 3 s). Tests share it, so every
test uses its own namespace and its own object names. `controlplane` is the
kproxy_ebpf.dev.lab.controlplane.ControlPlane itself: tests may call compact_etcd() and
restart_apiserver() on it. The apiserver keeps its watch cache on, as in production: etcd
compaction alone does not expire a watch resumed from an older resourceVersion (the cache still
holds it); restart_apiserver() does (the new cache starts at the current revision). A test that
needs compaction alone to give 410 starts its own ControlPlane(uncached_resources=...).
`apiserver` is (kubernetes.client.ApiClient, admin kubeconfig path).
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest
from kubernetes import client, config

from kproxy_ebpf.dev.lab.binaries import CONTROL_PLANE_BINARIES, BinariesMissing, ensure_binaries
from kproxy_ebpf.dev.lab.controlplane import ControlPlane

REQUIRE_ENV = "KPROXY_REQUIRE_CONTROLPLANE"


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    # Anything that uses the control plane carries the marker, so `-m "not controlplane"` works.
    for item in items:
        if {"controlplane", "apiserver"} & set(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.controlplane)


@pytest.fixture(scope="session")
def controlplane(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ControlPlane]:
    try:
        bin_dir = ensure_binaries(build=False, names=CONTROL_PLANE_BINARIES)
    except BinariesMissing as e:
        if os.environ.get(REQUIRE_ENV):
            pytest.fail(f"{e} ({REQUIRE_ENV} is set, so this is a failure, not a skip)")
        pytest.skip(str(e))
    workdir = tmp_path_factory.mktemp("kproxy-controlplane")
    cp = ControlPlane(workdir, bin_dir)
    try:
        cp.start()
        yield cp
    finally:
        cp.stop()
        # etcd preallocates 64 MB WAL segments; keep only the logs and PKI for debugging.
        shutil.rmtree(workdir / "etcd", ignore_errors=True)


@pytest.fixture(scope="session")
def apiserver(controlplane: ControlPlane) -> Iterator[tuple[client.ApiClient, Path]]:
    kubeconfig = controlplane.admin_kubeconfig
    api = config.new_client_from_config(config_file=str(kubeconfig))
    try:
        yield api, kubeconfig
    finally:
        api.close()
