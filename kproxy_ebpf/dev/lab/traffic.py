#!/usr/bin/env python3
"""Counted traffic toward one Service address from one client namespace, for handover tests
(a proxy replaced under traffic): run as a script, standard library only.

    traffic.py --out FILE [--long N] [--tcp HOST:PORT] [--udp HOST:PORT] [--rate R]

* long-lived TCP: N connections to --tcp, each sending a line every 100 ms and reading the
  echo server's answer (lab/echo.py: `<pod> <client>`); a connection is *broken* when a send
  or read fails, times out (2 s), or the answer names another pod (a backend switch is a
  broken connection to the application). A broken one is replaced by a new one.
  SIGUSR1 opens N more long-lived connections, kept beside the first ones and logged as
  kind `long1` (`long2` for the next signal, ...): connections opened by whatever proxy
  serves at that moment (a handover test's way back).
* new TCP connections to --tcp at R per second: connect, read the greeting (2 s).
* UDP queries to --udp at R per second, each from a new unconnected socket: one datagram,
  one answer within 2 s.

Every outcome is one line of FILE: `<unix time> <kind> <ok 0|1> [<reason>]`, kinds `long`
(a 100 ms exchange; `long1`, ... for the batches SIGUSR1 opened), `new`, `udp`. The test
cuts the file into its steps by time. SIGTERM ends it."""
from __future__ import annotations

import argparse
import signal
import socket
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


def long_lived(log: Log, dst: tuple[str, int], stop: threading.Event,
               kind: str = "long") -> None:
    while not stop.is_set():
        try:
            s = socket.create_connection(dst, timeout=TIMEOUT)
            backend = read_line(s)
        except OSError as exc:
            log.put(kind, False, f"connect:{type(exc).__name__}")
            stop.wait(0.1)
            continue
        with s:
            while not stop.wait(0.1):
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


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--tcp")
    ap.add_argument("--udp")
    ap.add_argument("--long", type=int, default=2)
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
        jobs.append(lambda: paced(args.rate, stop, lambda: new_conn(log, dst)))
    if args.udp:
        udst = addr(args.udp)
        jobs.append(lambda: paced(args.rate, stop, lambda: udp_query(log, udst)))
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
