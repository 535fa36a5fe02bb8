"""procs.identify: telling the recorded process from a reused pid, from /proc alone."""
from __future__ import annotations

from kproxy_ebpf.dev.lab import procs
from kproxy_ebpf.dev.lab.state import ProcRec

REC = ProcRec(pid=4242, argv=["python3", "-m", "kproxy_ebpf.cli.main", "run"], starttime=100,
              target="node/node1", log="")


def proc(monkeypatch, starttime, state="S", argv=REC.argv) -> None:
    monkeypatch.setattr(procs, "read_starttime", lambda pid: starttime)
    monkeypatch.setattr(procs, "_state_letter", lambda pid: state)
    monkeypatch.setattr(procs, "cmdline", lambda pid: argv)


def test_the_recorded_process_runs(monkeypatch):
    proc(monkeypatch, 100)
    assert procs.identify(REC) == "running"


def test_a_process_caught_exiting_is_gone_not_reused(monkeypatch):
    # Right after SIGKILL: same start time, still "R" or "D", but its memory and with it
    # the command line already released (the agent restart test once saw exactly this).
    proc(monkeypatch, 100, state="R", argv=[])
    assert procs.identify(REC) == "gone"
    proc(monkeypatch, 100, state="Z", argv=[])
    assert procs.identify(REC) == "gone"


def test_another_process_on_the_pid_is_reused(monkeypatch):
    proc(monkeypatch, 101)
    assert procs.identify(REC) == "reused"
    proc(monkeypatch, 100, argv=["sleep", "60"])
    assert procs.identify(REC) == "reused"


def test_no_process_on_the_pid_is_gone(monkeypatch):
    proc(monkeypatch, None)
    assert procs.identify(REC) == "gone"
