"""What a frontend's rows must become: the diff of a desired frontend against what the kernel
holds for it (the writer's Ledger). No map is touched here.

Slots are filled stably (stable_slots): a backend that stays keeps its slot, a new one takes a
freed slot, and only the tail moves into the holes. That keeps writes proportional to what
changed and lets session affinity (which remembers the slot) survive most scale events.
"""
from __future__ import annotations

from collections.abc import Iterable

from kproxy_ebpf.datapath.maps import layout as L
from kproxy_ebpf.model.desired import Action, Backend, Frontend, FrontendKey, Scope
from kproxy_ebpf.model.objects import Protocol

from .programmed import BackendKey, Ledger, Programmed

# be_flags of each Backend.state, as a bytes.translate table: a frontend's state bytes become
# its slots' flags in one call, not one per endpoint (bytes() refuses a flag above 255).
_FLAGS = bytes(L.backend_flags(Backend(("", 0, Protocol.TCP), state)) for state in range(256))


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


def drained(fe: Frontend) -> frozenset[BackendKey]:
    """The backend rows fe holds for the flows of endpoints that left its slots."""
    return frozenset(b.key for b in fe.draining)


def wanted_slots(fe: Frontend) -> dict[BackendKey, int]:
    """The backends the frontend's slots must name, each with its be_flags. The keys are the
    Backends' own key objects, which the writer then holds (no copy per endpoint)."""
    if fe.action is not Action.FORWARD:
        return {}
    bs = fe.backends
    return dict(zip(bs.keys, bs.states.translate(_FLAGS), strict=True))


def slot_order(prog: Programmed, wanted: dict[BackendKey, int]) -> list[BackendKey]:
    """Which backend each slot 1..n names after the write: stable where the slots the
    lookups reach are all there, sorted otherwise (a new frontend, a hole restored)."""
    old = [prog.rows[s][0] if s in prog.rows else None for s in range(1, (prog.count or 0) + 1)]
    if old and None not in old:
        return stable_slots(old, wanted)        # type: ignore[arg-type]
    return sorted(wanted)


class Planner:
    """The diff, for a writer whose optional maps are there or not (the tests' fakes leave
    out the source-range trie and the TC filters)."""

    def __init__(self, ranges: bool, ext_addrs: bool, ext_locals: bool,
                 maglev: bool = False) -> None:
        self.has_ranges, self.has_ext_addrs, self.has_ext_locals = ranges, ext_addrs, ext_locals
        self.has_maglev = maglev

    def maglev(self, fe: Frontend) -> int:
        """The entries of the Maglev table fe needs; 0: none (no backend to pick, or no
        kp_maglev map)."""
        if not self.has_maglev or fe.action is not Action.FORWARD or not fe.backends:
            return 0
        return fe.maglev

    def table_held(self, prog: Programmed, fe: Frontend) -> bool:
        """Whether slot 0 names the table fe needs, built for the slots as they are."""
        size, held = self.maglev(fe), prog.maglev
        if not size:
            return held is None
        return held is not None and held.built_for(size, prog.order())

    def ranges(self, fe: Frontend) -> frozenset[str]:
        """The source-range rows fe needs (none where the map is missing: a flag without
        rows would drop every client)."""
        return frozenset(fe.source_ranges) if self.has_ranges else frozenset()

    def locals(self, fe: Frontend) -> frozenset[str]:
        """The local backends' addresses an EXT frontend needs in kp_extbe: their replies
        leave through kp_to_outside, which looks for their flows only from those."""
        if not self.has_ext_locals or fe.action is not Action.FORWARD or fe.scope is not Scope.EXT:
            return frozenset()
        return frozenset(b.ip for b in fe.backends if b.local)

    def filters_held(self, prog: Programmed, fe: Frontend) -> bool:
        """Whether an EXT frontend holds the TC filter rows it needs."""
        return (not self.has_ext_addrs or prog.addr_held) and prog.local_held == self.locals(fe)

    def to_write(self, ledger: Ledger, key: FrontendKey, fe: Frontend
                 ) -> dict[BackendKey, int] | None:
        """The slots fe wants (wanted_slots) when the kernel does not hold fe as it is; None
        when it does (nothing to write). Computed once: the writer writes from it."""
        wanted = wanted_slots(fe)
        p = ledger.frontends.get(key)
        if p is None or p.count is None:
            return wanted
        if key.scope is Scope.EXT and not self.filters_held(p, fe):
            return wanted
        same = (p.kind, p.service, p.action, p.affinity) == (
            fe.kind, fe.service, fe.action, fe.affinity_timeout) and p.live() == wanted \
            and p.count == len(wanted) and ledger.named.get(fe.service) == L.meta_view(fe.info) \
            and p.ranges == self.ranges(fe) and p.range_flag == bool(p.ranges) \
            and p.drain == drained(fe) and self.table_held(p, fe) and p.algorithm is fe.algorithm
        return None if same else wanted
