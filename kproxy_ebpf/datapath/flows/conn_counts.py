"""Connections per backend on this node, as ipvsadm -Ln showed them per real server: active
and inactive, for `services -o wide`, its JSON and the metrics.

Active: the sockets connected to the backend through least-conn frontends (kp_connload less
its flows, counted by the socket hooks from connect to close), plus the TC path's flows to it
that are new or established, read from the conntrack table itself (of every frontend: what
least-conn compares for its own frontends' flows, counters repaired from that table,
flow_fix.py), plus the flows of unconnected UDP sockets to least-conn frontends used within
their timeout (kp_flow). Inactive: TC flows past their FIN or RST and not yet expired (IPVS
counts its FIN_WAIT and TIME_WAIT connections there). The socket path has no inactive state:
a socket the application closed is gone from it (its TIME_WAIT is the kernel's, not a
connection).
"""
from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass

from kproxy_ebpf.datapath.flows import flow_fix
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


def per_backend(maps: Mapping[str, PinnedMap]) -> dict[int, Conns]:
    """Backend id -> its connections now (ids without any are left out)."""
    out: dict[int, Conns] = {}
    for bid, ix, row in flow_fix.counters(maps):
        n = flow_fix.sockets(flow_fix.load_at(maps, ix), row)
        if n > 0:
            out.setdefault(bid, Conns()).active += n
    now = time.clock_gettime_ns(time.CLOCK_MONOTONIC)
    if "flow" in maps:      # unconnected UDP sockets' flows of least-conn frontends
        for bid, n in flow_fix.live_udp_by_backend(maps["flow"], now)[0].items():
            out.setdefault(bid, Conns()).active += n
    if "ct" in maps:
        for _, val in maps["ct"].items():
            if val.expires <= now:
                continue
            c = out.setdefault(val.backend_id, Conns())
            if val.state in _OPEN:
                c.active += 1
            else:
                c.inactive += 1
    return out


def counts_by_backend(maps: Mapping[str, PinnedMap]) -> list[tuple[str, str, int]]:
    """(backend address:port, protocol, its least-conn count) for every backend with any,
    busiest first: the metrics' view of what least-conn compares (sockets plus TC flows open,
    lib/conns.h kp_conns_load), which reads kp_conns, kp_connload, kp_flowfix and the backend
    rows of its ids only (never the conntrack table: a scrape stays cheap at any flow count)."""
    out = []
    for bid, ix, _ in flow_fix.counters(maps):
        n = flow_fix.load(flow_fix.load_at(maps, ix), flow_fix.fix_at(maps, ix))
        be = maps["backend"].get(L.U32(bid)) if n > 0 else None
        if be is not None:
            proto = L.PROTO_BY_NUM.get(be.proto)
            out.append((hostport(L.ip_str(be.addr), L.port_host(be.port)),
                        proto.value if proto else str(be.proto), n))
    out.sort(key=lambda r: (-r[2], r[0], r[1]))
    return out
