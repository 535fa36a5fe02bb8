"""Where an apply's map operations go. The writer names each operation by its place in the
make-before-break order (a row that slots need, a slot, a slot 0, and their deletes), and
the sink it is handed either performs it at once (DirectWrites) or records it for a batched
replay (BatchedWrites).

The replay goes by phase: every new backend, name and filter row, every slot row, every slot
0, then the deletes of slot 0s, of slots, and the garbage. That is one valid linearisation of
the per-frontend make-before-break order (no slot 0 before its slots, no slot delete before
the slot 0 that stopped counting it, no backend freed before the slots naming it), with a
syscall per 1,024 rows instead of one per row.
"""
from __future__ import annotations

import enum
from collections.abc import Sequence

from kproxy_ebpf.datapath.maps.pinned import PinnedMap

BATCH_MIN = 64            # ops below which single writes are as cheap as a batch


class Phase(enum.Enum):
    PUT_ROWS = "put-rows"          # backend, meta, source-range and TC filter rows
    PUT_SLOTS = "put-slots"        # kp_svc slots 1..n
    PUT_HEADS = "put-heads"        # kp_svc slot 0
    PUT_CURSORS = "put-cursors"    # round-robin cursors, least-conn rows: after their slot 0
    DEL_HEADS = "del-heads"
    DEL_SLOTS = "del-slots"
    DEL_GARBAGE = "del-garbage"    # rows no slot (or slot 0) needs any more


class DirectWrites:
    """Each operation at once: a failure raises from the operation that met it, so the writer
    can tie it to its frontend."""

    batching = False

    def __init__(self, svc: PinnedMap) -> None:
        self.svc = svc

    def row(self, m: PinnedMap, key, value) -> None:
        m.put(key, value)

    def rows(self, m: PinnedMap, keys: Sequence, values: Sequence) -> None:
        for k, v in zip(keys, values, strict=True):
            m.put(k, v)

    def slots(self, keys: Sequence, values: Sequence) -> None:
        self.rows(self.svc, keys, values)

    def slot(self, key, value) -> None:
        self.svc.put(key, value)

    head = slot

    def drop_head(self, key) -> None:
        self.svc.delete(key)

    drop_slot = drop_head

    def cursor(self, m: PinnedMap, key, value) -> None:
        m.put(key, value)

    def drop(self, m: PinnedMap, key) -> None:
        m.delete(key)


class BatchedWrites:
    """Every operation recorded by phase, then replay()ed in batches. `batched` maps take
    BPF_MAP_*_BATCH; `one_by_one` maps are written element by element even then (the
    source-range rows are few, and the LPM trie's batch operations are not in every kernel
    the agent supports). Within a phase, maps go in the order given."""

    batching = True

    def __init__(self, svc: PinnedMap, batched: Sequence[PinnedMap],
                 one_by_one: Sequence[PinnedMap]) -> None:
        self.svc = svc
        self._maps = [(m, True) for m in (svc, *batched)] + [(m, False) for m in one_by_one]
        self._ops: dict[int, dict[Phase, tuple[list, list]]] = {
            id(m): {p: ([], []) for p in Phase} for m, _ in self._maps}

    def _put(self, m: PinnedMap, phase: Phase, keys: Sequence, values: Sequence) -> None:
        ops_keys, ops_values = self._ops[id(m)][phase]
        ops_keys += keys
        ops_values += values

    def row(self, m: PinnedMap, key, value) -> None:
        self._put(m, Phase.PUT_ROWS, (key,), (value,))

    def rows(self, m: PinnedMap, keys: Sequence, values: Sequence) -> None:
        self._put(m, Phase.PUT_ROWS, keys, values)

    def slots(self, keys: Sequence, values: Sequence) -> None:
        self._put(self.svc, Phase.PUT_SLOTS, keys, values)

    def slot(self, key, value) -> None:
        self._put(self.svc, Phase.PUT_SLOTS, (key,), (value,))

    def head(self, key, value) -> None:
        self._put(self.svc, Phase.PUT_HEADS, (key,), (value,))

    def drop_head(self, key) -> None:
        self._ops[id(self.svc)][Phase.DEL_HEADS][0].append(key)

    def drop_slot(self, key) -> None:
        self._ops[id(self.svc)][Phase.DEL_SLOTS][0].append(key)

    def cursor(self, m: PinnedMap, key, value) -> None:
        self._put(m, Phase.PUT_CURSORS, (key,), (value,))

    def drop(self, m: PinnedMap, key) -> None:
        self._ops[id(m)][Phase.DEL_GARBAGE][0].append(key)

    def replay(self) -> None:
        for phase in Phase:
            for m, batch in self._maps:
                keys, values = self._ops[id(m)][phase]
                if not keys:
                    continue
                if values:
                    if batch:
                        m.put_batch(keys, values)
                    else:
                        for k, v in zip(keys, values, strict=True):
                            m.put(k, v)
                elif batch:
                    m.delete_batch(keys)
                else:
                    for k in keys:
                        m.delete(k)


Writes = DirectWrites | BatchedWrites
