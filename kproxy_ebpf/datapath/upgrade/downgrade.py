"""The previous release's copy of each map whose layout this release changed, written when the
agent stops, so that a rollback to that release finds the map filled.

A release reads only its own layouts. An older one's load child adopts a pinned map of its own
layout (bcc's BPF_TABLE_PINNED opens the pin) or creates it empty, and its programs attach at
once, before its first sync: a map it finds empty is a gap in service until that sync. So each
map bumped since the previous release is listed here with how its rows go back to the old
layout, and a graceful stop (Agent.stop) creates the previous version's pin from the current
map. Only a missing pin is written: one that exists belongs to an agent of the previous release
running beside us (a DaemonSet rollback with maxSurge), which writes it itself. The next agent
of this release unpins it again once its programs are attached (sock_hooks.remove_stale_maps),
as it unpins any map of another version, so a copy gone stale is never adopted. A SIGKILL
writes nothing: the older release then starts that map empty, as before.

kp_srcrange v2 -> v3: v3 added the scope to the key (the socket path checks the ranges too);
v2 held only the TC path's rows, with that byte zero. A release that bumps a map the programs
write (kp_ct) lists it here the same way: the flows opened between the stop and the old
programs' attach are then the only ones lost.
"""
from __future__ import annotations

import logging
import os
from collections.abc import Callable
from pathlib import Path
from typing import NamedTuple

from kproxy_ebpf.datapath.load import libbpf
from kproxy_ebpf.datapath.maps import layout as L
from kproxy_ebpf.datapath.maps.pinned import PinnedMap

log = logging.getLogger(__name__)

Row = tuple[bytes, bytes]


class Previous(NamedTuple):
    target: str                               # the KP_MAPS id of the current map
    pin: str                                  # the previous release's pin name
    row: Callable[[bytes, bytes], Row | None]  # a current row in the old layout; None: none


_SCOPE_AT = L.SrcRangeKey.scope.offset


def _srcrange_v2(key: bytes, value: bytes) -> Row | None:
    if key[_SCOPE_AT] != L.SCOPE_EXT:
        return None
    return key[:_SCOPE_AT] + b"\0" + key[_SCOPE_AT + 1:], value


PREVIOUS = (Previous("srcrange", "kp_srcrange_v2", _srcrange_v2),)


def write_previous(bpffs_dir: Path, previous: tuple[Previous, ...] = PREVIOUS) -> dict[str, int]:
    """Creates each missing previous-layout pin from the current map: {pin: rows written}.
    Nothing is created for a map without rows (the older release makes an empty one itself)."""
    written = {}
    for prev in previous:
        path, spec = Path(bpffs_dir) / prev.pin, L.MAPS[prev.target]
        current = Path(bpffs_dir) / spec.name
        if path.exists() or not current.exists():
            continue
        with PinnedMap(current, spec) as cur:
            rows = dict(r for r in (prev.row(k, v) for k, v in cur.raw_items()) if r is not None)
            info = libbpf.map_info(cur.fd)
        if not rows:
            continue
        # The same map type, size and flags: only the meaning of the key's bytes changed.
        fd = libbpf.map_create(info.type, info.name.decode(), info.key_size, info.value_size,
                               info.max_entries, info.map_flags)
        try:
            for key, value in rows.items():
                libbpf.map_update(fd, key, value)
            libbpf.obj_pin(fd, str(path))        # filled first: no reader sees it half-written
        finally:
            os.close(fd)
        written[prev.pin] = len(rows)
        log.info("wrote %s (%d rows) from %s: a rollback to the previous release adopts it "
                 "instead of starting it empty", prev.pin, len(rows), spec.name)
    return written
