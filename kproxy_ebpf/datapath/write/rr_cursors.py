"""Round-robin cursors (kp_rr, bpf/lib/sched.h): one row per frontend whose slot 0 carries
KP_FE_F_ROUND_ROBIN, keyed by that slot 0's key.

A connect takes slot cursor % count + 1 and advances the cursor atomically. When the
frontend's backends change, the writer sets the cursor, right after the slot 0 with the new
count, to where the rotation goes on: the first backend after the last one picked that is
still there, at its new slot. So a change neither skips a backend's turn nor gives the one
just picked another at once. A connect between the two writes pairs the new count with the
old cursor and lands out of turn (once); one before a missing cursor row picks at random.
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence

from kproxy_ebpf.datapath.maps import layout as L
from kproxy_ebpf.datapath.maps.pinned import PinnedMap
from kproxy_ebpf.model.desired import Frontend, FrontendKey
from kproxy_ebpf.model.objects import LBAlgorithm

from .batch import Writes
from .programmed import BackendKey, Programmed

RrVal = L.STRUCTS["kp_rr_val"]


def resume_at(picked: int, old: Sequence[BackendKey], new: Sequence[BackendKey]) -> int:
    """The cursor for `new` that goes on from a rotation over `old` after `picked` picks:
    the new index of the first backend after the last picked one that `new` still has."""
    if not picked or not old or not new:
        return 0
    where = {b: i for i, b in enumerate(new)}
    last = (picked - 1) % len(old)
    for step in range(1, len(old) + 1):
        i = where.get(old[(last + step) % len(old)])
        if i is not None:
            return i
    return 0


class Cursors:
    """The writer's round-robin cursors in kp_rr."""

    def __init__(self, m: PinnedMap) -> None:
        self.map = m

    def update(self, fe: Frontend, was: LBAlgorithm, rotated: Sequence[BackendKey],
               order: Sequence[BackendKey], writes: Writes) -> int:
        """After fe's slot 0, which used `was` over the slots `rotated`: its cursor set where
        the rotation goes on when its slots changed, deleted when it stopped asking for one.
        Returns rows written."""
        rr = LBAlgorithm.ROUND_ROBIN
        if fe.algorithm is rr:
            return 0 if tuple(order) == tuple(rotated) else self.follow(fe.key, rotated, order,
                                                                        writes)
        return self.drop(fe.key, writes) if was is rr else 0

    def follow(self, key: FrontendKey, old: Sequence[BackendKey], new: Sequence[BackendKey],
               writes: Writes) -> int:
        """Sets key's cursor for the slots `new` (after the slot 0 announcing them); `old`:
        the slots it rotated over until now (empty: a new rotation). Returns rows written."""
        skey = L.frontend_svc_key(key)
        row = self.map.get(skey) if old else None
        start = resume_at(row.next if row is not None else 0, old, new)
        writes.cursor(self.map, skey, RrVal(next=start))
        return 1

    def drop(self, key: FrontendKey, writes: Writes) -> int:
        """Deletes key's cursor once no slot 0 asks for round robin."""
        writes.drop(self.map, L.frontend_svc_key(key))
        return 1

    def sweep(self, held: Mapping[FrontendKey, Programmed]) -> int:
        """Deletes the cursors of frontends that no longer use one (a restart after a change
        the previous agent did not finish); returns how many."""
        wanted = {bytes(L.frontend_svc_key(k)) for k, p in held.items()
                  if p.algorithm is LBAlgorithm.ROUND_ROBIN}
        gone = [k for k in self.map.keys() if bytes(k) not in wanted]
        for k in gone:
            self.map.delete(k)
        return len(gone)
