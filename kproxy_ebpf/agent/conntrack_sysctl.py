"""The node's TCP conntrack timeouts that kube-proxy sets at start (its
KubeProxyConfiguration conntrack.tcpEstablishedTimeout, 24h, and tcpCloseWaitTimeout, 1h), so
that replacing kube-proxy does not change how long the kernel tracks the node's flows: the
netfilter conntrack still NATs hostPort, masquerade and kube-proxy-free CNI traffic, and
upstream's e2e spec "KubeProxy should set TCP CLOSE_WAIT timeout" checks the 1h. These are
sysctls of the node's network namespace, where the agent runs (hostNetwork).

A container's /proc/sys is read-only (the runtime's readonlyPaths); with CAP_SYS_ADMIN the
agent mounts a procfs of its own below a private directory and writes there. A sysctl that
cannot be written is logged once with what to do; it never stops the agent."""
from __future__ import annotations

import ctypes
import errno
import logging
import os
import tempfile
from contextlib import contextmanager
from pathlib import Path

log = logging.getLogger(__name__)

SYSCTLS = {
    "conntrack_tcp_established_timeout": "net/netfilter/nf_conntrack_tcp_timeout_established",
    "conntrack_tcp_close_wait_timeout": "net/netfilter/nf_conntrack_tcp_timeout_close_wait",
}


@contextmanager
def _private_proc():
    """A procfs mounted for this process only (same network namespace), unmounted after."""
    libc = ctypes.CDLL(None, use_errno=True)
    where = tempfile.mkdtemp(prefix="kproxy-proc.")
    try:
        if libc.mount(b"proc", where.encode(), b"proc", 0, None) != 0:
            err = ctypes.get_errno()
            raise OSError(err, os.strerror(err), where)
        try:
            yield Path(where)
        finally:
            libc.umount2(where.encode(), 2)        # MNT_DETACH
    finally:
        os.rmdir(where)


def _write(proc: Path, name: str, value: int) -> bool:
    """Writes one sysctl when it differs; False when it does not exist (no nf_conntrack)."""
    path = proc / "sys" / name
    try:
        if int(path.read_text()) == value:
            return True
    except FileNotFoundError:
        return False
    path.write_text(f"{value}\n")
    log.info("set %s to %d (as kube-proxy does)", name.replace("/", "."), value)
    return True


def apply(values: dict[str, int], proc: Path = Path("/proc")) -> list[str]:
    """Sets each sysctl whose value is > 0 (0 leaves the kernel's); returns the problems."""
    wanted = {SYSCTLS[k]: v for k, v in values.items() if v > 0}
    problems: list[str] = []
    pending = dict(wanted)
    for name, value in list(pending.items()):
        try:
            if not _write(proc, name, value):
                problems.append(f"{name.replace('/', '.')} does not exist (nf_conntrack not loaded?)")
            del pending[name]
        except OSError as e:
            if e.errno not in (errno.EROFS, errno.EACCES, errno.EPERM):
                problems.append(f"{name.replace('/', '.')}: {e.strerror}")
                del pending[name]
    if pending:
        try:
            with _private_proc() as own:
                for name, value in pending.items():
                    _write(own, name, value)
        except OSError as e:
            problems += [f"{n.replace('/', '.')} is read-only here and a private procfs could not "
                         f"be mounted ({e.strerror}): grant CAP_SYS_ADMIN, or set it on the node, "
                         f"or set the agent's conntrack timeouts to 0 to leave it" for n in pending]
    for p in problems:
        log.warning("conntrack timeout not set: %s", p)
    return problems
