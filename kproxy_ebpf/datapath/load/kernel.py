"""What the running kernel must offer, probed at start with an error that names what is missing.

The minimum is Linux 5.18: bpf_set_retval() from cgroup sock_addr programs (5.18) is what makes
a refused Service fail with ECONNREFUSED instead of EPERM. Everything else came earlier: cgroup
BPF links and BPF_LINK_UPDATE (5.7), the getpeername hooks (5.8), bpf_get_netns_cookie() in
sock_addr programs (5.7), batched map reads (5.6). bpf_sk_storage_get() from sock_addr
programs (a TCP socket's reverse translation) is probed too; it was verified on 6.18 only.
Distribution kernels backport features, so each one is probed through libbpf (it loads a tiny
program or map per probe) rather than read from the version number; the version only decorates
the message.
"""
from __future__ import annotations

import ctypes
import os
import platform
from collections.abc import Callable
from dataclasses import dataclass
from functools import lru_cache

MIN_KERNEL = "5.18"
CGROUP2_SUPER_MAGIC = 0x63677270

# enum bpf_prog_type / bpf_map_type / bpf_func_id values (include/uapi/linux/bpf.h; stable ABI).
PROG_SCHED_CLS, PROG_CGROUP_SOCK_ADDR = 3, 18
MAP_HASH, MAP_PERCPU_ARRAY, MAP_LRU_HASH = 1, 6, 9
HELPERS = {  # name -> (id, kernel that added it)
    "bpf_map_lookup_elem": (1, "3.18"), "bpf_map_update_elem": (2, "3.18"),
    "bpf_ktime_get_ns": (5, "4.1"), "bpf_get_prandom_u32": (7, "4.1"),
    "bpf_get_socket_cookie": (46, "5.7 for sock_addr"),
    "bpf_get_netns_cookie": (122, "5.7"), "bpf_set_retval": (187, "5.18"),
    # a TCP socket's reverse translation (kp_sksvc); verified here on 6.18, probed anywhere
    "bpf_sk_storage_get": (107, "<= 6.18"),
    # kp_skwhere's cgroup (the stale-socket search's way into a namespace); verified on 6.18
    "bpf_get_current_cgroup_id": (80, "<= 6.18"),
}


@dataclass(frozen=True)
class Feature:
    what: str
    since: str
    check: Callable[[], bool]


class KernelUnsupported(RuntimeError):
    """The kernel lacks something the datapath needs; the message lists each missing piece."""


@lru_cache(maxsize=1)
def _lib():
    lib = ctypes.CDLL("libbpf.so.1", use_errno=True)
    for name, args in (("libbpf_probe_bpf_prog_type", [ctypes.c_int, ctypes.c_void_p]),
                       ("libbpf_probe_bpf_map_type", [ctypes.c_int, ctypes.c_void_p]),
                       ("libbpf_probe_bpf_helper", [ctypes.c_int, ctypes.c_int, ctypes.c_void_p])):
        fn = getattr(lib, name)
        fn.argtypes, fn.restype = args, ctypes.c_int
    return lib


def _features() -> list[Feature]:
    lib = _lib()
    out = [
        Feature("program type cgroup sock_addr", "4.17",
                lambda: lib.libbpf_probe_bpf_prog_type(PROG_CGROUP_SOCK_ADDR, None) == 1),
        Feature("map type hash", "3.19", lambda: lib.libbpf_probe_bpf_map_type(MAP_HASH, None) == 1),
        Feature("map type lru_hash", "4.10",
                lambda: lib.libbpf_probe_bpf_map_type(MAP_LRU_HASH, None) == 1),
        Feature("map type percpu_array", "4.6",
                lambda: lib.libbpf_probe_bpf_map_type(MAP_PERCPU_ARRAY, None) == 1),
    ]
    for name, (fid, since) in HELPERS.items():
        out.append(Feature(f"helper {name} in cgroup sock_addr programs", since,
                           _helper_probe(lib, fid)))
    return out


def _helper_probe(lib: ctypes.CDLL, fid: int) -> Callable[[], bool]:
    return lambda: lib.libbpf_probe_bpf_helper(PROG_CGROUP_SOCK_ADDR, fid, None) == 1


def missing(features: list[Feature] | None = None) -> list[Feature]:
    return [f for f in (features if features is not None else _features()) if not f.check()]


def fs_magic(path: str | os.PathLike) -> int | None:
    """statfs(2)'s f_type of the filesystem `path` is on (None when it cannot be read)."""
    buf = (ctypes.c_long * 16)()     # struct statfs; f_type is the first field
    libc = ctypes.CDLL(None, use_errno=True)
    return buf[0] & 0xFFFFFFFF if libc.statfs(os.fsencode(path), buf) == 0 else None


def is_cgroup2(path: str) -> bool:
    return fs_magic(path) == CGROUP2_SUPER_MAGIC


def cgroup2_at(path: str) -> str | None:
    """The cgroup v2 hierarchy the socket hooks should attach to for `path`: the path itself
    when it is cgroup2, else its `unified` child when that is (the hybrid layout: cgroup v1
    controllers at /sys/fs/cgroup and systemd's cgroup2 at /sys/fs/cgroup/unified, which a
    bind mount of /sys/fs/cgroup such as the chart's hostPath carries along); None otherwise."""
    for candidate in (path, os.path.join(path, "unified")):
        if is_cgroup2(candidate):
            return candidate
    return None


def require(cgroup: str | None = None, features: list[Feature] | None = None) -> None:
    """Raises KernelUnsupported naming every missing feature (and a non-cgroup2 hook target)."""
    problems = [f"{f.what} (Linux {f.since})" for f in missing(features)]
    if cgroup is not None and not is_cgroup2(cgroup):
        problems.append(f"{cgroup} is not a cgroup v2 directory (socket hooks attach to cgroup2)")
    if problems:
        raise KernelUnsupported(
            f"this kernel ({platform.release()}) cannot run kproxy-ebpf, which needs Linux "
            f"{MIN_KERNEL} or later with BPF enabled; missing: " + "; ".join(problems))
