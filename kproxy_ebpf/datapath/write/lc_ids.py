"""Least-conn rows (bpf/lib/sched.h): per frontend whose slot 0 carries KP_FE_F_LEAST_CONN, a
kp_lcids row (keyed by that slot 0's key) with the kp_conns index of each slot's backend in
slot order, so that a connect's scan reads one row and then arrays, not a kp_svc row and a
hashed counter per slot (measured in docs/design/schedulers.md).

A backend gets a counter index the first time a least-conn frontend names it: its kp_conns
row is written then with its backend id, its kp_connload word with a new random gen and a
count of 0 (its kp_flowfix row with 0), then kp_connix (backend id -> index), all before the
kp_lcids row naming the index. The index is freed with the backend id (garbage.py); its next
holder's word gets another gen, so a socket still counted on the old one takes back nothing
from the new (lib/sockconn.h, lib/conns.h kp_conn_tag).

A kp_lcids row is written whole, right after the slot 0 announcing the slots it describes
(the batch phase of the round-robin cursors): a connect between the two writes meets the old
row, which for a count it does not cover means a pick at random, otherwise one pick by old
counts; any pick is a slot of the frontend. A frontend with more than KP_LC_IDS backends, or
whose backends find no free counter, gets no row: its picks are at random (lc_no_ids).
"""
from __future__ import annotations

import logging
import secrets
from collections.abc import Mapping, Sequence

from kproxy_ebpf.datapath.maps import conn_load
from kproxy_ebpf.datapath.maps import layout as L
from kproxy_ebpf.datapath.maps.ids import IdAllocator, IdsExhausted
from kproxy_ebpf.datapath.maps.pinned import PinnedMap
from kproxy_ebpf.model.desired import Frontend, FrontendKey
from kproxy_ebpf.model.objects import LBAlgorithm

from .batch import Writes
from .programmed import BackendKey, Programmed

log = logging.getLogger(__name__)

LcIdsVal = L.STRUCTS["kp_lc_ids"]
ConnsVal = L.STRUCTS["kp_conns"]
FixVal = L.MAPS["flowfix"].value
LoadVal = L.MAPS["connload"].value
MAX_IDS = L.const("KP_LC_IDS")
LC = LBAlgorithm.LEAST_CONN


def row(ixs: Sequence[int]) -> object:
    """The kp_lc_ids value naming the counters `ixs` (at most KP_LC_IDS)."""
    val = LcIdsVal(count=len(ixs))
    val.conn[:len(ixs)] = list(ixs)
    return val


def new_gen() -> int:
    """A counter's gen for one holding of its index (16 bits: kp_conn_tag): random, so a
    restarted agent needs no record of the ones used before; never 0 (a kp_connload word
    with gen 0 is an index not handed out: lib/conns.h kp_conns_tag counts nothing on it)."""
    return secrets.randbits(16) or 1


def _indexes(conns: PinnedMap) -> IdAllocator[int]:
    """kp_conns indexes 1..size-1 (0: counted nowhere), at most 16 bits (kp_conn_tag)."""
    return IdAllocator(min(conns.max_entries - 1, 0xffff), "least-conn counters")


class LcIds:
    """The writer's least-conn rows (kp_lcids) and counter indexes (kp_conns, kp_connix)."""

    def __init__(self, m: PinnedMap, conns: PinnedMap, connix: PinnedMap,
                 connload: PinnedMap, flowfix: PinnedMap | None = None) -> None:
        self.map, self.conns, self.connix = m, conns, connix
        self.connload, self.flowfix = connload, flowfix
        self.ix: IdAllocator[int] = _indexes(conns)

    def update(self, fe: Frontend, was: LBAlgorithm, before: Sequence[BackendKey],
               order: Sequence[BackendKey], ids: IdAllocator[BackendKey],
               writes: Writes) -> int:
        """After fe's slot 0, which used `was` over the slots `before`: its row written when
        its slots changed or it started asking for least-conn, deleted when it stopped.
        Returns rows written."""
        if fe.algorithm is LC:
            if was is LC and tuple(order) == tuple(before):
                return 0
            return self.put(fe.key, [ids.get(b) or 0 for b in order], writes)
        return self.drop(fe.key, writes) if was is LC else 0

    def put(self, key: FrontendKey, bids: Sequence[int], writes: Writes) -> int:
        """key's row for the backends `bids` (slot order), with a counter for each."""
        if len(bids) > MAX_IDS:
            return self.drop(key, writes)
        ixs, n = [], 1
        try:
            for bid in bids:
                ix = self.ix.get(bid)
                if ix is None:
                    ix = self.ix.acquire(bid)
                    writes.row(self.conns, L.U32(ix), ConnsVal(backend_id=bid))
                    writes.row(self.connload, L.U32(ix), LoadVal(conn_load.word(new_gen())))
                    if self.flowfix is not None:     # a previous holder's repair
                        writes.row(self.flowfix, L.U32(ix), FixVal(0))
                    writes.row(self.connix, L.U32(bid), L.U32(ix))
                    n += 4
                ixs.append(ix)
        except IdsExhausted as exc:
            log.warning("least-conn picks at random for %s: %s", key, exc)
            return n - 1 + self.drop(key, writes)
        writes.cursor(self.map, L.frontend_svc_key(key), row(ixs))
        return n

    def drop(self, key: FrontendKey, writes: Writes) -> int:
        """Deletes key's row once no slot 0 asks for least-conn."""
        writes.drop(self.map, L.frontend_svc_key(key))
        return 1

    def free(self, bid: int, writes: Writes) -> None:
        """Backend id bid is freed: so is its counter index (garbage.py)."""
        if self.ix.release(bid) is not None:
            writes.drop(self.connix, L.U32(bid))

    def sweep(self, held: Mapping[FrontendKey, Programmed], ids: IdAllocator[BackendKey],
              writes: Writes) -> int:
        """After a restart: adopts the counter indexes of backends still held, frees the
        others, deletes the rows of frontends no longer least-conn and rewrites those that do
        not match their slots (the previous agent stopped between a slot 0 and its row).
        Returns rows changed."""
        self.ix = _indexes(self.conns)
        live = set(ids.by_id())
        changed = 0
        for k, v in list(self.connix.items()):
            if k.value in live and 1 <= v.value <= self.ix.max_id:
                self.ix.restore(k.value, v.value)
            else:
                self.connix.delete(k)
                changed += 1
        want = {bytes(L.frontend_svc_key(k)): (k, [ids.get(b) or 0 for b in p.order()])
                for k, p in held.items() if p.algorithm is LC}
        for k, v in list(self.map.items()):
            fkey, bids = want.pop(bytes(k), (None, None))
            if fkey is None or bids is None:
                self.map.delete(k)
                changed += 1
            elif [self.ix.get(b) for b in bids] != list(v.conn[:v.count]):
                changed += self.put(fkey, bids, writes)
        for fkey, bids in want.values():
            changed += self.put(fkey, bids, writes)
        return changed
