"""Moving a connected UDP socket in place (datapath/reconnect.py) on a real socket of another
process: found among the given processes by its inode, borrowed with pidfd_getfd, checked by
its cookie and connected again; the owner's next send() goes to the new address, with no
error and the same descriptor. Loopback only, no hook: the move itself."""
from __future__ import annotations

import os
import socket
import subprocess
import sys

import pytest

from kproxy_ebpf.datapath.sockets import reconnect

CHILD = """
import os, socket, sys
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
s.connect(("127.0.0.1", int(sys.argv[1])))
cookie = int.from_bytes(s.getsockopt(socket.SOL_SOCKET, 57, 8), "little")
print(s.fileno(), os.fstat(s.fileno()).st_ino, cookie, flush=True)
for line in sys.stdin:
    try:
        s.send(line.strip().encode())
        print("sent", flush=True)
    except OSError as e:
        print("error", e.errno, flush=True)
"""


@pytest.fixture
def owner():
    servers = [socket.socket(socket.AF_INET, socket.SOCK_DGRAM) for _ in range(2)]
    for s in servers:
        s.bind(("127.0.0.1", 0))
        s.settimeout(2)
    child = subprocess.Popen([sys.executable, "-c", CHILD, str(servers[0].getsockname()[1])],
                             stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    fd, inode, cookie = map(int, child.stdout.readline().split())

    def send(text: str) -> str:
        child.stdin.write(text + "\n")
        child.stdin.flush()
        return child.stdout.readline().strip()

    try:
        yield child, inode, cookie, servers, send
    finally:
        child.kill()
        child.wait()
        for s in servers:
            s.close()


def v4(addr: str) -> bytes:
    return bytes(10) + b"\xff\xff" + socket.inet_aton(addr)


def test_the_owners_socket_is_connected_again_in_place(owner):
    child, inode, cookie, (old, new), send = owner
    assert send("before") == "sent" and old.recv(64) == b"before"
    target = reconnect.Target(socket.AF_INET, inode, cookie, v4("127.0.0.1"),
                              new.getsockname()[1])
    reconnect.move(target, [os.getpid(), child.pid])
    assert send("after") == "sent" and new.recv(64) == b"after"


@pytest.mark.parametrize("change,why", [
    (lambda t, pids: (t, [os.getpid()]), "no process of its cgroup holds it"),
    (lambda t, pids: (reconnect.Target(t.family, t.inode, t.cookie + 1, t.service, t.port),
                      pids), "its descriptor was reused"),
    # connect() refused (a broadcast address without SO_BROADCAST: EACCES), as a hook
    # refusing a Service with no endpoints would be: nothing is sent either way.
    (lambda t, pids: (reconnect.Target(t.family, t.inode, t.cookie, v4("255.255.255.255"), 9),
                      pids), "the Service refused the connect (EACCES)"),
])
def test_what_cannot_be_moved_says_why_and_leaves_the_socket_as_it_was(owner, change, why):
    child, inode, cookie, (old, _new), send = owner
    target = reconnect.Target(socket.AF_INET, inode, cookie, v4("127.0.0.1"), 9)
    target, pids = change(target, [child.pid])
    with pytest.raises(reconnect.NotMoved) as exc:
        reconnect.move(target, pids)
    assert why in exc.value.why
    assert send("still") == "sent" and old.recv(64) == b"still"


def test_an_ipv6_socket_reaches_an_ipv4_service_ipv4_mapped():
    t = reconnect.Target(socket.AF_INET6, 1, 1, v4("10.96.0.10"), 53)
    assert t.address() == ("::ffff:10.96.0.10", 53)
    assert reconnect.Target(socket.AF_INET, 1, 1, v4("10.96.0.10"), 53).address() == \
        ("10.96.0.10", 53)
