"""Carries the TC path's tracked flows over an upgrade that changes kp_ct4's layout.

Only the programs write kp_ct4, so programs of a new layout version (kp_ct4_v2) would start
from an empty table: every flow from outside the node that was open at the upgrade would lose
its translation (a SNAT flow's replies would no longer find their client). The agent copies
the old version's rows into the new map, converted, twice: when the new programs are loaded
(the old ones still track flows, into the old map) and once the new ones are attached, for the
flows that opened or changed in between. The second copy leaves alone a row the new programs
have written since (they own it now). The old map is opened before the first copy, so the
stale-map removal after the attach (sock_hooks.py) does not take it away. kp_rnat4 kept its
layout: its rows serve the new programs as they are.
"""
from __future__ import annotations

import ctypes
import logging
import struct
from collections.abc import Callable
from pathlib import Path

from . import layout as L
from . import libbpf
from .pinned import PinnedMap

log = logging.getLogger(__name__)

# kp_ct4_val of layout version 1 (kproxy.h before the life word): expires, be_addr, nat_addr,
# be_port, nat_port, backend_id, svc_id, state, flags, seen_reply, pad. Frozen: that version's
# rows keep this shape for good.
_V1 = struct.Struct("=QIIHHIIBBBx")


def _v1_row(value: bytes) -> bytes:
    """A version-1 row as the current layout holds it."""
    (expires, be_addr, nat_addr, be_port, nat_port, backend_id, svc_id, state, flags,
     seen) = _V1.unpack(value)
    # No ISN: such a flow's replies are told apart by its state, as version 1 did.
    return bytes(L.CtVal(be_addr=be_addr, nat_addr=nat_addr, be_port=be_port, nat_port=nat_port,
                         backend_id=backend_id, svc_id=svc_id, expires=expires, state=state,
                         flags=flags & ~L.const("KP_CT_F_ISN"), seen_reply=seen))


class _OldSpec:
    """What PinnedMap needs of a map spec, for a layout version layout.py no longer has."""
    percpu = False

    def __init__(self, name: str, value_size: int):
        self.name, self.key = name, L.CtKey
        self.value = ctypes.c_uint8 * value_size


OLD_LAYOUTS = {1: (_V1.size, _v1_row)}      # kp_ct4 version -> (value size, converter)


def find(bpffs_dir: Path) -> CtUpgrade | None:
    """The upgrade to run when bpffs_dir holds kp_ct4 of an older layout, else None."""
    spec = L.MAPS["ct"]
    old = []
    for version, (size, convert) in OLD_LAYOUTS.items():
        path = Path(bpffs_dir) / f"{spec.base}_v{version}"
        if version != spec.version and path.exists():
            old.append((PinnedMap(path, _OldSpec(path.name, size)), convert))
    if not old:
        return None
    return CtUpgrade(PinnedMap(Path(bpffs_dir) / spec.name, spec), old)


class CtUpgrade:
    """The rows of older kp_ct4 maps (`old`: map and row converter), copied into `ct`, the
    current one."""

    def __init__(self, ct: PinnedMap, old: list[tuple[PinnedMap, Callable[[bytes], bytes]]]):
        self.ct, self._old = ct, old
        self._written: dict[bytes, bytes] = {}      # key -> the row this copy wrote

    def copy(self) -> int:
        """Writes each old row that is new or changed since the last copy, unless the current
        map holds a row for its flow that this copy did not write. Returns the rows written."""
        done = 0
        for old, convert in self._old:
            for key, value in old.raw_items():
                row = convert(value)
                mine = self._written.get(key)
                if mine == row:
                    continue
                cur = self.ct.get(L.CtKey.from_buffer_copy(key))
                if cur is not None and bytes(cur) != mine:
                    continue            # the new programs track this flow now
                try:
                    libbpf.map_update(self.ct.fd, key, row,
                                      libbpf.BPF_ANY if cur is not None else libbpf.BPF_NOEXIST)
                except libbpf.BpfError as exc:
                    log.warning("flow not carried over to %s: %s", self.ct.spec.name, exc)
                    continue
                self._written[key] = row
                done += 1
        return done

    def close(self) -> None:
        for old, _ in self._old:
            old.close()
        self._old.clear()
        self._written.clear()
        self.ct.close()
