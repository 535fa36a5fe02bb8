"""What the kernel holds for the writer's frontends, as the writer knows it: the Ledger.

Each frontend's slot 0 (kind, service, verdict, count) and slot rows, its source-range and
TC filter rows, the backend and service-port ids, and how many rows name each of them, so
that an apply writes only what differs and frees an id only when nothing names it any more.
restore.py rebuilds a Ledger from the pinned maps; writer.py keeps it up to date as it writes.
"""
from __future__ import annotations

from collections import Counter
from collections.abc import Collection, Iterable
from dataclasses import dataclass, field

from kproxy_ebpf.datapath.maps.ids import IdAllocator
from kproxy_ebpf.datapath.maps.layout import PROTO_BY_NUM, MetaView, ip_text
from kproxy_ebpf.model.desired import (
    Action,
    BackendKey,
    FrontendKey,
    FrontendKind,
    Scope,
    ServicePortName,
)
from kproxy_ebpf.model.objects import LBAlgorithm

Slot = tuple[BackendKey, int]            # the backend a slot names, and its be_flags

MAX_ID = 2**31


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
        be = self._be[i] if 0 <= i < len(self._be) else None
        if be is not None:
            return (be, self._flags[i])
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

    def backends(self, count: int) -> tuple[BackendKey, ...]:
        """The backends of slots 1..count that hold a row, in slot order."""
        return tuple(b for b in self._be[:count] if b is not None)

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


class RefCounts:
    """How many rows name each backend that holds an id: its slot rows, and a draining
    frontend's hold. Nearly every backend is named by exactly one slot row, so only the counts
    other than 1 are stored (a Counter of every backend was 21 MiB at 50,000 Services x 10).
    So a count is only meaningful for a key that holds an id: the writer calls taken() when it
    gives a backend an id, before any row names it, and freed() when it frees the id."""

    __slots__ = ("_other",)

    def __init__(self) -> None:
        self._other: dict[BackendKey, int] = {}

    def taken(self, key: BackendKey) -> None:
        self._other[key] = 0

    def drain(self) -> None:
        while self._other:
            self._other.popitem()

    def freed(self, key: BackendKey) -> None:
        self._other.pop(key, None)

    def count(self, key: BackendKey) -> int:
        return self._other.get(key, 1)

    def add(self, key: BackendKey, delta: int = 1) -> None:
        n = self._other.get(key, 1) + delta
        if n == 1:
            self._other.pop(key, None)
        else:
            self._other[key] = n

    def load(self, ids: Iterable[BackendKey], counts: Counter[BackendKey]) -> None:
        """The counts of every backend with an id (`ids`) at once, from a full count (restore)."""
        self._other = {k: n for k in ids if (n := counts.get(k, 0)) != 1}

    def unnamed(self) -> set[BackendKey]:
        """The backends with an id that no row names."""
        return {k for k, n in self._other.items() if n == 0}


@dataclass(frozen=True, slots=True)
class HeldTable:
    """A frontend's Maglev table in kp_maglev (maglev_tables.py): its id (slot 0's
    backend_id), entries, and the slot order it was built for; () when read back and not what
    the slots give, so the next apply writes it anew. Table 0 holds no rows."""
    table: int
    size: int
    order: tuple[BackendKey, ...]

    def built_for(self, size: int, order: tuple[BackendKey, ...]) -> bool:
        return self.size == size and self.order == order


@dataclass(slots=True)
class Programmed:
    """What the kernel holds for one frontend."""
    kind: FrontendKind
    service: ServicePortName | None
    action: Action
    affinity: int
    count: int | None                               # None: slot 0 not written yet
    rows: SlotRows = field(default_factory=SlotRows)      # slot -> (backend, flags)
    ranges: frozenset[str] = frozenset()            # kp_srcrange rows of this frontend
    range_flag: bool = False                        # slot 0's KP_FE_F_SRC_RANGES
    addr_held: bool = False                         # EXT: its address's kp_extaddr row
    local_held: frozenset[str] = frozenset()        # EXT: its local backends' kp_extbe rows
    drain: frozenset[BackendKey] = frozenset()      # EXT: backend rows held for old flows
    maglev: HeldTable | None = None                 # EXT: the Maglev table slot 0 names
    algorithm: LBAlgorithm = LBAlgorithm.RANDOM     # slot 0's scheduler flag
    lc_row: int = 0                                 # least-conn: the kp_lcrow row slot 0 names

    def order(self) -> tuple[BackendKey, ...]:
        """The backends of slots 1..count (those present)."""
        return self.rows.backends(self.count or 0)

    def live(self) -> dict[BackendKey, int]:
        """The backends lookups can reach, with their flags."""
        return dict(self.rows[s] for s in range(1, (self.count or 0) + 1) if s in self.rows)


class Ledger:
    """The writer's whole bookkeeping (see the module docstring)."""

    def __init__(self) -> None:
        self.frontends: dict[FrontendKey, Programmed] = {}
        self.backend_ids: IdAllocator[BackendKey] = IdAllocator(MAX_ID, "backend ids")
        self.svc_ids: IdAllocator[ServicePortName] = IdAllocator(MAX_ID, "service ids")
        self.refs = RefCounts()                           # rows naming each backend
        self.svc_refs: Counter[ServicePortName] = Counter()  # frontends of each service port
        self.named: dict[ServicePortName, MetaView] = {}  # service ports with a meta row
        self.unref: set[BackendKey] = set()               # may have dropped to 0 refs
        self.svc_unref: set[ServicePortName] = set()
        self.slot_rows = 0        # slot rows (1..n) of every frontend: O(1) row counts
        self.range_rows = 0       # kp_srcrange rows of every frontend, likewise

    def release(self) -> None:
        """Empty this Ledger one entry at a time. Freeing a large one in one statement is one
        cascade of deallocations that holds the GIL throughout (42 ms at 50,000 Services x
        10): the drift check frees its read-back this way, so syncs run between entries."""
        for table in (self.frontends, self.named, self.svc_refs):
            while table:
                table.popitem()
        for ids in (self.backend_ids, self.svc_ids, self.refs):
            ids.drain()
        self.unref, self.svc_unref = set(), set()

    def ref(self, prog: Programmed, slot: int, row: Slot | None) -> None:
        """Slot `slot` of a frontend now holds `row` (None: the row is gone)."""
        old = prog.rows.pop(slot, None)
        self.slot_rows += (row is not None) - (old is not None)
        if old is not None:
            self.refs.add(old[0], -1)
            self.unref.add(old[0])
        if row is not None:
            prog.rows[slot] = row
            self.refs.add(row[0])

    def set_service(self, prog: Programmed, spn: ServicePortName | None) -> None:
        if prog.service is not None:
            self.svc_refs[prog.service] -= 1
            self.svc_unref.add(prog.service)
        prog.service = spn
        if spn is not None:
            self.svc_refs[spn] += 1

    # -- what the maps hold now, for the stale-socket search, the conntrack purge and the
    #    counters: answered from the bookkeeping, never by reading a map
    def holds(self, peer: tuple[bytes, int, int]) -> bool:
        """Whether some frontend still names the backend (16-byte address, port, IP
        protocol number): its row is programmed."""
        addr, port, proto = peer
        return (ip_text(addr), port, PROTO_BY_NUM[proto]) in self.backend_ids

    def backends_of(self, key: FrontendKey) -> frozenset[BackendKey]:
        """The backends a lookup of frontend `key` (either scope) can pick now."""
        prog = self.frontends.get(key)
        return frozenset(prog.order()) if prog is not None else frozenset()

    def sock_backends(self, keys: Iterable[FrontendKey] | None = None
                      ) -> dict[FrontendKey, Collection[BackendKey]]:
        """The backends lookups of the scope-SOCK frontends among `keys` (None: all) can pick
        now: what a socket connected through them may be talking to. Tuples, not sets: a full
        sync holds one per frontend while it writes."""
        held = self.frontends
        return {k: prog.order() for k in (held if keys is None else keys)
                if k.scope is Scope.SOCK and (prog := held.get(k)) is not None}

    def svc_ids_held(self) -> set[int]:
        """Every service id some frontend holds now."""
        return {sid for _, sid in self.svc_ids}
