"""sock_diag over netlink: a network namespace's connected TCP and UDP sockets, and their end.

The kernel answers for the namespace the netlink socket was created in (stale_sockets.py opens
one per pod namespace). Each socket comes with its cookie, its cgroup id (INET_DIAG_CGROUP_ID,
on every dump since Linux 5.7) and, when asked with the map's fd, its row of an sk_storage map
(INET_DIAG_REQ_SK_BPF_STORAGES, 5.4): kp_sksvc, where connect4 records which frontend a TCP
socket was sent for. SOCK_DESTROY (CONFIG_INET_DIAG_DESTROY) ends one: a TCP socket is reset
(tcp_abort: an RST to the peer, ECONNABORTED to a blocked recv), a UDP one is disconnected with
ECONNABORTED pending (udp_abort), so the application's next connect() runs the hooks again.

Only the stdlib: the messages are small fixed structs (uapi/linux/inet_diag.h, sock_diag.h).
"""
from __future__ import annotations

import errno
import os
import socket
import struct
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

NETLINK_SOCK_DIAG = 4
TCPDIAG_GETSOCK = 18                         # the v1 request: TCP of both families
SOCK_DIAG_BY_FAMILY = 20
SOCK_DESTROY = 21
NLMSG_ERROR = 2
NLMSG_DONE = 3
NLM_F_REQUEST = 0x1
NLM_F_ACK = 0x4
NLM_F_DUMP = 0x300
NLA_F_NESTED = 0x8000

INET_DIAG_REQ_SK_BPF_STORAGES = 2            # request attribute (nested map fds)
SK_DIAG_BPF_STORAGE_REQ_MAP_FD = 1
INET_DIAG_SK_BPF_STORAGES = 20               # reply attributes
INET_DIAG_CGROUP_ID = 21
SK_DIAG_BPF_STORAGE = 1
SK_DIAG_BPF_STORAGE_MAP_ID = 2
SK_DIAG_BPF_STORAGE_MAP_VALUE = 3

# TCP states (include/net/tcp_states.h) a socket can be reset in: not LISTEN, TIME_WAIT or
# NEW_SYN_RECV, which no connect() of ours made. A connected UDP socket is ESTABLISHED.
TCP_ESTABLISHED, TCP_SYN_SENT, TCP_FIN_WAIT1, TCP_FIN_WAIT2 = 1, 2, 4, 5
TCP_CLOSE_WAIT, TCP_LAST_ACK, TCP_CLOSING = 8, 9, 11
CONNECTED_TCP = sum(1 << s for s in (TCP_ESTABLISHED, TCP_SYN_SENT, TCP_FIN_WAIT1, TCP_FIN_WAIT2,
                                     TCP_CLOSE_WAIT, TCP_LAST_ACK, TCP_CLOSING))
CONNECTED_UDP = 1 << TCP_ESTABLISHED

_NLMSG = struct.Struct("=IHHII")             # len, type, flags, seq, pid
_SOCKID = struct.Struct("!HH16s16s")         # sport, dport, src, dst (network order)
_SOCKID_TAIL = struct.Struct("=III")         # if, cookie low and high 32 bits (host order)
_REQ_HEAD = struct.Struct("=BBBBI")          # family, protocol, ext, pad, states
_REQ_V1_HEAD = struct.Struct("=BBBB")        # family, src_len, dst_len, ext
_REQ_V1_TAIL = struct.Struct("=II")          # states, dbs
_MSG_HEAD = struct.Struct("=BBBB")           # family, state, timer, retrans
_MSG_TAIL = struct.Struct("=IIIII")          # expires, rqueue, wqueue, uid, inode
_MSG_SIZE = _MSG_HEAD.size + _SOCKID.size + _SOCKID_TAIL.size + _MSG_TAIL.size
_NLA = struct.Struct("=HH")
# A dump's socket id: no addresses or ports, no cookie (INET_DIAG_NOCOOKIE).
_ANY_SOCKID = _SOCKID.pack(0, 0, b"", b"") + _SOCKID_TAIL.pack(0, 0xFFFFFFFF, 0xFFFFFFFF)


class SockDiagError(OSError):
    """The kernel refused a request (errno as OSError's)."""


@dataclass(frozen=True)
class DiagSocket:
    family: int              # AF_INET or AF_INET6 (the socket's own; IPv4-mapped peers are 6)
    protocol: int            # IPPROTO_TCP or IPPROTO_UDP
    state: int
    src: bytes               # 16 bytes as the kernel gives them (IPv4: the first 4)
    sport: int
    dst: bytes
    dport: int
    ifindex: int
    cookie: int              # the socket cookie, bpf_get_socket_cookie()'s
    cgroup_id: int | None
    storage: bytes | None    # the row of the sk_storage map asked for, if it has one
    inode: int = 0           # the socket's inode (its owners' /proc/PID/fd link names it)

    @property
    def peer(self) -> bytes:
        """The peer address as 16 bytes with IPv4 mapped (struct kp_ip's form)."""
        if self.family == socket.AF_INET:
            return b"\0" * 10 + b"\xff\xff" + self.dst[:4]
        return self.dst


def _attrs(data: bytes, offset: int) -> Iterator[tuple[int, bytes]]:
    while offset + _NLA.size <= len(data):
        length, kind = _NLA.unpack_from(data, offset)
        if length < _NLA.size:
            return
        yield kind & ~NLA_F_NESTED, data[offset + _NLA.size:offset + length]
        offset += (length + 3) & ~3


def _nla(kind: int, payload: bytes) -> bytes:
    length = _NLA.size + len(payload)
    return _NLA.pack(length, kind) + payload + b"\0" * (-length & 3)


def _storage(nested: bytes, map_id: int) -> bytes | None:
    for kind, stg in _attrs(nested, 0):
        if kind != SK_DIAG_BPF_STORAGE:
            continue
        fields = dict(_attrs(stg, 0))
        got = fields.get(SK_DIAG_BPF_STORAGE_MAP_ID)
        if got is not None and struct.unpack("=I", got[:4])[0] == map_id:
            return fields.get(SK_DIAG_BPF_STORAGE_MAP_VALUE)
    return None


def parse_msg(payload: bytes, protocol: int, storage_map_id: int | None = None) -> DiagSocket:
    """One inet_diag_msg and its attributes."""
    family, state, _timer, _retrans = _MSG_HEAD.unpack_from(payload, 0)
    off = _MSG_HEAD.size
    sport, dport, src, dst = _SOCKID.unpack_from(payload, off)
    ifindex, lo, hi = _SOCKID_TAIL.unpack_from(payload, off + _SOCKID.size)
    inode = _MSG_TAIL.unpack_from(payload, _MSG_SIZE - _MSG_TAIL.size)[4]
    cgroup_id = storage = None
    for kind, value in _attrs(payload, _MSG_SIZE):
        if kind == INET_DIAG_CGROUP_ID:
            cgroup_id = struct.unpack("=Q", value[:8])[0]
        elif kind == INET_DIAG_SK_BPF_STORAGES and storage_map_id is not None:
            storage = _storage(value, storage_map_id)
    return DiagSocket(family, protocol, state, src, sport, dst, dport, ifindex, lo | hi << 32,
                      cgroup_id, storage, inode)


def request(family: int, protocol: int, states: int, sock: DiagSocket | None = None,
            map_fds: Sequence[int] = ()) -> bytes:
    """inet_diag_req_v2 (with `sock`'s id for a request about one socket) and attributes."""
    if sock is None:
        sockid = _ANY_SOCKID
    else:
        sockid = (_SOCKID.pack(sock.sport, sock.dport, sock.src, sock.dst)
                  + _SOCKID_TAIL.pack(sock.ifindex, sock.cookie & 0xFFFFFFFF, sock.cookie >> 32))
    body = _REQ_HEAD.pack(family, protocol, 0, 0, states) + sockid
    if map_fds:
        fds = b"".join(_nla(SK_DIAG_BPF_STORAGE_REQ_MAP_FD, struct.pack("=I", fd))
                       for fd in map_fds)
        body += _nla(INET_DIAG_REQ_SK_BPF_STORAGES | NLA_F_NESTED, fds)
    return body


class SockDiag:
    """A NETLINK_SOCK_DIAG socket of the current thread's network namespace."""

    def __init__(self) -> None:
        self._sock = socket.socket(socket.AF_NETLINK, socket.SOCK_RAW | socket.SOCK_CLOEXEC,
                                   NETLINK_SOCK_DIAG)
        self._sock.bind((0, 0))
        self._seq = 0

    def close(self) -> None:
        self._sock.close()

    def __enter__(self) -> SockDiag:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def _send(self, kind: int, flags: int, body: bytes) -> int:
        self._seq += 1
        self._sock.send(_NLMSG.pack(_NLMSG.size + len(body), kind, flags, self._seq, 0) + body)
        return self._seq

    def _replies(self, seq: int) -> Iterator[tuple[int, bytes]]:
        """(type, payload) of every message answering `seq`, until DONE or an ack."""
        while True:
            data = self._sock.recv(1 << 16)
            off = 0
            while off + _NLMSG.size <= len(data):
                length, kind, _flags, got_seq, _pid = _NLMSG.unpack_from(data, off)
                payload = data[off + _NLMSG.size:off + length]
                off += (length + 3) & ~3
                if got_seq != seq:
                    continue
                if kind == NLMSG_DONE:
                    return
                if kind == NLMSG_ERROR:
                    err = -struct.unpack_from("=i", payload)[0]
                    if err:
                        raise SockDiagError(err, os.strerror(err))
                    return
                yield kind, payload

    def sockets(self, family: int, protocol: int, states: int,
                storage_map: tuple[int, int] | None = None) -> list[DiagSocket]:
        """Every socket of that family and protocol in one of `states` (a bit mask);
        `storage_map` (fd, id) of an sk_storage map adds each socket's row of it."""
        fds = (storage_map[0],) if storage_map else ()
        seq = self._send(SOCK_DIAG_BY_FAMILY, NLM_F_REQUEST | NLM_F_DUMP,
                         request(family, protocol, states, map_fds=fds))
        map_id = storage_map[1] if storage_map else None
        return [parse_msg(payload, protocol, map_id) for kind, payload in self._replies(seq)
                if kind == SOCK_DIAG_BY_FAMILY]

    def tcp_sockets(self, states: int) -> list[DiagSocket]:
        """Every TCP socket of both families in one of `states`, without sk_storage rows.
        A dump walks all of the kernel's TCP hash (tcp_ehash_entries buckets, shared by every
        namespace: 262,144 on a 24 GiB machine, ~1.1 ms), and a v2 request (sockets())
        names one family, so two walks; this v1 request (inet_diag_req, TCPDIAG_GETSOCK)
        asks for both in one (the kernel's compat dump, family AF_UNSPEC). Its replies
        carry the cgroup id like any other."""
        seq = self._send(TCPDIAG_GETSOCK, NLM_F_REQUEST | NLM_F_DUMP,
                         _REQ_V1_HEAD.pack(0, 0, 0, 0) + _ANY_SOCKID + _REQ_V1_TAIL.pack(states, 0))
        return [parse_msg(payload, socket.IPPROTO_TCP) for kind, payload in self._replies(seq)
                if kind == TCPDIAG_GETSOCK]

    def destroy(self, sock: DiagSocket) -> None:
        """Ends `sock` (matched by its tuple and cookie). Raises SockDiagError: ENOENT or
        ESTALE when it is already gone, EOPNOTSUPP without CONFIG_INET_DIAG_DESTROY."""
        seq = self._send(SOCK_DESTROY, NLM_F_REQUEST | NLM_F_ACK,
                         request(sock.family, sock.protocol, 0xFFFFFFFF, sock))
        for _ in self._replies(seq):
            pass


GONE = frozenset({errno.ENOENT, errno.ESTALE})
