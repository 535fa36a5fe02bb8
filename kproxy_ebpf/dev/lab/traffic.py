#!/usr/bin/env python3
"""Counted traffic toward one Service address from one client namespace, for handover tests
(a proxy replaced under traffic): run as a script, standard library only.

    traffic.py --out FILE [--long N] [--cycled N --lifetime S] [--tcp HOST:PORT] [--udp HOST:PORT] [--rate R]
               [--udp-flow HOST:PORT] [--dns HOST:PORT --dns-name NAME]

* long-lived TCP: N connections to --tcp, each sending a line every 100 ms and reading the
  echo server's answer (lab/echo.py: `<pod> <client>`); a connection is *broken* when a send
  or read fails, times out (2 s), or the answer names another pod (a backend switch is a
  broken connection to the application). A broken one is replaced by a new one.
  SIGUSR1 opens N more long-lived connections, kept beside the first ones and logged as
  kind `long1` (`long2` for the next signal, ...): connections opened by whatever proxy
  serves at that moment (a handover test's way back).
  --cycled N more (kind `cycled`), each closed cleanly and replaced every --lifetime seconds
  (staggered): connections opened under whichever proxy serves at each moment.
* new TCP connections to --tcp at R per second: connect, read the greeting (2 s).
* UDP queries to --udp at R per second, each from a new unconnected socket: one datagram,
  one answer within 2 s.
* a UDP flow to --udp-flow: one socket (one 5-tuple) for the whole run, a datagram every
  100 ms, one answer within 2 s naming the same backend as the first (`moved` otherwise).
* DNS A queries for --dns-name to --dns (CoreDNS), each at R per second: over one connected
  UDP socket kept for the whole run (`dnsconn`), and each over a new unconnected socket
  (`dnsnew`); an answer must carry the query's id, NOERROR and at least one record.

Every outcome is one line of FILE: `<unix time> <kind> <ok 0|1> [<reason>]`, kinds `long`
(a 100 ms exchange; `long1`, ... for the batches SIGUSR1 opened), `cycled`, `new`, `udp`,
`udpflow`, `dnsconn`, `dnsnew`. The test cuts the file into its steps by time. SIGTERM ends
it."""
from __future__ import annotations

import argparse
import itertools
import signal
import socket
import struct
import threading
import time

TIMEOUT = 2.0


class Log:
    def __init__(self, path: str) -> None:
        self.f = open(path, "a", buffering=1)      # kept open for the run
        self.lock = threading.Lock()

    def put(self, kind: str, ok: bool, reason: str = "") -> None:
        with self.lock:
            self.f.write(f"{time.time():.3f} {kind} {int(ok)} {reason}".rstrip() + "\n")


def addr(text: str) -> tuple[str, int]:
    host, _, port = text.rpartition(":")
    return host.strip("[]"), int(port)


def family(host: str) -> int:
    return socket.AF_INET6 if ":" in host else socket.AF_INET


def read_line(s: socket.socket) -> str:
    buf = b""
    while not buf.endswith(b"\n"):
        chunk = s.recv(4096)
        if not chunk:
            raise ConnectionError("closed by peer")
        buf += chunk
    return buf.decode().split()[0]


def long_lived(log: Log, dst: tuple[str, int], stop: threading.Event, kind: str = "long",
               lifetime: float = 0.0, first: float = 0.0) -> None:
    """LIFETIME > 0: each connection is closed (cleanly, not a failure) after that many
    seconds, the first after FIRST, and a new one opened: connections opened at every moment."""
    life = first or lifetime
    while not stop.is_set():
        try:
            s = socket.create_connection(dst, timeout=TIMEOUT)
            backend = read_line(s)
        except OSError as exc:
            log.put(kind, False, f"connect:{type(exc).__name__}")
            stop.wait(0.1)
            continue
        end = time.monotonic() + life if life else float("inf")
        life = lifetime
        with s:
            while not stop.wait(0.1) and time.monotonic() < end:
                try:
                    s.sendall(b"ping\n")
                    answer = read_line(s)
                except OSError as exc:
                    log.put(kind, False, type(exc).__name__)
                    break
                if answer != backend:
                    log.put(kind, False, f"moved:{backend}->{answer}")
                    break
                log.put(kind, True)


def paced(rate: float, stop: threading.Event, once) -> None:
    period, nxt = 1.0 / rate, time.monotonic()
    while not stop.is_set():
        once()
        nxt += period
        stop.wait(max(0.0, nxt - time.monotonic()))


def new_conn(log: Log, dst: tuple[str, int]) -> None:
    try:
        with socket.create_connection(dst, timeout=TIMEOUT) as s:
            read_line(s)
        log.put("new", True)
    except OSError as exc:
        log.put("new", False, type(exc).__name__)


def udp_query(log: Log, dst: tuple[str, int]) -> None:
    try:
        with socket.socket(family(dst[0]), socket.SOCK_DGRAM) as s:
            s.settimeout(TIMEOUT)
            s.sendto(b"q\n", dst)
            s.recvfrom(4096)
        log.put("udp", True)
    except OSError as exc:
        log.put("udp", False, type(exc).__name__)


def _drain(s: socket.socket) -> None:
    """Drops answers still queued (a copy of an earlier one: on kind, podman's bridge with
    br_netfilter delivered some answers twice), so the next read is this query's answer and
    not one that queued up long before (a move was logged ~20 s late)."""
    s.setblocking(False)
    try:
        while True:
            s.recv(4096)
    except OSError:
        pass
    finally:
        s.settimeout(TIMEOUT)


def udp_flow(log: Log, dst: tuple[str, int], stop: threading.Event) -> None:
    with socket.socket(family(dst[0]), socket.SOCK_DGRAM) as s:
        s.settimeout(TIMEOUT)
        backend = ""
        while not stop.wait(0.1):
            _drain(s)
            try:
                s.sendto(b"q\n", dst)
                answer = s.recvfrom(4096)[0].decode().split()[0]
            except OSError as exc:
                log.put("udpflow", False, type(exc).__name__)
                continue
            if backend and answer != backend:
                log.put("udpflow", False, f"moved:{backend}->{answer}")
            else:
                log.put("udpflow", True)
            backend = answer


def dns_query(name: str, qid: int) -> bytes:
    labels = b"".join(bytes([len(p)]) + p.encode() for p in name.strip(".").split("."))
    return struct.pack("!HHHHHH", qid, 0x0100, 1, 0, 0, 0) + labels + b"\0" + struct.pack("!HH", 1, 1)


def dns_ok(reply: bytes, qid: int) -> str:
    """"" when `reply` answers query `qid` with NOERROR and a record, else why not."""
    if len(reply) < 12:
        return "short"
    rid, flags, _, ancount = struct.unpack("!HHHH", reply[:8])
    if rid != qid:
        return "id"
    if flags & 0xF:
        return f"rcode{flags & 0xF}"
    return "" if ancount else "empty"


class Dns:
    def __init__(self, log: Log, dst: tuple[str, int], name: str) -> None:
        self.log, self.dst, self.name, self.ids = log, dst, name, itertools.count(1)
        self.conn = socket.socket(family(dst[0]), socket.SOCK_DGRAM)
        self.conn.settimeout(TIMEOUT)
        self.conn.connect(dst)

    def _ask(self, kind: str, s: socket.socket, connected: bool) -> None:
        qid = next(self.ids) & 0xFFFF    # itertools.count: safe from both threads
        try:
            if connected:
                s.send(dns_query(self.name, qid))
            else:
                s.sendto(dns_query(self.name, qid), self.dst)
            while True:     # a late answer to an earlier query is skipped
                why = dns_ok(s.recv(4096), qid)
                if why != "id":
                    break
        except OSError as exc:
            self.log.put(kind, False, type(exc).__name__)
            return
        self.log.put(kind, not why, why)

    def connected(self) -> None:
        self._ask("dnsconn", self.conn, True)

    def unconnected(self) -> None:
        with socket.socket(family(self.dst[0]), socket.SOCK_DGRAM) as s:
            s.settimeout(TIMEOUT)
            self._ask("dnsnew", s, False)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--tcp")
    ap.add_argument("--udp")
    ap.add_argument("--udp-flow")
    ap.add_argument("--dns")
    ap.add_argument("--dns-name", default="kubernetes.default.svc.cluster.local")
    ap.add_argument("--long", type=int, default=2)
    ap.add_argument("--cycled", type=int, default=0,
                    help="more long-lived connections (kind `cycled`), each reopened every "
                         "--lifetime seconds, staggered")
    ap.add_argument("--lifetime", type=float, default=20.0)
    ap.add_argument("--rate", type=float, default=20.0)
    args = ap.parse_args()
    log, stop = Log(args.out), threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    asked: list[int] = []                  # SIGUSR1s not served yet
    signal.signal(signal.SIGUSR1, lambda *_: asked.append(1))
    jobs = []
    if args.tcp:
        dst = addr(args.tcp)
        jobs += [lambda: long_lived(log, dst, stop)] * args.long
        jobs += [lambda i=i: long_lived(log, dst, stop, "cycled", args.lifetime,
                                        args.lifetime * (i + 1) / args.cycled)
                 for i in range(args.cycled)]
        jobs.append(lambda: paced(args.rate, stop, lambda: new_conn(log, dst)))
    if args.udp:
        udst = addr(args.udp)
        jobs.append(lambda: paced(args.rate, stop, lambda: udp_query(log, udst)))
    if args.udp_flow:
        fdst = addr(args.udp_flow)
        jobs.append(lambda: udp_flow(log, fdst, stop))
    if args.dns:
        dns = Dns(log, addr(args.dns), args.dns_name)
        jobs.append(lambda: paced(args.rate, stop, dns.connected))
        jobs.append(lambda: paced(args.rate, stop, dns.unconnected))
    threads = [threading.Thread(target=j, daemon=True) for j in jobs]
    for t in threads:
        t.start()
    batches = 0
    while not stop.wait(0.05):
        while asked and args.tcp:
            asked.pop()
            batches += 1
            kind = f"long{batches}"
            more = [threading.Thread(target=long_lived, args=(log, dst, stop, kind), daemon=True)
                    for _ in range(args.long)]
            for t in more:
                t.start()
            threads += more
    for t in threads:
        t.join(TIMEOUT + 1)


if __name__ == "__main__":
    main()
