"""Numeric ids for BPF map rows (services, backends), stable across agent restarts.

0 is never handed out: the datapath reads 0 as "no id". A freed id is reused as late as
possible, because a BPF program may have read it a moment ago and be between two lookups
(service slot -> backend id -> backend); reusing it at once could send that packet to an
unrelated backend. So fresh ids come first, in increasing order, and freed ids queue up
oldest-first behind them (a FIFO: effectively monotonic allocation with wrap-around).

restore() seeds the allocator from the pinned maps left by the previous agent, so live flows
keep their ids. Free ids below the highest restored one may have been freed just before the
restart, so they are used last of all: only after the cursor wraps and the queue is empty.
"""
from __future__ import annotations

from collections.abc import Hashable, Iterable, Iterator, KeysView
from typing import Generic, TypeVar

K = TypeVar("K", bound=Hashable)      # what holds an id: a backend, a service port, a table


class IdsExhausted(RuntimeError):
    """Every id is in use: the map behind this allocator is full."""


class IdAllocator(Generic[K]):
    """Maps keys to ids in 1..max_id; see the module docstring for the reuse order."""

    def __init__(self, max_id: int, name: str = "ids") -> None:
        if max_id < 1:
            raise ValueError(f"{name}: max_id must be >= 1, got {max_id}")
        self.max_id = max_id
        self.name = name
        # Keys to ids only: no reverse index (5 MiB at 100,000 backends). An id is bound iff
        # some key holds it; the rare questions by id (restore's checks, the wrap-around scan)
        # build one from _by_key for the occasion.
        self._by_key: dict[K, int] = {}
        self._next = 1                         # every id >= _next is free and never handed out
        self._freed: dict[int, None] = {}      # free ids below _next, oldest first (ordered set)

    def __len__(self) -> int:
        return len(self._by_key)

    def __contains__(self, key: object) -> bool:
        return key in self._by_key

    def __iter__(self) -> Iterator[tuple[K, int]]:
        return iter(list(self._by_key.items()))

    def drain(self) -> None:
        """Forget every key, one at a time (see Ledger.release)."""
        while self._by_key:
            self._by_key.popitem()
        self._freed.clear()

    def keys(self) -> KeysView[K]:
        """The keys holding an id (a live view)."""
        return self._by_key.keys()

    def get(self, key: K) -> int | None:
        return self._by_key.get(key)

    def key_of(self, id_: int) -> K | None:
        """The key holding id_ (O(n): for tests and tools, not the write path)."""
        return next((k for k, i in self._by_key.items() if i == id_), None)

    def by_id(self) -> dict[int, K]:
        """Every bound id with its key: a new dict, for one bulk question by id (restore)."""
        return {i: k for k, i in self._by_key.items()}

    @property
    def free(self) -> int:
        return self.max_id - len(self._by_key)

    def _advance_to(self, new_next: int) -> None:
        # Ids the cursor skips (unused ids below a restored one) are not listed: restoring id
        # 3,000,000 must not allocate 3 million entries. They stay free and are found by
        # _scan() once the cursor has passed max_id and no freed id is queued.
        self._next = new_next

    def _scan(self) -> int | None:
        """The first id that is neither bound nor queued, after wrap-around (rare: O(max_id))."""
        bound = set(self._by_key.values())
        for id_ in range(1, self.max_id + 1):
            if id_ not in bound and id_ not in self._freed:
                return id_
        return None

    def _bind(self, key: K, id_: int) -> int:
        self._by_key[key] = id_
        return id_

    def restore(self, key: K, id_: int) -> None:
        """Record that key already holds id_ (read back from kernel state). O(n): a whole
        map's worth goes through restore_all."""
        self.restore_all([(key, id_)])

    def restore_all(self, pairs: Iterable[tuple[K, int]]) -> None:
        """Record that each key already holds its id; an id held by another key, or a key
        restored with a second id, is a ValueError (the pairs before it are kept)."""
        owners = {i: k for k, i in self._by_key.items()}     # for this call only
        for key, id_ in pairs:
            if not 1 <= id_ <= self.max_id:
                raise ValueError(f"{self.name}: id {id_} for {key!r} is outside 1..{self.max_id}")
            owner = owners.get(id_)
            if owner is not None and owner != key:
                raise ValueError(f"{self.name}: id {id_} restored for {key!r} "
                                 f"is already held by {owner!r}")
            held = self._by_key.get(key)
            if held is not None and held != id_:
                raise ValueError(f"{self.name}: {key!r} restored with id {id_} "
                                 f"but already holds {held}")
            if id_ >= self._next:
                self._advance_to(id_ + 1)
            self._freed.pop(id_, None)
            owners[id_] = key
            self._bind(key, id_)

    def acquire(self, key: K) -> int:
        """The id of key, allocating one if it has none yet."""
        held = self._by_key.get(key)
        if held is not None:
            return held
        if self._next <= self.max_id:
            id_ = self._next
            self._next += 1
        elif self._freed:
            id_ = next(iter(self._freed))
            del self._freed[id_]
        elif (found := self._scan()) is not None:
            id_ = found
        else:
            raise IdsExhausted(f"{self.name}: all {self.max_id} ids are in use; "
                               "raise the map size")
        return self._bind(key, id_)

    def release(self, key: K) -> int | None:
        """Free the id of key (None if it held none); it is reused last."""
        id_ = self._by_key.pop(key, None)
        if id_ is None:
            return None
        self._freed[id_] = None
        return id_
