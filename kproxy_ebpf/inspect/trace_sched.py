"""trace's step for a frontend with a scheduler (bpf/lib/sched.h): which backend round robin
or least-conn gives the next new connection, and why. The same rules as the C, read from the
same maps; tests/datapath/test_sched_run.py runs both on the same rows."""
from __future__ import annotations

from collections.abc import Mapping, Sequence

from kproxy_ebpf.datapath.flows import flow_fix
from kproxy_ebpf.datapath.maps import layout as L
from kproxy_ebpf.datapath.maps.pinned import PinnedMap
from kproxy_ebpf.model.objects import LBAlgorithm

Slots = Sequence[tuple[str | None, str, int]]       # trace._slots: backend, state, backend id


def how(head) -> str:
    """How a new client's slot is picked, in words, for the 'backends' step."""
    alg = L.scheduler_of(head.fe_flags)
    if alg is LBAlgorithm.ROUND_ROBIN:
        return "in turn (round-robin)"
    if alg is LBAlgorithm.LEAST_CONN:
        return "to the backend with the fewest connections from this node (least-conn)"
    return "by the flow's entry in the Maglev table" if head.backend_id else \
        "at random (slot 1..count)"


def next_pick(maps: Mapping[str, PinnedMap], key, head, slots: Slots
              ) -> tuple[str, str, str, list[str]] | None:
    """(step, found, why, the backends the next connect may get) for a scheduled frontend;
    None for one that picks at random or by Maglev."""
    alg = L.scheduler_of(head.fe_flags)
    if alg is LBAlgorithm.ROUND_ROBIN:
        return _round_robin(maps, key, slots)
    if alg is LBAlgorithm.LEAST_CONN:
        return _least_conn(maps, key, head, slots)
    return None


def _round_robin(maps, key, slots: Slots) -> tuple[str, str, str, list[str]]:
    key.slot = 0
    row = maps["rr"].get(key) if "rr" in maps else None
    if row is None:
        return ("round-robin", "no cursor (kp_rr)", "picks at random until the agent writes "
                "the cursor, right after slot 0", [b for b, _, _ in slots if b])
    slot = row.next % len(slots) + 1
    b = slots[slot - 1][0]
    return ("round-robin", f"cursor {row.next} -> slot {slot} -> {b or '<missing>'}",
            f"{row.next} connections took their turn since the backends last changed; the "
            "next takes the slot after", [b] if b else [])


def _least_conn(maps, key, head, slots: Slots) -> tuple[str, str, str, list[str]]:
    scan = L.const("KP_LC_SCAN")
    # The row the C reads: the kp_lcrow row slot 0 names, else the frontend's kp_lcids row.
    if head.backend_id:
        at = L.U32(head.backend_id)
        ids = maps["lcrow"].get(at) if "lcrow" in maps else None
        where = f"kp_lcrow row {head.backend_id}"
    else:
        key.slot = 0
        ids = maps["lcids"].get(key) if "lcids" in maps else None
        where = "kp_lcids"
    if ids is None or ids.count < len(slots):
        return ("least-conn", f"no row for these slots ({where})", "picks at random until the "
                "agent writes the row (or: more than "
                f"{L.const('KP_LC_IDS')} backends)", [b for b, _, _ in slots if b])
    counts = []     # each slot's counter as the row names it, which is what the C reads
    for i, (b, _, _) in enumerate(slots):
        ix = ids.conn[i]
        counts.append(flow_fix.load(flow_fix.load_at(maps, ix), flow_fix.fix_at(maps, ix))
                      if b else 0)
    usable = [(n, b) for n, (b, _, _) in zip(counts, slots, strict=True) if b]
    least = min((n for n, _ in usable), default=0)
    found = ", ".join(f"{b} {n}" for n, b in usable)
    why = "sockets counted from connect to close and TC flows from first packet to FIN/RST " \
        "or expiry (kp_connload, kp_flowfix); ties go to the first from a random slot"
    if len(slots) > scan:
        why += f"; with more than {scan} backends only {scan} slots from a random one are read"
        return ("least-conn", found, why, [b for _, b in usable])
    return ("least-conn", found, why, [b for n, b in usable if n == least])
