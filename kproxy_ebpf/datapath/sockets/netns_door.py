"""The way into a client network namespace known by its cookie (kp_skwhere's rows name
namespaces by bpf_get_netns_cookie(), which no path carries).

Through the processes of the cgroups that connected from it (cgroup_procs.py): a container's
processes share its network namespace, so the first one whose /proc/PID/ns/net has the cookie
is the way in: a few syscalls, whatever the node holds. Only when none of them is there any
more (the process that connected exited, the row names a cgroup gone) is every namespace the
hooks can see tried in turn (netns_scope.scope), counted as a walk. A namespace found in
neither way is gone, and its sockets with it.
"""
from __future__ import annotations

from collections.abc import Iterable

from . import netns_scope
from .cgroup_procs import CgroupProcs

PIDS_TRIED = 3          # per cgroup: one is enough unless it exits under us


class NetnsDoor:
    def __init__(self, procs: CgroupProcs, cgroup_root: str,
                 netns_dirs: Iterable[str] = netns_scope.RUNTIME_NETNS_DIRS) -> None:
        self.procs, self.cgroup_root = procs, cgroup_root
        self.netns_dirs = tuple(netns_dirs)
        self.walks = 0

    def enter(self, netns: int, cgroups: Iterable[int]) -> bool:
        """Moves the calling thread (one made for it: netns_scope.in_thread) into the
        namespace whose cookie is `netns`; False when it no longer exists."""
        for cgroup in cgroups:
            for pid in self.procs.procs(cgroup)[:PIDS_TRIED]:
                if _try(f"/proc/{pid}/ns/net", netns):
                    return True
        self.walks += 1
        return any(_try(path, netns)
                   for path in netns_scope.scope(self.cgroup_root, self.netns_dirs).netns)


def _try(path: str, netns: int) -> bool:
    try:
        netns_scope.enter(path)
    except OSError:
        return False        # the process or namespace went away
    return netns_scope.netns_cookie() == netns
