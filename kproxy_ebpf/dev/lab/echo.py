#!/usr/bin/env python3
"""The lab pods' server: tells each client who answered and whom it saw.

Run as a script (`python3 echo.py --name POD --tcp 8080 --udp 5353`); it imports only the
standard library so a pod's server is up in tens of milliseconds.

The reply line is `<pod-name> <client-ip>:<client-port>\\n`, where the client address is the
peer as this server sees it. That is the whole point of the lab's checks: the name shows which
backend a Service picked, the address shows whether the client was SNATed on the way.

TCP: the line is sent at accept; after that every line the client sends is answered with the
same line again, so one long-lived connection can ask repeatedly (restart tests hold one open
across an agent restart). The connection closes when the client closes.
UDP: each datagram is answered with one datagram carrying the line, sent to the sender.

One thread, one selector: thousands of idle connections cost nothing, and SIGTERM ends it.
"""
from __future__ import annotations

import argparse
import selectors
import signal
import socket
import sys

MAX_PENDING_IN = 64 * 1024  # a "line" longer than this is junk: drop it
MAX_PENDING_OUT = 1024 * 1024  # a client that never reads is dropped


def _fmt(addr: tuple) -> str:
    host, port = addr[0], addr[1]
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


class _Conn:
    def __init__(self, sock: socket.socket, line: bytes) -> None:
        self.sock = sock
        self.line = line
        self.inbuf = bytearray()
        self.outbuf = bytearray(line)


class EchoServer:
    def __init__(self, name: str, tcp: list[int], udp: list[int], binds: list[str]) -> None:
        self.name = name
        self.sel = selectors.DefaultSelector()
        self.socks: list[socket.socket] = []
        for addr in binds:
            fam = socket.AF_INET6 if ":" in addr else socket.AF_INET
            for port in tcp:
                s = self._sock(fam, socket.SOCK_STREAM, addr, port)
                s.listen(4096)
                self.sel.register(s, selectors.EVENT_READ, "listen")
            for port in udp:
                s = self._sock(fam, socket.SOCK_DGRAM, addr, port)
                self.sel.register(s, selectors.EVENT_READ, "udp")

    def _sock(self, fam: int, kind: int, addr: str, port: int) -> socket.socket:
        s = socket.socket(fam, kind)
        self.socks.append(s)
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        if fam == socket.AF_INET6:
            s.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
        s.bind((addr, port))
        s.setblocking(False)
        return s

    def _line(self, peer: tuple) -> bytes:
        return f"{self.name} {_fmt(peer)}\n".encode()

    def serve(self) -> None:
        while True:
            for key, events in self.sel.select():
                if key.data == "listen":
                    self._accept(key.fileobj)
                elif key.data == "udp":
                    self._datagrams(key.fileobj)
                else:
                    self._conn_event(key.data, events)

    def _accept(self, lsock: socket.socket) -> None:
        while True:
            try:
                sock, peer = lsock.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError:  # e.g. ECONNABORTED, EMFILE: keep serving the others
                return
            sock.setblocking(False)
            conn = _Conn(sock, self._line(peer))
            self.sel.register(sock, selectors.EVENT_READ, conn)
            self._flush(conn)

    def _datagrams(self, sock: socket.socket) -> None:
        while True:
            try:
                _, peer = sock.recvfrom(65535)
            except (BlockingIOError, InterruptedError):
                return
            except OSError:  # a queued ICMP error, for instance: nothing to answer
                continue
            try:
                sock.sendto(self._line(peer), peer)
            except OSError:
                pass

    def _conn_event(self, conn: _Conn, events: int) -> None:
        if events & selectors.EVENT_READ:
            try:
                data = conn.sock.recv(65536)
            except (BlockingIOError, InterruptedError):
                data = None
            except OSError:
                data = b""
            if data == b"":
                self._close(conn)
                return
            if data:
                conn.inbuf += data
                n = conn.inbuf.count(b"\n")
                if n:
                    del conn.inbuf[: conn.inbuf.rindex(b"\n") + 1]
                    conn.outbuf += conn.line * n
                if len(conn.inbuf) > MAX_PENDING_IN:
                    conn.inbuf.clear()
        self._flush(conn)

    def _flush(self, conn: _Conn) -> None:
        if conn.sock.fileno() < 0:
            return
        while conn.outbuf:
            try:
                sent = conn.sock.send(conn.outbuf)
            except (BlockingIOError, InterruptedError):
                break
            except OSError:
                self._close(conn)
                return
            del conn.outbuf[:sent]
        if len(conn.outbuf) > MAX_PENDING_OUT:
            self._close(conn)
            return
        want = selectors.EVENT_READ | (selectors.EVENT_WRITE if conn.outbuf else 0)
        if self.sel.get_key(conn.sock).events != want:
            self.sel.modify(conn.sock, want, conn)

    def _close(self, conn: _Conn) -> None:
        try:
            self.sel.unregister(conn.sock)
        except (KeyError, ValueError):
            pass
        conn.sock.close()

    def close(self) -> None:
        for key in list(self.sel.get_map().values()):
            key.fileobj.close()
        self.sel.close()


def _stop(signum: int, frame: object) -> None:
    raise SystemExit(0)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description="lab pod echo server")
    ap.add_argument("--name", required=True, help="pod name put in every reply")
    ap.add_argument("--tcp", type=int, action="append", default=[], metavar="PORT")
    ap.add_argument("--udp", type=int, action="append", default=[], metavar="PORT")
    ap.add_argument("--bind", action="append", default=[], metavar="ADDR",
                    help="address to listen on (repeatable; default 0.0.0.0)")
    args = ap.parse_args(argv)
    signal.signal(signal.SIGTERM, _stop)
    signal.signal(signal.SIGINT, _stop)
    server = EchoServer(args.name, args.tcp, args.udp, args.bind or ["0.0.0.0"])
    print(f"echo {args.name}: tcp {args.tcp} udp {args.udp} ready", flush=True)
    try:
        server.serve()
    finally:
        server.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
