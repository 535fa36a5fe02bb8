"""The agent as a process with `run --socket-lb=false` (fed from manifests): no cgroup hooks,
the per-packet ClusterIP programs on every pod veth of node1, a pod created while the agent
runs covered at once, and a switch between the modes that leaves only the current mode's
programs attached. See dplab.py for the lab."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from kproxy_ebpf.cli.main import main
from kproxy_ebpf.datapath.load import tc
from kproxy_ebpf.datapath.load.sock_hooks import SOCK_HOOKS
from kproxy_ebpf.dev.lab import nsutil

from ..support import wait_until
from .agent_proc import log_of, programmed
from .dplab import PORTS, pod_of

pytestmark = pytest.mark.root


def pod_filters(lab) -> set[tuple[str, str]]:
    """(device, program) of the per-packet ClusterIP filters on node1."""
    return {(dev, prog) for dev, _, prog in nsutil.run_in_thread(lab.node("node1").netns, tc.attached)
            if prog in tc.POD_PROGRAMS}


def expected_filters(lab) -> set[tuple[str, str]]:
    return {(p.veth, prog) for p in lab.pods() if p.node == "node1" for prog in tc.POD_PROGRAMS}


def links(bpffs: str) -> set[str]:
    d = Path(bpffs, "links")
    return {p.name for p in d.iterdir()} if d.is_dir() else set()



def test_socket_lb_false_serves_pods_per_packet_and_covers_new_pods(lab, agents):
    bpffs = lab.node("node1").bpffs
    agents("agent-tc", "--socket-lb=false")
    wait_until(lambda: programmed(bpffs), 30, "the service programmed")
    assert links(bpffs) == set(), "no cgroup hook with socket LB off"
    assert pod_filters(lab) == expected_filters(lab)

    lines = lab.probe("client", "10.96.0.80", 80, count=40)
    assert {pod_of(x) for x in lines} == {"a1", "b1"}, lines
    out = CliRunner().invoke(main, ["ct", "list", "--bpffs-dir", bpffs, "-o", "json"])
    assert out.exit_code == 0, out.output
    flows = [r for r in json.loads(out.output) if r["frontend"] == "10.96.0.80:80"]
    assert flows and all(r["path"] == "pod" and r["snat"] is None and
                         r["client"].startswith(lab.pod("client").ip + ":") for r in flows)

    # A pod created while the agent runs gets the programs before its first connection.
    lab.create_pod("late", "node1", ports=PORTS)
    try:
        wait_until(lambda: pod_filters(lab) == expected_filters(lab), 10, "the late pod's veth")
        assert {pod_of(x) for x in lab.probe("late", "10.96.0.80", 80, count=20)} <= {"a1", "b1"}
    finally:
        lab.delete_pod("late")
    wait_until(lambda: pod_filters(lab) == expected_filters(lab), 10, "the late pod gone")
    assert "could not attach" not in log_of(lab, "agent-tc")


def test_switching_modes_leaves_only_the_current_paths_programs(lab, agents):
    bpffs = lab.node("node1").bpffs
    sock_pins = {pin for _, pin in SOCK_HOOKS.values()}
    for i, (flag, want_links, want_filters) in enumerate((
            ("--socket-lb=true", sock_pins, set()),
            ("--socket-lb=false", set(), expected_filters(lab)),
            ("--socket-lb=true", sock_pins, set()))):
        rec = agents(f"agent-{i}", flag)
        wait_until(lambda: programmed(bpffs), 30, "the service programmed")
        assert links(bpffs) == want_links, (flag, log_of(lab, f"agent-{i}")[-2500:])
        assert pod_filters(lab) == want_filters, flag
        lines = lab.probe("client", "10.96.0.80", 80, count=20)
        assert {pod_of(x) for x in lines} <= {"a1", "b1"} and len(lines) == 20, (flag, lines)
        assert all(pod_of(x) in ("a1", "b1") for x in lines), (flag, lines)
        lab.kill(rec.pid)
