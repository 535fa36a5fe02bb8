"""The agent as a process (fed from manifests): SIGKILL or SIGTERM it and start a new one while
clients keep connecting; the pinned maps and links carry the datapath across, the new agent
adopts the maps without rewriting them, and its first search for stale sockets (every socket
of the node) leaves the held connection to a live backend alone."""
from __future__ import annotations

import contextlib
import os
import signal
import threading
from pathlib import Path

import pytest
import yaml

from kproxy_ebpf.datapath.load.bpffs import open_pinned_maps, remove_pins
from kproxy_ebpf.datapath.maps import layout as L
from kproxy_ebpf.datapath.maps import reader
from kproxy_ebpf.dev.lab import LabError

from ..support import wait_until
from .agent_proc import log_of, programmed, start_agent, web_manifest
from .dplab import pod_of

pytestmark = pytest.mark.root

def forwarded(bpffs: str) -> int:
    """Connects the programs have translated so far (their own counter)."""
    maps = open_pinned_maps(Path(bpffs))
    try:
        return reader.counters(maps["stats"]).get("forward", 0)
    finally:
        for m in maps.values():
            m.close()


def restart_under_load(lab, tmp_path, sig, flags: tuple[str, ...] = (),
                       trees: tuple[Path | None, Path | None] = (None, None)):
    """Agent 1, clients connecting (new connections every 10 ms, one held and reused), agent 1
    stopped by `sig`, agent 2 (with `flags`) started; returns each client's lines and agent 2's
    log once the clients are done. `trees`: the checkout each agent runs from (None: this one)."""
    manifest = tmp_path / "web.yaml"
    manifest.write_text(web_manifest(lab))
    bpffs = lab.node("node1").bpffs
    first = start_agent(lab, manifest, "agent-1", tree=trees[0])
    second = None
    loops: list[threading.Thread] = []
    try:
        wait_until(lambda: programmed(bpffs), 30, "the first agent to program the service")
        # The rows come first; on fresh maps the hooks are attached at the end of that sync.
        wait_until(lambda: pod_of(lab.probe("client", "10.96.0.80", 80)[0]) in ("a1", "b1"),
                   15, "the hooks to serve the service")

        results: dict[str, list[str]] = {}
        loops = [
            threading.Thread(target=lambda: results.__setitem__("new", lab.probe(
                "client", "10.96.0.80", 80, count=500, interval=0.01))),
            threading.Thread(target=lambda: results.__setitem__("held", lab.probe(
                "client", "10.96.0.80", 80, count=250, interval=0.02, keep=True))),
        ]
        before = forwarded(bpffs)
        for t in loops:
            t.start()
        wait_until(lambda: forwarded(bpffs) >= before + 50, 30, "traffic through the agent")
        if sig == signal.SIGKILL:
            os.kill(first.pid, sig)
            assert lab.kill(first.pid) in ("gone", "killed")  # reaped and forgotten
        else:
            # SIGTERM, and a stop within the grace (no SIGKILL after it).
            assert lab.kill(first.pid, grace=10) == "killed"
            assert "stopping; the datapath stays programmed" in log_of(lab, "agent-1")
        killed = forwarded(bpffs)
        wait_until(lambda: forwarded(bpffs) >= killed + 30, 30, "traffic with no agent running")
        second = start_agent(lab, manifest, "agent-2", flags, tree=trees[1])
        wait_until(lambda: "first sync:" in log_of(lab, "agent-2"), 30,
                   "the second agent's first sync")
        # bcc compiled in a child process (datapath/progload.py): no LLVM in the agent itself,
        # and the child's staging pins are gone.
        assert "libbcc" not in Path(f"/proc/{second.pid}/maps").read_text()
        assert not list(Path(bpffs).glob("stage_*"))
        for t in loops:
            t.join()
        return results, log_of(lab, "agent-2")
    finally:
        # The probes end by themselves (count x interval); a failure above must not leave them
        # sending into the next test's counters.
        for t in loops:
            if t.is_alive():
                t.join(60)
        for rec in (first, second):
            if rec is not None:
                with contextlib.suppress(LabError):      # the test stopped it already
                    lab.kill(rec.pid)


def assert_no_failure(results: dict[str, list[str]]) -> None:
    for name, lines in results.items():
        failed = [(i, x) for i, x in enumerate(lines) if pod_of(x) not in ("a1", "b1")]
        assert not failed, f"{name}: {len(failed)} failed, e.g. {failed[:3]}"
        assert {pod_of(x) for x in lines} <= {"a1", "b1"}
    assert {pod_of(x) for x in results["new"]} == {"a1", "b1"}


@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGTERM], ids=["SIGKILL", "SIGTERM"])
def test_stop_and_restart_loses_no_connection(lab, tmp_path, sig):
    try:
        results, log = restart_under_load(lab, tmp_path, sig)
    finally:
        remove_pins(Path(lab.node("node1").bpffs))
    assert_no_failure(results)
    assert "adopted 1 frontends" in log, log
    assert "first sync: 1 frontends desired, 0 written, 0 removed, 0 map writes" in log, \
        "the new agent rewrote maps that were already right"


def test_new_map_sizes_take_effect_at_restart_and_lose_no_connection(lab, tmp_path):
    """mapSizes changed between two agents: the maps are made anew at the new sizes (with the
    maps their rows name), filled, and the programs swapped, with no `cleanup` and no failed
    or reset connection; the old maps' pins are gone after."""
    bpffs = Path(lab.node("node1").bpffs)
    sizes = {"svc": L.MAPS["svc"].default_size // 2, "sknat": L.MAPS["sknat"].default_size // 2}
    config = tmp_path / "config.yaml"
    config.write_text(yaml.safe_dump({"mapSizes": sizes}))
    try:
        results, log = restart_under_load(lab, tmp_path, signal.SIGTERM,
                                          ("--config", str(config)))
        maps = open_pinned_maps(bpffs)
        try:
            got = {name: maps[name].max_entries for name in ("svc", "sknat", "backend")}
        finally:
            for m in maps.values():
                m.close()
        leftovers = sorted(p.name for p in bpffs.glob("*_resize"))
    finally:
        remove_pins(bpffs)
    assert_no_failure(results)
    assert got == {**sizes, "backend": L.MAPS["backend"].default_size}, got
    assert leftovers == []
    assert "kp_svc_v3: made anew" in log and "kp_be_v3: made anew" in log, log
    # The new programs went in after the sync that filled the new maps, the old pins after.
    lines = log.splitlines()
    at = [next(i for i, ln in enumerate(lines) if what in ln) for what in (
        "made anew", "starting the sync loop", "replaced program of link", "_resize: the map")]
    assert at == sorted(at), log
