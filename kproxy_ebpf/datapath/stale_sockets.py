"""Sockets our hooks connected to a backend that no longer serves their frontend: ended.

The socket path translates a connect() once; the connected socket then talks to its backend
directly and no conntrack entry exists that anyone could flush. When the backend leaves the
Service (pod deleted, no longer serving, the Service gone), kube-proxy deletes the backend's UDP
conntrack entries and the client's next datagram reaches another backend. Here the socket itself
must go: a UDP one is disconnected with ECONNABORTED pending, so the application's next
connect() (a resolver's retry) runs the hook again and gets a live backend; a TCP one is reset
(ECONNABORTED to a recv blocked on a pod that vanished without a FIN). kube-proxy leaves TCP
alone and Calico resets it; `staleSocketsTCP: false` keeps TCP sockets (counted as kept).

Which sockets (never any other): created in our cgroup tree (netns_scope.py), whose peer is the
backend, and for which our connect4/6 left a row naming the frontend: the TCP socket's kp_sksvc
storage (dumped with the socket) or kp_sknat (keyed by cookie and backend, UDP and TCP sockets
without storage). A socket to the same pod made without a Service, or whose backend still serves
its frontend, is left alone. The ending is sock_diag's SOCK_DESTROY (sockdiag.py); a kernel
without CONFIG_INET_DIAG_DESTROY is found at start and every stale socket is then counted as
unsupported, once per sync that finds it.
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

from ..desired import FrontendKey, Scope
from ..model import Protocol, family_of, hostport
from . import layout as L
from . import libbpf, netns_scope, sockdiag
from .pinned import PinnedMap
from .programmed import BackendKey

log = logging.getLogger(__name__)

Peer = tuple[bytes, int, int]          # (16-byte address, port, IP protocol number)
Serves = Callable[[FrontendKey, BackendKey], bool]
_SKSVC = struct.Struct("!16s16sHHI")   # kp_sksvc_val (svc_id in host order: unused here)
_PROTOS = {socket.IPPROTO_TCP: (Protocol.TCP, sockdiag.CONNECTED_TCP),
           socket.IPPROTO_UDP: (Protocol.UDP, sockdiag.CONNECTED_UDP)}
_BOTH = (socket.AF_INET, socket.AF_INET6)


class Outcome(enum.StrEnum):
    DESTROYED = "destroyed"       # reset (TCP) or disconnected (UDP)
    GONE = "gone"                 # it ended by itself between the dump and the destroy
    KEPT = "kept"                 # TCP with staleSocketsTCP false
    UNSUPPORTED = "unsupported"   # the kernel cannot destroy sockets
    FAILED = "failed"             # the kernel refused (logged)


@dataclass
class Reaped:
    counts: Counter = field(default_factory=Counter)    # (protocol, Outcome) -> sockets
    namespaces: int = 0                                 # network namespaces searched
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
    TCP sockets' dump."""

    def __init__(self, sknat: PinnedMap, storage: tuple[int, int], cgroup_root: str,
                 reset_tcp: bool = True,
                 netns_dirs: Iterable[str] = netns_scope.RUNTIME_NETNS_DIRS,
                 supported: bool | None = None):
        self.sknat, self._storage = sknat, storage
        self.cgroup_root, self.reset_tcp = cgroup_root, reset_tcp
        self.netns_dirs = tuple(netns_dirs)
        self.supported = probe_destroy() if supported is None else supported
        if not self.supported:
            log.warning("this kernel cannot destroy sockets (no CONFIG_INET_DIAG_DESTROY): "
                        "a socket connected to a backend that left its Service keeps it until "
                        "the application reconnects (counted in "
                        "kproxy_stale_sockets_total{outcome=\"unsupported\"})")

    @classmethod
    def of(cls, maps: Mapping[str, PinnedMap], cgroup_root: str, reset_tcp: bool = True,
           netns_dirs: Iterable[str] = netns_scope.RUNTIME_NETNS_DIRS) -> StaleSockets:
        sksvc = maps["sksvc"]
        return cls(maps["sknat"], (sksvc.fd, libbpf.map_info(sksvc.fd).id), cgroup_root,
                   reset_tcp, netns_dirs)

    def reap(self, serves: Serves, peers: set[Peer] | None = None) -> Reaped:
        """Ends our sockets whose frontend no longer serves their peer; `peers` limits the
        search to sockets connected to those backends (the ones a sync removed), None checks
        every socket of ours."""
        t0 = time.monotonic()
        where = netns_scope.scope(self.cgroup_root, self.netns_dirs)
        res = Reaped(namespaces=len(where.netns))
        skipped = netns_scope.in_each_netns(
            where.netns, lambda path: self._reap_here(serves, peers, where.cgroup_ids, res))
        for path, exc in skipped:
            # The namespace went away with its pod, or it is not one we may enter.
            log.debug("stale sockets: skipped %s: %s", path, exc)
        res.seconds = time.monotonic() - t0
        return res

    def _reap_here(self, serves: Serves, peers: set[Peer] | None, ours: frozenset[int],
                   res: Reaped) -> None:
        with sockdiag.SockDiag() as diag:
            for proto_num, (proto, states) in _PROTOS.items():
                storage = self._storage if proto is Protocol.TCP else None
                for family in _families(diag, proto_num, states, peers, ours):
                    for sock in diag.sockets(family, proto_num, states, storage):
                        if sock.cgroup_id not in ours:
                            continue
                        if peers is not None and (sock.peer, sock.dport, proto_num) not in peers:
                            continue
                        frontend = self._frontend(sock, proto)
                        if frontend is None:
                            continue           # not connected by our hooks
                        backend = (L.ip_text(sock.peer), sock.dport, proto)
                        if serves(frontend, backend):
                            continue
                        outcome = self._end(diag, sock, proto)
                        res.counts[(proto.value, outcome)] += 1
                        if len(res.examples) < 3:
                            res.examples.append(f"{frontend} -> "
                                                f"{hostport(backend[0], backend[1])} {outcome}")

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

    def _end(self, diag: sockdiag.SockDiag, sock: sockdiag.DiagSocket,
             proto: Protocol) -> Outcome:
        if proto is Protocol.TCP and not self.reset_tcp:
            return Outcome.KEPT
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


def _families(diag: sockdiag.SockDiag, proto_num: int, states: int, peers: set[Peer] | None,
              ours: frozenset[int]) -> tuple[int, ...]:
    """The families whose sockets of this protocol are read. A search of every socket: both.
    A search for some backends: those that can hold a socket to one (an IPv4 backend also
    from an IPv6 socket, IPv4-mapped). For TCP, whose dump walks the kernel's whole TCP hash
    once per family and namespace (SockDiag.tcp_sockets), only the families where one walk
    for both found a socket of ours to one of them: nearly always none."""
    if peers is None:
        return _BOTH
    mine = [p for p in peers if p[2] == proto_num]
    if not mine:
        return ()
    if proto_num != socket.IPPROTO_TCP:
        return _BOTH if any(L.ip_is4(p[0]) for p in mine) else (socket.AF_INET6,)
    return tuple(sorted({s.family for s in diag.tcp_sockets(states)
                         if s.cgroup_id in ours and (s.peer, s.dport, proto_num) in peers}))


def _key(addr16: bytes, port: int, proto: Protocol) -> FrontendKey:
    ip = L.ip_text(addr16)
    return FrontendKey(ip, port, proto, Scope.SOCK, family_of(ip))
