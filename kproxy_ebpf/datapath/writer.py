"""Applies a desired state to the pinned maps: diff, ordered writes, garbage collection.

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

Slots are filled stably: a backend that stays keeps its slot, a new one takes a freed slot, and
only the tail moves into the holes. That keeps writes proportional to what changed and lets
session affinity (which remembers the slot) survive most scale events.

Both scopes of the svc map are written here (sockets, and packets from outside the node): a
frontend key (ip, port, proto) or (ip, port, proto, Scope.EXT) names its rows, backends and
service ids are shared. The order above holds per frontend, whatever its scope.

loadBalancerSourceRanges (scope EXT, LoadBalancer frontends) live in the kp_srcrange4 trie
with a flag in the frontend's slot 0 (KP_FE_F_SRC_RANGES): new range rows are written before
the slot 0 that sets or keeps the flag, and rows that left go only after the slot 0 that
cleared the flag or stopped needing them, so a reader never sees the flag without its rows
(it would drop every client). While ranges change, the union of old and new is admitted for
the moment between the two writes, never nothing.

Scope-EXT frontends also hold address rows (held_addrs.py): their own address in kp_extaddr4
and their local backends' in kp_extbe4, which tc_lb.c reads so that packets of no EXT flow
(pod-to-pod traffic between nodes) pass without a conntrack or service lookup. Like the range
rows, a frontend holds an address before the slot 0 that needs it and lets go after the slot 0
that stopped needing it.

The writer restores its bookkeeping from the maps, so a new agent process adopts what the last
one programmed and rewrites only what differs. It never decides policy.
"""
from __future__ import annotations

import logging
import socket
import struct
import sys
from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from ..desired import Action, Backend, Frontend, FrontendKind, ServicePortName
from ..model import Protocol
from . import layout as L
from .held_addrs import HeldAddrs
from .ids import IdAllocator, IdsExhausted
from .pinned import MapFull, PinnedMap

log = logging.getLogger(__name__)

BackendKey = tuple[str, int, Protocol]
FrontendKey = tuple          # desired.Frontend.key: (ip, port, proto[, Scope.EXT])
Slot = tuple[BackendKey, int]            # the backend a slot names, and its be_flags

MAX_ID = 2**31
BATCH_MIN = 64            # ops below which single writes are as cheap as a batch


# Rows written per endpoint are packed straight into bytes (the kernel's layout, from
# layout.py's formats): a ctypes object per row cost more than the syscalls.
_SVC_KEY = struct.Struct(L.MAPS["svc"].key_format)
_SVC_VAL = struct.Struct(L.MAPS["svc"].value_format).pack
_ID = struct.Struct(L.MAPS["backend"].key_format).pack
_BACKEND = struct.Struct(L.MAPS["backend"].value_format).pack
_NATIVE_U32, _NATIVE_U32_PACK = struct.Struct("=I").unpack, struct.Struct("=I").pack


def _backend_row(b: BackendKey) -> bytes:
    """kp_backend4 of (ip, port, protocol): address and port in network byte order. The
    address leads the row (checked below), so a row is its 4 bytes and the packed rest of
    (port, protocol), which few backends differ in."""
    tail = _BACKEND_TAIL.get((b[1], b[2]))
    if tail is None:
        tail = _BACKEND_TAIL[(b[1], b[2])] = _BACKEND(
            0, int.from_bytes(b[1].to_bytes(2, "big"), sys.byteorder), L.PROTO_NUM[b[2]])[4:]
    return socket.inet_aton(b[0]) + tail


_BACKEND_TAIL: dict[tuple[int, Protocol], bytes] = {}
if L.G.STRUCTS["kp_backend4"]["fields"][0] != ("addr", 0, "be32"):
    raise ImportError("kp_backend4 no longer starts with its be32 addr: fix _backend_row")


# be_flags of each (local, terminating, ready): L.backend_flags without a call per endpoint.
_FLAGS = {(loc, term, ready): L.backend_flags(Backend("", 0, Protocol.TCP, local=loc,
                                                      terminating=term, ready=ready))
          for loc in (False, True) for term in (False, True) for ready in (False, True)}


def _is_head(key) -> bool:
    """Whether a kp_svc4 key (ctypes or packed) names slot 0."""
    return (_SVC_KEY.unpack(key)[4] if isinstance(key, bytes) else key.slot) == 0


def _cstr(raw: bytes) -> str:
    return raw.split(b"\0", 1)[0].decode()


class _Plan:
    """The map operations of one apply, recorded in the writer's order and then replayed in
    batches by phase: every new backend and name row, every slot row, every slot 0, then the
    deletes of slot 0s, of slots, and the garbage. That is one valid linearisation of the
    per-frontend make-before-break order (no slot 0 before its slots, no slot delete before
    the slot 0 that stopped counting it, no backend freed before the slots naming it), with a
    syscall per 1,024 rows instead of one per row."""

    PHASES = ("put-rows", "put-slots", "put-heads", "del-heads", "del-slots", "del-garbage")
    # Source-range rows ride with the backend rows: puts in put-rows (before any slot 0),
    # deletes in del-garbage (after every slot 0 that cleared its flag).

    def __init__(self) -> None:
        self.recordings: list[_Recording] = []

    def replay(self) -> None:
        for phase in self.PHASES:
            for rec in self.recordings:
                keys, values = rec.ops[phase]
                if not keys:
                    continue
                if values:
                    rec.real.put_batch(keys, values)
                else:
                    rec.real.delete_batch(keys)


class _Recording:
    """Stands in for a map while an apply is planned: puts and deletes go into the plan."""

    def __init__(self, real, plan: _Plan, svc: bool):
        self.real, self.svc = real, svc
        self.spec, self.max_entries = real.spec, real.max_entries
        self.ops: dict[str, tuple[list, list]] = {p: ([], []) for p in _Plan.PHASES}
        plan.recordings.append(self)

    def put(self, key, value) -> None:
        keys, values = self.ops[("put-heads" if _is_head(key) else "put-slots")
                                if self.svc else "put-rows"]
        keys.append(key)
        values.append(value)

    def delete(self, key) -> bool:
        self.ops[("del-heads" if _is_head(key) else "del-slots")
                 if self.svc else "del-garbage"][0].append(key)
        return True

    def put_many(self, keys: list, values: list) -> None:
        """Rows that are all slots 1..n (svc) or all backend rows, in order: put() each."""
        ops_keys, ops_values = self.ops["put-slots" if self.svc else "put-rows"]
        ops_keys += keys
        ops_values += values


class _OneByOne:
    """A map written element by element where a plan would batch: the source-range rows are
    few, and the LPM trie's batch operations are not in every kernel the agent supports."""

    def __init__(self, real):
        self.real, self.spec, self.max_entries = real, real.spec, real.max_entries

    def put_batch(self, keys, values) -> None:
        for k, v in zip(keys, values):
            self.real.put(k, v)

    def delete_batch(self, keys) -> None:
        for k in keys:
            self.real.delete(k)


class SlotRows:
    """A frontend's slot rows 1..n as the writer remembers them: slot -> (backend, be_flags).

    Packed for 100,000 endpoints: one list of backend keys (None: no row in that slot, e.g. a
    hole restored from the maps) and the u8 flags in a bytearray, instead of a dict of
    (backend, flags) tuples (~1 KiB less per frontend of 10). Read and written like that
    dict; get() and iteration build the tuples on the fly."""

    __slots__ = ("_be", "_flags")

    def __init__(self) -> None:
        self._be: list[BackendKey | None] = []
        self._flags = bytearray()

    def get(self, slot: int, default=None) -> Slot | None:
        i = slot - 1
        if 0 <= i < len(self._be) and self._be[i] is not None:
            return (self._be[i], self._flags[i])
        return default

    def __getitem__(self, slot: int) -> Slot:
        row = self.get(slot)
        if row is None:
            raise KeyError(slot)
        return row

    def __contains__(self, slot: object) -> bool:
        return isinstance(slot, int) and self.get(slot) is not None

    def __setitem__(self, slot: int, row: Slot) -> None:
        if slot < 1:
            raise KeyError(slot)
        grow = slot - len(self._be)
        if grow > 0:
            self._be.extend([None] * grow)
            self._flags.extend(bytes(grow))
        self._be[slot - 1], self._flags[slot - 1] = row

    def above(self, count: int) -> list[int]:
        """The slots above `count` that hold a row, in order."""
        be = self._be
        return [i + 1 for i in range(count, len(be)) if be[i] is not None]

    def fill(self, backends: list[BackendKey], flags: bytes) -> None:
        """Slots 1..n of a frontend that has none yet, at once."""
        if self._be:
            raise ValueError("fill() is for a frontend without slot rows")
        self._be, self._flags = list(backends), bytearray(flags)

    def pop(self, slot: int, default=None) -> Slot | None:
        row = self.get(slot)
        if row is None:
            return default
        self._be[slot - 1] = None
        while self._be and self._be[-1] is None:      # no tail of holes kept
            self._be.pop()
            self._flags.pop()
        return row

    def __iter__(self):
        return (i + 1 for i, b in enumerate(self._be) if b is not None)

    def __len__(self) -> int:
        return sum(b is not None for b in self._be)


@dataclass(slots=True)
class Programmed:
    """What the kernel holds for one frontend."""
    kind: FrontendKind
    service: ServicePortName | None
    action: Action
    affinity: int
    count: int | None                               # None: slot 0 not written yet
    rows: SlotRows = field(default_factory=SlotRows)      # slot -> (backend, flags)
    ranges: frozenset[str] = frozenset()            # kp_srcrange4 rows of this frontend
    range_flag: bool = False                        # slot 0's KP_FE_F_SRC_RANGES
    addr_held: bool = False                         # EXT: its address's kp_extaddr4 row
    local_held: frozenset[str] = frozenset()        # EXT: its local backends' kp_extbe4 rows

    def live(self) -> dict[BackendKey, int]:
        """The backends lookups can reach, with their flags."""
        return dict(self.rows[s] for s in range(1, (self.count or 0) + 1) if s in self.rows)


@dataclass
class ApplyResult:
    updated: int = 0          # frontends written
    deleted: int = 0          # frontends removed
    writes: int = 0           # map rows written or deleted
    errors: list[str] = field(default_factory=list)
    full_maps: set[str] = field(default_factory=set)
    failed: dict[FrontendKey, ServicePortName | None] = field(default_factory=dict)  # retry these

    @property
    def ok(self) -> bool:
        return not self.errors


def stable_slots(old: list[BackendKey], wanted: Iterable[BackendKey]) -> list[BackendKey]:
    """The new slot order: survivors stay put, newcomers fill holes, the tail fills the rest."""
    want = sorted(set(wanted))
    keep = set(want)
    slots: list[BackendKey | None] = [b if b in keep else None for b in old]
    placed = {b for b in slots if b is not None}
    fresh = [b for b in want if b not in placed]
    for i, b in enumerate(slots):
        if b is None and fresh:
            slots[i] = fresh.pop(0)
    slots.extend(fresh)
    # Close the remaining holes with elements from the tail.
    while None in slots:
        if slots[-1] is None:
            slots.pop()
            continue
        slots[slots.index(None)] = slots.pop()
    return slots  # type: ignore[return-value]


class MapWriter:
    def __init__(self, maps: Mapping[str, PinnedMap]):
        self.svc, self.be, self.meta = maps["svc"], maps["backend"], maps["meta"]
        self.src = maps.get("srcrange")     # None: no source ranges written (tests' fakes)
        # The TC filters (None where the map is missing: tests' fakes).
        self.ext_addrs = HeldAddrs(maps["extaddr"]) if "extaddr" in maps else None
        self.ext_locals = HeldAddrs(maps["extbe"]) if "extbe" in maps else None
        self.programmed: dict[FrontendKey, Programmed] = {}
        self.backend_ids = IdAllocator(MAX_ID, "backend ids")
        self.svc_ids = IdAllocator(MAX_ID, "service ids")
        self._refs: Counter[BackendKey] = Counter()        # slot rows naming each backend
        self._svc_refs: Counter[ServicePortName] = Counter()  # frontends of each service port
        self._named: dict[ServicePortName, L.MetaView] = {}  # service ports with a meta row
        self._unref: set[BackendKey] = set()                # may have dropped to 0 refs
        self._svc_unref: set[ServicePortName] = set()
        self._slot_rows = 0         # slot rows (1..n) of every frontend: O(1) row counts
        self._range_rows = 0        # kp_srcrange4 rows of every frontend, likewise

    # -- restore ---------------------------------------------------------------------------
    def restore(self) -> int:
        """Rebuilds the bookkeeping from the maps; returns the number of frontends found."""
        # Everything is rebuilt from the kernel: what the maps do not hold is forgotten.
        self.programmed.clear()
        self._slot_rows = self._range_rows = 0
        self._refs.clear()
        self._svc_refs.clear()
        self._named.clear()
        self.backend_ids = IdAllocator(MAX_ID, "backend ids")
        self.svc_ids = IdAllocator(MAX_ID, "service ids")
        # Plain tuples (PinnedMap.unpacked): no ctypes object per row at 100,000 rows.
        names: dict[int, ServicePortName] = {}
        for (sid,), (ns, name, port_name, proto, *view) in self.meta.unpacked():
            spn = ServicePortName(_cstr(ns), _cstr(name), _cstr(port_name),
                                  L.PROTO_BY_NUM.get(proto, Protocol.TCP))
            names[sid] = spn
            self._named[spn] = tuple(view)
        self.svc_ids.restore_all((spn, sid) for sid, spn in names.items())
        ports: dict[int, int] = {}

        def addr(ip: int, port: int, proto: int) -> tuple[str, int, Protocol]:
            if port not in ports:
                ports[port] = L.port_host(port)
            return (socket.inet_ntoa(_NATIVE_U32_PACK(ip)), ports[port],
                    L.PROTO_BY_NUM.get(proto, Protocol.TCP))

        backends: dict[int, BackendKey] = {}
        for (bid,), (ip, port, proto) in self.be.unpacked():
            backends[bid] = addr(ip, port, proto)
        self.backend_ids.restore_all((bkey, bid) for bid, bkey in backends.items())
        # Both scopes (sockets, and packets from outside the node) are this writer's; rows of
        # a scope it does not know belong to some other writer and are left alone.
        rows = [(k, v) for k, v in self.svc.unpacked() if k[3] in L.SCOPE_BY_NUM]
        heads: dict[tuple, Programmed] = {}     # a frontend's (ip, port, proto, scope) as stored

        def record(ip: int, port: int, proto: int, scope: int, prog: Programmed) -> Programmed:
            fkey = addr(ip, port, proto) + (() if scope == L.SCOPE_SOCK
                                            else (L.SCOPE_BY_NUM[scope],))
            heads[(ip, port, proto, scope)] = self.programmed[fkey] = prog
            return prog

        for (ip, port, proto, scope, slot), (_, sid, affinity, count, action, kind, _,
                                             fe_flags) in rows:
            if slot == 0:
                prog = record(ip, port, proto, scope, Programmed(
                    kind=L.KIND_BY_NUM.get(kind, FrontendKind.CLUSTER_IP), service=None,
                    action=L.ACTION_BY_NUM.get(action, Action.REJECT), affinity=affinity,
                    count=count, range_flag=bool(fe_flags & L.FE_F_SRC_RANGES)))
                self._set_service(prog, names.get(sid))
        refs = self._refs
        for (ip, port, proto, scope, slot), (bid, *_, flags, _) in rows:
            if slot == 0:
                continue
            prog = heads.get((ip, port, proto, scope)) or record(
                ip, port, proto, scope,
                Programmed(FrontendKind.CLUSTER_IP, None, Action.REJECT, 0, None))
            bkey = backends.get(bid)
            # A slot naming no backend, or above its frontend's count (an agent killed between
            # writing slot 0 and deleting the surplus), is a leftover no lookup can reach.
            if bkey is None or (prog.count is not None and slot > prog.count):
                self.svc.delete(L.SvcKey(addr=ip, port=port, proto=proto, scope=scope, slot=slot))
                continue
            prog.rows[slot] = (bkey, flags)       # _ref() inline: a fresh slot, per endpoint
            refs[bkey] += 1
            self._slot_rows += 1
        self._restore_ranges()
        self._restore_filters()
        # Anything unreferenced (a crash between writes) is garbage now: only those are
        # candidates (a set difference, not a _gc() look at each of 100,000 backends).
        self._unref = self.backend_ids.keys() - self._refs.keys()
        self._svc_unref = self.svc_ids.keys() - self._svc_refs.keys()
        self._gc()
        return len(self.programmed)

    def _restore_ranges(self) -> None:
        """Source-range rows back into their frontends; rows whose frontend is gone (a crash
        between the slot 0 delete and theirs) are deleted."""
        if self.src is None:
            return
        for key in self.src.keys():
            fkey, cidr = L.srcrange_of(key)
            prog = self.programmed.get(fkey)
            if prog is None or prog.count is None:
                self.src.delete(key)
            else:
                prog.ranges = prog.ranges | {cidr}
                self._range_rows += 1

    def _restore_filters(self) -> None:
        """The TC filter rows of the EXT frontends found (see HeldAddrs.restore). A frontend
        whose row could not be written does not hold it, so the next apply rewrites it (see
        _same) and reports the failure."""
        ext = [(k, p) for k, p in self.programmed.items() if len(k) == 4 and p.count is not None]
        if self.ext_addrs is not None:
            failed = self.ext_addrs.restore(k[0] for k, _ in ext)
            for k, p in ext:
                p.addr_held = k[0] not in failed
                if p.addr_held:
                    self.ext_addrs.adopt(k[0])
        if self.ext_locals is not None:
            local = {k: frozenset(row[0][0] for row in map(p.rows.get, range(1, p.count + 1))
                                  if row is not None and row[1] & L.F_LOCAL) for k, p in ext}
            failed = self.ext_locals.restore(set().union(*local.values()))
            for k, p in ext:
                p.local_held = local[k] - failed
                for addr in p.local_held:
                    self.ext_locals.adopt(addr)

    # -- apply -----------------------------------------------------------------------------
    def apply(self, desired: Mapping[FrontendKey, Frontend],
              candidates: Iterable[FrontendKey] | None = None) -> ApplyResult:
        """Makes the maps hold `desired`. With `candidates`, only those keys are examined
        (the frontends of services that changed); without, everything is diffed. Only
        `desired[k]` and `k in desired` are read for the keys examined."""
        res = ApplyResult()
        keys = sorted(set(self.programmed) | set(desired) if candidates is None else set(candidates))
        if self._fits_batch(desired, keys):
            plan = _Plan()
            real = self.svc, self.be, self.meta, self.src
            filters = [f for f in (self.ext_addrs, self.ext_locals) if f is not None]
            real_filters = [f.map for f in filters]
            self.svc, self.be, self.meta = (_Recording(self.svc, plan, True),
                                            _Recording(self.be, plan, False),
                                            _Recording(self.meta, plan, False))
            if self.src is not None:
                self.src = _Recording(_OneByOne(self.src), plan, False)
            for f in filters:
                f.map = _Recording(_OneByOne(f.map), plan, False)
            try:
                self._apply_keys(desired, keys, res)
            finally:
                self.svc, self.be, self.meta, self.src = real
                for f, m in zip(filters, real_filters):
                    f.map = m
            # A failure here leaves the bookkeeping ahead of the kernel: the caller must
            # restore() before the next apply (the agent does, after any failed sync).
            plan.replay()
            return res
        self._apply_keys(desired, keys, res)
        return res

    def _fits_batch(self, desired: Mapping[FrontendKey, Frontend], keys: list[FrontendKey]) -> bool:
        """Batch when there is enough to write and the maps surely have room: a full map
        mid-batch could not be tied to its frontend, the one-by-one path handles it."""
        if not all(hasattr(m, "put_batch") for m in (self.svc, self.be, self.meta)):
            return False
        todo = [desired[k] for k in keys if k in desired]
        rows = sum(1 + len(fe.backends) for fe in todo)
        if rows + len(keys) < BATCH_MIN:
            return False
        used = self.row_counts()
        ranges = sum(len(desired[k].source_ranges) for k in keys if k in desired)
        if self.src is not None and used.get("srcrange", 0) + ranges > self.src.max_entries:
            return False
        ext = [desired[k] for k in keys if len(k) == 4 and k in desired]
        for f, name, need in ((self.ext_addrs, "extaddr", len(ext)),
                              (self.ext_locals, "extbe", sum(len(fe.backends) for fe in ext))):
            if f is not None and used.get(name, 0) + need > f.map.max_entries:
                return False
        return (used["svc"] + rows <= self.svc.max_entries
                and used["backend"] + rows <= self.be.max_entries
                and used["meta"] + len(todo) <= self.meta.max_entries)

    def _apply_keys(self, desired: Mapping[FrontendKey, Frontend], keys: list[FrontendKey],
                    res: ApplyResult) -> None:
        for key in keys:
            fe = desired.get(key)
            if fe is not None and not self._same(key, fe):
                self._guard(res, key, fe.service, lambda fe=fe: self._write_frontend(fe, res))
        for key in keys:
            if key not in desired and key in self.programmed:
                spn = self.programmed[key].service
                self._guard(res, key, spn, lambda key=key: self._delete_frontend(key, res))
        self._gc(res)

    def _guard(self, res: ApplyResult, key: FrontendKey, spn: ServicePortName | None, fn) -> None:
        """Runs one frontend's writes; a failure is recorded, the other frontends go on."""
        try:
            fn()
        except MapFull as exc:
            res.full_maps.add(exc.map_name)
            res.errors.append(f"{spn or '?'} {key[0]}:{key[1]}/{key[2].value}: {exc}")
            res.failed[key] = spn
        except (OSError, IdsExhausted) as exc:
            res.errors.append(f"{spn or '?'} {key[0]}:{key[1]}/{key[2].value}: {exc}")
            res.failed[key] = spn

    @staticmethod
    def _wanted(fe: Frontend) -> dict[BackendKey, int]:
        if fe.action is not Action.FORWARD:
            return {}
        # Backend.key and L.backend_flags inline (this runs per endpoint); a flag that is not
        # a bool misses the table and takes the function.
        get = _FLAGS.get
        out = {(b.ip, b.port, b.protocol): get((b.local, b.terminating, b.ready))
               for b in fe.backends}
        if None in out.values():
            out = {b.key: L.backend_flags(b) for b in fe.backends}
        return out

    def _same(self, key: FrontendKey, fe: Frontend) -> bool:
        p = self.programmed.get(key)
        if p is None or p.count is None:
            return False
        if len(key) == 4 and not self._filters_held(p, fe):
            return False
        wanted = self._wanted(fe)
        return (p.kind, p.service, p.action, p.affinity) == (
            fe.kind, fe.service, fe.action, fe.affinity_timeout) and p.live() == wanted \
            and p.count == len(wanted) and self._named.get(fe.service) == L.meta_view(fe.info) \
            and p.ranges == self._ranges(fe) and p.range_flag == bool(p.ranges)

    def _ranges(self, fe: Frontend) -> frozenset[str]:
        """The source-range rows fe needs (none where the map is missing: a flag without
        rows would drop every client)."""
        return frozenset(fe.source_ranges) if self.src is not None else frozenset()

    def _new_backend(self, b: BackendKey, res: ApplyResult) -> int:
        """An id for backend b, which has none; its row is written here, once, and never
        again."""
        bid = self.backend_ids.acquire(b)
        try:
            self.be.put(_ID(bid), _backend_row(b))
        except BaseException:
            self.backend_ids.release(b)
            raise
        self._unref.add(b)      # freed again at the end of apply if no slot names it
        res.writes += 1
        return bid

    def _write_frontend(self, fe: Frontend, res: ApplyResult) -> None:
        key = fe.key
        prog = self.programmed.get(key)
        if prog is None:
            prog = self.programmed[key] = Programmed(fe.kind, None, fe.action, 0, None)
        old_order = [prog.rows[s][0] if s in prog.rows else None
                     for s in range(1, (prog.count or 0) + 1)]
        wanted = self._wanted(fe)
        order = stable_slots([b for b in old_order if b is not None], wanted) \
            if old_order and None not in old_order else sorted(wanted)

        svc_id = self.svc_ids.acquire(fe.service)
        self._svc_unref.add(fe.service)     # in case this write fails before slot 0
        if self._named.get(fe.service) != L.meta_view(fe.info):
            self._write_meta(fe, svc_id)
            res.writes += 1

        head = L.frontend_svc_key(key)      # encoded once; slot keys are packed from it
        fields = (head.addr, head.port, head.proto, head.scope)
        if not prog.rows and isinstance(self.svc, _Recording):
            self._fill_slots(prog, fields, order, wanted, res)
        else:
            self._write_slots(prog, fields, order, wanted, res)
        local = self._locals(fe) if len(key) == 4 else frozenset()
        if len(key) == 4:
            self._hold_filters(key, local, prog, res)  # before the slot 0 that needs them
        ranges = self._ranges(fe)
        for cidr in sorted(ranges - prog.ranges):      # rows before the flag that needs them
            self.src.put(L.srcrange_key(key, cidr), L.U32(0))
            prog.ranges = prog.ranges | {cidr}
            self._range_rows += 1
            res.writes += 1
        # Only now may slot 0 announce the new count.
        self.svc.put(head, L.SvcVal(
            svc_id=svc_id, affinity_timeout=fe.affinity_timeout, count=len(order),
            action=L.ACTION_NUM[fe.action], kind=L.KIND_NUM[fe.kind],
            fe_flags=L.FE_F_SRC_RANGES if ranges else 0))
        prog.range_flag = bool(ranges)
        res.writes += 1
        self._drop_ranges(key, prog, prog.ranges - ranges, res)   # after the flag let go
        for addr in sorted(prog.local_held - local):   # after slot 0 let go
            self._release_local(prog, addr, res)
        self._set_service(prog, fe.service)
        prog.kind, prog.action = fe.kind, fe.action
        prog.affinity, prog.count = fe.affinity_timeout, len(order)
        for slot in prog.rows.above(len(order)):
            self.svc.delete(L.frontend_svc_key(key, slot))
            self._ref(prog, slot, None)
            res.writes += 1
        res.updated += 1

    def _write_slots(self, prog: Programmed, fields: tuple, order: list[BackendKey],
                     wanted: dict[BackendKey, int], res: ApplyResult) -> None:
        """Slot rows 1..n that differ from what the kernel holds, each with its bookkeeping."""
        rows, refs, unref, ids = prog.rows, self._refs, self._unref, self.backend_ids
        for slot, bkey in enumerate(order, start=1):
            row = (bkey, wanted[bkey])
            old = rows.get(slot)
            if old != row:
                bid = ids.get(bkey)
                if bid is None:
                    bid = self._new_backend(bkey, res)
                self.svc.put(_SVC_KEY.pack(*fields, slot), _SVC_VAL(bid, 0, 0, 0, 0, 0, row[1], 0))
                # the bookkeeping of _ref(prog, slot, row), inline: this loop runs per endpoint
                if old is not None:
                    refs[old[0]] -= 1
                    unref.add(old[0])
                else:
                    self._slot_rows += 1
                rows[slot] = row
                refs[bkey] += 1
                res.writes += 1

    def _fill_slots(self, prog: Programmed, fields: tuple, order: list[BackendKey],
                    wanted: dict[BackendKey, int], res: ApplyResult) -> None:
        """_write_slots for a frontend without slot rows while a plan batches (a cold start's
        every frontend): the same rows in the same order, each list handed to the plan at
        once and the bookkeeping done in bulk. A backend row is packed before its id is taken,
        so a failure (a bad address, no id left) leaves every id taken named by a slot row;
        the slots recorded until then are kept, as _write_slots keeps them."""
        get, acquire = self.backend_ids.get, self.backend_ids.acquire
        pack_key, (addr, port, proto, scope) = _SVC_KEY.pack, fields
        be_keys: list[bytes] = []
        be_rows: list[bytes] = []
        keys: list[bytes] = []
        values: list[bytes] = []
        try:
            for slot, bkey in enumerate(order, start=1):
                bid = get(bkey)
                if bid is None:
                    row = _backend_row(bkey)
                    bid = acquire(bkey)
                    be_keys.append(_ID(bid))
                    be_rows.append(row)
                keys.append(pack_key(addr, port, proto, scope, slot))
                values.append(_SVC_VAL(bid, 0, 0, 0, 0, 0, wanted[bkey], 0))
        finally:
            done = order[:len(keys)]
            self.be.put_many(be_keys, be_rows)
            self.svc.put_many(keys, values)
            prog.rows.fill(done, bytes(wanted[b] for b in done))
            self._refs.update(done)
            self._slot_rows += len(done)
            res.writes += len(be_keys) + len(done)

    def _delete_frontend(self, key: FrontendKey, res: ApplyResult) -> None:
        prog = self.programmed[key]
        self.svc.delete(L.frontend_svc_key(key))        # first: the frontend disappears at once
        prog.count = None
        self._set_service(prog, None)
        res.writes += 1
        prog.range_flag = False
        self._drop_ranges(key, prog, prog.ranges, res)
        for slot in sorted(prog.rows):
            self.svc.delete(L.frontend_svc_key(key, slot))
            self._ref(prog, slot, None)
            res.writes += 1
        for addr in sorted(prog.local_held):           # after its slot 0 is gone
            self._release_local(prog, addr, res)
        if prog.addr_held:
            self.ext_addrs.release(key[0], res)
            prog.addr_held = False
        del self.programmed[key]
        res.deleted += 1

    # -- TC filter rows (EXT frontends) ------------------------------------------------------
    def _locals(self, fe: Frontend) -> frozenset[str]:
        """The local backends' addresses an EXT frontend needs in kp_extbe4: their replies
        leave through kp_to_outside, which looks for their flows only from those."""
        if self.ext_locals is None or fe.action is not Action.FORWARD:
            return frozenset()
        return frozenset(b.ip for b in fe.backends if b.local)

    def _filters_held(self, prog: Programmed, fe: Frontend) -> bool:
        return (self.ext_addrs is None or prog.addr_held) and prog.local_held == self._locals(fe)

    def _hold_filters(self, key: FrontendKey, local: frozenset[str], prog: Programmed,
                      res: ApplyResult) -> None:
        if self.ext_addrs is not None and not prog.addr_held:
            self.ext_addrs.hold(key[0], res)
            prog.addr_held = True
        for addr in sorted(local - prog.local_held):
            self.ext_locals.hold(addr, res)
            prog.local_held = prog.local_held | {addr}

    def _release_local(self, prog: Programmed, addr: str, res: ApplyResult) -> None:
        self.ext_locals.release(addr, res)
        prog.local_held = prog.local_held - {addr}

    def _drop_ranges(self, key: FrontendKey, prog: Programmed, gone: frozenset[str],
                     res: ApplyResult) -> None:
        for cidr in sorted(gone):
            self.src.delete(L.srcrange_key(key, cidr))
            prog.ranges = prog.ranges - {cidr}
            self._range_rows -= 1
            res.writes += 1

    def _ref(self, prog: Programmed, slot: int, row: Slot | None) -> None:
        """Slot `slot` of a frontend now holds `row` (None: the row is gone)."""
        old = prog.rows.pop(slot, None)
        self._slot_rows += (row is not None) - (old is not None)
        if old is not None:
            self._refs[old[0]] -= 1
            self._unref.add(old[0])
        if row is not None:
            prog.rows[slot] = row
            self._refs[row[0]] += 1

    def _set_service(self, prog: Programmed, spn: ServicePortName | None) -> None:
        if prog.service is not None:
            self._svc_refs[prog.service] -= 1
            self._svc_unref.add(prog.service)
        prog.service = spn
        if spn is not None:
            self._svc_refs[spn] += 1

    # -- names and garbage -------------------------------------------------------------------
    def _write_meta(self, fe: Frontend, svc_id: int) -> None:
        """The service port's names and settings for the CLI (rewritten in place when the
        settings change: no program reads it)."""
        spn, view = fe.service, L.meta_view(fe.info)
        flags, hc, ranges, td = view
        self.meta.put(L.U32(svc_id), L.SvcMeta(
            namespace=spn.namespace.encode()[:63], name=spn.name.encode()[:63],
            port_name=spn.port.encode()[:15], proto=L.PROTO_NUM[spn.protocol], flags=flags,
            health_check_node_port=hc, source_ranges=ranges, traffic_distribution=td))
        self._named[spn] = view

    def _gc(self, res: ApplyResult | None = None) -> None:
        """Frees backends no row names and service ids no frontend uses, after all writes.
        Only candidates whose references dropped are looked at: O(changed)."""
        for bkey in self._unref:
            bid = self.backend_ids.get(bkey)
            if bid is None or self._refs.get(bkey, 0) > 0:
                continue
            self.be.delete(_ID(bid))
            self.backend_ids.release(bkey)
            self._refs.pop(bkey, None)
            if res:
                res.writes += 1
        self._unref = set()
        for spn in self._svc_unref:
            sid = self.svc_ids.get(spn)
            if sid is None or self._svc_refs.get(spn, 0) > 0:
                continue
            self.meta.delete(L.U32(sid))
            self.svc_ids.release(spn)
            self._named.pop(spn, None)
            self._svc_refs.pop(spn, None)
            if res:
                res.writes += 1
        self._svc_unref = set()

    def row_counts(self) -> dict[str, int]:
        """Rows the writer keeps in each map it owns (without iterating the kernel maps)."""
        counts = {"svc": len(self.programmed) + self._slot_rows,
                  "backend": len(self.backend_ids), "meta": len(self._named)}
        if self.src is not None:
            counts["srcrange"] = self._range_rows
        for f, name in ((self.ext_addrs, "extaddr"), (self.ext_locals, "extbe")):
            if f is not None:
                counts[name] = len(f.refs)
        return counts

    def stats(self) -> dict[str, int]:
        return {"frontends": len(self.programmed), "backends": len(self.backend_ids),
                "service_ports": len(self.svc_ids)}
