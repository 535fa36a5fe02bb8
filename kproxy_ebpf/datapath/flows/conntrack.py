"""The TC path's connection tracking, seen from the agent: decode it for `ct list`, and purge
the entries whose backend left their frontend.

The programs already re-balance a flow whose backend id was freed; purging also covers a
backend that left one service but still serves another (its id lives on), and frees the
entries (and their SNAT ports) at once instead of at the next packet or LRU eviction. A purge
walks the whole table (batched reads, plain tuples), so the agent runs it only after a sync
that changed scope-EXT frontends (or, with `socketLB: false`, any frontend), for the changed
frontends' flows only, and fully on full syncs.

TCP connections keep their backend (layout.ct_keeps_backend, the rule of lib/ct_pkt.h's
kp_ct_usable) and are never purged, from pods (KP_CT_F_POD, the per-packet ClusterIP path) and
from outside alike: the socket path translates a connect() once and the connection keeps its
backend until it ends, and kube-proxy leaves TCP conntrack entries of removed endpoints alone
and clears only UDP ones, so a NodePort connection to a pod that stops being ready goes on.
UDP flows are purged.

Which backend a flow keeps is the caller's rule (`keeps`): the agent passes kube-proxy's
(established.py: still in the slots, or a serving endpoint of the Service port), so a pod that
is shutting down but still serving drains its flows from outside too; tests pass
Ledger.backends_of (the slots only).
"""
from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Mapping
from typing import NamedTuple

from kproxy_ebpf.datapath.maps import layout as L
from kproxy_ebpf.datapath.maps.pinned import PinnedMap
from kproxy_ebpf.datapath.write.programmed import BackendKey
from kproxy_ebpf.model.desired import FrontendKey
from kproxy_ebpf.model.objects import family_of, hostport


class Purge(NamedTuple):
    removed: int        # flows deleted (each with its reply-tuple row)
    entries: int        # rows the table held before (the fill gauge, from the same walk)


Keeps = Callable[[FrontendKey, BackendKey], bool]   # whether a flow keeps its backend


def _raw_frontend(fkey: FrontendKey) -> tuple[bytes, int, int]:
    return L.ip_bytes(fkey.ip), L.port_be(fkey.port), L.PROTO_NUM[fkey.protocol]


def purge(maps: Mapping[str, PinnedMap], keeps: Keeps,
          frontends: Iterable[FrontendKey] | None = None) -> Purge:
    """Deletes every entry whose frontend is gone or does not keep its backend (`keeps`),
    with its reply-tuple row. `frontends` limits the check to
    flows of those frontend keys (a partial sync's changed keys), None checks all. The table is
    read in batches as plain tuples and only the candidates are decoded: with the per-packet
    ClusterIP path every pod connection has a row, and a partial sync must not pay a Python
    object per row."""
    snat = L.CT_F_SNAT
    wanted = None if frontends is None else {_raw_frontend(k) for k in frontends}
    rows = maps["ct"].unpacked()
    removed = 0
    flag_bits = L.const("KP_CT_LIFE_FLAGS")
    for (saddr, daddr, sport, dport, proto), (life, be_addr, nat_addr, be_port, nat_port,
                                              *_ids) in rows:
        if wanted is not None and (daddr, dport, proto) not in wanted:
            continue
        flags = life & flag_bits
        if L.ct_keeps_backend(proto):
            continue
        protocol = L.PROTO_BY_NUM.get(proto)
        ip = L.ip_str(daddr)
        # A protocol no frontend has is kept by none (keeps() finds no such key).
        if protocol is not None and keeps(
                FrontendKey(ip, L.port_host(dport), protocol, L.ct_scope(flags), family_of(ip)),
                (L.ip_str(be_addr), L.port_host(be_port), protocol)):
            continue
        addr = L.IP16.from_buffer_copy
        reply = L.CtKey(saddr=addr(be_addr), sport=be_port, proto=proto)
        reply.daddr, reply.dport = ((addr(nat_addr), nat_port) if flags & snat
                                    else (addr(saddr), sport))
        maps["ct"].delete(L.CtKey(saddr=addr(saddr), daddr=addr(daddr), sport=sport, dport=dport,
                                  proto=proto))
        maps["rnat"].delete(reply)
        removed += 1
    return Purge(removed, len(rows))


def entries(maps: Mapping[str, PinnedMap]) -> list[dict]:
    """Every tracked flow, decoded (with the service name from kp_meta when known)."""
    names = {k.value: f"{m.namespace.decode()}/{m.name.decode()}"
             + (f":{m.port_name.decode()}" if m.port_name else "")
             for k, m in maps["meta"].items()} if "meta" in maps else {}
    now = time.clock_gettime_ns(time.CLOCK_MONOTONIC)
    rows = []
    for key, val in maps["ct"].items():
        proto = L.PROTO_BY_NUM.get(key.proto)
        snat = bool(val.flags & L.CT_F_SNAT)
        rows.append({
            "protocol": proto.value if proto else str(key.proto),
            "client": hostport(L.ip_str(key.saddr), L.port_host(key.sport)),
            "frontend": hostport(L.ip_str(key.daddr), L.port_host(key.dport)),
            "backend": hostport(L.ip_str(val.be_addr), L.port_host(val.be_port)),
            "snat": hostport(L.ip_str(val.nat_addr), L.port_host(val.nat_port)) if snat else None,
            "path": "pod" if val.flags & L.CT_F_POD else "external",
            "state": L.CT_STATE_NAMES.get(val.state, str(val.state)),
            "expires_in_seconds": round(max(0, val.expires - now) / 1e9, 1),
            "service": names.get(val.svc_id),
            "backend_id": val.backend_id,
        })
    rows.sort(key=lambda r: (r["service"] or "", r["frontend"], r["client"]))
    return rows
