"""Network namespace primitives for the lab: the `ip` wrapper, setns, per-netns sysctls.

Every `ip` call here names its namespace (`ip -n NS ...`); nothing in the lab is ever created
in the host's own namespace, which is what keeps lab traffic and routes off the real network.
We drive iproute2 rather than pyroute2 because its commands read like the documentation of
the topology and its errors are plain text; the lab is not on a hot path.

Python 3.11 has no os.setns, so setns(2) is called through ctypes. Entering a namespace is
only ever done in a short-lived thread (for sysctls) or in a forked child before exec (see
procs.py), never in the caller's own thread.
"""
from __future__ import annotations

import ctypes
import os
import subprocess
import threading
from collections.abc import Callable
from typing import TypeVar

NETNS_DIR = "/run/netns"
CLONE_NEWNET = 0x40000000

T = TypeVar("T")

_libc = ctypes.CDLL(None, use_errno=True)


class LabError(RuntimeError):
    """A lab operation failed; the message says which command and why."""


def netns_path(name: str) -> str:
    return os.path.join(NETNS_DIR, name)


def setns_net(name: str) -> None:
    """Move the calling thread into netns `name` (safe in a forked child before exec)."""
    fd = os.open(netns_path(name), os.O_RDONLY | os.O_CLOEXEC)
    try:
        if _libc.setns(fd, CLONE_NEWNET) != 0:
            err = ctypes.get_errno()
            raise OSError(err, f"setns({name}): {os.strerror(err)}")
    finally:
        os.close(fd)


def ip(*args: str, netns: str, check: bool = True) -> subprocess.CompletedProcess:
    """Run `ip -n <netns> ARGS`; a netns is mandatory so the host namespace is never touched."""
    if not netns:
        raise ValueError("ip() needs a lab netns")
    argv = ["ip", "-n", netns, *args]
    r = subprocess.run(argv, capture_output=True, text=True)
    if check and r.returncode != 0:
        raise LabError(f"{' '.join(argv)}: {r.stderr.strip() or r.returncode}")
    return r


def list_netns() -> list[str]:
    try:
        return sorted(os.listdir(NETNS_DIR))
    except FileNotFoundError:
        return []


def exists(name: str) -> bool:
    return os.path.exists(netns_path(name))


# Set in every lab netns. ICMP errors are rate limited per netns (per peer: a burst of ~6-10,
# then 1/s), which turns a run of "port unreachable" answers into timeouts: a probe of a
# closed UDP port must say REFUSED every time, so the lab lifts both limits.
LAB_SYSCTLS = {
    "net.ipv4.icmp_ratelimit": "0",
    "net.ipv4.icmp_msgs_per_sec": "1000000",
    "net.ipv4.icmp_msgs_burst": "1000000",
}


def add(name: str, sysctls_: dict[str, str] | None = None) -> None:
    """Create netns `name` with loopback up, LAB_SYSCTLS and `sysctls_` set; idempotent."""
    if not exists(name):
        r = subprocess.run(["ip", "netns", "add", name], capture_output=True, text=True)
        if r.returncode != 0 and not exists(name):
            raise LabError(f"ip netns add {name}: {r.stderr.strip()}")
    sysctls(name, {**LAB_SYSCTLS, **(sysctls_ or {})})
    ip("link", "set", "lo", "up", netns=name)


def delete(name: str) -> str | None:
    """Delete netns `name`; returns an error text or None. Missing is not an error."""
    if not exists(name):
        return None
    r = subprocess.run(["ip", "netns", "del", name], capture_output=True, text=True)
    if r.returncode != 0 and exists(name):
        return f"ip netns del {name}: {r.stderr.strip()}"
    return None


def inode(name: str) -> int:
    return os.stat(netns_path(name)).st_ino


def pids_in(name: str) -> list[int]:
    """Processes whose network namespace is netns `name` (to report holders before delete)."""
    try:
        want = f"net:[{inode(name)}]"
    except FileNotFoundError:
        return []
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                if os.readlink(f"/proc/{entry}/ns/net") == want:
                    found.append(int(entry))
            except OSError:
                continue
    return found


def run_in_thread(name: str, fn: Callable[[], T]) -> T:
    """Call fn() in a fresh thread that has entered netns `name`; the caller is untouched.

    setns(CLONE_NEWNET) acts on the calling thread only and the thread dies afterwards, so its
    namespace never leaks into other threads of this process.
    """
    box: dict[str, object] = {}
    want = f"net:[{inode(name)}]"

    def body() -> None:
        try:
            setns_net(name)
            # Guard: never let a failed switch write into the host's namespace.
            if os.readlink("/proc/thread-self/ns/net") != want:
                raise LabError(f"thread is not in netns {name}")
            box["value"] = fn()
        except BaseException as e:  # re-raised in the caller
            box["error"] = e

    t = threading.Thread(target=body, name=f"kproxy-setns-{name}")
    t.start()
    t.join()
    if "error" in box:
        raise box["error"]  # type: ignore[misc]
    return box["value"]  # type: ignore[return-value]


def _sysctl_path(key: str) -> str:
    # Dotted keys ("net.ipv4.ip_forward") are converted; keys with an interface name that
    # could contain a dot must be given slashed ("net/ipv4/conf/kpv1/proxy_arp").
    return "/proc/sys/" + (key if "/" in key else key.replace(".", "/"))


def sysctl(name: str, key: str, value: str) -> None:
    """Write /proc/sys/<key> (dotted or slashed) inside netns `name`."""
    sysctls(name, {key: value})


def sysctls(name: str, values: dict[str, str]) -> None:
    """Write several sysctls inside netns `name`, in order, from one thread."""

    def write() -> None:
        for key, value in values.items():
            with open(_sysctl_path(key), "w") as f:
                f.write(value)

    run_in_thread(name, write)


def read_sysctl(name: str, key: str) -> str:
    path = _sysctl_path(key)

    def read() -> str:
        with open(path) as f:
            return f.read().strip()

    return run_in_thread(name, read)
