"""The sockets our hooks can have connected: where they live and how to reach them.

The socket hooks run for sockets created in the agent's cgroup or below it, in whatever network
namespace their process has. So the places to look are the network namespaces of the processes
in that cgroup tree (/proc/<pid>/ns/net: needs the node's pid namespace, hostPID in the chart),
the agent's own (host-network pods), and the namespaces a container runtime pins under
/run/netns (containerd's cni-*, whose processes may be out of our sight). A socket is ours only if
its own cgroup (fixed when it was created) is one of the tree's: that is what the kernel checked
before running our hook, and what stale_sockets.py checks before touching it.

in_netns() and in_each_netns() run a function in a thread that entered a namespace, so the
agent's own threads never change theirs (setns(CLONE_NEWNET) changes the calling thread only).
"""
from __future__ import annotations

import ctypes
import logging
import os
import socket
import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import TypeVar

log = logging.getLogger(__name__)

CLONE_NEWNET = 0x40000000
SO_NETNS_COOKIE = 71          # include/uapi/asm-generic/socket.h (Linux 5.14)
RUNTIME_NETNS_DIRS = ("/run/netns",)
T = TypeVar("T")


@dataclass(frozen=True)
class Scope:
    cgroup_ids: frozenset[int]      # the cgroup tree's ids (a cgroup2 directory's inode)
    netns: tuple[str, ...]          # one path per distinct network namespace


def _cgroup_dirs(root: str) -> Iterable[str]:
    yield root
    for parent, dirs, _files in os.walk(root, onerror=lambda e: None):
        for d in dirs:
            yield os.path.join(parent, d)


def _pids(cgroup_dir: str) -> list[int]:
    try:
        with open(os.path.join(cgroup_dir, "cgroup.procs")) as f:
            return [int(line) for line in f if line.strip() not in ("", "0")]
    except OSError:
        return []          # removed while we walk


def scope(cgroup_root: str, netns_dirs: Iterable[str] = RUNTIME_NETNS_DIRS) -> Scope:
    """The cgroup ids of the tree at `cgroup_root` and the network namespaces to search."""
    ids: set[int] = set()
    seen: dict[tuple[int, int], str] = {}

    def note(path: str) -> None:
        try:
            st = os.stat(path)
        except OSError:
            return         # the process or namespace went away, or is not ours to see
        seen.setdefault((st.st_dev, st.st_ino), path)

    note("/proc/thread-self/ns/net")
    for d in _cgroup_dirs(cgroup_root):
        try:
            ids.add(os.stat(d).st_ino)
        except OSError:
            continue
        for pid in _pids(d):
            note(f"/proc/{pid}/ns/net")
    for directory in netns_dirs:
        try:
            names = sorted(os.listdir(directory))
        except OSError:
            continue
        for name in names:
            note(os.path.join(directory, name))
    return Scope(frozenset(ids), tuple(seen.values()))


_libc = None


def _setns(fd: int) -> None:
    global _libc
    if _libc is None:
        _libc = ctypes.CDLL(None, use_errno=True)
    if _libc.setns(fd, CLONE_NEWNET) != 0:
        err = ctypes.get_errno()
        raise OSError(err, os.strerror(err))


def in_thread(fn: Callable[[], T], label: str) -> T:
    """fn() in a new thread (one that may change its namespace); its result or exception
    comes back to the caller's thread."""
    box: dict[str, object] = {}

    def body() -> None:
        try:
            box["value"] = fn()
        except BaseException as exc:  # noqa: BLE001 - re-raised in the caller's thread
            box["error"] = exc

    t = threading.Thread(target=body, name=f"kproxy-{label}", daemon=True)
    t.start()
    t.join()
    if "error" in box:
        raise box["error"]           # type: ignore[misc]
    return box["value"]              # type: ignore[return-value]


def enter(path: str) -> None:
    """Moves the calling thread into the network namespace at `path` (only threads made for
    it: in_thread)."""
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        _setns(fd)
    finally:
        os.close(fd)


def netns_cookie() -> int:
    """The calling thread's network namespace cookie (bpf_get_netns_cookie()'s value)."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        return int.from_bytes(s.getsockopt(socket.SOL_SOCKET, SO_NETNS_COOKIE, 8), "little")


def in_netns(path: str, fn: Callable[[], T]) -> T:
    """fn() in a new thread that entered the network namespace at `path`."""
    def body() -> T:
        enter(path)
        return fn()

    return in_thread(body, "netns")


def in_each_netns(paths: Iterable[str], fn: Callable[[str], None]) -> list[tuple[str, OSError]]:
    """fn(path) in each network namespace in turn, from one new thread that enters them one
    after the other (a thread per namespace cost more than a search in most of them).
    Returns the namespaces skipped and why: gone with their pod, or not ours to enter (an
    OSError from fn skips its namespace too)."""
    def body() -> list[tuple[str, OSError]]:
        skipped = []
        for path in paths:
            try:
                enter(path)
                fn(path)
            except OSError as exc:
                skipped.append((path, exc))
        return skipped

    return in_thread(body, "netns")
