"""A connected UDP socket whose backend left its Service, moved to a live backend in place.

Under kube-proxy such a socket stays connected to the Service address, and the conntrack flush
of the removed endpoint sends its next datagram to another backend: the application sees
nothing. Ours was connected to the backend itself by connect4/6, so the agent connects it
again, to the Service address, on the application's behalf: pidfd_getfd(2) (Linux 5.6;
ptrace access over the owner, which the privileged agent with the node's pid namespace has)
duplicates the owner's descriptor into the agent, and connect() on the duplicate runs the
socket's own cgroup hooks (a hook runs for the cgroup the socket was created in, not for the
caller's), which pick a live backend and record the Service address for getpeername() and
recvmsg(). The socket stays the application's: the same descriptor, the same local address
and port, the same peer name; its next send() goes to the new backend.

The owner is looked for among the processes of the socket's cgroup, by the socket's inode;
the borrowed descriptor's cookie is checked before anything is done with it (the owner may
have closed it and opened another in between). What cannot be done this way (no owner found,
ptrace refused, the Service refuses the connect) is left to the caller, which disconnects the
socket as before.
"""
from __future__ import annotations

import ctypes
import errno
import os
import socket
from collections.abc import Iterable
from dataclasses import dataclass

SYS_PIDFD_GETFD = 438           # the same number on every architecture (asm-generic)
SO_COOKIE = 57                  # include/uapi/asm-generic/socket.h

_libc = ctypes.CDLL(None, use_errno=True)


class NotMoved(Exception):
    """The socket could not be connected again; `why` says why, for the log."""

    def __init__(self, why: str) -> None:
        super().__init__(why)
        self.why = why


@dataclass(frozen=True)
class Target:
    family: int                 # the socket's: AF_INET or AF_INET6
    inode: int
    cookie: int
    service: bytes              # the Service address as struct kp_ip holds it (16 bytes)
    port: int

    def address(self) -> tuple[str, int]:
        """What the application connected to, in the socket's family (an AF_INET6 socket
        reached an IPv4 Service as an IPv4-mapped address)."""
        if self.family == socket.AF_INET:
            return socket.inet_ntoa(self.service[12:]), self.port
        return socket.inet_ntop(socket.AF_INET6, self.service), self.port


def find_owner(pids: Iterable[int], inode: int) -> tuple[int, int] | None:
    """(pid, fd) of a descriptor of socket `inode` among `pids`' open files."""
    want = f"socket:[{inode}]"
    for pid in pids:
        base = f"/proc/{pid}/fd"
        try:
            fds = os.listdir(base)
        except OSError:
            continue                # gone, or a kernel thread
        for fd in fds:
            try:
                if os.readlink(f"{base}/{fd}") == want:
                    return pid, int(fd)
            except OSError:
                continue
    return None


def _borrow(pid: int, fd: int) -> socket.socket:
    pidfd = os.pidfd_open(pid)
    try:
        got = _libc.syscall(SYS_PIDFD_GETFD, pidfd, fd, 0)
        if got < 0:
            err = ctypes.get_errno()
            raise OSError(err, os.strerror(err))
    finally:
        os.close(pidfd)
    return socket.socket(fileno=got)


def move(target: Target, pids: Iterable[int]) -> None:
    """Connects the socket again to its Service address. Raises NotMoved."""
    owner = find_owner(pids, target.inode)
    if owner is None:
        raise NotMoved("no process of its cgroup holds it")
    try:
        sock = _borrow(*owner)
    except OSError as exc:
        raise NotMoved(f"pidfd_getfd: {exc.strerror}") from exc
    with sock:
        cookie = int.from_bytes(sock.getsockopt(socket.SOL_SOCKET, SO_COOKIE, 8), "little")
        if cookie != target.cookie:
            raise NotMoved("its descriptor was reused")
        try:
            sock.connect(target.address())
        except OSError as exc:
            name = errno.errorcode.get(exc.errno or 0, str(exc.errno))
            raise NotMoved(f"the Service refused the connect ({name})") from exc
