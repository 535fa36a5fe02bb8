"""TCX links (kernel 6.6+): tc_lb.c's programs on a device's ingress/egress without a qdisc.

Why: creating the clsact qdisc the legacy path needs deactivates the device while it is grafted,
which drops a packet or so at an agent's first attach (tools/probes/attach_loss.sh qdisc). A tcx
link needs no qdisc.

A link detaches when its last fd closes, so each is pinned, <bpffs_dir>/tcx/<ifindex>-<ingress|
egress>, and the datapath outlives the agent; a new agent swaps the program behind the pinned
link with BPF_LINK_UPDATE (atomic: no packet sees no program). A link whose device was deleted
stays as a defunct object (its link info says ifindex 0) as long as its pin does: such pins are
removed (remove_defunct) and, for a device of the same ifindex, a new link made.

A program returning TCX_PASS (= TC_ACT_OK) ends the hook: the clsact filters behind it, a
previous agent's among them, no longer run.
"""
from __future__ import annotations

import contextlib
import ctypes
import errno
import logging
import os
from collections.abc import Iterator
from pathlib import Path

from . import libbpf

log = logging.getLogger(__name__)

DIRECTIONS = {"ingress": libbpf.ATTACH_TCX_INGRESS, "egress": libbpf.ATTACH_TCX_EGRESS}
PIN_DIR = "tcx"
_LINK_TYPE_TCX = 11
# What a kernel without tcx answers to link create and query.
UNSUPPORTED = frozenset({errno.EINVAL, errno.EOPNOTSUPP})


class Unsupported(Exception):
    """The kernel refused a tcx link (older than 6.6): use the clsact qdisc instead."""


def pin_path(bpffs_dir: Path, ifindex: int, direction: str) -> Path:
    return bpffs_dir / PIN_DIR / f"{ifindex}-{direction}"


class _LinkInfo(ctypes.Structure):
    """struct bpf_link_info with its tcx member."""
    _fields_ = [
        ("type", ctypes.c_uint32), ("id", ctypes.c_uint32), ("prog_id", ctypes.c_uint32),
        ("_pad", ctypes.c_uint32), ("ifindex", ctypes.c_uint32),
        ("attach_type", ctypes.c_uint32), ("_rest", ctypes.c_uint8 * 40),
    ]


class _ProgInfo(ctypes.Structure):
    """struct bpf_prog_info up to its name."""
    _fields_ = [
        ("type", ctypes.c_uint32), ("id", ctypes.c_uint32), ("_skip", ctypes.c_uint8 * 56),
        ("name", ctypes.c_char * 16),
    ]


class _QueryAttr(ctypes.Structure):
    """union bpf_attr for BPF_PROG_QUERY. A raw syscall: libbpf 1.1 knows no link_ids."""
    _fields_ = [
        ("target_ifindex", ctypes.c_uint32), ("attach_type", ctypes.c_uint32),
        ("query_flags", ctypes.c_uint32), ("attach_flags", ctypes.c_uint32),
        ("prog_ids", ctypes.c_uint64), ("count", ctypes.c_uint32), ("_pad", ctypes.c_uint32),
        ("prog_attach_flags", ctypes.c_uint64), ("link_ids", ctypes.c_uint64),
        ("link_attach_flags", ctypes.c_uint64), ("revision", ctypes.c_uint64),
    ]


# __NR_bpf per machine (the kernel's syscall tables; aarch64, riscv64 and loongarch64 share the
# generic table).
_NR_BPF = {"x86_64": 321, "i686": 357, "aarch64": 280, "riscv64": 280, "loongarch64": 280,
           "armv7l": 386, "ppc64le": 361, "s390x": 351}
_BPF_PROG_QUERY = 16


def _query(ifindex: int, direction: str, room: int = 64) -> list[tuple[int, int]]:
    """(program id, link id) on a hook, first to run first; link id 0: attached without a
    link (not ours). [] when the device is gone or the kernel has no tcx."""
    progs, links = (ctypes.c_uint32 * room)(), (ctypes.c_uint32 * room)()
    attr = _QueryAttr(target_ifindex=ifindex, attach_type=DIRECTIONS[direction], count=room,
                      prog_ids=ctypes.addressof(progs), link_ids=ctypes.addressof(links))
    machine = os.uname().machine
    if machine not in _NR_BPF:
        raise libbpf.BpfError(errno.ENOSYS, f"tcx links cannot be listed on {machine}: kproxy-ebpf "
                              "does not know its bpf syscall number (please report the machine)")
    libc = ctypes.CDLL(None, use_errno=True)
    libc.syscall.restype = ctypes.c_long
    ret = libc.syscall(ctypes.c_long(_NR_BPF[machine]), ctypes.c_int(_BPF_PROG_QUERY),
                       ctypes.byref(attr), ctypes.c_uint(ctypes.sizeof(attr)))
    if ret < 0:
        err = ctypes.get_errno()
        if err in UNSUPPORTED | {errno.ENODEV}:
            return []
        raise libbpf.BpfError(err, f"tcx query of ifindex {ifindex}: {os.strerror(err)}")
    return [(progs[i], links[i]) for i in range(min(attr.count, room))]


def _prog_name(prog_id: int) -> str | None:
    try:
        fd = libbpf.prog_get_fd_by_id(prog_id)
    except libbpf.BpfError as exc:
        if exc.errno == errno.ENOENT:        # unloaded meanwhile
            return None
        raise
    try:
        return libbpf.obj_info(fd, _ProgInfo(), "prog info").name.decode()
    finally:
        os.close(fd)


def programs(ifindex: int, direction: str) -> list[tuple[str | None, int]]:
    """(program name, link id) of everything on a device's tcx hook."""
    return [(_prog_name(prog_id), link_id) for prog_id, link_id in _query(ifindex, direction)]


@contextlib.contextmanager
def _pinned_link(pin: Path) -> Iterator[tuple[int, _LinkInfo] | None]:
    """The pinned tcx link's fd (open while the block runs) and its info; None when there is
    no pin or it holds no tcx link."""
    try:
        fd = libbpf.obj_get(str(pin))
    except libbpf.BpfError:
        yield None
        return
    try:
        info = libbpf.obj_info(fd, _LinkInfo(), "link info")
        yield (fd, info) if info.type == _LINK_TYPE_TCX else None
    finally:
        os.close(fd)


def _pinned_ifindex(pin: Path) -> int | None:
    """The ifindex the pinned link is attached to now (0: defunct); None if no tcx link."""
    with _pinned_link(pin) as link:
        return None if link is None else link[1].ifindex


def attach(bpffs_dir: Path, ifindex: int, direction: str, prog_fd: int) -> bool:
    """Puts prog_fd on a device's hook, first of all (before other tools' programs, as PRIO 1
    did). True: a pinned link was there and now runs prog_fd."""
    pin = pin_path(bpffs_dir, ifindex, direction)
    with _pinned_link(pin) as link:
        if link and link[1].ifindex == ifindex and link[1].attach_type == DIRECTIONS[direction]:
            libbpf.link_update(link[0], prog_fd)
            return True
    pin.parent.mkdir(exist_ok=True)
    try:
        fd = libbpf.link_create(prog_fd, ifindex, DIRECTIONS[direction], libbpf.F_BEFORE)
    except libbpf.BpfError as exc:
        if exc.errno in UNSUPPORTED:
            raise Unsupported(str(exc)) from exc
        raise
    # Pinned aside, then renamed over a defunct pin (bpffs names may not contain a dot).
    staged = pin.with_name(pin.name + "_new")
    try:
        staged.unlink(missing_ok=True)
        libbpf.obj_pin(fd, str(staged))
        os.replace(staged, pin)
    finally:
        os.close(fd)
    return False


def detach(ifindex: int, direction: str, names: frozenset[str] | set[str]) -> int:
    """Detaches the links running one of `names` on a hook, pinned or not (their pins stay,
    defunct). Returns how many."""
    n = 0
    for name, link_id in programs(ifindex, direction):
        if name in names and link_id:
            try:
                fd = libbpf.link_get_fd_by_id(link_id)
            except libbpf.BpfError as exc:
                if exc.errno == errno.ENOENT:
                    continue
                raise
            try:
                libbpf.link_detach(fd)
                n += 1
            finally:
                os.close(fd)
    return n


def remove_defunct(bpffs_dir: Path, ifindex: int | None = None) -> list[str]:
    """Unpins the links whose device is gone (all pins, or those of one ifindex): a defunct
    link would otherwise keep its program and a pin per deleted pod veth."""
    removed: list[str] = []
    pins = bpffs_dir / PIN_DIR
    if not pins.is_dir():
        return removed
    for pin in sorted(pins.iterdir()):
        where, _, rest = pin.name.partition("-")
        if not where.isdigit() or (ifindex is not None and int(where) != ifindex):
            continue
        # a "_new" pin outside attach(): an agent died between pinning and renaming
        if _pinned_ifindex(pin) != int(where) or (ifindex is None and rest.endswith("_new")):
            pin.unlink()
            removed.append(str(pin))
            log.info("removed %s: its device is gone", pin)
    return removed
