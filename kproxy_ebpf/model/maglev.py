"""Maglev consistent hashing (Eisenbud et al., "Maglev: A Fast and Reliable Software Network
Load Balancer", NSDI 2016, section 3.4) for scope-EXT frontends.

A table of `size` entries (a prime) names a backend for each entry; a flow goes to the entry
its hash (flow_hash, the twin of bpf/lib/maglev.h) picks. Each backend walks its own
permutation of the entries, (offset + j * skip) mod size, with offset and skip from a hash of
its address and port only, and the backends take turns claiming the next free entry of their
permutation. So every node with the same backends builds the same table, each backend holds
size / E entries (give or take one), and removing one of E backends moves little more than
its own 1/E of the entries.

Pure: no kernel, no network. The writer (datapath/maglev_tables.py) turns a table into rows.
"""
from __future__ import annotations

import hashlib
import ipaddress
from collections.abc import Sequence
from functools import lru_cache

# Table sizes the agent accepts: primes, so that every skip (1..size-1) is coprime with the
# size and each permutation visits every entry. The largest fits the kernel row's u16 slot
# index space (kproxy.h KP_MAGLEV_MAX).
MIN_SIZE = 251
MAX_SIZE = 65521
DEFAULT_SIZE = 16381
# Entries per backend a table grows to. 100 keeps each backend's share within 1 % of uniform
# (the paper's M >= 100 N), but removing one of E backends then moves up to 3.5 % more than
# its own 1/E; from 1000 the excess stays below 1 % (measured: E = 3..650, a backend removed,
# 0.1-0.85 %; docs/measurements.md "Maglev"). Past MAX_SIZE / 100 backends a table cannot
# give each even 100 (proxy/external.py reports such a Service).
ENTRIES_PER_BACKEND = 1000
MIN_PER_BACKEND = 100
SEED = 0x6B70726F              # kproxy.h KP_MAGLEV_SEED
_M32 = 0xFFFFFFFF


def is_prime(n: int) -> bool:
    if n < 2:
        return False
    if n % 2 == 0:
        return n == 2
    f = 3
    while f * f <= n:
        if n % f == 0:
            return False
        f += 2
    return True


def next_prime(n: int) -> int:
    while not is_prime(n):
        n += 1
    return n


def table_size(configured: int, backends: int) -> int:
    """The entries of a frontend's table: the configured size, or the smallest prime that
    gives each backend ENTRIES_PER_BACKEND, whichever is larger, at most MAX_SIZE (the
    configured size is the floor)."""
    need = backends * ENTRIES_PER_BACKEND
    if need <= configured:
        return configured
    return MAX_SIZE if need >= MAX_SIZE else min(next_prime(need), MAX_SIZE)


def validate_size(size: int) -> str | None:
    """Why `size` cannot be a table size, or None."""
    if not MIN_SIZE <= size <= MAX_SIZE or not is_prime(size):
        return (f"maglevTableSize must be a prime between {MIN_SIZE} and {MAX_SIZE} (16381 by "
                f"default; 4093, 32749 and 65521 are others), not {size}")
    return None


def _name(backend: tuple[str, int]) -> bytes:
    ip, port = backend
    return ipaddress.ip_address(ip).packed + port.to_bytes(2, "big")


def _offset_skip(backend: tuple[str, int], size: int) -> tuple[int, int]:
    digest = hashlib.blake2b(_name(backend), digest_size=16).digest()
    h1, h2 = int.from_bytes(digest[:8], "big"), int.from_bytes(digest[8:], "big")
    return h1 % size, h2 % (size - 1) + 1


def build(backends: Sequence[tuple[str, int]], size: int) -> list[int]:
    """The table: entry i holds the index in `backends` of the backend that entry i names.
    The result does not depend on the order of `backends` (ties go by the backends' sorted
    order); [] without backends."""
    return list(_build(tuple(backends), size))


@lru_cache(maxsize=256)
def _build(backends: tuple[tuple[str, int], ...], size: int) -> tuple[int, ...]:
    """Cached: the frontends of one Service (node addresses, LB IPs, ports) share a table,
    and an unchanged backend set is asked for again at every sync that touches it."""
    if not backends:
        return ()
    order = sorted(range(len(backends)), key=lambda i: backends[i])
    walks = [_offset_skip(backends[i], size) for i in order]
    table = [-1] * size
    step = [0] * len(order)            # how far each backend has walked its permutation
    filled = 0
    while True:
        for turn, i in enumerate(order):
            offset, skip = walks[turn]
            j = step[turn]
            c = (offset + j * skip) % size
            while table[c] >= 0:
                j += 1
                c = (offset + j * skip) % size
            table[c] = i
            step[turn] = j + 1
            filled += 1
            if filled == size:
                return tuple(table)


def _mix(h: int, k: int) -> int:
    k = (k * 0xCC9E2D51) & _M32
    k = ((k << 15) | (k >> 17)) & _M32
    k = (k * 0x1B873593) & _M32
    h ^= k
    h = ((h << 13) | (h >> 19)) & _M32
    return (h * 5 + 0xE6546B64) & _M32


def flow_hash(client_ip: str, client_port: int, frontend_port: int, proto: int) -> int:
    """bpf/lib/maglev.h kp_flow_hash of a flow from outside: what picks its table entry."""
    addr = ipaddress.ip_address(client_ip)
    raw = (addr.packed if addr.version == 6
           else b"\0" * 10 + b"\xff\xff" + addr.packed)     # IPv4-mapped, as struct kp_ip
    h = SEED
    for i in range(4):
        h = _mix(h, int.from_bytes(raw[4 * i:4 * i + 4], "big"))
    h = _mix(h, (client_port << 16) | frontend_port)
    h = _mix(h, proto)
    h ^= 24
    h ^= h >> 16
    h = (h * 0x85EBCA6B) & _M32
    h ^= h >> 13
    h = (h * 0xC2B2AE35) & _M32
    return h ^ (h >> 16)
