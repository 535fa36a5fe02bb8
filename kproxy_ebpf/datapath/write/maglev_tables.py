"""Maglev tables of scope-EXT frontends in kp_maglev (bpf/lib/maglev.h): ids, rows, writes,
deletes and read-back, for the writer.

A frontend's table is built for one slot order (slot i names order[i-1]): entry e holds the
slot of the backend maglev.build gives entry e. Tables are never rewritten in place: a new
backend set, slot order or size is a new table under a new id, written before the slot 0 that
names it; the old one is deleted after the slot 0 that stopped naming it (writer.py), and its
id is reused as late as possible (ids.py), so a reader holding an old slot 0 finds the old rows
or none (and reads slot 0 again), never another table's.
"""
from __future__ import annotations

import itertools
import struct
from collections import defaultdict
from collections.abc import Iterable

from kproxy_ebpf.datapath.maps import layout as L
from kproxy_ebpf.datapath.maps.ids import IdAllocator
from kproxy_ebpf.datapath.maps.pinned import PinnedMap
from kproxy_ebpf.model import maglev

from .batch import Writes
from .programmed import BackendKey, HeldTable, Programmed

ROW = L.const("KP_MAGLEV_ROW")
# maglev.py is pure (below datapath/ in the layers) and spells the header's constants itself.
if (maglev.MAX_SIZE, maglev.SEED) != (L.const("KP_MAGLEV_MAX"), L.const("KP_MAGLEV_SEED")):
    raise ImportError("maglev.py's MAX_SIZE or SEED no longer match bpf/kproxy.h's kp_maglev")
_KEY = struct.Struct(L.MAPS["maglev"].key_format)
_VALUE = struct.Struct(L.MAPS["maglev"].value_format)
MAX_ID = 2**31


def row_count(size: int) -> int:
    return -(-size // ROW)


def entries(size: int, order: tuple[BackendKey, ...]) -> list[int]:
    """Entry e -> the slot (1..len(order)) whose backend maglev.build gives it."""
    return [i + 1 for i in maglev.build([(b[0], b[1]) for b in order], size)]


def encode(table: int, size: int, order: tuple[BackendKey, ...]) -> tuple[list[bytes], list[bytes]]:
    """The kp_maglev rows of a table: keys and values."""
    slots = entries(size, order)
    keys, values = [], []
    for r in range(row_count(size)):
        chunk = slots[r * ROW:(r + 1) * ROW]
        chunk += [0] * (ROW - len(chunk))
        keys.append(_KEY.pack(table, r))
        values.append(_VALUE.pack(table, *chunk))
    return keys, values


class MaglevTables:
    """The writer's Maglev tables in kp_maglev."""

    def __init__(self, m: PinnedMap) -> None:
        self.map = m
        self.ids: IdAllocator[int] = IdAllocator(MAX_ID, "Maglev tables")   # keyed by serial
        self._owner: dict[int, int] = {}       # table id -> its allocator key (a serial)
        self._serial = itertools.count(1)
        self.rows = 0                          # rows held, for the writer's room checks

    def _take(self) -> int:
        serial = next(self._serial)
        tid = self.ids.acquire(serial)
        self._owner[tid] = serial
        return tid

    def _free(self, tid: int) -> None:
        serial = self._owner.pop(tid, None)
        if serial is not None:
            self.ids.release(serial)

    def write(self, size: int, order: tuple[BackendKey, ...], writes: Writes) -> HeldTable:
        """A new table, written whole (the caller names it in slot 0 after)."""
        tid = self._take()
        keys, values = encode(tid, size, order)
        try:
            writes.rows(self.map, keys, values)
        except BaseException:
            # Only the one-by-one path raises here, after the rows before the failure: no
            # slot 0 names them yet, so they go at once.
            for k in keys:
                self.map.delete(k)
            self._free(tid)
            raise
        self.rows += len(keys)
        return HeldTable(tid, size, order)

    def drop(self, held: HeldTable, writes: Writes) -> int:
        """Deletes a table no slot 0 names any more; returns the rows deleted."""
        if held.table not in self._owner:
            return 0                           # a slot 0 that named rows nobody holds
        n = row_count(held.size)
        for r in range(n):
            writes.drop(self.map, _KEY.pack(held.table, r))
        self._free(held.table)
        self.rows -= n
        return n

    def restore(self, named: Iterable[tuple[Programmed, int, int]]) -> None:
        """Adopts the tables that slot 0s name (`named`: (the frontend's Programmed, table
        id, size)) and deletes every other row (a table written by an agent stopped before
        its slot 0). Each frontend gets a HeldTable; one whose rows are missing or are not
        what its slots give has an empty order, so the next apply writes it anew (or drops
        it), and the program never keeps reading a broken table."""
        found: dict[int, dict[bytes, bytes]] = defaultdict(dict)
        for k, v in self.map.unpacked():
            found[k[0]][_KEY.pack(*k)] = _VALUE.pack(*v)
        adopted: list[tuple[int, int]] = []
        for prog, tid, size in named:
            rows = found.pop(tid, {})
            order = prog.order()
            keys = [_KEY.pack(tid, r) for r in range(row_count(size))]
            same = (len(rows) == len(keys) and len(order) == prog.count and order != ()
                    and [rows.get(k) for k in keys] == encode(tid, size, order)[1])
            if rows:
                serial = next(self._serial)
                adopted.append((serial, tid))
                self._owner[tid] = serial
                self.rows += len(rows)
            prog.maglev = HeldTable(tid if rows else 0, size, order if same else ())
        self.ids.restore_all(adopted)
        for rows in found.values():
            for raw_key in rows:
                self.map.delete(raw_key)
