"""Sockets our hooks connected to a backend that no longer serves their frontend: a UDP one
moved to a live backend, a TCP one reset.

The socket path translates a connect() once; the connected socket then talks to its backend
directly and no conntrack entry exists that anyone could flush. When the backend leaves the
Service (pod deleted, no longer serving, the Service gone), kube-proxy deletes the backend's UDP
conntrack entries and the client's next datagram reaches another backend on the same socket.
Here a connected UDP socket is connected again to its Service address in place (reconnect.py),
so the application's next send() reaches a live backend with no error and getpeername() still
names the Service; where that cannot be done it is disconnected with ECONNABORTED pending
(sock_diag's SOCK_DESTROY), so its next connect() runs the hook again. A TCP one is reset
(ECONNABORTED to a recv blocked on a pod that vanished without a FIN), as Calico does;
kube-proxy leaves TCP alone, and so does `staleSocketsTCP: false`, which skips TCP entirely.

Where: the namespaces kp_skwhere names for the backends concerned (sock_where.py), entered
through the processes that connected from them (netns_door.py), so the work follows the
sockets concerned, not the namespaces on the node. Which sockets (never any other): those in
such a namespace whose peer is the backend and for which our connect4/6 left a row naming the
frontend (the TCP socket's kp_sksvc storage, dumped with it, or kp_sknat, keyed by cookie and
backend), and whose backend no longer serves that frontend. A socket to the same pod made
without a Service has no such row and is left alone. Only a node whose kp_skwhere is new (the
first start of this version) searches every namespace once, as before it existed.
"""
from __future__ import annotations

import enum
import errno
import logging
import socket
import struct
import time
from collections import Counter
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field

from kproxy_ebpf.datapath.load import libbpf
from kproxy_ebpf.datapath.maps import layout as L
from kproxy_ebpf.datapath.maps.pinned import PinnedMap
from kproxy_ebpf.datapath.write.programmed import BackendKey
from kproxy_ebpf.model.desired import FrontendKey, Scope
from kproxy_ebpf.model.objects import Protocol, family_of, hostport

from . import netns_scope, reconnect, sockdiag
from .cgroup_procs import CgroupProcs
from .netns_door import NetnsDoor
from .sock_where import Held, Namespace, Peer, SocketWhere, clock_ns

log = logging.getLogger(__name__)

Serves = Callable[[FrontendKey, BackendKey], bool]
_SKSVC = struct.Struct("!16s16sHHI")   # kp_sksvc_val (its least-conn tag: unused here)
_STATES = {socket.IPPROTO_TCP: sockdiag.CONNECTED_TCP, socket.IPPROTO_UDP: sockdiag.CONNECTED_UDP}
_AF = {4: socket.AF_INET, 6: socket.AF_INET6}
_FAMILY: dict[int, int] = {socket.AF_INET: 4, socket.AF_INET6: 6}
RACE_NS = 1_000_000_000   # a row this much older than the search is no connect racing it


class Outcome(enum.StrEnum):
    MOVED = "moved"               # UDP: connected again to its Service, a live backend now
    DESTROYED = "destroyed"       # reset (TCP) or disconnected (UDP)
    GONE = "gone"                 # it ended by itself between the dump and the destroy
    UNSUPPORTED = "unsupported"   # the kernel cannot destroy sockets
    FAILED = "failed"             # the kernel refused (logged)


@dataclass
class Reaped:
    """What one search did: its outcomes and its work, counted (the tests hold it to the
    sockets concerned)."""
    counts: Counter = field(default_factory=Counter)    # (protocol, Outcome) -> sockets
    namespaces: int = 0         # network namespaces entered
    dumps: int = 0              # sock_diag dumps made
    rows: int = 0               # kp_skwhere rows read
    walks: int = 0              # namespaces looked for by trying every one (their way in gone)
    everywhere: bool = False    # every namespace searched: no kp_skwhere rows to go by
    seconds: float = 0.0
    examples: list[str] = field(default_factory=list)   # a few, for the log line


def peer_of(backend: BackendKey) -> Peer:
    ip, port, proto = backend
    return L.ip_bytes(ip), port, L.PROTO_NUM[proto]


def probe_destroy() -> bool:
    """Whether this kernel destroys sockets through sock_diag: asking it to end a socket that
    does not exist says ENOENT when it can, EOPNOTSUPP when it cannot."""
    ghost = sockdiag.DiagSocket(socket.AF_INET, socket.IPPROTO_UDP, 0, b"\x7f\0\0\1" + bytes(12),
                                1, b"\x7f\0\0\1" + bytes(12), 1, 0, 0, None, None)
    try:
        with sockdiag.SockDiag() as d:
            d.destroy(ghost)
    except OSError as exc:
        return exc.errno != errno.EOPNOTSUPP
    return True


class StaleSockets:
    """`sknat`: the kp_sknat map; `storage`: (fd, id) of kp_sksvc, whose rows come with the
    TCP sockets' dump; `where`: kp_skwhere."""

    def __init__(self, sknat: PinnedMap, storage: tuple[int, int], where: SocketWhere,
                 cgroup_root: str, reset_tcp: bool = True,
                 netns_dirs: Iterable[str] = netns_scope.RUNTIME_NETNS_DIRS,
                 supported: bool | None = None):
        self.sknat, self._storage, self.where = sknat, storage, where
        self.cgroup_root, self.reset_tcp = cgroup_root, reset_tcp
        self.netns_dirs = tuple(netns_dirs)
        self.procs = CgroupProcs(cgroup_root)
        self.door = NetnsDoor(self.procs, cgroup_root, self.netns_dirs)
        self.supported = probe_destroy() if supported is None else supported
        if not self.supported:
            log.warning("this kernel cannot destroy sockets (no CONFIG_INET_DIAG_DESTROY): "
                        "a socket connected to a backend that left its Service and that "
                        "cannot be connected again keeps it until the application reconnects "
                        "(counted in kproxy_stale_sockets_total{outcome=\"unsupported\"})")

    @classmethod
    def of(cls, maps: Mapping[str, PinnedMap], cgroup_root: str, reset_tcp: bool = True,
           netns_dirs: Iterable[str] = netns_scope.RUNTIME_NETNS_DIRS) -> StaleSockets:
        sksvc = maps["sksvc"]
        return cls(maps["sknat"], (sksvc.fd, libbpf.map_info(sksvc.fd).id),
                   SocketWhere(maps["skwhere"]), cgroup_root, reset_tcp, netns_dirs)

    def reap(self, serves: Serves, held: Held, peers: set[Peer] | None = None,
             everywhere: bool = False) -> Reaped:
        """Moves or ends our sockets whose frontend no longer serves their peer, among those
        connected to `peers` (the backends a sync removed) or, with None, to any backend no
        frontend holds (`held`: what changed while no agent ran, a connect that raced a
        write). `everywhere`: every socket of every namespace the hooks can see."""
        t0, start_ns = time.monotonic(), clock_ns()
        res = Reaped(everywhere=everywhere)
        walks = self.door.walks
        if everywhere:
            self._everywhere(serves, res)
        else:
            spaces, res.rows = self.where.namespaces(peers if peers is not None
                                                     else (lambda p: not held(p)))
            gone = netns_scope.in_thread(lambda: self._visit_all(spaces, serves, res), "netns")
            self.where.forget(spaces, held, start_ns - RACE_NS, gone)
        res.walks = self.door.walks - walks
        res.seconds = time.monotonic() - t0
        return res

    def _visit_all(self, spaces: list[Namespace], serves: Serves, res: Reaped) -> set[int]:
        """In one thread that enters each namespace in turn; returns the namespaces gone."""
        gone = set()
        for ns in spaces:
            if not self.door.enter(ns.netns, ns.cgroups):
                gone.add(ns.netns)
                continue
            res.namespaces += 1
            try:
                with sockdiag.SockDiag() as diag:
                    moved = self._search(diag, ns.peers, serves, res)
                    if moved:
                        self._note_moved(diag, ns.netns, moved, res)
            except OSError as exc:
                log.debug("stale sockets: netns %#x: %s", ns.netns, exc)
        return gone

    def _everywhere(self, serves: Serves, res: Reaped) -> None:
        where = netns_scope.scope(self.cgroup_root, self.netns_dirs)
        both = {4: None, 6: None}

        def here(path: str) -> None:
            res.namespaces += 1
            with sockdiag.SockDiag() as diag:
                self._search(diag, both, serves, res, where.cgroup_ids)

        for path, exc in netns_scope.in_each_netns(where.netns, here):
            # The namespace went away with its pod, or it is not one we may enter.
            log.debug("stale sockets: skipped %s: %s", path, exc)

    def _search(self, diag: sockdiag.SockDiag, peers: Mapping[int, set[Peer] | None],
                serves: Serves, res: Reaped, ours: frozenset[int] | None = None
                ) -> list[sockdiag.DiagSocket]:
        """One dump per protocol and socket family the peers call for (None: any peer of
        ours, checked by cgroup); returns the UDP sockets moved."""
        moved = []
        for proto_num, states in _STATES.items():
            if proto_num == socket.IPPROTO_TCP and not self.reset_tcp:
                continue                # staleSocketsTCP false: TCP is never looked at
            proto = L.PROTO_BY_NUM[proto_num]
            storage = self._storage if proto is Protocol.TCP else None
            for family, mine in peers.items():
                if mine is not None and not any(p[2] == proto_num for p in mine):
                    continue
                res.dumps += 1
                for sock in diag.sockets(_AF[family], proto_num, states, storage):
                    if ours is not None and sock.cgroup_id not in ours:
                        continue
                    if mine is not None and (sock.peer, sock.dport, proto_num) not in mine:
                        continue
                    frontend = self._frontend(sock, proto)
                    if frontend is None:
                        continue           # not connected by our hooks
                    backend = (L.ip_text(sock.peer), sock.dport, proto)
                    if serves(frontend, backend):
                        continue
                    outcome = self._end(diag, sock, proto, frontend)
                    if outcome is Outcome.MOVED:
                        moved.append(sock)
                    res.counts[(proto.value, outcome)] += 1
                    if len(res.examples) < 3:
                        res.examples.append(f"{frontend} -> "
                                            f"{hostport(backend[0], backend[1])} {outcome}")
        return moved

    def _frontend(self, sock: sockdiag.DiagSocket, proto: Protocol) -> FrontendKey | None:
        """The frontend our hook translated this socket for, if it did."""
        if sock.storage is not None and len(sock.storage) >= _SKSVC.size:
            be_addr, addr, be_port, port, _ = _SKSVC.unpack_from(sock.storage)
            if be_addr == sock.peer and be_port == sock.dport:
                return _key(addr, port, proto)
        key = L.SknatKey.from_buffer_copy(struct.pack("=Q", sock.cookie) + sock.peer
                                          + struct.pack("!H", sock.dport) + bytes(6))
        row = self.sknat.get(key)
        if row is None:
            return None
        return _key(bytes(row.addr), L.port_host(row.port), proto)

    def _end(self, diag: sockdiag.SockDiag, sock: sockdiag.DiagSocket, proto: Protocol,
             frontend: FrontendKey) -> Outcome:
        if proto is Protocol.UDP:
            target = reconnect.Target(sock.family, sock.inode, sock.cookie,
                                      L.ip_bytes(frontend.ip), frontend.port)
            try:
                reconnect.move(target, self.procs.procs(sock.cgroup_id or 0))
                return Outcome.MOVED
            except reconnect.NotMoved as exc:
                log.info("a UDP socket to %s (through %s) is disconnected instead of moved: "
                         "%s", hostport(L.ip_text(sock.peer), sock.dport), frontend, exc.why)
        if not self.supported:
            return Outcome.UNSUPPORTED
        try:
            diag.destroy(sock)
        except OSError as exc:
            if exc.errno in sockdiag.GONE:
                return Outcome.GONE
            log.warning("could not end a %s socket to %s:%d: %s", proto.value,
                        L.ip_text(sock.peer), sock.dport, exc.strerror)
            return Outcome.FAILED
        return Outcome.DESTROYED

    def _note_moved(self, diag: sockdiag.SockDiag, netns: int,
                    moved: list[sockdiag.DiagSocket], res: Reaped) -> None:
        """kp_skwhere rows for the moved sockets' new backends, naming their own cgroup (the
        hook saw the agent connect)."""
        cookies = {s.cookie: s for s in moved}
        for family in sorted({s.family for s in moved}):
            res.dumps += 1
            for sock in diag.sockets(family, socket.IPPROTO_UDP, sockdiag.CONNECTED_UDP):
                if sock.cookie in cookies and sock.cgroup_id:
                    self.where.note((sock.peer, sock.dport, socket.IPPROTO_UDP),
                                    _FAMILY[family], netns, sock.cgroup_id)


def _key(addr16: bytes, port: int, proto: Protocol) -> FrontendKey:
    ip = L.ip_text(addr16)
    return FrontendKey(ip, port, proto, Scope.SOCK, family_of(ip))
