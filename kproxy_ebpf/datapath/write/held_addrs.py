"""Address rows held by frontends: the filters tc_lb.c reads before its conntrack and service
lookups (kp_extaddr: the addresses of scope-EXT frontends; kp_extbe: their local backends).

A row (key: an IPv4 address in network order; value 1, only its presence is read) exists while
some frontend holds its address. The writer holds an address before the slot 0 that needs it
and releases it after the slot 0 that stopped needing it, so the first hold writes the row and
the last release deletes it; here they are only counted.
"""
from __future__ import annotations

import logging
import struct
from collections import Counter
from collections.abc import Iterable

from kproxy_ebpf.datapath.maps import layout as L
from kproxy_ebpf.datapath.maps.pinned import MapFull, PinnedMap

from .batch import Writes

log = logging.getLogger(__name__)

_ROW = struct.pack("=I", 1)


class HeldAddrs:
    def __init__(self, bpf_map: PinnedMap) -> None:
        self.map = bpf_map
        self.refs: Counter[str] = Counter()

    def hold(self, addr: str, res, writes: Writes) -> None:
        """One more holder of addr; its row is written first (through the apply's `writes`,
        datapath/batch.py) if it had none (a failure raises before anything is counted)."""
        if not self.refs[addr]:
            writes.row(self.map, L.addr_key(addr), _ROW)
            res.writes += 1
        self.refs[addr] += 1

    def release(self, addr: str, res, writes: Writes) -> None:
        self.refs[addr] -= 1
        if not self.refs[addr]:
            del self.refs[addr]
            writes.drop(self.map, L.addr_key(addr))
            res.writes += 1

    def adopt(self, addr: str) -> None:
        """A holder found by restore(), whose row is already there."""
        self.refs[addr] += 1

    def restore(self, wanted: Iterable[str]) -> set[str]:
        """Makes the map hold exactly `wanted`: missing rows first (maps of an agent that kept
        none, before the programs that read them attach), then the stale ones deleted. Counts
        start again from zero (the caller adopts its holders). Returns the addresses whose row
        could not be written, each logged."""
        self.refs.clear()
        wanted = set(wanted)
        have = {L.ip_text(k) for k in self.map.keys()}
        failed = set()
        for addr in sorted(wanted - have):
            try:
                self.map.put(L.addr_key(addr), _ROW)
            except (MapFull, OSError) as exc:
                log.error("no %s row for %s (%s): packets from outside for it pass untranslated "
                          "until a sync writes it", self.map.spec.name, addr, exc)
                failed.add(addr)
        for addr in sorted(have - wanted):
            self.map.delete(L.addr_key(addr))
        return failed
