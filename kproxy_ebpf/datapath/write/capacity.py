"""How many rows the writer keeps in each map it owns, and whether a batch surely fits: both
from the Ledger's own counts, never by iterating a kernel map."""
from __future__ import annotations

from collections.abc import Mapping

from kproxy_ebpf.datapath.maps.pinned import PinnedMap
from kproxy_ebpf.model.desired import Frontend, FrontendKey, Scope
from kproxy_ebpf.model.objects import LBAlgorithm

from . import batch
from .held_addrs import HeldAddrs
from .lc_rows import LcRows
from .maglev_tables import MaglevTables, row_count
from .plan import Planner
from .programmed import Ledger


class Capacity:
    """The writer's maps, for their row counts and room (the optional ones None where the
    tests' fakes leave them out)."""

    def __init__(self, svc: PinnedMap, be: PinnedMap, meta: PinnedMap, src: PinnedMap | None,
                 ext_addrs: HeldAddrs | None, ext_locals: HeldAddrs | None,
                 scheduled: Mapping[LBAlgorithm, PinnedMap] | None = None,
                 lc_rows: LcRows | None = None) -> None:
        """`scheduled`: the map of the row each scheduler keeps beside slot 0 (kp_rr's
        cursors, kp_lcids' rows). kp_lcrow needs no check: an array cannot be full, and a
        frontend finding no pair free takes a kp_lcids row, which this counts for every
        least-conn frontend; its rows held are counted (`lc_rows`), for the fill metrics."""
        self.svc, self.be, self.meta, self.src = svc, be, meta, src
        self.lc_rows = lc_rows
        self.ext_addrs, self.ext_locals = ext_addrs, ext_locals
        self.scheduled = dict(scheduled or {})

    def row_counts(self, held: Ledger, tables: MaglevTables | None) -> dict[str, int]:
        counts = {"svc": len(held.frontends) + held.slot_rows,
                  "backend": len(held.backend_ids), "meta": len(held.named)}
        if self.src is not None:
            counts["srcrange"] = held.range_rows
        if tables is not None:
            counts["maglev"] = tables.rows
        if self.lc_rows is not None:        # a pair each, rows 0 and 1 never held
            counts["lcrow"] = 2 * len(self.lc_rows.pairs)
        for f, name in ((self.ext_addrs, "extaddr"), (self.ext_locals, "extbe")):
            if f is not None:
                counts[name] = len(f.refs)
        return counts

    def fits_batch(self, desired: Mapping[FrontendKey, Frontend], keys: list[FrontendKey],
                   held: Ledger, tables: MaglevTables | None, plan: Planner) -> bool:
        """Batch when there is enough to write and the maps surely have room: a full map
        mid-batch could not be tied to its frontend, the one-by-one path handles it."""
        if not all(hasattr(m, "put_batch") for m in (self.svc, self.be, self.meta)):
            return False
        todo = [desired[k] for k in keys if k in desired]
        rows = sum(1 + len(fe.backends) for fe in todo)
        if rows + len(keys) < batch.BATCH_MIN:
            return False
        used = self.row_counts(held, tables)
        ranges = sum(len(fe.source_ranges) for fe in todo)
        if self.src is not None and used.get("srcrange", 0) + ranges > self.src.max_entries:
            return False
        ext = [fe for fe in todo if fe.key.scope is Scope.EXT]
        if tables is not None and tables.rows + sum(
                row_count(plan.maglev(fe)) for fe in ext) > tables.map.max_entries:
            return False
        for f, name, need in ((self.ext_addrs, "extaddr", len(ext)),
                              (self.ext_locals, "extbe", sum(len(fe.backends) for fe in ext))):
            if f is not None and used.get(name, 0) + need > f.map.max_entries:
                return False
        for alg, m in self.scheduled.items():   # counted only when they could be too many
            need = sum(1 for fe in todo if fe.algorithm is alg)
            if need and len(held.frontends) + need > m.max_entries and need + sum(
                    1 for p in held.frontends.values() if p.algorithm is alg) > m.max_entries:
                return False
        return (used["svc"] + rows <= self.svc.max_entries
                and used["backend"] + rows <= self.be.max_entries
                and used["meta"] + len(todo) <= self.meta.max_entries)
