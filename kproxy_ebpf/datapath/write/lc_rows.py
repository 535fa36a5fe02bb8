"""Least-conn rows in an array (kp_lcrow, bpf/lib/sched.h): a frontend with at most
KP_LC_ROW backends has its counters' indexes in a 64-byte row its slot 0 names (backend_id,
which a least-conn frontend does not need for a Maglev table), so a connect reads one array
row instead of the hashed kp_lcids row (lc_ids.py): no jhash, one cache line.

An array row is rewritten in place, and a reader must never meet one half written. So each
such frontend owns a pair of rows, 2p and 2p + 1: the new version goes into the one its slot
0 does not name, before the slot 0 that names it (the batch's PUT_ROWS phase, before
PUT_HEADS). A reader holding the previous slot 0 reads the previous row, untouched until the
frontend's next change. A frontend that stops being least-conn, grows past KP_LC_ROW backends
or goes gives its pair back at the end of the apply (collect()), after its new slot 0: no
other frontend of that apply writes into it. Row 0 is never named (0: no row); with every
pair taken a frontend falls back on its kp_lcids row.
"""
from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence

from kproxy_ebpf.datapath.maps import layout as L
from kproxy_ebpf.datapath.maps.ids import IdAllocator, IdsExhausted
from kproxy_ebpf.datapath.maps.pinned import PinnedMap
from kproxy_ebpf.model.desired import FrontendKey

from .batch import Writes
from .programmed import Programmed

log = logging.getLogger(__name__)

RowVal = L.STRUCTS["kp_lc_row"]
ROW = L.const("KP_LC_ROW")


def row(ixs: Sequence[int]) -> object:
    """The kp_lc_row value naming the counters `ixs` (at most KP_LC_ROW)."""
    val = RowVal(count=len(ixs))
    val.conn[:len(ixs)] = list(ixs)
    return val


def same(val, ixs: Sequence[int]) -> bool:
    """Whether a kp_lc_row read back names exactly `ixs`."""
    return val is not None and val.count == len(ixs) and list(val.conn[:val.count]) == list(ixs)


class LcRows:
    """The writer's kp_lcrow pairs, keyed by frontend."""

    def __init__(self, m: PinnedMap) -> None:
        self.map = m
        self.pairs = self._pairs()
        self._freeing: set[FrontendKey] = set()
        self._warned = False

    def _pairs(self) -> IdAllocator[FrontendKey]:
        """Pair p is rows 2p and 2p + 1; p = 0 would hold row 0, which means "no row"."""
        return IdAllocator(max(self.map.max_entries // 2 - 1, 1), "least-conn rows")

    def write(self, key: FrontendKey, ixs: Sequence[int] | None, current: int,
              writes: Writes) -> int:
        """key's counters `ixs` (slot order) written into the row of its pair that slot 0
        (naming `current`) does not name; returns that row, for the next slot 0 to name. 0: no
        row (more than KP_LC_ROW backends, no counters, or no pair free): kp_lcids then."""
        if ixs is None or len(ixs) > ROW:
            return 0
        self._freeing.discard(key)
        try:
            p = self.pairs.acquire(key)
        except IdsExhausted as exc:
            if not self._warned:
                log.warning("least-conn frontends beyond %d use their kp_lcids row: %s",
                            self.pairs.max_id, exc)
                self._warned = True
            return 0
        at = 2 * p + (current == 2 * p)
        writes.row(self.map, L.U32(at), row(ixs))
        return at

    def free(self, key: FrontendKey) -> None:
        """key's slot 0 names no row of its pair any more: the pair goes at collect()."""
        if key in self.pairs:
            self._freeing.add(key)

    def collect(self) -> None:
        """After every slot 0 of an apply: the pairs freed in it go back to the allocator."""
        for key in self._freeing:
            self.pairs.release(key)
        self._freeing = set()

    def adopt(self, held: Mapping[FrontendKey, Programmed]) -> set[FrontendKey]:
        """After a restart: the pairs of the rows held slot 0s name (the other row of each
        pair with it); a row no slot 0 names is free, whatever it holds. Returns the
        frontends whose slot 0 names a row they cannot keep (outside the map, or in a pair
        another slot 0 names): the sweep gives them another."""
        self.pairs, self._freeing = self._pairs(), set()
        owner: dict[int, FrontendKey] = {}
        stray: set[FrontendKey] = set()
        for k, p in held.items():
            if p.lc_row:
                pair = p.lc_row // 2
                if 1 <= pair <= self.pairs.max_id and pair not in owner:
                    owner[pair] = k
                else:
                    stray.add(k)
        self.pairs.restore_all((k, pair) for pair, k in owner.items())
        return stray
