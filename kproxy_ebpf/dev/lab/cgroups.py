"""cgroup v2 directories of the lab: create, remove, move a pid, list pids.

Each simulated node has a cgroup (/sys/fs/cgroup/unified/kproxy-<lab>/node<i>) where its agent
attaches the socket hooks; the node's pods and host processes live in children of it, so the
hooks see exactly that node's sockets, as on a real node. No controllers are enabled, so
cgroup v2's "no internal processes" rule does not apply and a cgroup is just a process set.

Every path is checked to lie under <root>/kproxy-*: this module can never create, write or
remove anything else, in particular not the machine's root cgroup.
"""
from __future__ import annotations

import errno
import os
import time

ROOT = "/sys/fs/cgroup/unified"
PREFIX = "kproxy-"


def check(path: str, root: str = ROOT) -> str:
    """Return the normalised path, or raise if it is not strictly inside <root>/kproxy-*."""
    real = os.path.realpath(path)
    base = os.path.realpath(root)
    rel = os.path.relpath(real, base)
    if rel.startswith("..") or rel == "." or not rel.split(os.sep)[0].startswith(PREFIX):
        raise ValueError(f"refusing to touch cgroup {path!r}: not under {base}/{PREFIX}*")
    return real


def ensure(path: str, root: str = ROOT) -> str:
    """Create the cgroup (and its parents below root); idempotent."""
    path = check(path, root)
    os.makedirs(path, exist_ok=True)
    return path


def move(pid: int, path: str, root: str = ROOT) -> None:
    path = check(path, root)
    with open(os.path.join(path, "cgroup.procs"), "w") as f:
        f.write(str(pid))


def pids(path: str, root: str = ROOT) -> list[int]:
    path = check(path, root)
    try:
        with open(os.path.join(path, "cgroup.procs")) as f:
            return [int(x) for x in f.read().split()]
    except FileNotFoundError:
        return []


def walk(path: str, root: str = ROOT) -> list[str]:
    """The cgroup and all its descendants, deepest first (the order rmdir needs)."""
    path = check(path, root)
    if not os.path.isdir(path):
        return []
    found = []
    for dirpath, _dirs, _files in os.walk(path):
        found.append(dirpath)
    return sorted(found, key=lambda p: p.count(os.sep), reverse=True)


def pids_recursive(path: str, root: str = ROOT) -> list[int]:
    out: list[int] = []
    for d in walk(path, root):
        out.extend(pids(d, root))
    return out


def remove_tree(path: str, root: str = ROOT) -> list[str]:
    """rmdir the cgroup and its descendants, deepest first; returns problems (empty = done).

    A cgroup directory can only be removed when it has no processes and no children, so the
    caller must have stopped the processes first.
    """
    problems = []
    for d in walk(path, root):
        try:
            _rmdir_when_empty(d, root)
        except FileNotFoundError:
            pass
        except OSError as e:
            left = ", ".join(_describe(pid) for pid in pids(d, root))
            problems.append(f"rmdir {d}: {e.strerror} (pids [{left}])")
    return problems


def _describe(pid: int) -> str:
    """`pid (comm, state S, ppid P)`, what a leftover process in a cgroup tells about itself."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            stat = f.read()
    except OSError:
        return f"{pid} (gone)"
    comm = stat[stat.find("(") + 1:stat.rfind(")")]
    state, ppid = stat.rsplit(")", 1)[1].split()[:2]
    return f"{pid} ({comm}, state {state}, ppid {ppid})"


def kill_all(path: str, root: str = ROOT, timeout: float = 3.0) -> bool:
    """SIGKILL every process in the cgroup and its descendants at once (cgroup.kill, Linux
    5.14): unlike a pid-by-pid sweep it also gets a child forked while the sweep ran. Waits
    until they have exited; False when some are left (or the kernel has no cgroup.kill)."""
    path = check(path, root)
    try:
        with open(os.path.join(path, "cgroup.kill"), "w") as f:
            f.write("1")
    except FileNotFoundError:
        return False
    deadline = time.monotonic() + timeout
    while _populated(path):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.02)
    return True


def _populated(path: str) -> bool:
    try:
        with open(os.path.join(path, "cgroup.events")) as f:
            return "populated 1" in f.read()
    except FileNotFoundError:
        return False


def _rmdir_when_empty(d: str, root: str, timeout: float = 3.0) -> None:
    """rmdir, waiting out tasks that were killed but are still exiting: they may still be
    listed in cgroup.procs, or no longer listed yet keep the cgroup populated (EBUSY) until
    the kernel releases them. cgroup.events says when that has happened."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            os.rmdir(d)
            return
        except OSError as e:
            if e.errno != errno.EBUSY or time.monotonic() > deadline:
                raise
        if not os.path.isdir(d):
            return
        if not _populated(d):
            continue
        time.sleep(0.02)
