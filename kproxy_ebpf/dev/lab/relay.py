"""A TCP relay from a lab namespace to the host's loopback, so lab nodes reach the API server.

The control plane listens on the host's 127.0.0.1 only (tests and the CLI reach it there, and no
packet of ours ever leaves loopback in the host namespace). Lab nodes have no path to the host's
loopback, so this relay opens its listening socket *inside* the underlay namespace (a socket
belongs to the namespace it was created in; the process itself stays in the host namespace) and
forwards each connection to 127.0.0.1:<port>. That gives the API server a lab address,
10.250.0.1:6443, which is also what the `kubernetes` Service's endpoint says.

SIGUSR1 freezes every connection it carries at that moment: their bytes go nowhere, both ways,
while the sockets stay open (the kernel still answers TCP keepalives), what a proxy whose
upstream hung does; connections made afterwards pass. The fault run uses it (bench/faults.py).

Run as: python3 -m kproxy_ebpf.dev.lab.relay --netns NAME --listen IP:PORT --to 127.0.0.1:PORT
"""
from __future__ import annotations

import argparse
import os
import signal
import socket
import threading

from .nsutil import run_in_thread

_open: set[int] = set()         # ids of the connections being relayed
_frozen: set[int] = set()       # ...of those frozen by SIGUSR1


def listen_in(netns: str, host: str, port: int) -> socket.socket:
    """A listening socket in `netns`, made by a short-lived thread that entered it; this
    process's own threads stay in the host namespace."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    return run_in_thread(netns, lambda: socket.create_server((host, port), family=family,
                                                             reuse_port=False, backlog=128))


def _pipe(src: socket.socket, dst: socket.socket, cid: int) -> None:
    try:
        while True:
            data = src.recv(65536)
            if not data:
                break
            if cid not in _frozen:
                dst.sendall(data)
    except OSError:
        pass
    finally:
        for s, how in ((dst, socket.SHUT_WR), (src, socket.SHUT_RD)):
            try:
                s.shutdown(how)
            except OSError:
                pass


def _serve_one(client: socket.socket, to: tuple[str, int]) -> None:
    try:
        upstream = socket.create_connection(to, timeout=5)
        upstream.settimeout(None)
    except OSError:
        client.close()
        return
    cid = client.fileno()
    _open.add(cid)
    t = threading.Thread(target=_pipe, args=(upstream, client, cid), daemon=True)
    t.start()
    _pipe(client, upstream, cid)
    t.join()
    _open.discard(cid)
    _frozen.discard(cid)
    client.close()
    upstream.close()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--netns", required=True)
    ap.add_argument("--listen", required=True, action="append",
                    help="IP:PORT inside --netns ([IPv6]:PORT); repeatable")
    ap.add_argument("--to", required=True, help="127.0.0.1:PORT in the host namespace")
    args = ap.parse_args()
    thost, _, tport = args.to.rpartition(":")
    if not thost.startswith("127."):
        raise SystemExit("--to must be a loopback address: the relay never sends off-host")
    servers = []
    for listen in args.listen:
        lhost, _, lport = listen.rpartition(":")
        servers.append(listen_in(args.netns, lhost.strip("[]"), int(lport)))
    signal.signal(signal.SIGTERM, lambda *_: os._exit(0))
    signal.signal(signal.SIGUSR1, lambda *_: _frozen.update(_open))
    print(f"relaying {args.netns} {', '.join(args.listen)} -> {args.to}", flush=True)
    for server in servers[1:]:
        threading.Thread(target=_accept, args=(server, (thost, int(tport))), daemon=True).start()
    _accept(servers[0], (thost, int(tport)))


def _accept(server: socket.socket, to: tuple[str, int]) -> None:
    while True:
        client, _ = server.accept()
        threading.Thread(target=_serve_one, args=(client, to), daemon=True).start()


if __name__ == "__main__":
    main()
