"""The agent as a process with a program cache (datapath/progcache.py): the first start compiles
and records the programs, a restart loads them without clang (log line) and serves ClusterIP
traffic on the socket path (maps adopted) and on the per-packet TC path (maps created by the
cache, after a cleanup), and an entry the verifier rejects falls back to a compile that serves
as well."""
from __future__ import annotations

import base64
import json
import struct
from pathlib import Path

import pytest

from kproxy_ebpf.datapath.load.bpffs import remove_pins

from ..support import wait_until
from .agent_proc import log_of, metrics, programmed, sample
from .dplab import pod_of

pytestmark = pytest.mark.root

HIT = "programs from the program cache in"


def serves(lab) -> None:
    lines = lab.probe("client", "10.96.0.80", 80, count=20)
    assert len(lines) == 20 and {pod_of(x) for x in lines} <= {"a1", "b1"}, lines


def test_a_restart_loads_from_the_cache_and_serves_both_paths(lab, agents, tmp_path):
    bpffs = lab.node("node1").bpffs
    cache = tmp_path / "programs"
    flag = f"--program-cache={cache}"

    first = agents("agent-c1", flag)
    wait_programmed(bpffs)
    serves(lab)
    log = log_of(lab, "agent-c1")
    assert "program cache: no entry" in log and "compiled and loaded" in log, log[-2000:]
    assert len(list(cache.glob("*.json"))) == 1, "stored for the next start"
    lab.kill(first.pid)

    # socket path, pinned maps adopted
    second = agents("agent-c2", flag, "--metrics-bind-address=127.0.0.1:10249")
    wait_programmed(bpffs)
    serves(lab)
    log = log_of(lab, "agent-c2")
    assert HIT in log and "compiled and loaded" not in log, log[-2000:]
    m = metrics(lab)
    assert sample(m, 'kproxy_program_cache_loads_total{result="hit"}') == 1
    assert sample(m, 'kproxy_program_cache_loads_total{result="miss"}') == 0
    assert "libbcc" not in Path(f"/proc/{second.pid}/maps").read_text()
    lab.kill(second.pid)

    # per-packet TC path, on a node with nothing pinned: the cache creates the maps
    remove_pins(Path(bpffs))
    third = agents("agent-c3", flag, "--socket-lb=false")
    wait_programmed(bpffs)
    serves(lab)
    assert HIT in log_of(lab, "agent-c3"), log_of(lab, "agent-c3")[-2000:]
    lab.kill(third.pid)


def test_an_entry_the_verifier_rejects_falls_back_to_the_compile(lab, agents, tmp_path):
    bpffs = lab.node("node1").bpffs
    cache = tmp_path / "programs"
    flag = f"--program-cache={cache}"
    lab.kill(agents("agent-v1", flag).pid)
    (entry,) = cache.glob("*.json")
    data = json.loads(entry.read_text())
    # r0 = *(u64 *)(r9 + 0); exit: r9 was never written, the verifier refuses the read
    bad = struct.pack("<BBhi", 0x79, 0x90, 0, 0) + struct.pack("<BBhi", 0x95, 0, 0, 0)
    data["programs"][0].update(insns=base64.b64encode(bad).decode(), refs=[])
    entry.write_text(json.dumps(data))

    agents("agent-v2", flag)
    wait_programmed(bpffs)
    serves(lab)
    log = log_of(lab, "agent-v2")
    assert "program cache not used, compiling instead: the kernel rejected cached" in log, \
        log[-2000:]
    assert "compiled and loaded" in log and "program cache: stored" in log
    # the fallback's compile rewrote the entry: the next start is a hit again
    assert json.loads(entry.read_text())["programs"][0]["insns"] != data["programs"][0]["insns"]


def wait_programmed(bpffs: str) -> None:
    wait_until(lambda: programmed(bpffs), 30, "the service programmed")
