#!/usr/bin/env python3
"""The lab's client: one result line per attempt, in a form tests can compare as text.

Results: the server's line (see echo.py) stripped; `REFUSED` for ECONNREFUSED (a TCP RST, an
ICMP port unreachable on UDP, or a socket hook rejecting a Service without endpoints);
`TIMEOUT`; `ERROR <errno name>` for anything else (ENETUNREACH, EPERM, ...; `ERROR EOF` when a
TCP peer closed without a line); for UDP `WRONG-SOURCE <ip>:<port> <line>` when the reply came
from another address than the one asked (the reverse translation of a Service VIP failed).

TCP opens a new connection per attempt, unless keep=True, which holds one connection and asks
again on it (a new connection is opened only after a failure). UDP sends from an unconnected
socket with sendto/recvfrom, as DNS resolvers do; that is the case where the reply's source
address must be rewritten back to the Service address, so it is checked. IP_RECVERR makes an
ICMP error visible on that unconnected socket. UDP with keep=True is the other client: one
connected socket for every attempt (connect() once, send/recv), as stub resolvers and metrics
clients hold one. An ICMP error (ECONNREFUSED, EHOSTUNREACH, ...) is reported and the socket
kept, as such clients treat it as transient; the socket is connected anew only once it is no
longer usable (a proxy that disconnected it: ECONNABORTED, then EDESTADDRREQ).
`stamp` prefixes each line with the wall-clock time the attempt ended.

It must run inside a lab namespace, so it is also a stdlib-only script:
`python3 probe.py ADDR:PORT [--udp [--sport P]] [--count K] [--timeout S] [--interval S] [--keep
[--once]]`
prints one line per attempt and exits 0 only if every attempt got a server line.
"""
from __future__ import annotations

import argparse
import errno
import socket
import struct
import sys
import time

IP_RECVERR = getattr(socket, "IP_RECVERR", 11)
IPV6_RECVERR = getattr(socket, "IPV6_RECVERR", 25)


def _err(e: OSError) -> str:
    if isinstance(e, socket.timeout):
        return "TIMEOUT"
    if e.errno == errno.ECONNREFUSED:
        return "REFUSED"
    if e.errno is None:
        return f"ERROR {type(e).__name__}"
    return f"ERROR {errno.errorcode.get(e.errno, str(e.errno))}"


def _family(addr: str) -> int:
    return socket.AF_INET6 if ":" in addr else socket.AF_INET


def _fmt(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


class _TcpLines:
    """One TCP connection read line by line (keeps what arrived after a line)."""

    def __init__(self, addr: str, port: int, timeout: float, source: str | None = None) -> None:
        self.sock = socket.socket(_family(addr), socket.SOCK_STREAM)
        self.sock.settimeout(timeout)
        self.buf = b""
        try:
            if source:
                self.sock.bind((source, 0))
            self.sock.connect((addr, port))
        except BaseException:
            self.sock.close()
            raise

    def readline(self) -> str:
        while b"\n" not in self.buf:
            data = self.sock.recv(4096)
            if not data:
                if self.buf:
                    line, self.buf = self.buf, b""
                    return line.decode(errors="replace").strip()
                raise EOFError
            self.buf += data
        line, self.buf = self.buf.split(b"\n", 1)
        return line.decode(errors="replace").strip()

    def close(self, abort: bool = False) -> None:
        if abort:  # SO_LINGER 0: the close sends a RST, no FIN and no TIME_WAIT
            self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        self.sock.close()


def _tcp_attempt(addr: str, port: int, timeout: float, held: list[_TcpLines] | None,
                 source: str | None = None, abort: bool = False) -> str:
    conn = held[0] if held else None
    try:
        if conn is None:
            conn = _TcpLines(addr, port, timeout, source)
        else:
            conn.sock.sendall(b"\n")
        line = conn.readline()
    except EOFError:
        result = "ERROR EOF"
    except OSError as e:
        result = _err(e)
    else:
        if held is not None:
            held[:] = [conn]
        else:
            conn.close(abort)
        return line
    if conn is not None:
        conn.close()
    if held is not None:
        held.clear()  # reconnect on the next attempt
    return result


def _udp_attempt(addr: str, port: int, timeout: float, sport: int = 0,
                 source: str | None = None) -> str:
    fam = _family(addr)
    with socket.socket(fam, socket.SOCK_DGRAM) as s:
        if sport or source:  # sport: every attempt the same 5-tuple, one conntrack flow
            s.bind((source or ("::" if fam == socket.AF_INET6 else "0.0.0.0"), sport))
        if fam == socket.AF_INET:
            s.setsockopt(socket.SOL_IP, IP_RECVERR, 1)
        else:
            s.setsockopt(socket.IPPROTO_IPV6, IPV6_RECVERR, 1)
        s.settimeout(timeout)
        try:
            s.sendto(b"probe\n", (addr, port))
            data, src = s.recvfrom(65535)
        except OSError as e:
            return _err(e)
    line = data.decode(errors="replace").strip()
    same = (socket.inet_pton(fam, src[0]) == socket.inet_pton(fam, addr)) and src[1] == port
    return line if same else f"WRONG-SOURCE {_fmt(src[0], src[1])} {line}"


# Errors after which a connected UDP socket cannot be used again as it is.
_UDP_UNUSABLE = (errno.ECONNABORTED, errno.EDESTADDRREQ, errno.ENOTCONN, errno.EBADF)


class _ConnectedUdp:
    """One connected UDP socket, asked again and again; connected anew once unusable, unless
    `once`: then it is connected once and never again, as a client that never reconnects
    (every error is reported, and a peer name other than the address asked, which the
    application would see, is WRONG-PEER)."""

    def __init__(self, addr: str, port: int, timeout: float, once: bool = False) -> None:
        self.addr, self.port, self.timeout, self.once = addr, port, timeout, once
        self.sock: socket.socket | None = None
        self.connected = False

    def attempt(self) -> str:
        try:
            if self.sock is None:
                if self.once and self.connected:
                    return "ERROR EBADF"
                self.sock = socket.socket(_family(self.addr), socket.SOCK_DGRAM)
                self.sock.settimeout(self.timeout)
                self.sock.connect((self.addr, self.port))
                self.connected = True
            self.sock.send(b"probe\n")
            line = self.sock.recv(65535).decode(errors="replace").strip()
        except TimeoutError:
            return "TIMEOUT"           # no answer is no error: the socket stays
        except OSError as e:
            if e.errno in _UDP_UNUSABLE and not self.once:
                self.close()
            return _err(e)
        if self.once:
            host, port = self.sock.getpeername()[:2]
            if (socket.inet_pton(_family(host), host), port) != \
                    (socket.inet_pton(_family(self.addr), self.addr), self.port):
                return f"WRONG-PEER {_fmt(host, port)} {line}"
        return line

    def close(self) -> None:
        if self.sock is not None:
            self.sock.close()
            self.sock = None


def probe(addr: str, port: int, udp: bool = False, count: int = 1, timeout: float = 1.0,
          interval: float = 0.0, keep: bool = False, sport: int = 0, out=None,
          source: str | None = None, abort: bool = False, stamp: bool = False,
          once: bool = False) -> list[str]:
    """Make `count` attempts against addr:port; returns one result line per attempt.
    UDP with `sport` sends every attempt from that source port; `source`: the local address
    to send from (a client with several addresses); `abort`: TCP connections end with a RST;
    `once` (UDP with `keep`): the socket is connected once and never again.

    `out`, if given, is a text stream that gets each line as soon as it is known.
    """
    results: list[str] = []
    held: list[_TcpLines] | None = [] if keep and not udp else None
    connected = _ConnectedUdp(addr, port, timeout, once) if keep and udp else None
    try:
        for i in range(count):
            if i and interval > 0:
                time.sleep(interval)
            if connected is not None:
                r = connected.attempt()
            elif udp:
                r = _udp_attempt(addr, port, timeout, sport, source)
            else:
                r = _tcp_attempt(addr, port, timeout, held, source, abort)
            if stamp:
                r = f"{time.time():.3f} {r}"
            results.append(r)
            if out is not None:
                print(r, file=out, flush=True)
    finally:
        for c in held or []:
            c.close()
        if connected is not None:
            connected.close()
    return results


def is_reply(result: str) -> bool:
    """True when the attempt got a server line (not REFUSED/TIMEOUT/ERROR/WRONG-SOURCE)."""
    return result.split(" ", 1)[0] not in ("REFUSED", "TIMEOUT", "ERROR", "WRONG-SOURCE",
                                           "WRONG-PEER")


def stamped(text: str, t0: float = 0.0, t1: float = float("inf")) -> list[tuple[float, str]]:
    """(time, result) of each --stamp line of a probe's output between t0 and t1 (a line
    without a stamp, such as a traceback, is left out)."""
    out = []
    for line in text.splitlines():
        stamp, _, result = line.partition(" ")
        try:
            at = float(stamp)
        except ValueError:
            continue
        if t0 <= at <= t1:
            out.append((at, result))
    return out


def parse_target(text: str) -> tuple[str, int]:
    if text.startswith("["):
        host, _, port = text[1:].partition("]:")
    else:
        host, _, port = text.rpartition(":")
    if not host or not port.isdigit():
        raise ValueError(f"expected ADDR:PORT, got {text!r}")
    return host, int(port)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description="lab probe: one result line per attempt")
    ap.add_argument("target", help="ADDR:PORT ([v6]:PORT)")
    ap.add_argument("--udp", action="store_true")
    ap.add_argument("--count", type=int, default=1)
    ap.add_argument("--timeout", type=float, default=1.0)
    ap.add_argument("--interval", type=float, default=0.0)
    ap.add_argument("--keep", action="store_true",
                    help="ask repeatedly on one connection (UDP: one connected socket)")
    ap.add_argument("--once", action="store_true",
                    help="UDP with --keep: connect once and never again (errors reported)")
    ap.add_argument("--stamp", action="store_true", help="prefix lines with the time")
    ap.add_argument("--sport", type=int, default=0, help="UDP: send from this source port")
    ap.add_argument("--source", help="send from this local address")
    ap.add_argument("--abort", action="store_true", help="TCP: close with a RST, not a FIN")
    args = ap.parse_args(argv)
    try:
        addr, port = parse_target(args.target)
    except ValueError as e:
        ap.error(str(e))
    results = probe(addr, port, udp=args.udp, count=args.count, timeout=args.timeout,
                    interval=args.interval, keep=args.keep, sport=args.sport,
                    out=sys.stdout, source=args.source, abort=args.abort, stamp=args.stamp,
                    once=args.once)
    if args.stamp:
        results = [r.split(" ", 1)[1] for r in results]
    return 0 if all(is_reply(r) for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
