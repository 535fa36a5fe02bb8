"""In-memory stand-ins for pinned BPF maps, keyed by the encoded bytes as the kernel keys them."""
import errno
import struct

from kproxy_ebpf.datapath.load.libbpf import BpfError
from kproxy_ebpf.datapath.maps import layout as L
from kproxy_ebpf.datapath.maps.pinned import MapFull


class FakeMap:
    def __init__(self, spec, max_entries=1000, on_op=None):
        self.spec, self.max_entries, self.on_op = spec, max_entries, on_op
        self.rows: dict[bytes, bytes] = {}
        self.ops: list[tuple[str, bytes]] = []
        self.batches = 0
        # Backend and Maglev rows are written once per id and never modified (no torn reads,
        # see writer and maglev_tables).
        self.immutable = spec.id in ("backend", "maglev")

    def _k(self, key):
        return L.raw(key)

    def get(self, key):
        data = self.rows.get(self._k(key))
        return None if data is None else self.spec.value.from_buffer_copy(data)

    def put(self, key, value):
        k = self._k(key)
        if self.immutable and k in self.rows:
            raise AssertionError(f"{self.spec.name}: row {k.hex()} rewritten in place")
        if k not in self.rows and len(self.rows) >= self.max_entries:
            raise MapFull(self.spec.name, self.max_entries) from BpfError(errno.E2BIG, "full")
        self.rows[k] = L.raw(value)
        self.ops.append(("put", k))
        if self.on_op:
            self.on_op()

    def delete(self, key):
        found = self.rows.pop(self._k(key), None) is not None
        self.ops.append(("delete", self._k(key)))
        if self.on_op:
            self.on_op()
        return found

    def put_batch(self, keys, values):
        """As the kernel: element by element, so checks run between any two."""
        self.batches += 1
        for k, v in zip(keys, values, strict=True):
            self.put(k, v)

    def delete_batch(self, keys):
        self.batches += 1
        for k in keys:
            self.delete(k)

    def unpacked(self):
        return [(struct.unpack(self.spec.key_format, k), struct.unpack(self.spec.value_format, v))
                for k, v in self.rows.items()]

    def keys(self):
        return [self.spec.key.from_buffer_copy(k) for k in self.rows]

    def items(self):
        return [(self.spec.key.from_buffer_copy(k), self.spec.value.from_buffer_copy(v))
                for k, v in self.rows.items()]

    def raw_items(self):
        return list(self.rows.items())


_STAT_KEY, _STAT = L.MAPS["svcstat"].key, L.MAPS["svcstat"].value


class PerCpuMap:
    """kp_svcstat as the kernel keeps it: one struct per CPU for each (svc_id, scope); count()
    adds what the programs would."""

    def __init__(self, cpus: int = 2):
        self.cpus, self.rows = cpus, {}

    def count(self, svc_id: int, cpu: int, scope: int = L.SCOPE_SOCK, **fields) -> None:
        row = self.rows.setdefault((svc_id, scope), [_STAT() for _ in range(self.cpus)])
        for name, n in fields.items():
            setattr(row[cpu], name, getattr(row[cpu], name) + n)

    def items(self):
        return [(_STAT_KEY(svc_id=i, scope=s), v) for (i, s), v in self.rows.items()]

    def keys(self):
        return [_STAT_KEY(svc_id=i, scope=s) for i, s in self.rows]

    def delete_batch(self, keys):
        for k in keys:
            self.rows.pop((k.svc_id, k.scope), None)

    def ids(self) -> set[int]:
        return {i for i, _ in self.rows}


def fake_maps(names=("svc", "backend", "meta"), on_op=None) -> dict:
    return {name: FakeMap(L.MAPS[name], on_op=on_op) for name in names}


def consistent(maps) -> None:
    """What a lookup can see right now is whole."""
    rows = {L.raw(k): v for k, v in maps["svc"].items()}
    backends = {k.value for k, _ in maps["backend"].items()}
    for key, val in maps["svc"].items():
        if key.slot:
            assert val.backend_id in backends, f"slot {key.slot} names a freed backend"
    ext = {L.raw(k) for k in maps["extaddr"].keys()} if "extaddr" in maps else None
    ext_be = {L.raw(k) for k in maps["extbe"].keys()} if "extbe" in maps else None
    be_addr = {k.value: v.addr for k, v in maps["backend"].items()} if ext_be is not None else {}
    for key, val in maps["svc"].items():
        if ext is not None and key.slot == 0 and key.scope == L.SCOPE_EXT:
            assert bytes(key.addr) in ext, f"{L.key_tuple(key)}: no kp_extaddr row"
        if key.slot != 0 or val.action != L.const("KP_ACTION_FORWARD"):
            continue
        for slot in range(1, val.count + 1):
            skey = L.SvcKey(addr=key.addr, port=key.port, proto=key.proto, scope=key.scope, slot=slot)
            row = rows.get(L.raw(skey))
            assert row is not None, f"slot {slot} of {L.key_tuple(key)} missing (count {val.count})"
            assert row.backend_id in backends, f"slot {slot} names a freed backend"
            if ext_be is not None and key.scope == L.SCOPE_EXT and row.be_flags & L.F_LOCAL:
                assert bytes(be_addr[row.backend_id]) in ext_be, \
                    f"slot {slot} of {L.key_tuple(key)}: its local backend has no kp_extbe row"
    if "maglev" in maps:
        consistent_tables(maps)


def maglev_tables(maps) -> dict[int, list[int]]:
    """Table id -> its entries (slot numbers), from the kp_maglev rows; every row's tag is
    its key's table."""
    rows: dict[int, dict[int, tuple]] = {}
    for (table, row), (tag, *slots) in maps["maglev"].unpacked():
        assert tag == table, f"kp_maglev row {table}/{row} tagged {tag}"
        rows.setdefault(table, {})[row] = slots
    return {t: [s for r in sorted(rs) for s in rs[r]] for t, rs in rows.items()}


def consistent_tables(maps) -> None:
    """A slot 0 naming a Maglev table finds all of its rows, and every entry a slot within
    its count."""
    tables = maglev_tables(maps)
    for key, val in maps["svc"].items():
        if key.slot or not val.backend_id:
            continue
        assert key.scope == L.SCOPE_EXT, f"{L.key_tuple(key)}: a table on a socket frontend"
        entries = tables.get(val.backend_id, [])
        assert len(entries) >= val.maglev_size, \
            f"{L.key_tuple(key)}: table {val.backend_id} has {len(entries)} of {val.maglev_size}"
        assert all(1 <= s <= val.count for s in entries[:val.maglev_size]), \
            f"{L.key_tuple(key)}: table {val.backend_id} names a slot beyond {val.count}"


def checked_maps(names=("svc", "backend", "meta"), max_entries=1000, **sizes) -> dict:
    """FakeMaps that run consistent() over all of them after every single operation;
    `sizes` gives a map its own max_entries."""
    m: dict = {}
    for name in names:
        m[name] = FakeMap(L.MAPS[name], max_entries=sizes.get(name, max_entries),
                          on_op=lambda: consistent(m))
    return m
