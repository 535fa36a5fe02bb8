"""The writer's Ledger read back from the pinned maps, so that a new agent process adopts what
the last one programmed and rewrites only what differs.

Everything is rebuilt from the kernel: what the maps do not hold is forgotten. Rows no lookup
can reach (left by an agent killed between two writes) are deleted on the way; backends and
service ports nothing names any more are left to the writer's garbage collection (the
Ledger's unref sets name them).
"""
from __future__ import annotations

from collections import Counter

from kproxy_ebpf.datapath.maps import layout as L
from kproxy_ebpf.datapath.maps.encode import as_stored, text_of
from kproxy_ebpf.datapath.maps.pinned import PinnedMap
from kproxy_ebpf.datapath.write.held_addrs import HeldAddrs
from kproxy_ebpf.datapath.write.maglev_tables import MaglevTables
from kproxy_ebpf.datapath.write.programmed import BackendKey, Ledger, Programmed
from kproxy_ebpf.model.desired import Action, FrontendKey, FrontendKind, Scope, ServicePortName
from kproxy_ebpf.model.objects import IPFamily, LBAlgorithm, Protocol


def read_back(svc: PinnedMap, be: PinnedMap, meta: PinnedMap, src: PinnedMap | None,
              ext_addrs: HeldAddrs | None, ext_locals: HeldAddrs | None,
              tables: MaglevTables | None = None, previous: Ledger | None = None,
              repair: bool = True) -> Ledger:
    """The Ledger of what the maps hold (None: a map the writer does not have; `tables`
    adopts the Maglev tables slot 0s name). A row that says what `previous` (the Ledger
    being replaced) says is recorded with previous's own key objects: a periodic re-read at
    50,000 Services otherwise kept a second copy of every backend's address text and key
    (~60 MiB) beside the model's. `repair` False writes nothing (the drift check reads
    while syncs write: a slot above its count may be one a sync is about to count)."""
    led = Ledger()
    same = _Canon(previous)
    # Plain tuples (PinnedMap.unpacked): no ctypes object per row at 100,000 rows.
    names: dict[int, ServicePortName] = {}
    taken: set[ServicePortName] = set()
    for (sid,), (ns, name, port_name, proto, *view) in meta.unpacked():
        spn = same.service(sid, text_of(ns), text_of(name), text_of(port_name),
                           L.PROTO_BY_NUM.get(proto, Protocol.TCP))
        if spn in taken:
            # Two ids whose names read back alike (a port name cut to its 15 bytes, or one
            # with a NUL): told apart by the id, so neither is lost; the next sync, which
            # knows the whole names, gives the ports their rows again.
            spn = ServicePortName(spn.namespace, spn.name, f"{spn.port}#{sid}", spn.protocol)
        taken.add(spn)
        names[sid] = spn
        led.named[spn] = tuple(view)
    led.svc_ids.restore_all((spn, sid) for sid, spn in names.items())
    ports: dict[int, int] = {}

    def host(port: int) -> int:
        if port not in ports:
            ports[port] = L.port_host(port)
        return ports[port]

    def addr(ip: bytes, port: int, proto: int) -> BackendKey:
        return (L.ip_text(ip), host(port), L.PROTO_BY_NUM.get(proto, Protocol.TCP))

    backends: dict[int, BackendKey] = {}
    for (bid,), (ip, port, proto) in be.unpacked():
        backends[bid] = same.backend(bid, ip, host(port), proto) or addr(ip, port, proto)
    led.backend_ids.restore_all((bkey, bid) for bid, bkey in backends.items())
    # Both scopes (sockets, and packets from outside the node) are this writer's; rows of
    # a scope it does not know belong to some other writer and are left alone. Read twice,
    # slot 0s first, from the packed rows.
    rows = svc.unpacked()
    ours = L.SCOPE_BY_NUM
    heads: dict[tuple, Programmed] = {}     # a frontend's (ip, port, proto, scope) as stored

    def record(ip: bytes, port: int, proto: int, scope: int, prog: Programmed) -> Programmed:
        fkey = same.frontend(FrontendKey(*addr(ip, port, proto), L.SCOPE_BY_NUM[scope],
                                         IPFamily.IPV4 if L.ip_is4(ip) else IPFamily.IPV6))
        heads[(ip, port, proto, scope)] = led.frontends[fkey] = prog
        return prog

    named_tables: list[tuple[Programmed, int, int]] = []
    for (ip, port, proto, scope, slot), (table, sid, affinity, count, action, kind, _,
                                         fe_flags, maglev_size) in rows:
        if slot == 0 and scope in ours:
            prog = record(ip, port, proto, scope, Programmed(
                kind=L.KIND_BY_NUM.get(kind, FrontendKind.CLUSTER_IP), service=None,
                action=L.ACTION_BY_NUM.get(action, Action.REJECT), affinity=affinity,
                count=count, range_flag=bool(fe_flags & L.FE_F_SRC_RANGES),
                algorithm=L.scheduler_of(fe_flags)))
            led.set_service(prog, names.get(sid))
            if prog.algorithm is LBAlgorithm.LEAST_CONN:
                prog.lc_row = table         # a least-conn slot 0 names its kp_lcrow row
            elif table:
                named_tables.append((prog, table, maglev_size))
    refs: Counter[BackendKey] = Counter()
    for (ip, port, proto, scope, slot), (bid, *_, flags, _, _) in rows:
        if slot == 0 or scope not in ours:
            continue
        prog = heads.get((ip, port, proto, scope)) or record(
            ip, port, proto, scope,
            Programmed(FrontendKind.CLUSTER_IP, None, Action.REJECT, 0, None))
        bkey = backends.get(bid)
        # A slot naming no backend, or above its frontend's count (an agent killed between
        # writing slot 0 and deleting the surplus), is a leftover no lookup can reach.
        if bkey is None or (prog.count is not None and slot > prog.count):
            if repair:
                svc.delete(L.SvcKey(addr=L.IP16.from_buffer_copy(ip), port=port, proto=proto,
                                    scope=scope, slot=slot))
            continue
        prog.rows[slot] = (bkey, flags)       # Ledger.ref() inline: a fresh slot, per endpoint
        refs[bkey] += 1
        led.slot_rows += 1
    if tables is not None:
        tables.restore(named_tables)
    if src is not None:
        _restore_ranges(led, src, repair)
    _restore_filters(led, ext_addrs, ext_locals)
    # Anything unreferenced (a crash between writes) is garbage now: only those are
    # candidates (RefCounts keeps the count-0 ones apart: no look at each of 100,000).
    led.refs.load(led.backend_ids.keys(), refs)
    led.unref = led.refs.unnamed()
    led.svc_unref = led.svc_ids.keys() - led.svc_refs.keys()
    return led


class _Canon:
    """The key objects of the Ledger a re-read replaces, found by the ids and values the maps
    hold; every answer is None (or the new object itself) on a first restore."""

    def __init__(self, previous: Ledger | None) -> None:
        self._backends = previous.backend_ids.by_id() if previous is not None else {}
        self._services = previous.svc_ids.by_id() if previous is not None else {}
        self._frontends = {k: k for k in previous.frontends} if previous is not None else {}

    def backend(self, bid: int, ip: bytes, port: int, proto: int) -> BackendKey | None:
        """previous's key for backend id `bid` when it names the address (`port` in host
        order) this row holds."""
        old = self._backends.get(bid)
        if (old is not None and old[1] == port and L.PROTO_NUM[old[2]] == proto
                and L.ip_bytes(old[0]) == ip):
            return old
        return None

    def service(self, sid: int, ns: str, name: str, port: str,
                proto: Protocol) -> ServicePortName:
        old = self._services.get(sid)
        if (old is not None and old.namespace == ns and old.name == name and old.port == port
                and old.protocol is proto):
            return old               # nearly every row: no new object at 100,000 rows
        read = ServicePortName(ns, name, port, proto)
        # previous's whole name when the maps hold it as they keep it (a long port name cut)
        if old is not None and as_stored(old) == read:
            return old
        return read

    def frontend(self, key: FrontendKey) -> FrontendKey:
        return self._frontends.get(key, key)


def _restore_ranges(led: Ledger, src: PinnedMap, repair: bool = True) -> None:
    """Source-range rows back into their frontends; rows whose frontend is gone (a crash
    between the slot 0 delete and theirs) are deleted."""
    for key in src.keys():
        fkey, cidr = L.srcrange_of(key)
        prog = led.frontends.get(fkey)
        if prog is None or prog.count is None:
            if repair:
                src.delete(key)
        else:
            prog.ranges = prog.ranges | {cidr}
            led.range_rows += 1


def _restore_filters(led: Ledger, ext_addrs: HeldAddrs | None,
                     ext_locals: HeldAddrs | None) -> None:
    """The TC filter rows of the EXT frontends found (see HeldAddrs.restore). A frontend
    whose row could not be written does not hold it, so the next apply rewrites it (see
    Planner.to_write) and reports the failure."""
    ext = [(k, p) for k, p in led.frontends.items()
           if k.scope is Scope.EXT and p.count is not None]
    if ext_addrs is not None:
        failed = ext_addrs.restore(k.ip for k, _ in ext)
        for k, p in ext:
            p.addr_held = k.ip not in failed
            if p.addr_held:
                ext_addrs.adopt(k.ip)
    if ext_locals is not None:
        local = {k: frozenset(row[0][0] for row in map(p.rows.get, range(1, (p.count or 0) + 1))
                              if row is not None and row[1] & L.F_LOCAL) for k, p in ext}
        failed = ext_locals.restore(set().union(*local.values()))
        for k, p in ext:
            p.local_held = local[k] - failed
            for addr in p.local_held:
                ext_locals.adopt(addr)
