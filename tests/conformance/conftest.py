"""Differential Service tests: every scenario runs against kproxy and upstream kube-proxy
(nftables, iptables), each in its own lab cluster (real kube-apiserver, EndpointSlice
controller, one proxy per node), and the outcomes are compared (see verdicts.py).

Conventions: labs "cf-<proxy>" (2 nodes: node1 10.250.0.11 zone-a, node2 10.250.0.12 zone-b),
client pod "client" on node1, host client = node1's own namespace, external client "ext"
(10.250.0.250, outside the cluster); backends named after their scenario; namespace default.
The IPv6 and dual-stack labs "cf6-<proxy>" and "cfd-<proxy>" have the same nodes, pods and
client at their addresses of lab/addressing.py (fd00:250::11, ...), for kproxy and nftables.
One cluster per proxy and family for the whole run (session scope: the modules share it).

`make conformance` sets KPROXY_CONFORMANCE_FULL=1 and runs all three columns; otherwise (as in
`make test`) the iptables column is left out (deselected, not skipped): it repeats what
nftables proves and costs a cluster start plus iptables-restore runs.
"""
from __future__ import annotations

import os
from collections.abc import Iterator

import pytest

from kproxy_ebpf.dev.lab.cluster import Cluster

from ..support import lab_cluster
from . import verdicts
from .scenario import Scenario

HERE = os.path.dirname(os.path.abspath(__file__))
FULL_ENV = "KPROXY_CONFORMANCE_FULL"


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if os.environ.get(FULL_ENV) == "1":
        return
    drop = [i for i in items if str(i.path).startswith(HERE + os.sep)
            and getattr(i, "callspec", None)
            and i.callspec.params.get("cluster", ("",))[0] == "iptables"]
    if drop:
        config.hook.pytest_deselected(items=drop)
        items[:] = [i for i in items if i not in drop]


def pytest_terminal_summary(terminalreporter, exitstatus, config) -> None:
    if not verdicts.RESULTS:
        return
    lines, mismatches = verdicts.table()
    tr = terminalreporter
    tr.section("Service conformance: kproxy vs kube-proxy (cells: backends from source, or verdict)")
    for line in lines:
        tr.write_line(line)
    for key, div in sorted(verdicts.DIVERGENCES.items()):
        if key in verdicts.RESULTS or (key[0], key[1] + verdicts.TWIN) in verdicts.RESULTS:
            until = f" (until {div.until})" if div.until else ""
            tr.write_line(f"listed{until}: {key[0]} / {key[1]}: {div.reason}")
    if mismatches:
        tr.write_line(f"{mismatches} kproxy cell(s) differ from nftables without being listed",
                      red=True)


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    if verdicts.RESULTS and verdicts.table()[1] and session.exitstatus == 0:
        session.exitstatus = 1


CLUSTERS = ([(p, "ipv4") for p in verdicts.PROXIES]
            + [(p, f) for f in verdicts.FAMILIES[1:] for p in verdicts.FAMILY_PROXIES])
LAB_PREFIX = {"ipv4": "cf", "ipv6": "cf6", "dual": "cfd"}


@pytest.fixture(scope="session", params=CLUSTERS,
                ids=[p if f == "ipv4" else f"{p}-{f}" for p, f in CLUSTERS])
def cluster(request) -> Iterator[Cluster]:
    proxy, family = request.param
    image = proxy == "image"
    with lab_cluster(f"{LAB_PREFIX[family]}-{proxy}", "kproxy" if image else proxy,
                     "image" if image else "process", client_pod=True, ip_family=family) as c:
        yield c


@pytest.fixture
def scenario(cluster: Cluster, request) -> Iterator[Scenario]:
    name = request.node.originalname.removeprefix("test_")
    s = Scenario(cluster, name)
    try:
        yield s
    finally:
        s.cleanup()
