"""After every write of an apply: backend rows no slot names and service ids no frontend
uses are freed. Only candidates whose references dropped are looked at: O(changed)."""
from __future__ import annotations

from collections.abc import Callable

from kproxy_ebpf.datapath.maps import encode as E
from kproxy_ebpf.datapath.maps import layout as L
from kproxy_ebpf.datapath.maps.pinned import PinnedMap

from .apply_result import ApplyResult
from .batch import Writes
from .programmed import Ledger


def collect(held: Ledger, be: PinnedMap, meta: PinnedMap, writes: Writes,
            res: ApplyResult | None = None,
            on_free: Callable[[int, Writes], None] | None = None) -> list[int]:
    """Frees what no row references; returns the service ids freed (their per-Service
    counter rows go after the sync). on_free(backend id, writes): for what goes with a freed
    backend id (its least-conn counter index, lc_ids.py)."""
    for bkey in held.unref:
        bid = held.backend_ids.get(bkey)
        if bid is None or held.refs.count(bkey) > 0:
            continue
        writes.drop(be, E.backend_id_key(bid))
        if on_free is not None:
            on_free(bid, writes)
        held.backend_ids.release(bkey)
        held.refs.freed(bkey)
        if res:
            res.writes += 1
    held.unref = set()
    freed = []
    for spn in held.svc_unref:
        sid = held.svc_ids.get(spn)
        if sid is None or held.svc_refs.get(spn, 0) > 0:
            continue
        writes.drop(meta, L.U32(sid))
        held.svc_ids.release(spn)
        freed.append(sid)
        held.named.pop(spn, None)
        held.svc_refs.pop(spn, None)
        if res:
            res.writes += 1
    held.svc_unref = set()
    return freed
