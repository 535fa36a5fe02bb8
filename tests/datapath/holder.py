"""A client that holds connections in a lab namespace: each stdin line is a command
(`tcp`, `udp`, `close N`, `rst N`), answered by one line. Shared by the least-conn lab
tests (test_schedulers.py from a pod, test_flowcount_lab.py from outside)."""
from __future__ import annotations

import signal
import subprocess
import sys

from kproxy_ebpf.dev.lab import procs

SCRIPT = """
import socket, struct, sys
addr, af, tcp_port, udp_port = sys.argv[1], getattr(socket, sys.argv[2]), int(sys.argv[3]), \\
    int(sys.argv[4])
held = []
for line in sys.stdin:
    cmd, *arg = line.split()
    if cmd == "tcp":
        s = socket.create_connection((addr, tcp_port), timeout=3)
        held.append(s)
        print(s.recv(100).decode().split()[0], flush=True)
    elif cmd == "udp":
        u = socket.socket(af, socket.SOCK_DGRAM)
        u.settimeout(3)
        u.connect((addr, udp_port))
        u.send(b"x")
        held.append(u)
        print(u.recv(100).decode().split()[0], flush=True)
    elif cmd == "close":
        held[int(arg[0])].close()
        print("closed", flush=True)
    elif cmd == "rst":
        s = held[int(arg[0])]
        s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        s.close()
        print("reset", flush=True)
"""


class Holder:
    """SCRIPT in lab target `where` (its netns and cgroup, so the hooks see it there)."""

    def __init__(self, lab, where: str, addr: str, tcp_port: int = 80, udp_port: int = 53):
        t = lab.target(where)
        af = "AF_INET6" if ":" in addr else "AF_INET"
        self.p = subprocess.Popen(procs.trampoline(t.netns, t.cgroup, [
            sys.executable, "-c", SCRIPT, addr, af, str(tcp_port), str(udp_port)]),
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)

    def do(self, cmd: str) -> str:
        assert self.p.stdin and self.p.stdout
        self.p.stdin.write(cmd + "\n")
        self.p.stdin.flush()
        line = self.p.stdout.readline().strip()
        assert line, f"the client died on {cmd!r}"
        return line

    def kill(self) -> None:
        self.p.send_signal(signal.SIGKILL)
        self.p.wait(10)
