"""A frontend's slot rows 1..n and the backend rows they name, with the Ledger's bookkeeping:
the per-endpoint part of MapWriter._write_frontend (writer.py), which runs once per endpoint
of every frontend written, so its bookkeeping is inline rather than through Ledger.ref.

A backend row is written once, when its id is allocated, and never again (no torn reads:
writer.py's docstring).
"""
from __future__ import annotations

from collections.abc import Callable

from kproxy_ebpf.datapath.maps import encode as E
from kproxy_ebpf.datapath.maps.pinned import PinnedMap

from .apply_result import ApplyResult
from .batch import Writes
from .programmed import BackendKey, Ledger, Programmed


def new_backend(held: Ledger, be: PinnedMap, b: BackendKey, res: ApplyResult,
                writes: Writes) -> int:
    """An id for backend b, which has none; its row is written here."""
    ids = held.backend_ids
    bid = ids.acquire(b)
    try:
        writes.row(be, E.backend_id_key(bid), E.backend_row(b))
    except BaseException:
        ids.release(b)
        raise
    held.refs.taken(b)
    held.unref.add(b)      # freed again at the end of apply if no slot names it
    res.writes += 1
    return bid


def write_slots(held: Ledger, be: PinnedMap, prog: Programmed, key_of: Callable[[int], bytes],
                order: list[BackendKey], wanted: dict[BackendKey, int], res: ApplyResult,
                writes: Writes) -> None:
    """Slot rows 1..n that differ from what the kernel holds, each with its bookkeeping."""
    rows, refs, unref, ids = prog.rows, held.refs, held.unref, held.backend_ids
    slot_value = E.slot_value
    for slot, bkey in enumerate(order, start=1):
        row = (bkey, wanted[bkey])
        old = rows.get(slot)
        if old != row:
            bid = ids.get(bkey)
            if bid is None:
                bid = new_backend(held, be, bkey, res, writes)
            writes.slot(key_of(slot), slot_value(bid, row[1]))
            # the bookkeeping of Ledger.ref(prog, slot, row), inline: this runs per endpoint
            if old is not None:
                refs.add(old[0], -1)
                unref.add(old[0])
            else:
                held.slot_rows += 1
            rows[slot] = row
            refs.add(bkey)
            res.writes += 1


def fill_slots(held: Ledger, be: PinnedMap, prog: Programmed, key_of: Callable[[int], bytes],
               order: list[BackendKey], wanted: dict[BackendKey, int], res: ApplyResult,
               writes: Writes) -> None:
    """write_slots for a frontend without slot rows while the writes are batched (a cold
    start's every frontend): the same rows in the same order, each list handed to the sink at
    once and the bookkeeping done in bulk. A backend row is packed before its id is taken, so
    a failure (a bad address, no id left) leaves every id taken named by a slot row; the
    slots recorded until then are kept, as write_slots keeps them."""
    get, acquire = held.backend_ids.get, held.backend_ids.acquire
    slot_value = E.slot_value
    be_keys: list[bytes] = []
    be_rows: list[bytes] = []
    keys: list[bytes] = []
    values: list[bytes] = []
    fresh: set[BackendKey] = set()      # given an id here
    try:
        for slot, bkey in enumerate(order, start=1):
            bid = get(bkey)
            if bid is None:
                row = E.backend_row(bkey)
                bid = acquire(bkey)
                fresh.add(bkey)
                be_keys.append(E.backend_id_key(bid))
                be_rows.append(row)
            keys.append(key_of(slot))
            values.append(slot_value(bid, wanted[bkey]))
    finally:
        done = order[:len(keys)]
        writes.rows(be, be_keys, be_rows)
        writes.slots(keys, values)
        prog.rows.fill(done, bytes(wanted[b] for b in done))
        # A backend given its id here is named by this one slot (a count of 1 is not stored,
        # RefCounts); one that had an id gains a row.
        add = held.refs.add
        for b in done:
            if b not in fresh:
                add(b)
        for b in fresh.difference(done):     # an id no slot came to name: garbage
            held.refs.taken(b)
            held.unref.add(b)
        held.slot_rows += len(done)
        res.writes += len(be_keys) + len(done)
