"""Applies a desired state to the pinned maps: ordered make-before-break writes and garbage
collection. What to write comes from plan.py (the diff against the Ledger, programmed.py),
the rows' bytes from encode.py, the Ledger of a new agent from restore.py; every write goes
through the sink of datapath/batch.py that apply() hands down (at once, or batched by phase).

Order (make-before-break), per frontend:
  1. backend rows it needs, 2. slot rows 1..n, 3. slot 0 with the new count, 4. surplus slots;
then, after every frontend: deleted frontends (slot 0 first), then backends and service ids that
no row references any more. A lookup therefore never sees a count that covers an unwritten slot
nor a slot naming a freed backend, and ids are not reused at once (see ids.py).

No torn reads (the programs copy each row once, see bpf/lib/lb.h): a backend row is written
once, when its id is allocated, and never modified; an id names one (address, port, protocol)
for its whole life and is freed only after the apply that removed the last slot naming it.
What changes about an endpoint (ready, terminating, local) belongs to the frontend that uses
it and lives in that frontend's slot row (be_flags), of which tc_lb.c reads KP_BE_F_LOCAL.

Both scopes of the svc map are written here (sockets, and packets from outside the node): a
FrontendKey names a frontend's rows whatever its scope; backends and service ids are shared.

loadBalancerSourceRanges (scope EXT, LoadBalancer frontends) live in the kp_srcrange trie
with a flag in the frontend's slot 0 (KP_FE_F_SRC_RANGES): new range rows are written before
the slot 0 that sets or keeps the flag, and rows that left go only after the slot 0 that
cleared the flag or stopped needing them, so a reader never sees the flag without its rows
(it would drop every client). While ranges change, the union of old and new is admitted for
the moment between the two writes, never nothing.

Scope-EXT frontends also hold address rows (held_addrs.py): their own address in kp_extaddr
and their local backends' in kp_extbe, which tc_lb.c reads so that packets of no EXT flow
(pod-to-pod traffic between nodes) pass without a conntrack or service lookup. Like the range
rows, a frontend holds an address before the slot 0 that needs it and lets go after the slot 0
that stopped needing it. The writer never decides policy.
"""
from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping

from kproxy_ebpf.datapath.maps import encode as E
from kproxy_ebpf.datapath.maps import layout as L
from kproxy_ebpf.datapath.maps.ids import IdsExhausted
from kproxy_ebpf.datapath.maps.pinned import PinnedMap
from kproxy_ebpf.datapath.upgrade.restore import read_back
from kproxy_ebpf.model.desired import Frontend, FrontendKey, Scope, ServicePortName
from kproxy_ebpf.model.objects import LBAlgorithm

from .apply_result import ApplyResult
from .batch import BatchedWrites, DirectWrites, Writes
from .capacity import Capacity
from .garbage import collect
from .held_addrs import HeldAddrs
from .lc_ids import LcIds
from .maglev_tables import MaglevTables, row_count
from .plan import Planner, drained, slot_order
from .programmed import BackendKey, HeldTable, Ledger, Programmed
from .rr_cursors import Cursors
from .slots import fill_slots, new_backend, write_slots

RR = LBAlgorithm.ROUND_ROBIN
SCHEDULED = (RR, LBAlgorithm.LEAST_CONN)     # algorithms with a row beside slot 0

log = logging.getLogger(__name__)

class MapWriter:
    def __init__(self, maps: Mapping[str, PinnedMap]):
        self.svc, self.be, self.meta = maps["svc"], maps["backend"], maps["meta"]
        self.src = maps.get("srcrange")     # None: no source ranges written (tests' fakes)
        # The TC filters (None where the map is missing: tests' fakes).
        self.ext_addrs = HeldAddrs(maps["extaddr"]) if "extaddr" in maps else None
        self.ext_locals = HeldAddrs(maps["extbe"]) if "extbe" in maps else None
        # Maglev tables of EXT frontends (None where the map is missing: tests' fakes).
        self.tables = MaglevTables(maps["maglev"]) if "maglev" in maps else None
        # Round-robin cursors and least-conn counters (None where missing: tests' fakes).
        self.cursors = Cursors(maps["rr"]) if "rr" in maps else None
        self.lc_ids = LcIds.of(maps)
        self.plan = Planner(self.src is not None, self.ext_addrs is not None,
                            self.ext_locals is not None, self.tables is not None)
        scheduled = {RR: self.cursors.map} if self.cursors is not None else {}
        if self.lc_ids is not None:
            scheduled[LBAlgorithm.LEAST_CONN] = self.lc_ids.map
        self.capacity = Capacity(self.svc, self.be, self.meta, self.src, self.ext_addrs,
                                 self.ext_locals, scheduled, self.lc_ids.rows if self.lc_ids else None)
        self.held = Ledger()
        # While the drift check reads the maps (drift.py): every key an apply looked at;
        # a restore() replaces it with None (the check's comparison is void then).
        self.journal: set[FrontendKey] | None = None
        # Service ids freed since take_freed_svc_ids(): their per-Service counter rows
        # (kp_svcstat, svc_counters.py) go after the sync.
        self._freed_svc_ids: list[int] = []

    # Questions about what the maps hold go to self.held (the Ledger), read anew each time:
    # restore() replaces it.
    @property
    def programmed(self) -> Mapping[FrontendKey, Programmed]:
        """What the kernel holds, per frontend (read-only: the writer keeps it)."""
        return self.held.frontends

    @property
    def backend_ids(self):
        return self.held.backend_ids

    def restore(self) -> int:
        """Rebuilds the bookkeeping from the maps; returns the number of frontends found."""
        self.journal = None
        if self.tables is not None:
            self.tables = MaglevTables(self.tables.map)
        self.held = read_back(self.svc, self.be, self.meta, self.src, self.ext_addrs,
                              self.ext_locals, self.tables, previous=self.held)
        self._gc(DirectWrites(self.svc))
        if self.cursors is not None:    # of frontends no longer round-robin
            self.cursors.sweep(self.held.frontends)
        if self.lc_ids is not None:
            self.lc_ids.sweep(self.held.frontends, self.held.backend_ids, DirectWrites(self.svc))
        return len(self.held.frontends)

    def _gc(self, writes: Writes, res: ApplyResult | None = None) -> None:
        freed = self.lc_ids.free if self.lc_ids is not None else None
        self._freed_svc_ids += collect(self.held, self.be, self.meta, writes, res, freed)
        if self.lc_ids is not None:         # kp_lcrow pairs no slot 0 names now
            self.lc_ids.collect()

    # -- apply -----------------------------------------------------------------------------
    def apply(self, desired: Mapping[FrontendKey, Frontend],
              candidates: Iterable[FrontendKey] | None = None,
              res: ApplyResult | None = None) -> ApplyResult:
        """Makes the maps hold `desired`. With `candidates`, only those keys are examined
        (the frontends of services that changed); without, everything is diffed. Only
        `desired[k]` and `k in desired` are read for the keys examined. Reported into `res`
        (a new ApplyResult without) and returned."""
        res = ApplyResult() if res is None else res
        keys = sorted(set(self.held.frontends) | set(desired) if candidates is None
                      else set(candidates))
        if self.journal is not None:
            self.journal.update(keys)
        if not self.capacity.fits_batch(desired, keys, self.held, self.tables, self.plan):
            self._apply_keys(desired, keys, res, DirectWrites(self.svc))
            return res
        lc = self.lc_ids
        few = (self.src, *(o.map for o in (self.ext_addrs, self.ext_locals, self.cursors)
                           if o is not None),
               *(lc.batch_maps() if lc is not None else ()))
        tables = [self.tables.map] if self.tables is not None else []
        writes = BatchedWrites(self.svc, [self.be, self.meta, *tables],
                               [m for m in few if m is not None])
        self._apply_keys(desired, keys, res, writes)
        # A failure here leaves the bookkeeping ahead of the kernel: the caller must
        # restore() before the next apply (the agent does, after any failed sync).
        writes.replay()
        return res

    def _apply_keys(self, desired: Mapping[FrontendKey, Frontend], keys: list[FrontendKey],
                    res: ApplyResult, writes: Writes) -> None:
        frontends, to_write = self.held.frontends, self.plan.to_write
        for key in keys:
            fe = desired.get(key)
            if fe is not None and (wanted := to_write(self.held, key, fe)) is not None:
                self._guard(res, key, fe.service,
                            lambda fe=fe, w=wanted: self._write_frontend(fe, w, res, writes))
        for key in keys:
            if key not in desired and key in frontends:
                spn = frontends[key].service
                self._guard(res, key, spn, lambda key=key: self._delete_frontend(key, res, writes))
        self._gc(writes, res)

    def _guard(self, res: ApplyResult, key: FrontendKey, spn: ServicePortName | None, fn) -> None:
        """Runs one frontend's writes; a failure is recorded, the other frontends go on."""
        if not res.attempt(f"{spn or '?'} {key}", fn, (OSError, IdsExhausted)):
            res.failed[key] = spn

    def _write_frontend(self, fe: Frontend, wanted: dict[BackendKey, int], res: ApplyResult,
                        writes: Writes) -> None:
        """fe's rows in make-before-break order; `wanted`: its slots (Planner.to_write)."""
        key, held = fe.key, self.held
        prog = held.frontends.get(key)
        if prog is None:
            prog = held.frontends[key] = Programmed(fe.kind, None, fe.action, 0, None)
        order = slot_order(prog, wanted)
        was = prog.algorithm
        before = prog.order() if was in SCHEDULED else ()      # the slots as they were

        svc_id = held.svc_ids.acquire(fe.service)
        held.svc_unref.add(fe.service)     # in case this write fails before slot 0
        view = L.meta_view(fe.info)
        if held.named.get(fe.service) != view:
            # Rewritten in place when the settings change: no program reads it.
            writes.row(self.meta, L.U32(svc_id), E.meta_value(fe.service, view))
            held.named[fe.service] = view
            res.writes += 1

        key_of = E.svc_keys(key)       # slot -> kp_svc key, the frontend encoded once
        slots = fill_slots if not prog.rows and writes.batching else write_slots
        slots(held, self.be, prog, key_of, order, wanted, res, writes)
        local = self.plan.locals(fe)
        if key.scope is Scope.EXT:
            self._hold_filters(key, local, prog, res, writes)  # before the slot 0 needing them
        ranges = self.plan.ranges(fe)
        for cidr in sorted(ranges - prog.ranges):      # rows before the flag that needs them
            assert self.src is not None                # Planner.ranges: none without the map
            writes.row(self.src, L.srcrange_key(key, cidr), L.U32(0))
            prog.ranges = prog.ranges | {cidr}
            held.range_rows += 1
            res.writes += 1
        old_table = prog.maglev
        table = self._table(fe, prog, order, res, writes)    # before the slot 0 naming it
        had_row, lc = prog.lc_row, self.lc_ids                # a row before the slot 0 naming it
        lc_row = lc.row_for(fe, was, had_row, before, order, held.backend_ids, writes,
                            res) if lc is not None else 0
        # Only now may slot 0 announce the new count.
        writes.head(key_of(0), E.head_value(fe, svc_id, len(order), bool(ranges), table, lc_row))
        prog.range_flag, prog.maglev, prog.lc_row = bool(ranges), table, lc_row
        res.writes += 1
        if self.cursors is not None:                          # after the slot 0 it follows
            res.writes += self.cursors.update(fe, was, before if was is RR else (), order,
                                              writes)
        if self.lc_ids is not None:                           # after the slot 0 it follows
            res.writes += self.lc_ids.update(fe, was, had_row, lc_row, before, order, held.backend_ids, writes)
        prog.algorithm = fe.algorithm
        if old_table is not None and old_table is not table:  # after slot 0 let go
            assert self.tables is not None                     # it held the table
            res.writes += self.tables.drop(old_table, writes)
        self._drop_ranges(key, prog, prog.ranges - ranges, res, writes)   # after the flag let go
        for addr in sorted(prog.local_held - local):   # after slot 0 let go
            self._release_local(prog, addr, res, writes)
        self._hold_drain(prog, drained(fe), res, writes)
        held.set_service(prog, fe.service)
        prog.kind, prog.action = fe.kind, fe.action
        prog.affinity, prog.count = fe.affinity_timeout, len(order)
        for slot in prog.rows.above(len(order)):
            writes.drop_slot(key_of(slot))
            held.ref(prog, slot, None)
            res.writes += 1
        res.updated += 1

    def _table(self, fe: Frontend, prog: Programmed, order: list[BackendKey], res: ApplyResult,
               writes: Writes) -> HeldTable | None:
        """The Maglev table fe's slot 0 is to name: the one held if it was built for these
        slots at this size, else a new one, written here."""
        size = self.plan.maglev(fe)
        if not size:
            return None
        assert self.tables is not None      # Planner.maglev: 0 without the map
        held, slots = prog.maglev, tuple(order)
        if held is not None and held.built_for(size, slots):
            return held
        table = self.tables.write(size, slots, writes)
        res.writes += row_count(size)
        return table

    def _delete_frontend(self, key: FrontendKey, res: ApplyResult, writes: Writes) -> None:
        held = self.held
        prog, key_of = held.frontends[key], E.svc_keys(key)
        writes.drop_head(key_of(0))     # first: the frontend disappears at once
        prog.count = None
        if self.cursors is not None and prog.algorithm is RR:
            res.writes += self.cursors.drop(key, writes)
        if self.lc_ids is not None and prog.algorithm is LBAlgorithm.LEAST_CONN:
            res.writes += self.lc_ids.gone(key, prog.lc_row, writes)
        if prog.maglev is not None:
            assert self.tables is not None      # it held the table
            res.writes += self.tables.drop(prog.maglev, writes)
            prog.maglev = None
        held.set_service(prog, None)
        res.writes += 1
        prog.range_flag = False
        self._drop_ranges(key, prog, prog.ranges, res, writes)
        for slot in sorted(prog.rows):
            writes.drop_slot(key_of(slot))
            held.ref(prog, slot, None)
            res.writes += 1
        for addr in sorted(prog.local_held):           # after its slot 0 is gone
            self._release_local(prog, addr, res, writes)
        self._hold_drain(prog, frozenset(), res, writes)
        if prog.addr_held:
            assert self.ext_addrs is not None   # held only where the map is (_hold_filters)
            self.ext_addrs.release(key.ip, res, writes)
            prog.addr_held = False
        del held.frontends[key]
        res.deleted += 1

    def _hold_drain(self, prog: Programmed, want: frozenset[BackendKey], res: ApplyResult,
                    writes: Writes) -> None:
        """References the backends of `want` without a slot (Frontend.draining): their rows,
        and ids, live on for the TC path's flows (lib/ct_pkt.h kp_ct_usable checks the row)."""
        held = self.held
        for b in sorted(want - prog.drain):
            if held.backend_ids.get(b) is None:
                new_backend(held, self.be, b, res, writes)
            held.refs.add(b)
        for b in prog.drain - want:
            held.refs.add(b, -1)
            held.unref.add(b)
        prog.drain = want

    # -- TC filter and source-range rows (EXT frontends) -------------------------------------
    def _hold_filters(self, key: FrontendKey, local: frozenset[str], prog: Programmed,
                      res: ApplyResult, writes: Writes) -> None:
        if self.ext_addrs is not None and not prog.addr_held:
            self.ext_addrs.hold(key.ip, res, writes)
            prog.addr_held = True
        for addr in sorted(local - prog.local_held):
            assert self.ext_locals is not None     # Planner.locals: none without the map
            self.ext_locals.hold(addr, res, writes)
            prog.local_held = prog.local_held | {addr}

    def _release_local(self, prog: Programmed, addr: str, res: ApplyResult, writes: Writes) -> None:
        assert self.ext_locals is not None      # prog held addr in it (_hold_filters)
        self.ext_locals.release(addr, res, writes)
        prog.local_held = prog.local_held - {addr}

    def _drop_ranges(self, key: FrontendKey, prog: Programmed, gone: frozenset[str],
                     res: ApplyResult, writes: Writes) -> None:
        for cidr in sorted(gone):
            assert self.src is not None                 # prog held the row in it
            writes.drop(self.src, L.srcrange_key(key, cidr))
            prog.ranges = prog.ranges - {cidr}
            self.held.range_rows -= 1
            res.writes += 1

    def take_freed_svc_ids(self) -> list[int]:
        """The service ids freed since the last call."""
        freed, self._freed_svc_ids = self._freed_svc_ids, []
        return freed

    def row_counts(self) -> dict[str, int]:
        """Rows the writer keeps in each map it owns (without iterating the kernel maps)."""
        return self.capacity.row_counts(self.held, self.tables)

    def stats(self) -> dict[str, int]:
        return {"frontends": len(self.held.frontends), "backends": len(self.held.backend_ids),
                "service_ports": len(self.held.svc_ids)}
