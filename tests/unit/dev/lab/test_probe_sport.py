"""probe.py --sport: every UDP attempt leaves from the same source port (one conntrack flow)."""
from __future__ import annotations

import socket
import threading

from kproxy_ebpf.dev.lab import probe


def test_udp_attempts_share_the_given_source_port():
    seen: list[int] = []
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as srv, \
            socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as spare:
        srv.bind(("127.0.0.1", 0))
        spare.bind(("127.0.0.1", 0))
        sport = spare.getsockname()[1]
        spare.close()                       # a port that was free a moment ago

        def serve() -> None:
            for _ in range(3):
                data, peer = srv.recvfrom(100)
                seen.append(peer[1])
                srv.sendto(b"echo %d\n" % peer[1], peer)

        t = threading.Thread(target=serve)
        t.start()
        lines = probe.probe("127.0.0.1", srv.getsockname()[1], udp=True, count=3, timeout=2,
                            sport=sport)
        t.join(5)
    assert lines == [f"echo {sport}"] * 3
    assert seen == [sport] * 3
