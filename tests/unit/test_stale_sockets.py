"""Which sockets the stale-socket search ends (datapath/stale_sockets.py), and the sock_diag
messages it reads and writes (datapath/sockdiag.py), built by hand as the kernel lays them out
(uapi/linux/inet_diag.h). The kernel side is tested in tests/integration/test_stale_sockets.py."""
from __future__ import annotations

import dataclasses
import errno
import socket
import struct
import threading

import pytest

from kproxy_ebpf.datapath import layout as L
from kproxy_ebpf.datapath import netns_scope, sockdiag
from kproxy_ebpf.datapath.stale_sockets import Outcome, StaleSockets, peer_of
from kproxy_ebpf.desired import FrontendKey, Scope
from kproxy_ebpf.model import Protocol

from .fakemaps import FakeMap

REAL_IN_EACH_NETNS = netns_scope.in_each_netns


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
             cookie=0x1_0000_0002, cgroup=OURS, storage: tuple[int, bytes] | None = None) -> bytes:
    af = socket.AF_INET6 if family == socket.AF_INET6 else socket.AF_INET

    def raw(ip: str) -> bytes:
        return socket.inet_pton(af, ip) + bytes(12 if af == socket.AF_INET else 0)

    head = struct.pack("=BBBB", family, state, 0, 0)
    sockid = struct.pack("!HH16s16s", sport, dport, raw(src), raw(dst))
    sockid += struct.pack("=III", 3, cookie & 0xFFFFFFFF, cookie >> 32)
    body = head + sockid + bytes(20)               # expires, rqueue, wqueue, uid, inode
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


def test_a_dumped_socket_reads_back_with_its_cookie_cgroup_and_storage_row():
    msg = diag_msg(socket.AF_INET, 1, dport=8080, storage=(42, sksvc_row()))
    s = sockdiag.parse_msg(msg, socket.IPPROTO_TCP, storage_map_id=42)
    assert (s.family, s.state, s.sport, s.dport, s.ifindex) == (socket.AF_INET, 1, 40000, 8080, 3)
    assert (s.cookie, s.cgroup_id, s.storage) == (0x1_0000_0002, OURS, sksvc_row())
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


# -- which sockets are ended ----------------------------------------------------------------

class FakeDiag:
    """sock_diag of one namespace: the sockets it dumps and what destroy() did."""
    sockets_by_proto: dict[int, list[sockdiag.DiagSocket]] = {}
    destroyed: list[sockdiag.DiagSocket] = []
    fail: int | None = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        pass

    dumps: list[tuple[int, int]] = []       # (protocol, family) of each v2 dump

    def sockets(self, family, protocol, states, storage_map=None):
        FakeDiag.dumps.append((protocol, family))
        return [s for s in self.sockets_by_proto.get(protocol, []) if s.family == family]

    def tcp_sockets(self, states):
        FakeDiag.dumps.append((socket.IPPROTO_TCP, 0))
        return [dataclasses.replace(s, storage=None)
                for s in self.sockets_by_proto.get(socket.IPPROTO_TCP, [])]

    def destroy(self, sock):
        if FakeDiag.fail is not None:
            raise sockdiag.SockDiagError(FakeDiag.fail, "refused")
        FakeDiag.destroyed.append(sock)


@pytest.fixture
def diag(monkeypatch):
    FakeDiag.sockets_by_proto, FakeDiag.destroyed, FakeDiag.fail = {}, [], None
    FakeDiag.dumps = []
    monkeypatch.setattr(sockdiag, "SockDiag", FakeDiag)
    monkeypatch.setattr(netns_scope, "scope",
                        lambda root, dirs: netns_scope.Scope(frozenset({OURS}), ("/ns/a",)))
    monkeypatch.setattr(netns_scope, "in_each_netns", each_netns)
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


def udp_sock(cookie, dst=BE, cgroup=OURS) -> sockdiag.DiagSocket:
    return sockdiag.parse_msg(diag_msg(dst=dst, cookie=cookie, cgroup=cgroup),
                              socket.IPPROTO_UDP)


def tcp_sock(cookie, dst=BE, storage=True) -> sockdiag.DiagSocket:
    row = (5, sksvc_row(be=dst)) if storage else None
    return sockdiag.parse_msg(diag_msg(dst=dst, dport=8080, cookie=cookie, storage=row),
                              socket.IPPROTO_TCP, storage_map_id=5)


def reaper(sknat, reset_tcp=True, supported=True) -> StaleSockets:
    return StaleSockets(sknat, (99, 5), "/cg", reset_tcp=reset_tcp, netns_dirs=(),
                        supported=supported)


def nobody_serves(key, backend):
    return False


def test_a_udp_socket_to_a_backend_that_left_is_destroyed_and_others_are_not(diag):
    stale = udp_sock(1)
    still_served = udp_sock(2, dst=BE2)
    not_ours = udp_sock(3, cgroup=OTHER)           # another cgroup: never touched
    direct = udp_sock(4)                          # to the pod itself: no row of our hooks
    diag.sockets_by_proto = {socket.IPPROTO_UDP: [stale, still_served, not_ours, direct]}
    sknat = sknat_with((1, BE, 5353, SVC, 53), (2, BE2, 5353, SVC, 53), (3, BE, 5353, SVC, 53))
    res = reaper(sknat).reap(lambda key, be: key == frontend() and be[0] == BE2)
    assert diag.destroyed == [stale]
    assert res.counts == {("UDP", Outcome.DESTROYED): 1}
    assert res.examples == [f"{frontend()} -> {BE}:5353 destroyed"]


def test_the_search_can_be_limited_to_the_backends_a_sync_removed(diag):
    diag.sockets_by_proto = {socket.IPPROTO_UDP: [udp_sock(1), udp_sock(2, dst=BE2)]}
    sknat = sknat_with((1, BE, 5353, SVC, 53), (2, BE2, 5353, SVC, 53))
    reaper(sknat).reap(nobody_serves, {peer_of((BE2, 5353, Protocol.UDP))})
    assert [s.cookie for s in diag.destroyed] == [2]


def test_a_tcp_socket_is_found_through_its_storage_row_and_reset(diag):
    diag.sockets_by_proto = {socket.IPPROTO_TCP: [tcp_sock(1), tcp_sock(2, storage=False)]}
    seen = []
    res = reaper(sknat_with()).reap(lambda key, be: seen.append((key, be)))
    # Only the socket with a row: the other was not connected through our hooks.
    assert seen == [(frontend(80, Protocol.TCP), (BE, 8080, Protocol.TCP))]
    assert [s.cookie for s in diag.destroyed] == [1]
    assert res.counts == {("TCP", Outcome.DESTROYED): 1}


def test_tcp_sockets_are_kept_when_the_setting_says_so(diag):
    diag.sockets_by_proto = {socket.IPPROTO_TCP: [tcp_sock(1)],
                             socket.IPPROTO_UDP: [udp_sock(2)]}
    res = reaper(sknat_with((2, BE, 5353, SVC, 53)), reset_tcp=False).reap(nobody_serves)
    assert [s.cookie for s in diag.destroyed] == [2]
    assert res.counts == {("TCP", Outcome.KEPT): 1, ("UDP", Outcome.DESTROYED): 1}


@pytest.mark.parametrize("err,outcome", [(errno.ENOENT, Outcome.GONE),
                                         (errno.EPERM, Outcome.FAILED)])
def test_a_socket_that_ended_first_is_gone_and_a_refusal_is_counted(diag, err, outcome):
    diag.sockets_by_proto = {socket.IPPROTO_UDP: [udp_sock(1)]}
    diag.fail = err
    res = reaper(sknat_with((1, BE, 5353, SVC, 53))).reap(nobody_serves)
    assert res.counts == {("UDP", outcome): 1}


def test_a_kernel_without_destroy_counts_the_stale_sockets_it_cannot_end(diag):
    diag.sockets_by_proto = {socket.IPPROTO_UDP: [udp_sock(1)]}
    res = reaper(sknat_with((1, BE, 5353, SVC, 53)), supported=False).reap(nobody_serves)
    assert diag.destroyed == []
    assert res.counts == {("UDP", Outcome.UNSUPPORTED): 1}


def test_a_namespace_that_went_away_is_skipped(diag, monkeypatch):
    def gone(path):
        raise FileNotFoundError(errno.ENOENT, "gone", path)
    monkeypatch.setattr(netns_scope, "_enter", gone)
    monkeypatch.setattr(netns_scope, "in_each_netns", REAL_IN_EACH_NETNS)
    diag.sockets_by_proto = {socket.IPPROTO_UDP: [udp_sock(1)]}
    assert reaper(sknat_with((1, BE, 5353, SVC, 53))).reap(nobody_serves).counts == {}
    assert diag.dumps == []


def test_a_search_for_removed_backends_walks_the_tcp_hash_once_unless_a_socket_is_found(diag):
    """The TCP dump of a family walks the kernel's whole hash: a search for some backends
    reads that family's sockets (with their storage rows) only where the one walk for
    both families found a socket of ours to one of them."""
    tcp = tcp_sock(1)
    diag.sockets_by_proto = {socket.IPPROTO_TCP: [tcp], socket.IPPROTO_UDP: [udp_sock(2)]}
    elsewhere = {peer_of((BE2, 8080, Protocol.TCP))}
    reaper(sknat_with()).reap(nobody_serves, elsewhere)
    assert diag.dumps == [(socket.IPPROTO_TCP, 0)] and diag.destroyed == []
    diag.dumps = []
    reaper(sknat_with()).reap(nobody_serves, {peer_of((BE, 8080, Protocol.TCP))})
    assert diag.dumps == [(socket.IPPROTO_TCP, 0), (socket.IPPROTO_TCP, socket.AF_INET)]
    assert diag.destroyed == [tcp]


def test_a_search_for_udp_backends_reads_the_families_that_can_hold_one(diag):
    """An IPv4 backend can be the peer of an IPv6 socket (IPv4-mapped), an IPv6 one of an
    IPv6 socket only; TCP is not read at all."""
    reaper(sknat_with()).reap(nobody_serves, {peer_of(("fd00::5", 53, Protocol.UDP))})
    assert diag.dumps == [(socket.IPPROTO_UDP, socket.AF_INET6)]
    diag.dumps = []
    reaper(sknat_with()).reap(nobody_serves, {peer_of((BE, 53, Protocol.UDP))})
    assert diag.dumps == [(socket.IPPROTO_UDP, socket.AF_INET),
                          (socket.IPPROTO_UDP, socket.AF_INET6)]


def test_every_namespace_is_searched_from_one_thread(monkeypatch):
    entered, threads = [], set()
    monkeypatch.setattr(netns_scope, "_enter", entered.append)
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
    assert str(ns / "cni-1") in where.netns

