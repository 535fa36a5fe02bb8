"""The TC path's connection tracking, seen from the agent: decode it for `ct list`, and purge
the entries whose backend left their frontend.

The programs already re-balance a flow whose backend id was freed; purging also covers a
backend that left one service but still serves another (its id lives on), and frees the
entries (and their SNAT ports) at once instead of at the next packet or LRU eviction. A purge
walks the whole table (batched reads), so the agent runs it only after a sync that changed
scope-EXT frontends (or, with `socketLB: false`, any frontend).

Flows opened by a pod of this node (KP_CT_F_POD, the per-packet ClusterIP path) belong to
scope-SOCK frontends. Their TCP connections are never purged: the socket path translates a
connect() once and the connection keeps its backend until it ends, so the per-packet path
does the same (kube-proxy, too, leaves TCP conntrack entries of removed endpoints alone and
clears only UDP ones). Their UDP flows are purged like any other.
"""
from __future__ import annotations

import time
from collections.abc import Mapping

from ..desired import Scope
from ..model import Protocol
from . import layout as L
from .pinned import PinnedMap


def _frontend(key, val) -> tuple:
    """The writer's key of the flow's frontend (desired.Frontend.key)."""
    fkey = (L.ip_str(key.daddr), L.port_host(key.dport), L.PROTO_BY_NUM.get(key.proto))
    return fkey if val.flags & L.const("KP_CT_F_POD") else (*fkey, Scope.EXT)


def _backend(val, key) -> tuple:
    return (L.ip_str(val.be_addr), L.port_host(val.be_port), L.PROTO_BY_NUM.get(key.proto))


def purge(maps: Mapping[str, PinnedMap], programmed: Mapping[tuple, object]) -> int:
    """Deletes every entry whose frontend is gone or no longer lists its backend, with its
    reply-tuple row. `programmed` is the writer's view (MapWriter.programmed). Returns the
    number of flows removed."""
    removed = 0
    pod, tcp = L.const("KP_CT_F_POD"), L.PROTO_NUM[Protocol.TCP]
    for key, val in list(maps["ct"].items()):
        if val.flags & pod and key.proto == tcp:
            continue
        prog = programmed.get(_frontend(key, val))
        if prog is not None and _backend(val, key) in prog.live():
            continue
        reply = L.CtKey(saddr=val.be_addr, sport=val.be_port, proto=key.proto)
        if val.flags & L.const("KP_CT_F_SNAT"):
            reply.daddr, reply.dport = val.nat_addr, val.nat_port
        else:
            reply.daddr, reply.dport = key.saddr, key.sport
        maps["ct"].delete(key)
        maps["rnat"].delete(reply)
        removed += 1
    return removed


def entries(maps: Mapping[str, PinnedMap]) -> list[dict]:
    """Every tracked flow, decoded (with the service name from kp_meta when known)."""
    names = {k.value: f"{m.namespace.decode()}/{m.name.decode()}"
             + (f":{m.port_name.decode()}" if m.port_name else "")
             for k, m in maps["meta"].items()} if "meta" in maps else {}
    now = time.clock_gettime_ns(time.CLOCK_MONOTONIC)
    rows = []
    for key, val in maps["ct"].items():
        proto = L.PROTO_BY_NUM.get(key.proto)
        snat = bool(val.flags & L.const("KP_CT_F_SNAT"))
        rows.append({
            "protocol": proto.value if proto else str(key.proto),
            "client": f"{L.ip_str(key.saddr)}:{L.port_host(key.sport)}",
            "frontend": f"{L.ip_str(key.daddr)}:{L.port_host(key.dport)}",
            "backend": f"{L.ip_str(val.be_addr)}:{L.port_host(val.be_port)}",
            "snat": f"{L.ip_str(val.nat_addr)}:{L.port_host(val.nat_port)}" if snat else None,
            "path": "pod" if val.flags & L.const("KP_CT_F_POD") else "external",
            "state": L.CT_STATE_NAMES.get(val.state, str(val.state)),
            "expires_in_seconds": round(max(0, val.expires - now) / 1e9, 1),
            "service": names.get(val.svc_id),
            "backend_id": val.backend_id,
        })
    rows.sort(key=lambda r: (r["service"] or "", r["frontend"], r["client"]))
    return rows
