"""The agent as a process (fed from manifests): SIGKILL it and start a new one while clients keep
connecting; the pinned maps and links carry the datapath across, and the new agent adopts the
maps without rewriting them."""
from __future__ import annotations

import os
import signal
import sys
import threading
from pathlib import Path

import pytest

from kproxy_ebpf.datapath import layout as L
from kproxy_ebpf.datapath import reader
from kproxy_ebpf.datapath.bpffs import open_pinned_maps, remove_pins

from ..support import wait_until
from .conftest import pod_of

pytestmark = pytest.mark.root

MANIFEST = """
apiVersion: v1
kind: Service
metadata: {name: web, namespace: default}
spec:
  clusterIP: 10.96.0.80
  ports: [{name: http, port: 80, targetPort: 8080}]
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: web-1, namespace: default, labels: {kubernetes.io/service-name: web}}
addressType: IPv4
ports: [{name: http, port: 8080, protocol: TCP}]
endpoints:
- {addresses: [%(a1)s], conditions: {ready: true}, nodeName: node1}
- {addresses: [%(b1)s], conditions: {ready: true}, nodeName: node2}
"""


def start_agent(lab, manifest: Path, name: str, flags: tuple[str, ...] = ()):
    node = lab.node("node1")
    argv = [sys.executable, "-m", "kproxy_ebpf.cli", "run", "--manifests", str(manifest),
            "--cgroup", node.cgroup, "--bpffs-dir", node.bpffs, "--hostname-override", "node1",
            "--healthz-bind-address", "127.0.0.1:10256", "--metrics-bind-address", "",
            "--min-sync-period", "50ms",
            # the lab's own program cache (gone with the lab); a later --program-cache wins
            "--program-cache", os.path.join(lab.state_dir, "programs"), *flags]
    # The lab appends to a name's log: an earlier agent's "first sync" must not count.
    Path(lab.log_path(name)).unlink(missing_ok=True)
    return lab.spawn("node1", argv, name)


def log_of(lab, name: str) -> str:
    return Path(lab.log_path(name)).read_text()


def programmed(bpffs: str) -> list[dict]:
    if not Path(bpffs, L.MAPS["svc"].name).exists():
        return []
    maps = open_pinned_maps(Path(bpffs))
    try:
        return [s for s in reader.services(maps) if s["address"] == "10.96.0.80" and s["backends"]]
    finally:
        for m in maps.values():
            m.close()


def forwarded(bpffs: str) -> int:
    """Connects the programs have translated so far (their own counter)."""
    maps = open_pinned_maps(Path(bpffs))
    try:
        return reader.counters(maps["stats"]).get("forward", 0)
    finally:
        for m in maps.values():
            m.close()


def test_sigkill_and_restart_loses_no_connection(lab, tmp_path):
    manifest = tmp_path / "web.yaml"
    manifest.write_text(MANIFEST % {"a1": lab.pod("a1").ip, "b1": lab.pod("b1").ip})
    bpffs = lab.node("node1").bpffs
    first = start_agent(lab, manifest, "agent-1")
    second = None
    loops: list[threading.Thread] = []
    try:
        wait_until(lambda: programmed(bpffs), 30, "the first agent to program the service")

        results: dict[str, list[str]] = {}
        loops = [
            # new connections every 10 ms, and one connection held open and reused
            threading.Thread(target=lambda: results.__setitem__("new", lab.probe(
                "client", "10.96.0.80", 80, count=500, interval=0.01))),
            threading.Thread(target=lambda: results.__setitem__("held", lab.probe(
                "client", "10.96.0.80", 80, count=250, interval=0.02, keep=True))),
        ]
        before = forwarded(bpffs)
        for t in loops:
            t.start()
        wait_until(lambda: forwarded(bpffs) >= before + 50, 30, "traffic through the agent")
        os.kill(first.pid, signal.SIGKILL)
        assert lab.kill(first.pid) in ("gone", "killed")      # reaped and forgotten
        killed = forwarded(bpffs)
        wait_until(lambda: forwarded(bpffs) >= killed + 30, 30, "traffic with no agent running")
        second = start_agent(lab, manifest, "agent-2")
        wait_until(lambda: "first sync:" in log_of(lab, "agent-2"), 30,
                 "the second agent's first sync")
        # bcc compiled in a child process (datapath/progload.py): no LLVM in the agent itself,
        # and the child's staging pins are gone.
        assert "libbcc" not in Path(f"/proc/{second.pid}/maps").read_text()
        assert not list(Path(bpffs).glob("stage_*"))
        for t in loops:
            t.join()
    finally:
        # The probes end by themselves (count x interval); a failure above must not leave them
        # sending into the next test's counters.
        for t in loops:
            if t.is_alive():
                t.join(60)
        for rec in (first, second):
            if rec is not None:
                try:
                    lab.kill(rec.pid)
                except Exception:
                    pass
        remove_pins(Path(bpffs))

    for name, lines in results.items():
        failed = [x for x in lines if pod_of(x) not in ("a1", "b1")]
        assert not failed, f"{name}: {len(failed)} failed, e.g. {failed[:3]}"
        assert {pod_of(x) for x in lines} <= {"a1", "b1"}
    assert {pod_of(x) for x in results["new"]} == {"a1", "b1"}
    log = log_of(lab, "agent-2")
    assert "adopted 1 frontends" in log, log
    assert "first sync: 1 frontends desired, 0 written, 0 removed, 0 map writes" in log, \
        "the new agent rewrote maps that were already right"
