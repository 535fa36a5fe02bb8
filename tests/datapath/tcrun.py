"""The BPF_PROG_TEST_RUN harness of tc_lb.c shared by test_tc_run.py (scope EXT) and
test_tc_pod_run.py (the per-packet ClusterIP path): hand-built packets and their checksum
checks, a netns of its own (one veth pair, the "node" address 10.250.0.11/24, a route to
node2's pod CIDR) so the programs' route lookups are deterministic, and real maps written by
the real MapWriter. A test run never sends a packet anywhere: a redirect is only its return
value."""
from __future__ import annotations

import contextlib
import os
import socket
import struct
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from kproxy_ebpf.datapath.load import libbpf
from kproxy_ebpf.datapath.load.bpffs import open_pinned_maps, remove_pins
from kproxy_ebpf.datapath.load.compile_child import compile_program
from kproxy_ebpf.datapath.load.paths import bpf_dir
from kproxy_ebpf.datapath.load.tc import PROGRAMS, write_config
from kproxy_ebpf.datapath.maps import layout as L
from kproxy_ebpf.datapath.write.writer import MapWriter
from kproxy_ebpf.dev.lab import nsutil
from kproxy_ebpf.model.desired import Action, Backend, Frontend, FrontendKind, Scope, ServicePortName
from kproxy_ebpf.model.objects import Protocol

BPFFS = Path("/sys/fs/bpf/kproxy-tcrun")
NETNS = "kproxy-tcrun"
TCP, UDP = Protocol.TCP, Protocol.UDP
NODE, CLIENT = "10.250.0.11", "10.250.0.250"
LOCAL_BE, REMOTE_BE = "10.244.1.10", "10.244.2.10"
NODE6, CLIENT6 = "fd00:250::11", "fd00:250::250"
LOCAL_BE6, REMOTE_BE6 = "fd00:244:1::10", "fd00:244:2::10"


@dataclass(frozen=True)
class Addrs:
    """The harness's addresses in one family: tests of both families name them through this."""
    node: str
    client: str
    local_be: str                 # a pod of this node
    remote_be: str                # a pod of node2 (routed via node2)
    local_be2: str                # another pod of this node
    client2: str                  # another client on the node's network
    elsewhere: str                # an address no frontend has
    eip: str                      # an external IP no other row uses
    lb_ip: str
    other_client: str             # a client outside `client_net`
    client_net: str               # the node network, CLIENT's range
    other_net: str                # OTHER_CLIENT's range
    icmp: int                     # the family's ICMP protocol number
    port_unreach: tuple[int, int]  # ICMP (type, code) of a port unreachable
    quote: int                    # the bytes of an error's quote: IP header and 8 of L4
    router: str                   # a router on the node network (sends ICMP errors)

    @property
    def family(self) -> str:
        return "ipv6" if is6(self.node) else "ipv4"

    @property
    def client_host(self) -> str:
        """CLIENT's own range (a /32 or /128)."""
        return f"{self.client}/{128 if is6(self.client) else 32}"


V4 = Addrs(NODE, CLIENT, LOCAL_BE, REMOTE_BE, "10.244.1.11", "10.250.0.99", "10.244.9.9", "192.0.2.7",
           "10.250.200.7", "10.250.1.250", "10.250.0.0/24", "10.250.1.0/24", 1, (3, 3), 28, "10.250.0.1")
V6 = Addrs(NODE6, CLIENT6, LOCAL_BE6, REMOTE_BE6, "fd00:244:1::11", "fd00:250::99", "fd00:244:9::9",
           "2001:db8::7", "fd00:250:200::7", "fd00:250:1::250", "fd00:250::/64", "fd00:250:1::/64",
           58, (1, 4), 48, "fd00:250::1")
FAMILIES = {"ipv4": V4, "ipv6": V6}
TC_ACT_OK, TC_ACT_SHOT, TC_ACT_REDIRECT = 0, 2, 7
SYN, ACK, FIN, RST = 0x02, 0x10, 0x01, 0x04
PORTS = (61000, 61003)
ISN = 1000                  # the sequence number of the test clients' SYNs


# -- frontends -----------------------------------------------------------------------------------

def frontend(ip: str, port: int, kind: FrontendKind, name: str,
             backends: Iterable[tuple[str, bool]] = (), action: Action = Action.FORWARD,
             proto: Protocol = TCP, affinity: int = 0, scope: Scope = Scope.EXT,
             ranges: Iterable[str] = (), maglev: int = 0) -> Frontend:
    """A frontend of Service t/<name> (unnamed port); `backends`: (address, local) pairs on
    port 8080, kept in the order given (slot order: the programs' picks depend on it)."""
    bs = tuple(Backend.of(b, 8080, proto, local=local) for b, local in backends)
    return Frontend(ip, port, proto, kind, ServicePortName("t", name, "", proto), action, bs,
                    affinity, scope, source_ranges=tuple(ranges), maglev=maglev)


# -- packets --------------------------------------------------------------------------------------

def csum(data: bytes) -> int:
    if len(data) % 2:
        data += b"\0"
    s = sum(struct.unpack(f"!{len(data) // 2}H", data))
    while s >> 16:
        s = (s & 0xFFFF) + (s >> 16)
    return ~s & 0xFFFF


def is6(addr: str) -> bool:
    return ":" in addr


def pton(addr: str) -> bytes:
    return socket.inet_pton(socket.AF_INET6 if is6(addr) else socket.AF_INET, addr)


def ntop(raw: bytes) -> str:
    return socket.inet_ntop(socket.AF_INET6 if len(raw) == 16 else socket.AF_INET, raw)


def pseudo(src: str, dst: str, proto: int, length: int) -> bytes:
    """The TCP/UDP/ICMPv6 pseudo header of either family (RFC 793, RFC 8200 8.1)."""
    if is6(src):
        return pton(src) + pton(dst) + struct.pack("!I3xB", length, proto)
    return pton(src) + pton(dst) + struct.pack("!BBH", 0, proto, length)


def ip_header(src: str, dst: str, proto: int, payload_len: int, ip_options=b"", frag=0) -> bytes:
    """An IPv4 header (checksum filled) or an IPv6 one, with its EtherType in front."""
    if is6(src):
        return struct.pack("!HIHBB", 0x86DD, 0x6 << 28, payload_len, proto, 64) + pton(src) + pton(dst)
    hl = 20 + len(ip_options)
    ip = struct.pack("!BBHHHBBH4s4s", 0x40 | hl // 4, 0, hl + payload_len, 1, frag, 64, proto, 0,
                     pton(src), pton(dst)) + ip_options
    return struct.pack("!H", 0x0800) + ip[:10] + struct.pack("!H", csum(ip)) + ip[12:]


ETH_ADDRS = bytes.fromhex("02000000000a02000000000b")


def packet(src, sport, dst, dport, proto=TCP, flags=SYN, payload=b"hello", udp_csum=True,
           ip_options=b"", frag=0, seq=ISN, ack=ISN + 1) -> bytes:
    """An Ethernet frame of either family (by the addresses). TCP: every packet carries seq
    ISN and acknowledges ISN + 1 unless told otherwise, so a client's SYN and a backend's
    SYN-ACK belong to one connection."""
    num = L.PROTO_NUM[proto]
    if proto is TCP:
        l4 = struct.pack("!HHIIBBHHH", sport, dport, seq, ack, 5 << 4, flags, 65535, 0, 0) + payload
        off = 16
    else:
        l4 = struct.pack("!HHHH", sport, dport, 8 + len(payload), 0) + payload
        off = 6
    if proto is TCP or udp_csum:
        c = csum(pseudo(src, dst, num, len(l4)) + l4) or 0xFFFF
        l4 = l4[:off] + struct.pack("!H", c) + l4[off + 2:]
    return ETH_ADDRS + ip_header(src, dst, num, len(l4), ip_options, frag) + l4


def icmp_error(src: str, dst: str, typ: int, code: int, quoted: bytes, info: int = 0) -> bytes:
    """An ICMP(v6) error from src to dst quoting `quoted` (an IP packet without its Ethernet
    header), checksum filled; `info` is the 4-byte field (PTB's MTU, frag-needed's next-hop
    MTU in its low 16 bits)."""
    num = 58 if is6(src) else 1
    msg = struct.pack("!BBHI", typ, code, 0, info) + quoted
    c = csum((pseudo(src, dst, num, len(msg)) if num == 58 else b"") + msg)
    msg = msg[:2] + struct.pack("!H", c) + msg[4:]
    return ETH_ADDRS + ip_header(src, dst, num, len(msg)) + msg


def parse(frame: bytes) -> dict:
    if frame[12:14] == b"\x86\xdd":
        ip = frame[14:54]
        proto, src, dst = ip[6], ntop(ip[8:24]), ntop(ip[24:40])
        l4 = frame[54:54 + struct.unpack("!H", ip[4:6])[0]]
        out = {"src": src, "dst": dst, "proto": proto, "ip_ok": True, "hop_limit": ip[7]}
        icmp, quote = 58, 48
    else:
        hl = (frame[14] & 0x0F) * 4
        ip = frame[14:14 + hl]
        proto, src, dst = ip[9], ntop(ip[12:16]), ntop(ip[16:20])
        l4 = frame[14 + hl:14 + struct.unpack("!H", ip[2:4])[0]]
        out = {"src": src, "dst": dst, "proto": proto, "ip_ok": csum(ip) == 0}
        icmp, quote = 1, 28
    if proto == icmp:
        ok = csum((pseudo(src, dst, proto, len(l4)) if proto == 58 else b"") + l4) == 0
        out.update(type=l4[0], code=l4[1], l4_ok=ok, quote=l4[8:8 + quote], icmp_body=l4[8:])
        return out
    out["sport"], out["dport"] = struct.unpack("!HH", l4[:4])
    if proto == 17 and l4[6:8] == b"\0\0":
        out["l4_ok"] = "none"
    else:
        out["l4_ok"] = csum(pseudo(src, dst, proto, len(l4)) + l4) == 0
    return out


@contextlib.contextmanager
def open_harness():
    """A netns of its own with tc_lb.c loaded: yields (program fds by name, pinned maps);
    removes all of it after."""
    from bcc import BPF

    remove_pins(BPFFS)
    nsutil.delete(NETNS)
    bpf = None
    maps = {}
    try:
        nsutil.add(NETNS, {"net.ipv4.conf.all.forwarding": "1",
                           "net.ipv6.conf.all.forwarding": "1"})
        nsutil.add_veth(NETNS, "kpt0", NETNS, "kpt1")
        nsutil.set_addr(NETNS, "kpt0", f"{NODE}/24")
        nsutil.set_addr(NETNS, "kpt0", f"{NODE6}/64")
        for dev in ("kpt0", "kpt1"):
            nsutil.link_up(NETNS, dev)
        nsutil.set_route(NETNS, "10.244.2.0/24", "kpt0", via="10.250.0.12")
        nsutil.set_route(NETNS, "fd00:244:2::/64", "kpt0", via="fd00:250::12")
        bpf = compile_program(bpf_dir() / "tc_lb.c", BPFFS)
        fds = {name: bpf.load_func(name.encode(), BPF.SCHED_CLS).fd
               for name in PROGRAMS}     # the per-packet ClusterIP ones too (test_tc_pod_run)
        write_config(BPFFS, (NODE, NODE6), PORTS)
        maps = open_pinned_maps(BPFFS)
        yield fds, maps
    finally:
        for m in maps.values():
            m.close()
        if bpf is not None:
            bpf.cleanup()
        remove_pins(BPFFS)
        nsutil.delete(NETNS)


def ct_key(src, sport, dst, dport, proto=TCP) -> L.CtKey:
    """The kp_ct key of a flow's original tuple."""
    return L.ct_key(src, sport, dst, dport, L.PROTO_NUM[proto])


class TcRun:
    """One test's view of the harness: its frontends programmed, conntrack emptied, programs
    run with BPF_PROG_TEST_RUN inside the netns (on CPU `cpu` when given: kp_snat_alloc reuses
    a port only on the CPU whose slice holds it). close() removes the frontends."""

    def __init__(self, harness, frontends: list[Frontend]):
        self.fds, self.maps = harness
        self.writer = MapWriter(self.maps)
        self.writer.restore()
        assert self.writer.apply({f.key: f for f in frontends}).ok
        for name in ("ct", "rnat"):
            for k in self.maps[name].keys():
                self.maps[name].delete(k)

    def run(self, prog: str, frame: bytes, cpu: int | None = None) -> tuple[int, bytes]:
        def go():
            if cpu is not None:
                os.sched_setaffinity(0, {cpu})     # this thread only
            return libbpf.prog_test_run(self.fds[prog], frame)
        return nsutil.run_in_thread(NETNS, go)

    def ct(self, src, sport, dst, dport, proto=TCP):
        key = ct_key(src, sport, dst, dport, proto)
        return key, self.maps["ct"].get(key)

    def stat(self, name) -> int:
        idx = {n: v for v, n in L.STAT_NAMES.items()}[name]
        return sum(self.maps["stats"].get(L.U32(idx)))

    def close(self) -> None:
        self.writer.apply({})


def snat_reply_key(key: L.CtKey, ct: L.CtVal) -> L.CtKey:
    """The kp_rnat key of SNAT flow `key`: the tuple its backend's replies carry."""
    return L.CtKey(saddr=ct.be_addr, daddr=ct.nat_addr, sport=ct.be_port, dport=ct.nat_port,
                   proto=key.proto)


def moved_snat_reply(run, key: L.CtKey, addr: str | None = None, port: int | None = None) -> bytes:
    """Rewrites the SNAT flow `key` as if it had been given `addr`:`port` (each kept where
    None), with its kp_rnat row, and returns the backend's reply to it: a reply that
    kp_reply() would translate if it were asked."""
    ct = run.maps["ct"].get(key)
    if addr is not None:
        ct.nat_addr = L.ip16(addr)
    if port is not None:
        ct.nat_port = L.port_be(port)
    run.maps["ct"].put(key, ct)
    run.maps["rnat"].put(snat_reply_key(key, ct), key)
    return packet(L.ip_str(ct.be_addr), L.port_host(ct.be_port), L.ip_str(ct.nat_addr),
                  L.port_host(ct.nat_port), flags=SYN | ACK)
