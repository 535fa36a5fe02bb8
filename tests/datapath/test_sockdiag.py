"""datapath/sockdiag.py against this kernel, in a namespace of the test's own: the one-walk TCP
dump of both families (the v1 request the stale-socket search starts with) answers the same
sockets, cookies and cgroup ids as the two v2 dumps it stands in for."""
from __future__ import annotations

import socket

import pytest

from kproxy_ebpf.datapath.sockets import sockdiag
from kproxy_ebpf.dev.lab import nsutil

pytestmark = pytest.mark.root

NETNS = "kproxy-sockdiag"


@pytest.fixture
def netns():
    nsutil.delete(NETNS)
    nsutil.add(NETNS)
    try:
        yield NETNS
    finally:
        nsutil.delete(NETNS)


def _pair(family: int, host: str) -> list[socket.socket]:
    listener = socket.socket(family)
    listener.bind((host, 0))
    listener.listen()
    client = socket.create_connection(listener.getsockname()[:2])
    server, _ = listener.accept()
    return [listener, client, server]


def test_one_walk_finds_both_families_as_the_per_family_dumps_do(netns):
    def look():
        socks = _pair(socket.AF_INET, "127.0.0.1") + _pair(socket.AF_INET6, "::1")
        try:
            with sockdiag.SockDiag() as d:
                both = d.tcp_sockets(sockdiag.CONNECTED_TCP)
                apart = (d.sockets(socket.AF_INET, socket.IPPROTO_TCP, sockdiag.CONNECTED_TCP)
                         + d.sockets(socket.AF_INET6, socket.IPPROTO_TCP,
                                     sockdiag.CONNECTED_TCP))
            return both, apart
        finally:
            for s in socks:
                s.close()

    both, apart = nsutil.run_in_thread(netns, look)
    # Two connected pairs per family; the listeners are in no connected state.
    assert sorted(s.family for s in both) == [socket.AF_INET] * 2 + [socket.AF_INET6] * 2
    assert {(s.family, s.cookie, s.peer, s.dport, s.cgroup_id) for s in both} == \
        {(s.family, s.cookie, s.peer, s.dport, s.cgroup_id) for s in apart}
    assert all(s.cgroup_id for s in both)
