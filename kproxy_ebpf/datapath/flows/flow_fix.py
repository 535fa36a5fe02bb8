"""The agent's repair of least-conn's flow counts (bpf/lib/flowcount.h).

The programs count a least-conn frontend's flows per backend in two counters that only grow:
kp_conns.flows_open when a flow's row is made (a TC flow's kp_ct row marked KP_CT_F_COUNTED,
an unconnected UDP socket's kp_flow row marked KP_AFF_F_COUNTED) and flows_done when a packet
ends a TC flow (FIN/RST) or re-balances it while it is live. A flow that
ends without a packet (expiry, LRU eviction, a purge, a row overwritten) is never done, so
open - done alone would only grow. The agent therefore keeps, per backend,

    fix(b) = open(b) - done(b) - live(b)

in kp_flowfix at the backend's counter index (the programs only read it), live(b) being the
marked rows of kp_ct that are new or established and not expired: the truth the counters
stand for. The programs keep sockets + open - done in kp_connload and compare
load(b) - fix, whose flows are live(b) as of the repair plus what the counters moved since.
The fix is recomputed from the table each period, never added to: a close missed in one
period is wrong until the next repair and then gone, whatever happened before (a flow that
opens or ends during the walk is the one race, and it too lasts one period).
"""
from __future__ import annotations

import time
from collections import Counter
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from kproxy_ebpf.datapath.maps import conn_load
from kproxy_ebpf.datapath.maps import layout as L
from kproxy_ebpf.datapath.maps.pinned import PinnedMap

COUNTED = L.const("KP_CT_F_COUNTED")
_STATE_SHIFT, _STATE_MASK = L.const("KP_CT_LIFE_STATE_SHIFT"), L.const("KP_CT_LIFE_STATE")
_TIME_SHIFT = L.const("KP_CT_LIFE_TIME_SHIFT")
_CLOSING = L.const("KP_CT_CLOSING")
AFF_COUNTED = L.const("KP_AFF_F_COUNTED")
UDP_FLOW_NS = L.const("KP_UDP_FLOW_TIMEOUT_S") * 10**9


def counted_live(life: int, now: int) -> bool:
    """Whether a conntrack row's life word is a counted flow that has not ended (the C's
    kp_flow_live) and has not expired (kp_ct_usable: expired once now passes the deadline)."""
    return bool(life & COUNTED) and (life >> _STATE_SHIFT) & _STATE_MASK < _CLOSING and \
        now <= life >> _TIME_SHIFT << _TIME_SHIFT


def live_by_backend(ct: PinnedMap, now: int | None = None) -> tuple[Counter[int], int]:
    """Backend id -> counted flows live in kp_ct, and the rows walked (one batched read)."""
    now = time.clock_gettime_ns(time.CLOCK_MONOTONIC) if now is None else now
    out: Counter[int] = Counter()
    rows = ct.unpacked()
    for _, (life, _a, _n, _p, _q, backend_id, *_rest) in rows:
        if life & COUNTED and counted_live(life, now):
            out[backend_id] += 1
    return out, len(rows)


def live_udp_by_backend(flow: PinnedMap, now: int) -> tuple[Counter[int], int]:
    """Backend id -> counted unconnected-UDP flows of the socket path live in kp_flow (used
    within KP_UDP_FLOW_TIMEOUT_S, as lib/lb.h reuses them), and the rows walked."""
    out: Counter[int] = Counter()
    rows = flow.unpacked()
    for _, (last_used, backend_id, _slot, flags, *_rest) in rows:
        if flags & AFF_COUNTED and now - last_used <= UDP_FLOW_NS:
            out[backend_id] += 1
    return out, len(rows)


def load(load_val: int, fix: int) -> int:
    """What least-conn compares (lib/conns.h kp_conns_load): sockets plus open flows."""
    return max(0, load_val - fix)


def sockets(load_val: int, row) -> int:
    """The sockets in a counter's load: what its flows (open - done) leave of it."""
    return max(0, load_val - (row.flows_open - row.flows_done))


def fixes(counters: Mapping[int, tuple[int, int]], live: Mapping[int, int]) -> dict[int, int]:
    """backend id -> fix, from (flows_open, flows_done) per backend and the live flows."""
    return {bid: opened - done - live.get(bid, 0) for bid, (opened, done) in counters.items()}


def counters(maps: Mapping[str, PinnedMap]) -> Iterator[tuple[int, int, Any]]:
    """(backend id, its kp_conns index, the row) of every backend with a least-conn counter:
    through kp_connix, which holds only those, not the whole array (bpf/lib/conns.h)."""
    if "connix" not in maps or "conns" not in maps:
        return
    conns = maps["conns"]
    for bid, ix in maps["connix"].items():
        row = conns.get(ix)
        if row is not None and row.backend_id == bid.value:   # else: being handed over
            yield bid.value, ix.value, row


def _at(maps: Mapping[str, PinnedMap], name: str, ix: int) -> int:
    row = maps[name].get(L.U32(ix)) if name in maps else None
    return row.value if row is not None else 0


def fix_at(maps: Mapping[str, PinnedMap], ix: int) -> int:
    """kp_flowfix at a counter index (0 without the map: an older layout)."""
    return _at(maps, "flowfix", ix)


def load_at(maps: Mapping[str, PinnedMap], ix: int) -> int:
    """The count in kp_connload at a counter index: sockets + flows open - flows done, before
    the fix."""
    return conn_load.count(_at(maps, "connload", ix))


def needed(maps: Mapping[str, PinnedMap]) -> bool:
    """Whether any backend's flows read as open now (a walk can only change those): a read of
    the counter rows, not of the conntrack table."""
    return any(r.flows_open - r.flows_done != fix_at(maps, ix) for _, ix, r in counters(maps))


@dataclass
class Repair:
    walked: int = 0         # conntrack rows read
    written: int = 0        # kp_flowfix rows changed
    seconds: float = 0.0


def repair(maps: Mapping[str, PinnedMap], now: int | None = None) -> Repair:
    """One repair: reads the counters, then walks kp_ct, then writes each counter's fix where
    it changed."""
    t0 = time.monotonic()
    rows = list(counters(maps))
    opened = {bid: (r.flows_open, r.flows_done) for bid, _, r in rows}
    now = time.clock_gettime_ns(time.CLOCK_MONOTONIC) if now is None else now
    live, walked = live_by_backend(maps["ct"], now)
    if "flow" in maps:
        udp, more = live_udp_by_backend(maps["flow"], now)
        live.update(udp)
        walked += more
    want = fixes(opened, live)
    written = 0
    for bid, ix, _ in rows:
        f = want.get(bid, 0)
        if fix_at(maps, ix) != f:
            maps["flowfix"].put(L.U32(ix), L.MAPS["flowfix"].value(f))
            written += 1
    return Repair(walked, written, time.monotonic() - t0)
