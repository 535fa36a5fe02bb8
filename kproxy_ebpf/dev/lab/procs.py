"""Start lab processes inside a (cgroup, netns) pair, and stop exactly those again.

The lab calls this from several threads at once (a probe loop while pods are created), so
nothing Python runs between fork and exec (no preexec_fn: a forked copy of a multi-threaded
process may inherit a lock another thread held). A child is started through a tiny exec
trampoline instead, with subprocess's plain fork+exec:

    sh -c 'echo $$ > <cgroup>/cgroup.procs && shift && exec "$@"' - nsenter --net=<netns> -- ARGV

`sh` joins the cgroup with its own pid, then execs `nsenter`, which enters the network
namespace and execs the target: one pid throughout, and the target never runs an instruction
outside its cgroup or namespace (so a socket hook attached there sees its first connect()).
The cgroup is joined before the namespace because joining needs the host's
/sys/fs/cgroup/unified, which `ip netns exec` would hide by remounting /sys. Only the network
namespace is entered; mount, pid and uts stay the host's.

Pids are reused by the kernel, so a started process is recorded as (pid, start time, argv).
kill_recorded() signals a pid only while all three still match, which makes a stale state file
harmless: it can never kill an unrelated process that inherited the number.
"""
from __future__ import annotations

import os
import shutil
import signal
import subprocess
import time
from collections.abc import Sequence
from typing import Any

from . import cgroups, nsutil
from .state import ProcRec

# Popen objects of children this process started, so it can reap them (no zombies, no
# ResourceWarning); processes started by an earlier CLI invocation are reaped by init.
_children: dict[int, subprocess.Popen] = {}

_JOIN_CGROUP = 'echo $$ >"$1" && shift && exec "$@"'


def _tool(name: str) -> str:
    path = shutil.which(name) or shutil.which(name, path="/usr/bin:/bin:/usr/sbin:/sbin")
    if not path:
        raise nsutil.LabError(f"{name} not found (util-linux / a POSIX sh is needed)")
    return path


def trampoline(netns: str | None, cgroup: str | None, argv: Sequence[str]) -> list[str]:
    """The argv that runs `argv` inside the cgroup and netns (checked here, so a bad target is
    a clear error in the caller rather than a cryptic exit status of the child)."""
    out = list(argv)
    if not out:
        raise ValueError("empty argv")
    if netns:
        if not nsutil.exists(netns):
            raise nsutil.LabError(f"no netns {netns}")
        out = [_tool("nsenter"), f"--net={nsutil.netns_path(netns)}", "--", *out]
    if cgroup:
        procs_file = os.path.join(cgroups.check(cgroup), "cgroup.procs")
        if not os.path.exists(procs_file):
            raise nsutil.LabError(f"no cgroup {cgroup}")
        out = [_tool("sh"), "-c", _JOIN_CGROUP, "kproxy-trampoline", procs_file, *out]
    return out


def run_in(netns: str | None, cgroup: str | None, argv: Sequence[str],
           **kwargs: Any) -> subprocess.CompletedProcess:
    """Run a one-off command in the netns+cgroup; kwargs go to subprocess.run.

    Without stdin/stdout/capture_output arguments the child inherits this process's stdio, so
    `lab exec` forwards the terminal, pipes and the exit code unchanged.
    """
    return subprocess.run(trampoline(netns, cgroup, argv), **kwargs)


def read_starttime(pid: int) -> int | None:
    try:
        with open(f"/proc/{pid}/stat") as f:
            stat = f.read()
    except (FileNotFoundError, ProcessLookupError):
        return None
    # comm (field 2) may contain spaces and parentheses: split after the last ')'.
    return int(stat.rsplit(")", 1)[1].split()[19])


def _state_letter(pid: int) -> str | None:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError):
        return None


def cmdline(pid: int) -> list[str] | None:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            raw = f.read()
    except (FileNotFoundError, ProcessLookupError):
        return None
    return [a.decode(errors="surrogateescape") for a in raw.split(b"\0")[:-1]]


def spawn(argv: Sequence[str], *, netns: str | None, cgroup: str | None, log_path: str,
          target: str, name: str = "", env: dict[str, str] | None = None,
          cwd: str | None = None) -> ProcRec:
    """Start a long-running process in its own session; stdout+stderr append to log_path.

    Returns once the trampoline has exec'd the target (or died), so the recorded argv is
    already what /proc/<pid>/cmdline shows and identify() never mistakes the trampoline for a
    reused pid.
    """
    full = trampoline(netns, cgroup, argv)
    os.makedirs(os.path.dirname(log_path), exist_ok=True)
    with open(log_path, "ab") as log:
        p = subprocess.Popen(full, stdin=subprocess.DEVNULL, stdout=log, stderr=log,
                             start_new_session=True, env=env, cwd=cwd)
    _children[p.pid] = p
    start = read_starttime(p.pid)
    if start is None:  # died at once; still record it so the caller sees a dead pid
        start = -1
    _wait_exec(p, list(argv))
    return ProcRec(pid=p.pid, argv=list(argv), starttime=start, target=target, log=log_path,
                   name=name)


def _wait_exec(p: subprocess.Popen, argv: list[str], timeout: float = 10.0) -> None:
    """Until the pid runs `argv` (sh and nsenter exec within milliseconds) or has exited."""
    deadline = time.monotonic() + timeout
    while cmdline(p.pid) != argv and p.poll() is None:
        if time.monotonic() > deadline:
            raise nsutil.LabError(f"pid {p.pid} did not exec {argv[0]} within {timeout:.0f}s")
        time.sleep(0.002)


def identify(rec: ProcRec) -> str:
    """'running' if pid is still the recorded process, 'gone' if it exited, 'reused' if the
    pid now belongs to someone else."""
    start = read_starttime(rec.pid)
    if start is None:
        return "gone"
    if rec.starttime >= 0 and start != rec.starttime:
        return "reused"
    if _state_letter(rec.pid) in ("Z", "X"):
        return "gone"  # exited, only its zombie is left (cmdline is empty then)
    argv = cmdline(rec.pid)
    if not argv:
        # Same start time, so the same process, caught exiting: its memory, and with it the
        # command line, is released before it turns into a zombie (seen right after SIGKILL
        # of an agent, which a plain comparison took for a reused pid).
        return "gone"
    if argv != rec.argv:
        return "reused"
    return "running"


def _reap(pid: int) -> None:
    p = _children.get(pid)
    if p is not None:
        if p.poll() is not None:
            del _children[pid]
        return
    try:
        os.waitpid(pid, os.WNOHANG)
    except ChildProcessError:
        pass  # not our child: its parent (or init) reaps it


def _wait_gone(rec: ProcRec, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while True:
        _reap(rec.pid)
        if identify(rec) != "running":
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.02)


def kill_recorded(rec: ProcRec, grace: float = 3.0) -> str:
    """Stop the recorded process: SIGTERM, then SIGKILL after `grace` seconds, then reap.

    Returns 'killed', 'gone' (had already exited), 'reused' (pid now belongs to another
    process, which is left alone) or 'stuck' (survived SIGKILL, e.g. in uninterruptible sleep).
    """
    status = identify(rec)
    if status != "running":
        _reap(rec.pid)
        return status
    try:
        os.kill(rec.pid, signal.SIGTERM)
    except ProcessLookupError:
        return "gone"
    if _wait_gone(rec, grace):
        return "killed"
    if identify(rec) == "running":  # re-check right before the hard kill
        try:
            os.kill(rec.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    return "killed" if _wait_gone(rec, 5.0) else "stuck"


def kill_pid(pid: int, grace: float = 2.0) -> bool:
    """Stop an unrecorded process found in a lab cgroup (a child of something we started).

    It is identified by its start time at discovery, so the same pid is not signalled again
    if it was reused meanwhile. Returns True when it is gone.
    """
    start = read_starttime(pid)
    if start is None:
        return True
    rec = ProcRec(pid=pid, argv=cmdline(pid) or [], starttime=start, target="", log="")
    if not rec.argv:  # a zombie or kernel thread: nothing to signal
        return True
    return kill_recorded(rec, grace) != "stuck"
