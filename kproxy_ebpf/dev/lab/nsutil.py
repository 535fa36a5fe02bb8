"""Network namespace primitives for the lab: create/remove, netlink handles, per-netns sysctls.

Netlink work (links, addresses, routes) goes through pyroute2's IPRoute on a socket opened
*inside* the lab namespace: a netlink socket acts on the namespace it was created in, for its
whole life, whichever thread later uses it. Nothing here ever opens a netlink socket in the
host's own namespace, which is what keeps lab traffic and routes off the real network.

No fork happens here. pyroute2's own `netns.create()` and `IPRoute(netns=...)` fork a child
to enter the namespace; this module is called from threads (tests run probes in one while
another creates pods), and a fork of a multi-threaded Python process may inherit a lock held
by another thread. Instead a short-lived thread enters the namespace (setns acts on the
calling thread only) and dies afterwards, so the namespace never leaks into other threads.
"""
from __future__ import annotations

import contextlib
import ctypes
import errno
import os
import socket
from collections.abc import Callable, Iterator
from typing import TypeVar

from pyroute2 import IPRoute
from pyroute2 import netns as pr_netns
from pyroute2.netlink import NETLINK_ROUTE
from pyroute2.netlink.exceptions import NetlinkError

from kproxy_ebpf.datapath.sockets.netns_scope import CLONE_NEWNET, in_thread

NETNS_DIR = "/run/netns"

T = TypeVar("T")

# unshare(2) only: Python 3.11 has no os.unshare, and pyroute2 offers thread-level unshare
# only inside its forking netns.create().
_libc = ctypes.CDLL(None, use_errno=True)


class LabError(RuntimeError):
    """A lab operation failed; the message says which operation and why."""


def netns_path(name: str) -> str:
    return os.path.join(NETNS_DIR, name)


def list_netns() -> list[str]:
    try:
        return sorted(os.listdir(NETNS_DIR))
    except FileNotFoundError:
        return []


def exists(name: str) -> bool:
    return os.path.exists(netns_path(name))


def inode(name: str) -> int:
    return os.stat(netns_path(name)).st_ino


def run_in_thread(name: str, fn: Callable[[], T]) -> T:
    """Call fn() in a fresh thread that has entered netns `name`; the caller is untouched."""
    want = f"net:[{inode(name)}]"

    def body() -> T:
        pr_netns.setns(name, flags=0)  # flags=0: never create a missing namespace
        # Guard: never let a failed switch act on the host's namespace.
        if os.readlink("/proc/thread-self/ns/net") != want:
            raise LabError(f"thread is not in netns {name}")
        return fn()

    return in_thread(body, f"setns-{name}")


def _create(name: str) -> None:
    """unshare a new netns in a throwaway thread and bind-mount it at /run/netns/<name> (what
    `ip netns add` does); the thread's own namespace is the new one, nobody else's."""

    def body() -> None:
        if _libc.unshare(CLONE_NEWNET) != 0:
            err = ctypes.get_errno()
            raise OSError(err, f"unshare(CLONE_NEWNET): {os.strerror(err)}")
        pr_netns.attach(name, "thread-self")

    in_thread(body, f"create-{name}")


@contextlib.contextmanager
def iproute(name: str) -> Iterator[IPRoute]:
    """An IPRoute acting on netns `name` (mandatory: the host namespace is never touched)."""
    if not name:
        raise ValueError("iproute() needs a lab netns")
    fd = run_in_thread(name, lambda: socket.socket(socket.AF_NETLINK, socket.SOCK_DGRAM,
                                                   NETLINK_ROUTE).detach())
    try:
        ipr = IPRoute(fileno=fd)
    except BaseException:
        os.close(fd)
        raise
    with ipr:
        yield ipr


def link_index(ipr: IPRoute, dev: str) -> int | None:
    found = ipr.link_lookup(ifname=dev)
    return found[0] if found else None


def need_link(ipr: IPRoute, dev: str, netns: str) -> int:
    idx = link_index(ipr, dev)
    if idx is None:
        raise LabError(f"netns {netns}: no link {dev}")
    return idx


RTNH_F_ONLINK = 4  # the gateway is on the link even though no local prefix covers it
RT_SCOPE_LINK = 253


def link_exists(netns: str, dev: str) -> bool:
    with iproute(netns) as ipr:
        return link_index(ipr, dev) is not None


def add_veth(netns: str, dev: str, peer_netns: str, peer: str = "eth0") -> None:
    """veth `dev` in `netns` whose peer `peer` lands in `peer_netns` (both lab namespaces)."""
    fd = os.open(netns_path(peer_netns), os.O_RDONLY | os.O_CLOEXEC)
    try:
        with iproute(netns) as ipr:
            ipr.link("add", ifname=dev, kind="veth", peer={"ifname": peer, "net_ns_fd": fd})
    finally:
        os.close(fd)


def add_bridge(netns: str, dev: str) -> None:
    with iproute(netns) as ipr:
        if link_index(ipr, dev) is None:
            ipr.link("add", ifname=dev, kind="bridge")


def link_up(netns: str, dev: str, master: str | None = None) -> None:
    with iproute(netns) as ipr:
        spec: dict[str, object] = {"state": "up"}
        if master:
            spec["master"] = need_link(ipr, master, netns)
        ipr.link("set", index=need_link(ipr, dev, netns), **spec)


IFA_F_NODAD = 0x02


def _family(*addrs: str | None) -> int:
    return socket.AF_INET6 if any(a and ":" in a for a in addrs) else socket.AF_INET


def set_addr(netns: str, dev: str, cidr: str, scope: int | None = None) -> None:
    """Add (or keep) address `cidr` on `dev`: `ip addr replace`; IPv6 ones `nodad` (the
    lab's addresses are unique by construction, and a tentative one cannot be bound)."""
    addr, _, plen = cidr.partition("/")
    family = _family(addr)
    with iproute(netns) as ipr:
        extra: dict[str, object] = {"scope": scope} if scope is not None else {}
        if family == socket.AF_INET6:
            extra["flags"] = IFA_F_NODAD
        ipr.addr("replace", index=need_link(ipr, dev, netns), address=addr, family=family,
                 prefixlen=int(plen or (32 if family == socket.AF_INET else 128)), **extra)


def del_route(netns: str, dst: str) -> bool:
    """`ip route del DST`; False when there was no such route."""
    with iproute(netns) as ipr:
        try:
            ipr.route("del", dst=dst, family=_family(dst))
        except NetlinkError as exc:
            if exc.code == errno.ESRCH:
                return False
            raise
    return True


def set_route(netns: str, dst: str, dev: str, via: str | None = None, onlink: bool = False,
              src: str | None = None) -> None:
    """`ip route replace DST [via GW] dev DEV [onlink] [src SRC]`; dst may be "default" (of
    the gateway's family)."""
    family = _family(None if dst == "default" else dst, via)
    if dst == "default":
        dst = "::/0" if family == socket.AF_INET6 else "0.0.0.0/0"
    with iproute(netns) as ipr:
        spec: dict[str, object] = {"dst": dst, "family": family,
                                   "oif": need_link(ipr, dev, netns)}
        if via:
            spec["gateway"] = via
        if onlink:
            spec["flags"] = RTNH_F_ONLINK
        if src:
            spec["prefsrc"] = src
        ipr.route("replace", **spec)


def set_unreachable(netns: str, dst: str) -> None:
    """`ip route replace unreachable DST`: local senders get EHOSTUNREACH at once."""
    with iproute(netns) as ipr:
        ipr.route("replace", dst=dst, type="unreachable", family=_family(dst))


def del_link(netns: str, dev: str) -> str | None:
    """Delete `dev` (a veth takes its peer along); error text or None. Missing is fine."""
    with iproute(netns) as ipr:
        idx = link_index(ipr, dev)
        if idx is None:
            return None
        try:
            ipr.link("del", index=idx)
        except OSError as e:
            if link_index(ipr, dev) is not None:
                return f"netns {netns}: delete {dev}: {e}"
    return None


# Set in every lab netns. ICMP errors are rate limited per netns (per peer: a burst of ~6-10,
# then 1/s), which turns a run of "port unreachable" answers into timeouts: a probe of a
# closed UDP port must say REFUSED every time, so the lab lifts both limits.
LAB_SYSCTLS = {
    "net.ipv4.icmp_ratelimit": "0",
    "net.ipv4.icmp_msgs_per_sec": "1000000",
    "net.ipv4.icmp_msgs_burst": "1000000",
    "net.ipv6.icmp.ratelimit": "0",
    # No duplicate address detection: lab addresses are unique by construction, and while a
    # new link's own link-local address is tentative (~1 s) its first packets wait for it.
    "net.ipv6.conf.all.accept_dad": "0",
    "net.ipv6.conf.default.accept_dad": "0",
    # Lab links carry no router advertisements worth learning from: routes are set by hand.
    "net.ipv6.conf.all.accept_ra": "0",
    "net.ipv6.conf.default.accept_ra": "0",
}


def add(name: str, sysctls_: dict[str, str] | None = None) -> None:
    """Create netns `name` with loopback up, LAB_SYSCTLS and `sysctls_` set; idempotent."""
    if not exists(name):
        try:
            _create(name)
        except OSError as e:
            if not exists(name):
                raise LabError(f"create netns {name}: {e}") from e
    sysctls(name, {**LAB_SYSCTLS, **(sysctls_ or {})})
    with iproute(name) as ipr:
        ipr.link("set", index=need_link(ipr, "lo", name), state="up")


def delete(name: str) -> str | None:
    """Delete netns `name`; returns an error text or None. Missing is not an error.

    Like `ip netns del`: the mount goes, and the namespace itself dies with its last user."""
    if not exists(name):
        return None
    try:
        pr_netns.remove(name)
    except OSError as e:
        if exists(name):
            return f"remove netns {name}: {e}"
    return None


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


def _sysctl_path(key: str) -> str:
    # Dotted keys ("net.ipv4.ip_forward") are converted; keys with an interface name that
    # could contain a dot must be given slashed ("net/ipv4/conf/kpv1/proxy_arp").
    return "/proc/sys/" + (key if "/" in key else key.replace(".", "/"))


def sysctl(name: str, key: str, value: str) -> None:
    """Write /proc/sys/<key> (dotted or slashed) inside netns `name`."""
    sysctls(name, {key: value})


def sysctls(name: str, values: dict[str, str]) -> None:
    """Write several sysctls inside netns `name`, in order, from one thread.

    /proc/sys/net shows the namespace of the thread that opens it (/proc/self is the thread
    group leader's, but /proc/sys/net follows the opener's current namespace)."""

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

