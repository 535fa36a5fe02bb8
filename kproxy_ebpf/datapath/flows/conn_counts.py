"""Connections per backend on this node, as ipvsadm -Ln showed them per real server: active
and inactive, for `services -o wide`, its JSON and the metrics.

Active: the sockets connected to the backend through least-conn frontends (kp_conns, counted
by the socket hooks from connect to close: what least-conn compares), plus the TC path's
flows to it that are new or established. Inactive: TC flows past their FIN or RST and not yet expired (IPVS counts its
FIN_WAIT and TIME_WAIT connections there). The socket path has no inactive state: a socket the
application closed is gone from it (its TIME_WAIT is the kernel's, not a connection).
"""
from __future__ import annotations

import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from kproxy_ebpf.datapath.maps import layout as L
from kproxy_ebpf.datapath.maps.pinned import PinnedMap
from kproxy_ebpf.model.objects import hostport

_OPEN = {L.const("KP_CT_NEW"), L.const("KP_CT_ESTABLISHED")}


@dataclass
class Conns:
    active: int = 0
    inactive: int = 0

    def as_dict(self) -> dict[str, int]:
        return {"active": self.active, "inactive": self.inactive}


def counters(maps: Mapping[str, PinnedMap]) -> Iterator[tuple[int, Any]]:
    """(backend id, its kp_conns row) of every backend with a least-conn counter: through
    kp_connix, which holds only those, not the whole array."""
    if "connix" not in maps or "conns" not in maps:
        return
    conns = maps["conns"]
    for bid, ix in maps["connix"].items():
        row = conns.get(ix)
        if row is not None and row.backend_id == bid.value:   # else: being handed over
            yield bid.value, row


def per_backend(maps: Mapping[str, PinnedMap]) -> dict[int, Conns]:
    """Backend id -> its connections now (ids without any are left out)."""
    out: dict[int, Conns] = {}
    for bid, row in counters(maps):
        if row.sock > 0:
            out.setdefault(bid, Conns()).active += row.sock
    if "ct" in maps:
        now = time.clock_gettime_ns(time.CLOCK_MONOTONIC)
        for _, val in maps["ct"].items():
            if val.expires <= now:
                continue
            c = out.setdefault(val.backend_id, Conns())
            if val.state in _OPEN:
                c.active += 1
            else:
                c.inactive += 1
    return out


def sockets_by_backend(maps: Mapping[str, PinnedMap]) -> list[tuple[str, str, int]]:
    """(backend address:port, protocol, sockets connected to it through the hooks) for every
    backend with any, busiest first: the metrics' view, which reads kp_conns and the backend
    rows of its ids only (never the conntrack table: a scrape stays cheap at any flow count)."""
    out = []
    for bid, row in counters(maps):
        be = maps["backend"].get(L.U32(bid)) if row.sock > 0 else None
        if be is not None:
            proto = L.PROTO_BY_NUM.get(be.proto)
            out.append((hostport(L.ip_str(be.addr), L.port_host(be.port)),
                        proto.value if proto else str(be.proto), row.sock))
    out.sort(key=lambda r: (-r[2], r[0], r[1]))
    return out
