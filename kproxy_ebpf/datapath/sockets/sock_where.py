"""Where the sockets connected to a backend live: kp_skwhere, which connect4/6 fill (one row
per backend, socket family and client network namespace, with the cgroup of the process that
connected).

The stale-socket search (stale_sockets.py) starts here instead of in every namespace of the
node: a backend that leaves costs a read of these rows and a look into the namespaces they
name, none when no socket of this node was ever connected to it. A row is a hint, not a count:
it stays after its sockets closed (the search then finds nothing there and forgets it), and
the LRU may evict a live one only when more pairs exist than the map holds
(`mapSizes.skwhere`).
"""
from __future__ import annotations

import struct
import time
from collections.abc import Callable, Collection, Iterable
from dataclasses import dataclass, field

from kproxy_ebpf.datapath.maps.pinned import PinnedMap

Peer = tuple[bytes, int, int]          # (16-byte address, port, IP protocol number)
Held = Callable[[Peer], bool]          # whether some frontend still names that backend
_KEY = struct.Struct("=16s2sBB4xQ")    # kp_skwhere_key, the port as the kernel's bytes
_VAL = struct.Struct("=QQ")            # kp_skwhere_val
_PORT = struct.Struct("!H")


def clock_ns() -> int:
    """bpf_ktime_get_ns()'s clock."""
    return time.monotonic_ns()


@dataclass
class Namespace:
    """A client network namespace the rows name: its cookie, the cgroups whose processes
    connected from it (the way in), and which backends it holds sockets to, per socket
    family (4 or 6: an AF_INET6 socket reaches an IPv4 backend IPv4-mapped)."""
    netns: int
    cgroups: list[int] = field(default_factory=list)
    peers: dict[int, set[Peer]] = field(default_factory=dict)

    def all_peers(self) -> set[Peer]:
        return set().union(*self.peers.values())


def key_bytes(peer: Peer, family: int, netns: int) -> bytes:
    addr, port, proto = peer
    return _KEY.pack(addr, _PORT.pack(port), proto, family, netns)


class SocketWhere:
    def __init__(self, rows: PinnedMap) -> None:
        self.rows = rows

    def namespaces(self, wanted: Callable[[Peer], bool] | Collection[Peer]
                   ) -> tuple[list[Namespace], int]:
        """The namespaces holding sockets to a `wanted` backend (a predicate, or the
        backends themselves: then a row of another is passed over on its first bytes), with
        the cgroups that connected there (the most recent first), and how many rows were
        read."""
        found: dict[int, Namespace] = {}
        latest: dict[tuple[int, int], int] = {}
        rows = self.rows.raw_items()
        predicate: Callable[[Peer], bool] | None
        heads: set[bytes] | None
        if callable(wanted):
            predicate, heads = wanted, None
        else:
            predicate, heads = None, {a + _PORT.pack(port) + bytes((proto,)) for a, port, proto in wanted}
        for key, value in rows:
            if heads is not None and key[:19] not in heads:
                continue
            addr, port, proto, family, netns = _KEY.unpack(key)
            peer = (addr, _PORT.unpack(port)[0], proto)
            if predicate is not None and not predicate(peer):
                continue
            cgroup, last = _VAL.unpack(value)
            ns = found.get(netns)
            if ns is None:
                ns = found[netns] = Namespace(netns)
            ns.peers.setdefault(family, set()).add(peer)
            latest[(netns, cgroup)] = max(latest.get((netns, cgroup), 0), last)
        for (netns, cgroup), _ in sorted(latest.items(), key=lambda kv: -kv[1]):
            found[netns].cgroups.append(cgroup)
        return list(found.values()), len(rows)

    def forget(self, namespaces: Iterable[Namespace], held: Held, before_ns: int,
               gone: Collection[int] = ()) -> int:
        """Deletes the rows of backends no frontend holds any more, last written before
        `before_ns` (a connect that raced the search keeps its row for the next one), and
        every row of the namespaces in `gone`. Returns how many went."""
        n = 0
        for ns in namespaces:
            for family, peers in ns.peers.items():
                for peer in peers:
                    if ns.netns not in gone and held(peer):
                        continue
                    key = self.rows.spec.key.from_buffer_copy(key_bytes(peer, family, ns.netns))
                    row = self.rows.get(key)
                    if row is not None and (ns.netns in gone or row.last < before_ns):
                        n += self.rows.delete(key)
        return n

    def note(self, peer: Peer, family: int, netns: int, cgroup: int) -> None:
        """The row a reconnect made from the agent names the agent's cgroup: this names the
        socket's own, where its owner is found next time."""
        key = self.rows.spec.key.from_buffer_copy(key_bytes(peer, family, netns))
        self.rows.put(key, self.rows.spec.value.from_buffer_copy(_VAL.pack(cgroup, clock_ns())))
