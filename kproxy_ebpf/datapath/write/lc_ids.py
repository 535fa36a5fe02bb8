"""Least-conn rows (bpf/lib/sched.h): per frontend whose slot 0 carries KP_FE_F_LEAST_CONN,
the kp_conns index of each slot's backend in slot order, so that a connect's scan reads one
row and then arrays, not a kp_svc row and a hashed counter per slot (measured in
docs/design/schedulers.md). A frontend of at most KP_LC_ROW backends has it in a kp_lcrow
array row its slot 0 names (lc_rows.py: written before that slot 0); one with more, or
finding no row free, in a kp_lcids row keyed by its slot 0's key (slot 0's backend_id 0).

A backend gets a counter index the first time a least-conn frontend names it: its kp_conns
row is written then with its backend id, its kp_connload word with a new random gen and a
count of 0 (its kp_flowfix row with 0), then kp_connix (backend id -> index), all before the
row naming the index. The index is freed with the backend id (garbage.py); its next
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

from .apply_result import ApplyResult
from .batch import Writes
from .lc_rows import ROW, LcRows, same
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
    """The writer's least-conn rows (kp_lcrow, kp_lcids) and counter indexes (kp_conns,
    kp_connix). `rows` None: no kp_lcrow (tests' fakes), every frontend on kp_lcids."""

    def __init__(self, m: PinnedMap, conns: PinnedMap, connix: PinnedMap,
                 connload: PinnedMap, flowfix: PinnedMap | None = None,
                 rows: PinnedMap | None = None) -> None:
        self.map, self.conns, self.connix = m, conns, connix
        self.connload, self.flowfix = connload, flowfix
        self.ix: IdAllocator[int] = _indexes(conns)
        self.rows = LcRows(rows) if rows is not None else None

    @classmethod
    def of(cls, maps: Mapping[str, PinnedMap]) -> LcIds | None:
        """The writer's, None where a map it needs is missing (tests' fakes)."""
        if not {"lcids", "conns", "connix", "connload"} <= maps.keys():
            return None
        return cls(maps["lcids"], maps["conns"], maps["connix"], maps["connload"],
                   maps.get("flowfix"), maps.get("lcrow"))

    def batch_maps(self) -> tuple[PinnedMap | None, ...]:
        """Its maps in the order a batch writes them: a counter zeroed before kp_connix leads
        a flow to it."""
        return (self.map, self.conns, self.connload, self.flowfix, self.connix,
                self.rows.map if self.rows is not None else None)

    def row_for(self, fe: Frontend, was: LBAlgorithm, current: int,
                before: Sequence[BackendKey], order: Sequence[BackendKey],
                ids: IdAllocator[BackendKey], writes: Writes, res: ApplyResult) -> int:
        """Before fe's slot 0 (which names `current` now): the kp_lcrow row the new slot 0 is
        to name (0: none, kp_lcids instead), written here. The row named now is kept while
        the slots are the same."""
        if self.rows is None or fe.algorithm is not LC or len(order) > ROW:
            return 0
        if was is LC and current and tuple(order) == tuple(before):
            return current
        ixs, n = self.counters(fe.key, [ids.get(b) or 0 for b in order], writes)
        at = self.rows.write(fe.key, ixs, current, writes)
        res.writes += n + bool(at)
        return at

    def update(self, fe: Frontend, was: LBAlgorithm, had: int, row: int,
               before: Sequence[BackendKey], order: Sequence[BackendKey],
               ids: IdAllocator[BackendKey], writes: Writes) -> int:
        """After fe's slot 0, which used `was` over the slots `before` and named the kp_lcrow
        row `had`, and now names `row`: its kp_lcids row written when it needs one (no
        kp_lcrow row) and its slots changed or it had none, deleted when it needs none any
        more; a pair of kp_lcrow rows it stopped naming freed. Returns rows written."""
        if not row and self.rows is not None:     # (also a pair taken by a failed write)
            self.rows.free(fe.key)
        hashed = was is LC and not had              # it had a kp_lcids row
        if fe.algorithm is LC and not row:
            if hashed and tuple(order) == tuple(before):
                return 0
            return self.put(fe.key, [ids.get(b) or 0 for b in order], writes)
        return self.drop(fe.key, writes) if hashed else 0

    def gone(self, key: FrontendKey, had: int, writes: Writes) -> int:
        """A least-conn frontend was deleted (slot 0 first): its rows go."""
        if self.rows is not None:
            self.rows.free(key)
        return 0 if had else self.drop(key, writes)

    def counters(self, key: FrontendKey, bids: Sequence[int],
                 writes: Writes) -> tuple[list[int] | None, int]:
        """A counter index for each of the backends `bids` (slot order), handed out here if
        it has none; None when none is left. Also returns the rows written."""
        ixs, n = [], 0
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
            return None, n
        return ixs, n

    def put(self, key: FrontendKey, bids: Sequence[int], writes: Writes) -> int:
        """key's kp_lcids row for the backends `bids` (slot order), with a counter for each."""
        if len(bids) > MAX_IDS:
            return self.drop(key, writes)
        ixs, n = self.counters(key, bids, writes)
        if ixs is None:
            return n + self.drop(key, writes)
        writes.cursor(self.map, L.frontend_svc_key(key), row(ixs))
        return n + 1

    def drop(self, key: FrontendKey, writes: Writes) -> int:
        """Deletes key's kp_lcids row once its slot 0 no longer reads it."""
        writes.drop(self.map, L.frontend_svc_key(key))
        return 1

    def free(self, bid: int, writes: Writes) -> None:
        """Backend id bid is freed: so is its counter index (garbage.py)."""
        if self.ix.release(bid) is not None:
            writes.drop(self.connix, L.U32(bid))

    def collect(self) -> None:
        """The end of an apply, after every slot 0: the kp_lcrow pairs freed go back."""
        if self.rows is not None:
            self.rows.collect()

    def sweep(self, held: Mapping[FrontendKey, Programmed], ids: IdAllocator[BackendKey],
              writes: Writes) -> int:
        """After a restart: adopts the counter indexes of backends still held, frees the
        others; adopts the kp_lcrow rows slot 0s name; gives a frontend whose row does not
        match its slots (the previous agent stopped between a row and its slot 0), or that
        has none and fits one, a row written anew and a slot 0 naming it; deletes the
        kp_lcids rows of frontends that do not read them and rewrites those that do not
        match their slots. Returns rows changed."""
        self.ix = _indexes(self.conns)
        live = set(ids.by_id())
        changed = 0
        for k, v in list(self.connix.items()):
            if k.value in live and 1 <= v.value <= self.ix.max_id:
                self.ix.restore(k.value, v.value)
            else:
                self.connix.delete(k)
                changed += 1
        lc = {k: (p, [ids.get(b) or 0 for b in p.order()])
              for k, p in held.items() if p.algorithm is LC}
        if self.rows is not None:
            changed += self._sweep_rows(lc, writes.svc, writes)
        want = {bytes(L.frontend_svc_key(k)): (k, bids)
                for k, (p, bids) in lc.items() if not p.lc_row}
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

    def _sweep_rows(self, lc: Mapping[FrontendKey, tuple[Programmed, list[int]]],
                    svc: PinnedMap, writes: Writes) -> int:
        """sweep()'s kp_lcrow part: every least-conn frontend that fits a row ends with its
        slot 0 naming a row that matches its slots, written before that slot 0; one that
        does not fit, or finds no row, with slot 0 naming none (after its kp_lcids row)."""
        assert self.rows is not None
        stray = self.rows.adopt({k: p for k, (p, _) in lc.items()})
        changed = 0
        for k, (p, bids) in lc.items():
            ixs = [self.ix.get(b) or 0 for b in bids]     # 0: none (a row never names it)
            if not p.lc_row and len(bids) > ROW:
                continue                              # on kp_lcids: the loop after this
            if (p.lc_row and k not in stray and 0 not in ixs
                    and same(self.rows.map.get(L.U32(p.lc_row)), ixs)):
                continue
            named = p.lc_row
            got, n = self.counters(k, bids, writes)
            at = self.rows.write(k, got, 0 if k in stray else named, writes)
            if not at:
                n += self.put(k, bids, writes)       # before the slot 0 that reads it
            if at != named:
                head = svc.get(L.frontend_svc_key(k))
                if head is not None:
                    head.backend_id = at
                    svc.put(L.frontend_svc_key(k), head)
                    n += 1
            if named and not at and k not in stray:
                self.rows.free(k)
            p.lc_row = at
            changed += n
        self.rows.collect()
        return changed
