"""The compiled-program cache: loading the BPF programs again without clang.

A bcc compile costs ~2 s of CPU (LLVM) at every agent start although the programs only change
when their inputs do. So after a successful compile the load child records, per program, the
instructions bcc handed to the kernel (BPF.dump_func), its type, expected attach type and
license, and which map each BPF_PSEUDO_MAP_FD immediate referred to (by map id: the fd numbers
belong to that process). The entry is keyed by a hash of every input of the compile: each file
under bpf/, the -D flags (map sizes), the programs asked for, layout.py's map and struct specs,
the kernel release, bcc's version and the header tree. A later start with the same key opens
or creates the pinned maps through libbpf exactly as bcc would (type, key/value size,
max_entries, flags, name, pin path), substitutes their fds and loads the programs with
bpf_prog_load. Cilium does the same for its datapath objects (cilium/cilium
pkg/datapath/loader: hash.go takes a sha256 over the node configuration header it writes for
the compile, cache.go's ObjectCache maps that hash to the ELF object compiled for it under
templates/<hash>/). Cilium's loader relocates ELF objects itself; bcc gives no object file, so
the unit cached here is the relocated instruction stream with its map references recorded.

Anything wrong with an entry (missing, unreadable, another key, a map that differs, the
verifier says no) raises CacheMiss: the caller compiles as without a cache. Loading is all or
nothing: every program is loaded before any fd is handed on.

Differences from a bcc load, on purpose: maps the cache creates carry no BTF (bpftool dumps
them as hex) and programs no func/line info; the verifier needs neither.
"""
from __future__ import annotations

import base64
import hashlib
import importlib.util
import json
import os
import re
import struct
from pathlib import Path

from kproxy_ebpf.datapath.maps import kproxy_h as G
from kproxy_ebpf.datapath.maps.layout import MAPS, MapSpec
from kproxy_ebpf.datapath.maps.map_sizes import MapSizes

from . import libbpf

FORMAT = 1                # bump when the entry's shape changes
DEFAULT_DIR = "/var/cache/kproxy-ebpf/programs"

# enum bpf_map_type values for the KP_MAPS types (include/uapi/linux/bpf.h)
MAP_TYPES = {"hash": 1, "array": 2, "percpu_hash": 5, "percpu_array": 6, "lru_hash": 9,
             "lpm_trie": 11, "sk_storage": 24}
# enum bpf_prog_type, for the names progload.Program uses (bcc's BPF.<NAME>)
PROG_TYPES = {"SCHED_CLS": 3, "CGROUP_SOCK_ADDR": 18}

LD_IMM64 = 0x18                # BPF_LD | BPF_IMM | BPF_DW: the only insn carrying a map fd
PSEUDO_MAP_FD = 1
INSN = struct.Struct("<BBhi")   # code, dst:4|src:4, off, imm


class CacheMiss(Exception):
    """The cache cannot serve this start; str() says why (one log line). `expected` is True
    for the ordinary case of no entry yet (a first start), False for a real problem."""

    def __init__(self, reason: str, expected: bool = False):
        super().__init__(reason)
        self.expected = expected


# -- the key ---------------------------------------------------------------------------------
def bcc_version() -> str:
    """bcc's version, read from its package without importing it (the agent never imports
    bcc, and the cache path of the load child should not pay for loading LLVM)."""
    spec = importlib.util.find_spec("bcc")
    if spec is None or not spec.submodule_search_locations:
        return "none"
    text = (Path(list(spec.submodule_search_locations)[0]) / "version.py").read_text()
    m = re.search(r"""__version__\s*=\s*['"]([^'"]+)""", text)
    return m.group(1) if m else "unknown"


def key_inputs(bpf_root: Path, cflags: list[str], programs: list[dict], headers: str,
               kernel_release: str | None = None, bcc: str | None = None) -> dict:
    """Everything a compile's output depends on, as one JSON-able dict (stored in the entry,
    so a mismatch can be explained)."""
    files = {str(p.relative_to(bpf_root)): hashlib.sha256(p.read_bytes()).hexdigest()
             for p in sorted(bpf_root.rglob("*")) if p.is_file()}
    return {"format": FORMAT, "files": files, "cflags": list(cflags),
            "programs": programs, "maps": G.MAPS, "structs": G.STRUCTS,
            "kernel": kernel_release or os.uname().release, "bcc": bcc or bcc_version(),
            "headers": headers}


def cache_key(inputs: dict) -> str:
    return hashlib.sha256(json.dumps(inputs, sort_keys=True).encode()).hexdigest()


# -- map fd relocations ----------------------------------------------------------------------
def map_refs(insns: bytes, fd_to_map: dict[int, str]) -> list[list]:
    """[insn index, map id] for every map fd immediate in a program. Anything the cache could
    not reproduce (an fd of a map we do not know, map-value or BTF pseudo loads) raises
    CacheMiss, so such a program is never recorded."""
    if len(insns) % INSN.size:
        raise CacheMiss(f"program is {len(insns)} bytes, not whole instructions")
    refs, i, n = [], 0, len(insns) // INSN.size
    while i < n:
        code, regs, _, imm = INSN.unpack_from(insns, i * INSN.size)
        if code == LD_IMM64:
            src = regs >> 4
            if src == PSEUDO_MAP_FD:
                if imm not in fd_to_map:
                    raise CacheMiss(f"instruction {i} refers to fd {imm}, not a kproxy map")
                refs.append([i, fd_to_map[imm]])
            elif src != 0:
                raise CacheMiss(f"instruction {i}: ld_imm64 with src {src} is not cacheable")
            i += 2          # the second half of ld_imm64 is no instruction of its own
        else:
            i += 1
    return refs


def relocate(insns: bytes, refs: list[list], fds: dict[str, int]) -> bytes:
    """The instructions with each recorded map reference pointing at this process's fd."""
    out = bytearray(insns)
    for index, map_id in refs:
        off = index * INSN.size
        code, regs, o, _ = INSN.unpack_from(out, off)
        if code != LD_IMM64 or regs >> 4 != PSEUDO_MAP_FD:
            raise CacheMiss(f"entry is corrupt: instruction {index} is no map load")
        INSN.pack_into(out, off, code, regs, o, fds[map_id])
    return bytes(out)


# -- maps as bcc creates them ----------------------------------------------------------------
def map_shape(spec: MapSpec, sizes: MapSizes) -> dict:
    """What BPF_TABLE_PINNED creates for a KP_MAPS row (bcc names a map after its table)."""
    import ctypes

    return {"type": MAP_TYPES[spec.type], "key_size": ctypes.sizeof(spec.key),
            "value_size": ctypes.sizeof(spec.value),
            "max_entries": getattr(sizes, spec.id, None) or spec.default_size,
            "flags": G.MAPS[spec.id]["flags"], "name": spec.base[:15]}


def _differs(info, shape: dict) -> str | None:
    got = {"type": info.type, "key_size": info.key_size, "value_size": info.value_size,
           "flags": info.map_flags}
    want = {k: shape[k] for k in got}
    return None if got == want else f"has {got}, expected {want}"


def check_bcc_maps(fd_of: dict[str, int], sizes: MapSizes) -> None:
    """After a compile: the maps bcc holds must be what map_shape() would create, or the
    cache would create different maps than a compile (max_entries aside: an adopted map keeps
    the size it was created with)."""
    for mid, fd in fd_of.items():
        problem = _differs(libbpf.map_info(fd), map_shape(MAPS[mid], sizes))
        if problem:
            raise CacheMiss(f"bcc's map {MAPS[mid].name} {problem}")


def open_maps(bpffs_dir: Path, sizes: MapSizes) -> dict[str, int]:
    """An fd per map: the pinned one, or a new one pinned where bcc pins it."""
    fds: dict[str, int] = {}
    try:
        for mid, spec in MAPS.items():
            path = str(bpffs_dir / spec.name)
            shape = map_shape(spec, sizes)
            if not os.path.exists(path):
                fd = libbpf.map_create(shape["type"], shape["name"], shape["key_size"],
                                       shape["value_size"], shape["max_entries"], shape["flags"],
                                       btf=spec.per_socket)
                try:
                    libbpf.obj_pin(fd, path)
                except libbpf.BpfError:
                    os.close(fd)      # another process pinned it first: adopt that one
                    fd = libbpf.obj_get(path)
            else:
                fd = libbpf.obj_get(path)
            fds[mid] = fd
            problem = _differs(libbpf.map_info(fd), shape)
            if problem:
                raise CacheMiss(f"pinned map {path} {problem}")
    except BaseException:
        for fd in fds.values():
            os.close(fd)
        raise
    return fds


# -- entries ---------------------------------------------------------------------------------
def entry_path(cache_dir: Path, key: str) -> Path:
    return cache_dir / f"{key}.json"


def store(cache_dir: Path, key: str, inputs: dict, programs: list[dict]) -> Path:
    """Writes an entry atomically (a reader sees the old file or the whole new one).
    programs: name, prog_type (int), attach_type, license, kern_version, insns (bytes), refs."""
    # Root's alone: whoever can write an entry chooses the programs the agent loads.
    cache_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
    entry = {"key": key, "inputs": inputs, "programs": [
        {**p, "insns": base64.b64encode(p["insns"]).decode()} for p in programs]}
    path = entry_path(cache_dir, key)
    tmp = path.with_name(f".{path.name}.{os.getpid()}")
    with os.fdopen(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600), "w") as f:
        f.write(json.dumps(entry))
    os.replace(tmp, path)
    return path


def read(cache_dir: Path, key: str, names: list[str]) -> dict[str, dict]:
    """The recorded programs by name, or CacheMiss."""
    path = entry_path(cache_dir, key)
    try:
        entry = json.loads(path.read_text())
    except FileNotFoundError:
        raise CacheMiss(f"no entry {path.name} yet", expected=True) from None
    except (OSError, ValueError) as exc:
        raise CacheMiss(f"entry {path} unreadable: {exc}") from None
    try:
        if entry["key"] != key:
            raise CacheMiss(f"entry {path} holds key {entry['key']!r}")
        progs = {p["name"]: {**p, "insns": base64.b64decode(p["insns"], validate=True)}
                 for p in entry["programs"]}
    except (KeyError, TypeError, ValueError) as exc:
        raise CacheMiss(f"entry {path} is corrupt: {exc!r}") from None
    missing = [n for n in names if n not in progs]
    if missing:
        raise CacheMiss(f"entry {path} lacks {', '.join(missing)}")
    return progs


def load(cache_dir: Path, key: str, bpffs_dir: Path, sizes: MapSizes,
         names: list[str]) -> dict[str, int]:
    """An fd per program name, loaded from the cache; CacheMiss (and no fd left open)
    otherwise."""
    recorded = read(cache_dir, key, names)
    maps = open_maps(bpffs_dir, sizes)
    fds: dict[str, int] = {}
    try:
        for name in names:
            p = recorded[name]
            try:
                insns = relocate(p["insns"], p["refs"], maps)
                fds[name] = libbpf.prog_load(p["prog_type"], name, p["license"], insns,
                                             p["attach_type"] or 0, p.get("kern_version", 0))
            except libbpf.VerifierRejected as exc:
                tail = " | ".join(exc.log.strip().splitlines()[-3:])
                raise CacheMiss(f"the kernel rejected cached {name}: {exc.strerror}: "
                                f"{tail}") from None
            except (KeyError, TypeError, ValueError, OSError) as exc:
                raise CacheMiss(f"cached {name} could not be loaded: {exc!r}") from None
    except BaseException:
        for fd in fds.values():
            os.close(fd)
        raise
    finally:
        for fd in maps.values():
            os.close(fd)
    return fds


KEEP = 4    # entries kept: the current inputs and a few earlier ones (a rollback reuses them)


def touch(cache_dir: Path, key: str) -> None:
    """Marks an entry used (pruning keeps the most recently used)."""
    try:
        os.utime(entry_path(cache_dir, key))
    except OSError:
        pass


def prune(cache_dir: Path, keep: int = KEEP) -> list[str]:
    """Removes all but the `keep` most recently used entries (each upgrade adds one)."""
    entries = sorted(cache_dir.glob("*.json"), key=lambda p: p.stat().st_mtime, reverse=True)
    removed = []
    for old in entries[keep:]:
        old.unlink(missing_ok=True)
        removed.append(old.name)
    return removed


def remove(cache_dir: Path) -> list[str]:
    """Every entry (and the directory once empty): `kproxy-ebpf cleanup`. Only our files:
    the directory may be a hostPath an operator pointed elsewhere by mistake."""
    removed = []
    for entry in sorted(cache_dir.glob("*.json")) + sorted(cache_dir.glob(".*.json.*")):
        entry.unlink(missing_ok=True)
        removed.append(str(entry))
    try:
        cache_dir.rmdir()
        removed.append(str(cache_dir))
    except OSError:
        pass
    return removed
