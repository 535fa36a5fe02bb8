"""Decodes the pinned maps into plain dicts for the CLI (and for tests that look inside).

The same decoding serves `kproxy-ebpf services` and `kproxy-ebpf maps dump`, so what an
operator reads is what the kernel holds, not what the agent believes it wrote.
"""
from __future__ import annotations

import ctypes
import json
import os
import socket
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from . import layout as L
from .pinned import PinnedMap

STAT_NAMES = L.STAT_NAMES


def _service_name(meta: L.SvcMeta | None) -> str:
    if meta is None:
        return "?"
    name = f"{meta.namespace.decode()}/{meta.name.decode()}"
    return f"{name}:{meta.port_name.decode()}" if meta.port_name else name


def _policy(meta: L.SvcMeta | None) -> dict:
    if meta is None:
        return {}
    return L.policy_of((meta.flags, meta.health_check_node_port, meta.source_ranges,
                        meta.traffic_distribution))


def _cidr_order(cidr: str) -> tuple[bytes, int]:
    addr, _, bits = cidr.partition("/")
    return L.ip_bytes(addr), int(bits)


def services(maps: Mapping[str, PinnedMap]) -> list[dict]:
    """One entry per frontend: address, port, protocol, type, action, backends in slot order."""
    rows = list(maps["svc"].items())
    backends = {k.value: v for k, v in maps["backend"].items()}
    metas = {k.value: v for k, v in maps["meta"].items()} if "meta" in maps else {}
    slots: dict[tuple, dict[int, tuple[int, int]]] = {}
    ranges: dict[tuple, list[str]] = {}
    for rkey in maps["srcrange"].keys() if "srcrange" in maps else ():
        fkey, cidr = L.srcrange_of(rkey)
        ranges.setdefault(fkey, []).append(cidr)
    for key, val in rows:
        if key.slot:
            slots.setdefault((bytes(key.addr), key.port, key.proto, key.scope), {})[key.slot] = (
                val.backend_id, val.be_flags)
    out = []
    for key, val in rows:
        if key.slot:
            continue
        ip, port, proto = L.key_tuple(key)
        entry = {
            "address": ip, "port": port, "protocol": proto.value,
            "type": L.KIND_BY_NUM[val.kind].value if val.kind in L.KIND_BY_NUM else f"kind-{val.kind}",
            "service": _service_name(metas.get(val.svc_id)), "service_id": val.svc_id,
            "action": L.ACTION_BY_NUM[val.action].value if val.action in L.ACTION_BY_NUM
            else str(val.action),
            "affinity_timeout": val.affinity_timeout, "scope": key.scope,
            "policy": _policy(metas.get(val.svc_id)), "backends": [],
        }
        # How a new connection picks its backend: by the frontend's Maglev table (kp_maglev),
        # of this many entries; by a scheduler (lib/sched.h); at random.
        entry["algorithm"] = ("maglev" if val.backend_id and not val.fe_flags & L.SCHED_ANY
                              else L.scheduler_of(val.fe_flags).value)
        if entry["algorithm"] == "maglev":
            entry["maglev"] = val.maglev_size
        if val.fe_flags & L.FE_F_SRC_RANGES:
            # loadBalancerSourceRanges as enforced (kp_srcrange): the sources a new flow
            # from outside may come from.
            entry["source_ranges"] = sorted(ranges.get(L.frontend_key(key), []),
                                            key=_cidr_order)
        mine = slots.get((bytes(key.addr), key.port, key.proto, key.scope), {})
        for slot in range(1, val.count + 1):
            bid, flags = mine.get(slot, (None, 0))
            be = backends.get(bid) if bid is not None else None
            if be is None:
                entry["backends"].append({"slot": slot, "id": bid, "missing": True})
                continue
            entry["backends"].append({
                "slot": slot, "id": bid, "address": L.ip_str(be.addr),
                "port": L.port_host(be.port), "state": L.backend_state(flags)})
        out.append(entry)
    out.sort(key=lambda e: (e["service"], e["type"], e["address"], e["port"], e["protocol"]))
    return out


# Fields whose integer is a constant of the header, named by it (the prefix of its enum).
_ENUM_FIELDS = {"action": "KP_ACTION_", "kind": "KP_KIND_", "scope": "KP_SCOPE_"}
# Fields whose bits are flags of the header.
_FLAG_FIELDS = {"be_flags": "KP_BE_F_", "fe_flags": "KP_FE_F_"}


def _flags(value: int, prefix: str) -> list[str]:
    names = L.enum_names(prefix)
    out = [names[bit] for bit in sorted(names) if value & bit]
    rest = value & ~sum(names)
    return out + ([hex(rest)] if rest else [])


def _field(name: str, spelled: str, value) -> Any:
    """One field as the header types it: __be integers in host order, an address as text
    (None when it is all zeros: no address, e.g. a flow without SNAT), a constant by name."""
    if spelled == "struct kp_ip":
        return L.ip_str(value) if any(bytes(value)) else None
    if spelled == "be16":
        return socket.ntohs(value)
    if spelled == "be32":
        return socket.ntohl(value)
    if name == "proto":
        return L.PROTO_BY_NUM[value].value if value in L.PROTO_BY_NUM else value
    if name in _ENUM_FIELDS:
        return L.enum_names(_ENUM_FIELDS[name]).get(value, value)
    if name in _FLAG_FIELDS:
        return _flags(value, _FLAG_FIELDS[name])
    return _plain(value)


def _plain(obj) -> Any:
    """ctypes value -> JSON-able, each struct field decoded by its type in bpf/kproxy.h."""
    if isinstance(obj, bytes):          # a char[] field reads as bytes
        return obj.decode(errors="replace")
    if isinstance(obj, L.IP16):         # struct kp_ip
        return L.ip_text(obj)
    if isinstance(obj, ctypes.Array):
        if obj._type_ is ctypes.c_char:
            return obj.value.decode(errors="replace")
        return [_plain(x) for x in obj]
    if isinstance(obj, ctypes._SimpleCData):
        return obj.value
    if not isinstance(obj, ctypes.Structure):
        return obj
    types = {f: t for f, _, t in L.STRUCT_SPECS[type(obj).__name__]["fields"]}
    return {name: _field(name, types[name], getattr(obj, name))
            for name, *_ in obj._fields_ if name != "pad"}


# A kp_svc row's fields by what it is (kproxy.h): slot 0 describes the frontend, a slot n
# names a backend; the other fields of each are zero and mean nothing there.
_SLOT_FIELDS = ("backend_id", "be_flags")


def _svc_row(slot: int, value: dict) -> dict:
    if slot:
        return {k: value[k] for k in _SLOT_FIELDS}
    head = {k: v for k, v in value.items() if k != "be_flags"}
    # slot 0's backend_id: a least-conn frontend's kp_lcrow row, else its Maglev table
    lc = "least_conn" in head.get("fe_flags", ())
    head["lc_row" if lc else "maglev_table"] = head.pop("backend_id")
    return head


def dump(m: PinnedMap) -> list[dict]:
    """Every row of a map, decoded; per-CPU values are summed (and listed per CPU)."""
    rows = []
    for key, value in m.items():
        if m.spec.by_addr:                  # clusterip, extaddr, extbe
            row = {"key": L.ip_text(key), "value": _plain(value)}
        elif m.spec.percpu:
            per_cpu = [_plain(v) for v in value]
            # a counter's total; a per-CPU struct (kp_scratch) has none
            total = sum(per_cpu) if all(isinstance(v, int) for v in per_cpu) else None
            row = {"key": _plain(key), "value": total, "per_cpu": per_cpu}
            if m.spec.id == "stats":
                row["counter"] = STAT_NAMES.get(key.value, str(key.value))
        else:
            row = {"key": _plain(key), "value": _plain(value)}
            if m.spec.id == "svc":
                row["value"] = _svc_row(key.slot, row["value"])
        rows.append(row)
    rows.sort(key=lambda r: json.dumps(r["key"], sort_keys=True))
    if m.spec.id in ("affinity", "flow"):
        now = time.clock_gettime_ns(time.CLOCK_MONOTONIC)
        for row in rows:
            row["value"]["age_seconds"] = round((now - row["value"]["last_used"]) / 1e9, 1)
    return rows


def counters(m: PinnedMap) -> dict[str, int]:
    return {r["counter"]: r["value"] for r in dump(m) if r.get("counter") in STAT_NAMES.values()}


def hooks(bpffs_dir: Path, cgroup_roots: tuple[str, ...] = ("/sys/fs/cgroup/unified", "/sys/fs/cgroup")
          ) -> list[dict]:
    """The pinned links: which program each socket hook runs and on which cgroup."""
    from kproxy_ebpf.datapath.load import libbpf
    from kproxy_ebpf.datapath.load.sock_hooks import SOCK_HOOKS

    out = []
    for _prog, (attach_type, pin) in SOCK_HOOKS.items():
        path = bpffs_dir / "links" / pin
        row: dict = {"hook": pin, "pinned": path.exists()}
        if path.exists():
            fd = libbpf.obj_get(str(path))
            try:
                info = libbpf.link_info(fd)
            finally:
                os.close(fd)
            row.update(link_id=info.id, prog_id=info.prog_id, cgroup_id=info.cgroup_id,
                       attach_type_ok=info.attach_type == attach_type,
                       cgroup=_cgroup_path(info.cgroup_id, cgroup_roots))
        out.append(row)
    return out


def _cgroup_path(cgroup_id: int, roots: tuple[str, ...], max_depth: int = 6) -> str | None:
    """A cgroup v2 id is its directory's inode number: find the directory (bounded walk)."""
    for root in roots:
        base = Path(root)
        if not (base / "cgroup.controllers").exists():     # not a cgroup v2 mount
            continue
        stack = [(base, 0)]
        while stack:
            path, depth = stack.pop()
            try:
                if os.stat(path).st_ino == cgroup_id:
                    return str(path)
                if depth < max_depth:
                    stack.extend((p, depth + 1) for p in path.iterdir() if p.is_dir())
            except OSError:
                continue
    return None
