"""Typed access to one pinned BPF map, checked against its layout when opened."""
from __future__ import annotations

import ctypes
import errno
import os
import struct
from collections.abc import Iterator
from functools import lru_cache
from pathlib import Path

from kproxy_ebpf.datapath.load import libbpf

from .layout import MapSpec, raw

ENOTSUPP = 524     # the kernel's internal "not supported", which bpf() can return


class LayoutMismatch(RuntimeError):
    """A pinned map's key/value sizes differ from layout.py: never write into it."""


class MapFull(RuntimeError):
    """The map has no room for a new entry (E2BIG): raise its size in the configuration."""

    def __init__(self, name: str, max_entries: int):
        super().__init__(f"BPF map {name} is full ({max_entries} entries): raise its size "
                         f"in the agent configuration (map sizes)")
        self.map_name, self.max_entries = name, max_entries


@lru_cache(maxsize=1)
def _possible_ranges() -> tuple[tuple[int, int], ...]:
    """/sys/devices/system/cpu/possible ("0-3", "0-3,8-11") as inclusive ranges."""
    text = Path("/sys/devices/system/cpu/possible").read_text().strip()
    return tuple((int(lo), int(hi or lo))
                 for lo, _, hi in (part.partition("-") for part in text.split(",")))


def possible_cpus() -> int:
    """Per-CPU maps return one value per possible CPU (not online): their count."""
    return sum(hi - lo + 1 for lo, hi in _possible_ranges())


def cpu_id_bound() -> int:
    """Above every id bpf_get_smp_processor_id() can return: the highest possible CPU + 1,
    more than possible_cpus() when the list has gaps."""
    return max(hi for _, hi in _possible_ranges()) + 1


def _packed(rows: list) -> bytes:
    """Rows (ctypes objects or their packed bytes) back to back, as the batch calls want."""
    try:
        return b"".join(rows)           # the writer's rows: packed already
    except TypeError:
        return b"".join(map(raw, rows))


class PinnedMap:
    def __init__(self, path: str | Path, spec: MapSpec):
        self.path, self.spec = str(path), spec
        self.fd = libbpf.obj_get(self.path)
        try:
            info = libbpf.map_info(self.fd)
            want = (ctypes.sizeof(spec.key), ctypes.sizeof(spec.value))
            if (info.key_size, info.value_size) != want:
                raise LayoutMismatch(
                    f"{self.path}: kernel map has key/value {info.key_size}/{info.value_size} "
                    f"bytes, layout.py expects {want[0]}/{want[1]}")
            self.max_entries = info.max_entries
        except BaseException:
            os.close(self.fd)
            raise
        self._values = possible_cpus() if spec.percpu else 1

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1

    def __enter__(self) -> PinnedMap:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def _new_value(self):
        return (self.spec.value * self._values)() if self.spec.percpu else self.spec.value()

    def get(self, key):
        value = self._new_value()
        return value if libbpf.map_lookup(self.fd, key, value) else None

    def put(self, key, value) -> None:
        try:
            libbpf.map_update(self.fd, key, value)
        except libbpf.BpfError as exc:
            if exc.errno == errno.E2BIG:
                raise MapFull(self.spec.name, self.max_entries) from exc
            raise

    def delete(self, key) -> bool:
        return libbpf.map_delete(self.fd, key)

    def put_batch(self, keys: list, values: list) -> None:
        """Writes every (key, value) in order, one syscall per _BATCH entries (the kernel
        applies them one by one, so readers see the same order as with single puts). Keys and
        values are ctypes objects or their packed bytes."""
        for i in range(0, len(keys), self._BATCH):
            ks, vs = keys[i:i + self._BATCH], values[i:i + self._BATCH]
            try:
                libbpf.map_update_batch(self.fd, _packed(ks), _packed(vs), len(ks))
            except libbpf.BpfError as exc:
                if exc.errno == errno.E2BIG:
                    raise MapFull(self.spec.name, self.max_entries) from exc
                raise

    def delete_batch(self, keys: list) -> None:
        """Deletes every key in order; keys already gone are skipped (one by one)."""
        i = 0
        while i < len(keys):
            chunk = keys[i:i + self._BATCH]
            try:
                i += libbpf.map_delete_batch(self.fd, _packed(chunk), len(chunk))
            except libbpf.BpfError as exc:
                if exc.errno != errno.ENOENT:
                    raise
                i += exc.done + 1      # the missing key: nothing to delete

    def keys(self) -> list:
        """A snapshot of the keys (iterating while deleting restarts a hash walk)."""
        out: list = []
        prev = None
        while True:
            nxt = self.spec.key()
            if not libbpf.map_next_key(self.fd, prev, nxt):
                return out
            out.append(nxt)
            prev = nxt

    def items(self) -> Iterator[tuple]:
        """Every (key, value). Hash maps are read in batches (one syscall per 1024 entries);
        a kernel or map type without batch support falls back to key-by-key reads."""
        try:
            yield from self._items_batched()
            return
        except libbpf.BpfError as exc:
            if exc.errno not in (errno.EINVAL, ENOTSUPP, errno.EOPNOTSUPP):
                raise
        for key in self.keys():
            value = self.get(key)
            if value is not None:       # deleted since the snapshot
                yield key, value

    _BATCH = 1024

    def unpacked(self) -> UnpackedRows:
        """Every (key, value) as plain tuples (the spec's struct formats: pads dropped), read
        in batches and decoded without a Python object per field: what restore() wants at
        100,000 rows. The rows stay packed until iterated (see UnpackedRows)."""
        return UnpackedRows(self.spec.key_format, self.spec.value_format,
                            list(self._raw_batches()))

    def raw_items(self) -> list[tuple[bytes, bytes]]:
        """Every (key, value) as the kernel's bytes, read in batches."""
        ks, vs = ctypes.sizeof(self.spec.key), ctypes.sizeof(self.spec.value)
        return [(keys[i * ks:(i + 1) * ks], values[i * vs:(i + 1) * vs])
                for keys, values in self._raw_batches() for i in range(len(keys) // ks)]

    def _raw_batches(self) -> Iterator[tuple[bytes, bytes]]:
        """The map's rows as (keys, values) byte strings of up to _BATCH rows each."""
        if self.spec.percpu:
            raise TypeError("per-CPU maps hold one value per CPU: use items()")
        ks, vs = ctypes.sizeof(self.spec.key), ctypes.sizeof(self.spec.value)
        keys = (ctypes.c_uint8 * (ks * self._BATCH))()
        values = (ctypes.c_uint8 * (vs * self._BATCH))()
        token, nxt = None, self._token()
        while True:
            n, done = libbpf.map_lookup_batch(self.fd, token, nxt, keys, values, self._BATCH)
            yield bytes(keys)[:n * ks], bytes(values)[:n * vs]
            if done:
                return
            token, nxt = nxt, self._token()

    def _items_batched(self) -> list[tuple]:
        # Collected first: a caller deleting while we yield would disturb the bucket walk.
        # A per-CPU map's row holds a value per possible CPU, each 8-byte aligned (every
        # per-CPU value in kproxy.h is a multiple of 8 bytes): the row type of get().
        row = type(self._new_value())
        out: list[tuple] = []
        keys = (self.spec.key * self._BATCH)()
        values = (row * self._BATCH)()
        token, nxt = None, self._token()
        while True:
            n, done = libbpf.map_lookup_batch(self.fd, token, nxt, keys, values)
            ks, vs = ctypes.sizeof(self.spec.key), ctypes.sizeof(row)
            out.extend((self.spec.key.from_buffer_copy(keys, i * ks),
                        row.from_buffer_copy(values, i * vs)) for i in range(n))
            if done:
                return out
            token, nxt = nxt, self._token()

    def _token(self) -> ctypes.Array:
        """A batch walk's position. Hash maps keep a u32 bucket index there, but arrays and
        LPM tries (generic_map_lookup_batch, kernel/bpf/syscall.c) write the last key read,
        key_size bytes: a smaller buffer is overrun (the v3 layout's 20- and 40-byte LPM keys
        corrupted the heap and crashed `status`)."""
        return (ctypes.c_uint8 * max(8, ctypes.sizeof(self.spec.key)))()

    def __len__(self) -> int:
        return sum(1 for _ in self.items())


class UnpackedRows:
    """A map's rows read at one moment, kept as the kernel's packed batches and decoded into
    (key, value) tuples each time they are iterated. A full sync's re-read walks its 500,000
    slot rows twice: decoded all at once they were ~300 MiB of small tuples held at the same
    time, whose freed pymalloc arenas stayed in the agent's RSS; packed they are ~30 MiB of
    large buffers, returned to the system when dropped."""

    __slots__ = ("_key", "_value", "_batches")

    def __init__(self, key_format: str, value_format: str,
                 batches: list[tuple[bytes, bytes]]) -> None:
        self._key, self._value = struct.Struct(key_format), struct.Struct(value_format)
        self._batches = batches

    def __iter__(self) -> Iterator[tuple[tuple, tuple]]:
        kf, vf = self._key, self._value
        for keys, values in self._batches:
            yield from zip(kf.iter_unpack(keys), vf.iter_unpack(values), strict=True)

    def __len__(self) -> int:
        return sum(len(keys) for keys, _ in self._batches) // self._key.size
