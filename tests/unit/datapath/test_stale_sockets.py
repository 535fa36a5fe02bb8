"""Which sockets the stale-socket search ends (datapath/stale_sockets.py), and the sock_diag
messages it reads and writes (datapath/sockdiag.py), built by hand as the kernel lays them out
(uapi/linux/inet_diag.h). The kernel side is tested in tests/integration/test_stale_sockets.py."""
from __future__ import annotations

import errno
import socket
import struct
import threading
import time

import pytest

from kproxy_ebpf.datapath.maps import layout as L
from kproxy_ebpf.datapath.sockets import netns_scope, reconnect, sockdiag
from kproxy_ebpf.datapath.sockets.cgroup_procs import CgroupProcs
from kproxy_ebpf.datapath.sockets.netns_door import NetnsDoor
from kproxy_ebpf.datapath.sockets.sock_where import SocketWhere, key_bytes
from kproxy_ebpf.datapath.sockets.stale_sockets import Outcome, StaleSockets, peer_of
from kproxy_ebpf.model.desired import FrontendKey, Scope
from kproxy_ebpf.model.objects import Protocol

from ...fakemaps import FakeMap


def each_netns(paths, fn):
    """in_each_netns without entering anything: the tests' sockets are FakeDiag's."""
    for path in paths:
        fn(path)
    return []

OURS, OTHER = 1001, 2002          # cgroup ids
SVC, BE, BE2 = "10.96.0.10", "10.244.1.5", "10.244.1.6"


def nla(kind: int, payload: bytes) -> bytes:
    length = 4 + len(payload)
    return struct.pack("=HH", length, kind) + payload + b"\0" * (-length & 3)


def diag_msg(family=socket.AF_INET, state=1, src="10.244.0.9", sport=40000, dst=BE, dport=5353,
             cookie=0x1_0000_0002, cgroup=OURS, storage: tuple[int, bytes] | None = None,
             inode=0) -> bytes:
    af = socket.AF_INET6 if family == socket.AF_INET6 else socket.AF_INET

    def raw(ip: str) -> bytes:
        return socket.inet_pton(af, ip) + bytes(12 if af == socket.AF_INET else 0)

    head = struct.pack("=BBBB", family, state, 0, 0)
    sockid = struct.pack("!HH16s16s", sport, dport, raw(src), raw(dst))
    sockid += struct.pack("=III", 3, cookie & 0xFFFFFFFF, cookie >> 32)
    body = head + sockid + struct.pack("=IIIII", 0, 0, 0, 0, inode)  # expires .. uid, inode
    body += nla(sockdiag.INET_DIAG_CGROUP_ID, struct.pack("=Q", cgroup))
    if storage is not None:
        map_id, value = storage
        one = nla(sockdiag.SK_DIAG_BPF_STORAGE_MAP_ID, struct.pack("=I", map_id)) + \
            nla(sockdiag.SK_DIAG_BPF_STORAGE_MAP_VALUE, value)
        body += nla(sockdiag.INET_DIAG_SK_BPF_STORAGES | sockdiag.NLA_F_NESTED,
                    nla(sockdiag.SK_DIAG_BPF_STORAGE | sockdiag.NLA_F_NESTED, one))
    return body


def sksvc_row(be=BE, be_port=8080, svc=SVC, port=80) -> bytes:
    return struct.pack("!16s16sHHI", L.ip_bytes(be), L.ip_bytes(svc), be_port, port, 7)


def test_a_dumped_socket_reads_back_with_its_cookie_cgroup_inode_and_storage_row():
    msg = diag_msg(socket.AF_INET, 1, dport=8080, storage=(42, sksvc_row()), inode=31337)
    s = sockdiag.parse_msg(msg, socket.IPPROTO_TCP, storage_map_id=42)
    assert (s.family, s.state, s.sport, s.dport, s.ifindex) == (socket.AF_INET, 1, 40000, 8080, 3)
    assert (s.cookie, s.cgroup_id, s.storage) == (0x1_0000_0002, OURS, sksvc_row())
    assert s.inode == 31337
    assert s.peer == L.ip_bytes(BE)                 # IPv4-mapped, struct kp_ip's form


def test_another_maps_storage_row_is_not_ours():
    msg = diag_msg(storage=(41, sksvc_row()))
    assert sockdiag.parse_msg(msg, socket.IPPROTO_TCP, storage_map_id=42).storage is None


def test_an_ipv6_socket_keeps_its_peer_as_given():
    msg = diag_msg(socket.AF_INET6, src="fd00::9", dst="::ffff:10.244.1.5")
    assert sockdiag.parse_msg(msg, socket.IPPROTO_UDP).peer == L.ip_bytes(BE)


def test_a_dump_request_asks_for_the_storage_map_by_fd():
    req = sockdiag.request(socket.AF_INET, socket.IPPROTO_TCP, sockdiag.CONNECTED_TCP,
                           map_fds=(9,))
    family, proto, ext, _pad, states = struct.unpack_from("=BBBBI", req)
    assert (family, proto, ext, states) == (socket.AF_INET, socket.IPPROTO_TCP, 0,
                                            sockdiag.CONNECTED_TCP)
    # Any socket: the cookie is INET_DIAG_NOCOOKIE.
    assert struct.unpack_from("=III", req, 8 + 36) == (0, 0xFFFFFFFF, 0xFFFFFFFF)
    attrs = dict(sockdiag._attrs(req, 8 + 48))
    assert list(attrs) == [sockdiag.INET_DIAG_REQ_SK_BPF_STORAGES]
    fds = dict(sockdiag._attrs(attrs[sockdiag.INET_DIAG_REQ_SK_BPF_STORAGES], 0))
    assert fds == {sockdiag.SK_DIAG_BPF_STORAGE_REQ_MAP_FD: struct.pack("=I", 9)}


def test_a_destroy_request_names_the_socket_by_tuple_and_cookie():
    s = sockdiag.parse_msg(diag_msg(cookie=0xAB_0000_00CD), socket.IPPROTO_UDP)
    req = sockdiag.request(s.family, s.protocol, 0xFFFFFFFF, s)
    sport, dport, src, dst = struct.unpack_from("!HH16s16s", req, 8)
    assert (sport, dport, src[:4], dst[:4]) == (40000, 5353, socket.inet_aton("10.244.0.9"),
                                                socket.inet_aton(BE))
    assert struct.unpack_from("=III", req, 8 + 36) == (3, 0xCD, 0xAB)


def test_only_established_udp_and_connected_tcp_states_are_asked_for():
    assert sockdiag.CONNECTED_UDP == 1 << 1
    listen, time_wait = 10, 6
    assert not sockdiag.CONNECTED_TCP & (1 << listen | 1 << time_wait)
    assert sockdiag.CONNECTED_TCP & (1 << sockdiag.TCP_SYN_SENT)


# -- which sockets are moved or ended ------------------------------------------------------

NS_A, NS_B = 0xA1, 0xB2          # netns cookies
GONE_NS = 0xDEAD


class FakeDiag:
    """sock_diag of the namespace the (fake) door entered last: the sockets it dumps and what
    destroy() did."""
    sockets_by_ns: dict[int, dict[int, list[sockdiag.DiagSocket]]] = {}
    current: int = NS_A
    destroyed: list[sockdiag.DiagSocket] = []
    fail: int | None = None
    dumps: list[tuple[int, int, int]] = []       # (netns, protocol, family) of each dump

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        pass

    def sockets(self, family, protocol, states, storage_map=None):
        FakeDiag.dumps.append((FakeDiag.current, protocol, family))
        here = self.sockets_by_ns.get(FakeDiag.current, {})
        return [s for s in here.get(protocol, []) if s.family == family]

    def destroy(self, sock):
        if FakeDiag.fail is not None:
            raise sockdiag.SockDiagError(FakeDiag.fail, "refused")
        FakeDiag.destroyed.append(sock)


class FakeMoves:
    """reconnect.move: records each socket it moved, or refuses with `refuse`."""

    def __init__(self) -> None:
        self.moved: list[tuple[reconnect.Target, list[int]]] = []
        self.refuse: str | None = None

    def __call__(self, target, pids):
        if self.refuse:
            raise reconnect.NotMoved(self.refuse)
        self.moved.append((target, list(pids)))


@pytest.fixture
def diag(monkeypatch):
    FakeDiag.sockets_by_ns, FakeDiag.destroyed, FakeDiag.fail = {}, [], None
    FakeDiag.dumps, FakeDiag.current = [], NS_A
    entered = []

    def enter(door, netns, cgroups):
        entered.append(netns)
        FakeDiag.current = netns
        return netns != GONE_NS

    monkeypatch.setattr(sockdiag, "SockDiag", FakeDiag)
    monkeypatch.setattr(NetnsDoor, "enter", enter)
    monkeypatch.setattr(CgroupProcs, "procs", lambda self, cgroup: [cgroup * 10])
    moves = FakeMoves()
    monkeypatch.setattr(reconnect, "move", moves)
    monkeypatch.setattr(netns_scope, "scope",
                        lambda root, dirs: netns_scope.Scope(frozenset({OURS}), ("/ns/a",)))
    monkeypatch.setattr(netns_scope, "in_each_netns", each_netns)
    FakeDiag.entered, FakeDiag.moves = entered, moves
    return FakeDiag


def frontend(port=53, proto=Protocol.UDP) -> FrontendKey:
    return FrontendKey(SVC, port, proto, Scope.SOCK, "IPv4")


def sknat_with(*rows: tuple[int, str, int, str, int]) -> FakeMap:
    m = FakeMap(L.MAPS["sknat"])
    for cookie, be, be_port, svc, port in rows:
        key = L.SknatKey.from_buffer_copy(struct.pack("=Q", cookie) + L.ip_bytes(be)
                                          + struct.pack("!H", be_port) + bytes(6))
        val = L.SknatVal(addr=L.ip16(svc), port=L.port_be(port), svc_id=7)
        m.put(key, val)
    return m


def where_with(*rows: tuple[str, int, Protocol, int], last=0, family=4) -> FakeMap:
    """kp_skwhere rows (backend ip, port, protocol, netns), the connecting cgroup OURS."""
    m = FakeMap(L.MAPS["skwhere"], max_entries=100_000)
    for ip, port, proto, netns in rows:
        key = L.MAPS["skwhere"].key.from_buffer_copy(
            key_bytes(peer_of((ip, port, proto)), family, netns))
        m.put(key, L.MAPS["skwhere"].value(cgroup=OURS, last=last))
    return m


def udp_sock(cookie, dst=BE, cgroup=OURS, family=socket.AF_INET) -> sockdiag.DiagSocket:
    src = "fd00::9" if family == socket.AF_INET6 else "10.244.0.9"
    if family == socket.AF_INET6 and "." in dst:
        dst = "::ffff:" + dst
    return sockdiag.parse_msg(diag_msg(family, src=src, dst=dst, cookie=cookie, cgroup=cgroup,
                                       inode=cookie + 1000), socket.IPPROTO_UDP)


def tcp_sock(cookie, dst=BE, storage=True) -> sockdiag.DiagSocket:
    row = (5, sksvc_row(be=dst)) if storage else None
    return sockdiag.parse_msg(diag_msg(dst=dst, dport=8080, cookie=cookie, storage=row),
                              socket.IPPROTO_TCP, storage_map_id=5)


def reaper(sknat, where, reset_tcp=True, supported=True) -> StaleSockets:
    return StaleSockets(sknat, (99, 5), SocketWhere(where), "/cg", reset_tcp=reset_tcp,
                        netns_dirs=(), supported=supported)


def nobody_serves(key, backend):
    return False


def nothing_held(peer):
    return False


UDP_BE = peer_of((BE, 5353, Protocol.UDP))


def test_a_connected_udp_socket_to_a_backend_that_left_is_moved_in_place(diag):
    stale = udp_sock(1)
    still_served = udp_sock(2, dst=BE2)
    direct = udp_sock(4)                          # to the pod itself: no row of our hooks
    diag.sockets_by_ns = {NS_A: {socket.IPPROTO_UDP: [stale, still_served, direct]}}
    sknat = sknat_with((1, BE, 5353, SVC, 53), (2, BE2, 5353, SVC, 53))
    where = where_with((BE, 5353, Protocol.UDP, NS_A), (BE2, 5353, Protocol.UDP, NS_A))
    res = reaper(sknat, where).reap(lambda key, be: key == frontend() and be[0] == BE2,
                                    nothing_held)
    # The socket is connected again to the Service address, its owner looked for among the
    # processes of its own cgroup; nothing is destroyed.
    [(target, pids)] = diag.moves.moved
    assert (target.cookie, target.inode, target.address()) == (1, 1001, (SVC, 53))
    assert pids == [OURS * 10]
    assert diag.destroyed == []
    assert res.counts == {("UDP", Outcome.MOVED): 1}
    assert res.examples == [f"{frontend()} -> {BE}:5353 moved"]


def test_an_ipv6_socket_is_moved_to_the_ipv4_mapped_service_address(diag):
    diag.sockets_by_ns = {NS_A: {socket.IPPROTO_UDP: [udp_sock(1, family=socket.AF_INET6)]}}
    where = where_with((BE, 5353, Protocol.UDP, NS_A), family=6)
    reaper(sknat_with((1, BE, 5353, SVC, 53)), where).reap(nobody_serves, nothing_held)
    [(target, _)] = diag.moves.moved
    assert target.address() == ("::ffff:" + SVC, 53)
    # The family the row names, then once more for the moved socket's new backend.
    assert diag.dumps == [(NS_A, socket.IPPROTO_UDP, socket.AF_INET6)] * 2


def test_a_socket_that_cannot_be_moved_is_disconnected(diag):
    diag.sockets_by_ns = {NS_A: {socket.IPPROTO_UDP: [udp_sock(1)]}}
    diag.moves.refuse = "no process of its cgroup holds it"
    res = reaper(sknat_with((1, BE, 5353, SVC, 53)),
                 where_with((BE, 5353, Protocol.UDP, NS_A))).reap(nobody_serves, nothing_held)
    assert [s.cookie for s in diag.destroyed] == [1]
    assert res.counts == {("UDP", Outcome.DESTROYED): 1}


def test_only_the_namespaces_holding_sockets_to_a_removed_backend_are_entered(diag):
    """The work follows the sockets concerned: 100 namespaces hold sockets to another
    backend, two to the removed one; one dump each (UDP, the family the rows name), and one
    more where a socket was moved (its new backend's row names its own cgroup)."""
    others = [(BE2, 5353, Protocol.UDP, 0x1000 + i) for i in range(100)]
    where = where_with(*others, (BE, 5353, Protocol.UDP, NS_A), (BE, 5353, Protocol.UDP, NS_B))
    diag.sockets_by_ns = {NS_B: {socket.IPPROTO_UDP: [udp_sock(7)]}}
    res = reaper(sknat_with((7, BE, 5353, SVC, 53)), where).reap(
        nobody_serves, nothing_held, {UDP_BE})
    assert sorted(diag.entered) == [NS_A, NS_B]
    assert (res.namespaces, res.dumps, res.rows) == (2, 3, 102)
    assert res.counts == {("UDP", Outcome.MOVED): 1}


def test_a_backend_no_socket_was_connected_to_costs_no_namespace(diag):
    where = where_with(*[(BE2, 5353, Protocol.UDP, 0x1000 + i) for i in range(100)])
    res = reaper(sknat_with(), where).reap(nobody_serves, nothing_held, {UDP_BE})
    assert diag.entered == [] and diag.dumps == []
    assert (res.namespaces, res.dumps, res.counts) == (0, 0, {})


def test_a_tcp_socket_is_found_through_its_storage_row_and_reset(diag):
    diag.sockets_by_ns = {NS_A: {socket.IPPROTO_TCP: [tcp_sock(1), tcp_sock(2, storage=False)]}}
    seen = []
    where = where_with((BE, 8080, Protocol.TCP, NS_A))
    res = reaper(sknat_with(), where).reap(lambda key, be: seen.append((key, be)), nothing_held)
    # Only the socket with a row: the other was not connected through our hooks.
    assert seen == [(frontend(80, Protocol.TCP), (BE, 8080, Protocol.TCP))]
    assert [s.cookie for s in diag.destroyed] == [1]
    assert res.counts == {("TCP", Outcome.DESTROYED): 1}
    assert diag.moves.moved == []                 # TCP is never moved


def test_stale_sockets_tcp_false_skips_tcp_entirely(diag):
    diag.sockets_by_ns = {NS_A: {socket.IPPROTO_TCP: [tcp_sock(1)],
                                 socket.IPPROTO_UDP: [udp_sock(2)]}}
    where = where_with((BE, 8080, Protocol.TCP, NS_A), (BE, 5353, Protocol.UDP, NS_B))
    res = reaper(sknat_with((2, BE, 5353, SVC, 53)), where, reset_tcp=False).reap(
        nobody_serves, nothing_held)
    assert [d[1] for d in diag.dumps] == [socket.IPPROTO_UDP]
    assert res.counts == {}                       # NS_B's dump found nothing of NS_A's
    assert diag.destroyed == []


@pytest.mark.parametrize("err,outcome", [(errno.ENOENT, Outcome.GONE),
                                         (errno.EPERM, Outcome.FAILED)])
def test_a_socket_that_ended_first_is_gone_and_a_refusal_is_counted(diag, err, outcome):
    diag.sockets_by_ns = {NS_A: {socket.IPPROTO_TCP: [tcp_sock(1)]}}
    diag.fail = err
    res = reaper(sknat_with(), where_with((BE, 8080, Protocol.TCP, NS_A))).reap(
        nobody_serves, nothing_held)
    assert res.counts == {("TCP", outcome): 1}


def test_a_kernel_without_destroy_still_moves_and_counts_what_it_cannot_end(diag):
    diag.sockets_by_ns = {NS_A: {socket.IPPROTO_UDP: [udp_sock(1)],
                                 socket.IPPROTO_TCP: [tcp_sock(2)]}}
    where = where_with((BE, 5353, Protocol.UDP, NS_A), (BE, 8080, Protocol.TCP, NS_A))
    res = reaper(sknat_with((1, BE, 5353, SVC, 53)), where, supported=False).reap(
        nobody_serves, nothing_held)
    assert diag.destroyed == []
    assert res.counts == {("UDP", Outcome.MOVED): 1, ("TCP", Outcome.UNSUPPORTED): 1}


def test_rows_of_backends_gone_are_forgotten_unless_a_connect_raced_the_search(diag):
    held_be = peer_of((BE2, 5353, Protocol.UDP))
    where = where_with((BE, 5353, Protocol.UDP, NS_A), (BE2, 5353, Protocol.UDP, NS_A))
    fresh = where_with((BE, 5353, Protocol.UDP, NS_B), last=time.monotonic_ns() + 10**9)
    where.rows.update(fresh.rows)
    reaper(sknat_with(), where).reap(nobody_serves, lambda p: p == held_be,
                                     {UDP_BE, held_be})
    left = {(L.ip_text(k[:16]), struct.unpack_from("=Q", k, 24)[0]) for k in where.rows}
    # BE's row of NS_A went; NS_B's was written after the search began; BE2 is still held.
    assert left == {(BE2, NS_A), (BE, NS_B)}


def test_a_namespace_that_went_away_loses_its_rows_and_costs_no_dump(diag):
    where = where_with((BE, 5353, Protocol.UDP, GONE_NS), last=time.monotonic_ns() + 10**9)
    res = reaper(sknat_with(), where).reap(nobody_serves, lambda p: True, {UDP_BE})
    assert diag.dumps == [] and res.namespaces == 0
    assert where.rows == {}


def test_the_first_start_beside_older_maps_searches_every_namespace(diag):
    """No kp_skwhere rows from before this version: every namespace the hooks can see, every
    socket of the hook cgroup's tree (and no other cgroup's)."""
    mine, other = udp_sock(1), udp_sock(3, cgroup=OTHER)
    diag.sockets_by_ns = {NS_A: {socket.IPPROTO_UDP: [mine, other]}}
    sknat = sknat_with((1, BE, 5353, SVC, 53), (3, BE, 5353, SVC, 53))
    res = reaper(sknat, where_with()).reap(nobody_serves, nothing_held, everywhere=True)
    assert [t.cookie for t, _ in diag.moves.moved] == [1]
    assert res.everywhere and res.namespaces == 1


def test_every_namespace_is_searched_from_one_thread(monkeypatch):
    entered, threads = [], set()
    monkeypatch.setattr(netns_scope, "enter", entered.append)
    skipped = netns_scope.in_each_netns(
        ["/ns/a", "/ns/b", "/ns/c"],
        lambda path: threads.add(threading.get_ident()) if path != "/ns/b"
        else (_ for _ in ()).throw(OSError(errno.EPERM, "no")))
    assert entered == ["/ns/a", "/ns/b", "/ns/c"] and len(threads) == 1
    assert threading.get_ident() not in threads
    assert [(p, e.errno) for p, e in skipped] == [("/ns/b", errno.EPERM)]


def test_the_cgroup_tree_and_the_namespaces_are_found(tmp_path):
    root = tmp_path / "node"
    (root / "pod-a").mkdir(parents=True)
    (root / "cgroup.procs").write_text("0\n")
    ns = tmp_path / "netns"
    ns.mkdir()
    (ns / "cni-1").write_text("")
    where = netns_scope.scope(str(root), (str(ns),))
    assert where.cgroup_ids == {root.stat().st_ino, (root / "pod-a").stat().st_ino}
    assert where.netns[0] == "/proc/thread-self/ns/net"
