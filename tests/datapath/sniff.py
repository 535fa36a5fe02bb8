"""A receive-only packet capture for the lab network tests: which interfaces of one namespace
saw packets of one destination address."""
from __future__ import annotations

import ipaddress
import socket
import threading

ETH_P_ALL = 0x0003
ETH_P_IP, ETH_P_IPV6 = 0x0800, 0x86DD


class Sniffer:
    """An AF_PACKET socket on every interface of one namespace (the host's, or a lab
    namespace's when `make` opens it through nsutil.run_in_thread); collects the interface
    names of IPv4 or IPv6 packets to `dest`."""

    def __init__(self, dest: str, make=lambda f: f()):
        addr = ipaddress.ip_address(dest)
        self._want = (ETH_P_IPV6, 24, 40) if addr.version == 6 else (ETH_P_IP, 16, 20)
        self._dest = addr.packed
        self.sock = make(lambda: socket.socket(socket.AF_PACKET, socket.SOCK_DGRAM,
                                               socket.htons(ETH_P_ALL)))
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 8 << 20)
        self.sock.settimeout(0.05)
        self.seen: list[str] = []
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run)
        self.thread.start()

    def _run(self) -> None:
        proto, start, end = self._want
        while True:
            try:
                data, addr = self.sock.recvfrom(65536)
            except TimeoutError:
                if self.stop.is_set():  # drained: nothing queued any more
                    return
                continue
            if addr[1] == proto and data[start:end] == self._dest:
                self.seen.append(addr[0])

    def close(self) -> list[str]:
        self.stop.set()
        self.thread.join()
        self.sock.close()
        return self.seen
