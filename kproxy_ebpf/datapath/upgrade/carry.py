"""Carries the rows only the programs write from an old map into its successor.

A new map (a layout version bump: ct_upgrade.py; a new size: resize.py) starts empty, and the
programs are its only writers: without a copy every tracked flow, UDP reverse translation and
affinity open at the switch would be forgotten. The rows are copied twice: when the new programs
are loaded (the old ones still write the old map) and once they are attached, for the rows that
appeared or changed in between. The second copy leaves alone a row the new programs have
written since (they own it now). The old maps are opened before the first copy, so their pins
may go once the new programs are attached (sock_hooks.py remove_stale_maps).
"""
from __future__ import annotations

import logging
from collections.abc import Callable
from typing import NamedTuple

from kproxy_ebpf.datapath.load import libbpf
from kproxy_ebpf.datapath.maps.pinned import PinnedMap

log = logging.getLogger(__name__)


def same(raw: bytes) -> bytes:
    return raw


class Pair(NamedTuple):
    old: PinnedMap
    new: PinnedMap
    key: Callable[[bytes], bytes] = same      # old key -> the new map's
    value: Callable[[bytes], bytes] = same


class RowCarry:
    def __init__(self, pairs: list[Pair]):
        self._pairs = pairs
        self._written: dict[tuple[str, bytes], bytes] = {}   # (map, key) -> the row written

    def __bool__(self) -> bool:
        return bool(self._pairs)

    def copy(self) -> int:
        """Writes each old row that is new or changed since the last copy, unless the new map
        holds a row for its key that this copy did not write. Returns the rows written."""
        done = 0
        for p in self._pairs:
            target = p.new.spec.name
            for raw_key, raw_value in p.old.raw_items():
                key, row = p.key(raw_key), p.value(raw_value)
                mine = self._written.get((target, key))
                if mine == row:
                    continue
                cur = p.new.get(p.new.spec.key.from_buffer_copy(key))
                if cur is not None and bytes(cur) != mine:
                    continue            # the new programs own this row now
                try:
                    libbpf.map_update(p.new.fd, key, row,
                                      libbpf.BPF_ANY if cur is not None else libbpf.BPF_NOEXIST)
                except libbpf.BpfError as exc:
                    log.warning("row not carried over to %s: %s", target, exc)
                    continue
                self._written[(target, key)] = row
                done += 1
        return done

    def close(self) -> None:
        for p in self._pairs:
            p.old.close()
            p.new.close()
