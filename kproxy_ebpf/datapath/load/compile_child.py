"""The load child: compiles the BPF programs with bcc, or loads them from the program cache,
and pins each one into its parent's staging directory; then it exits.

    python -m kproxy_ebpf.datapath.load.compile_child REQUEST_JSON     (started by progload.py)

Only this process imports bcc (progload.py says why the agent never does). Each program file is
compiled against the maps pinned in the bpffs directory (bcc adopts them, or creates and pins
them), and bcc's view of every map is checked against layout.py before a program is loaded.
With a program cache (progcache.py) the child first tries the programs an earlier compile with
the same inputs recorded, without bcc or clang, and records them after a compile otherwise.
Its last stdout line is a JSON status for the parent; a layout mismatch exits EXIT_LAYOUT.

The datapath tests compile in their own process with compile_program().
"""
from __future__ import annotations

import ctypes
import json
import os
import signal
import sys
from dataclasses import asdict
from pathlib import Path

from kproxy_ebpf.datapath.maps.layout import MAPS, STRUCTS
from kproxy_ebpf.datapath.maps.map_sizes import MapSizes
from kproxy_ebpf.datapath.maps.pinned import LayoutMismatch

from . import libbpf, progcache
from .bpffs import ensure_bpffs
from .paths import bpf_dir, kernel_headers
from .source import expand

PR_SET_PDEATHSIG = 1
EXIT_LAYOUT = 3           # the exit code for a layout mismatch (the parent re-raises it as such)


def size_cflags(sizes: MapSizes) -> list[str]:
    """The configured map sizes as the -D knobs of KP_MAPS."""
    return [f"-D{MAPS[name].size_macro}={value}" for name, value in asdict(sizes).items()]


def program_cflags(bpffs_dir: Path, sizes: MapSizes | None = None) -> list[str]:
    """The include path and defines every program is compiled with (tools/bpflint.py
    compiles with them too)."""
    return [f"-I{bpf_dir()}", f'-DKP_PIN_DIR="{bpffs_dir}"', *size_cflags(sizes or MapSizes())]


def compile_program(source: Path, bpffs_dir: Path, sizes: MapSizes | None = None):
    """Compiles one program file with bcc against the maps pinned in bpffs_dir (adopting
    them, or creating and pinning them)."""
    os.environ.setdefault("BCC_KERNEL_SOURCE", str(kernel_headers()))
    from bcc import BPF  # late: importing this module must not load LLVM

    ensure_bpffs(bpffs_dir)
    cflags = [*program_cflags(bpffs_dir, sizes), "-Wno-macro-redefined"]
    return BPF(text=expand(source).encode(), cflags=cflags)


def check_bcc_layout(bpf) -> None:
    """Refuses to run if bcc's view of a map (from the compiled C) differs from layout.py."""
    for spec in MAPS.values():
        if spec.per_socket:     # bcc has no table class for it; check_bcc_maps checks its sizes
            continue
        table = bpf[spec.base.encode()]
        leaf = table.Leaf
        if spec.percpu and issubclass(leaf, ctypes.Array):   # bcc: one value per CPU
            leaf = leaf._type_
        for ours, theirs in ((spec.key, table.Key), (spec.value, leaf)):
            if ctypes.sizeof(ours) != ctypes.sizeof(theirs):
                raise LayoutMismatch(f"{spec.name}: {ours.__name__} is {ctypes.sizeof(ours)} "
                                     f"bytes, the compiled map says {ctypes.sizeof(theirs)}")
            if ours in STRUCTS.values() and issubclass(ours, ctypes.Structure):
                for fname, *_ in ours._fields_:
                    if getattr(ours, fname).offset != getattr(theirs, fname).offset:
                        raise LayoutMismatch(f"{spec.name}: field {fname} offset differs")


def _child(request: dict) -> dict:
    """Loads the programs into the stage; returns the status line for the parent."""
    bpffs, stage = Path(request["bpffs_dir"]), Path(request["stage"])
    sizes = MapSizes(**request["sizes"])
    stage.mkdir()
    cache_dir = Path(request["cache_dir"]) if request.get("cache_dir") else None
    if cache_dir is None:
        _compile(request["programs"], bpffs, sizes, stage)
        return {"cache": "off"}
    inputs = cache_inputs(request["programs"], sizes)
    key = progcache.cache_key(inputs)
    names = [p["name"] for p in request["programs"]]
    try:
        fds = progcache.load(cache_dir, key, bpffs, sizes, names)
    except progcache.CacheMiss as exc:
        status = {"cache": "miss" if exc.expected else "fallback", "reason": str(exc)}
    else:
        for name, fd in fds.items():
            libbpf.obj_pin(fd, str(stage / name))
        progcache.touch(cache_dir, key)
        return {"cache": "hit", "key": key}
    records = _compile(request["programs"], bpffs, sizes, stage)
    try:
        if isinstance(records, str):
            raise progcache.CacheMiss(records)
        status["stored"] = str(progcache.store(cache_dir, key, inputs, records))
        progcache.prune(cache_dir)
    except (progcache.CacheMiss, OSError) as exc:
        status["store_error"] = str(exc)
    return status


def cache_inputs(programs: list[dict], sizes: MapSizes) -> dict:
    """The program cache's key inputs for this request. The compile flags without the pin
    directory and the include path: neither reaches the instructions (the maps are recorded
    by id, bpf/'s files by content), so labs and nodes with other paths share entries."""
    try:
        headers = str(kernel_headers())
    except FileNotFoundError:
        headers = "none"
    return progcache.key_inputs(bpf_dir(), ["-Wno-macro-redefined", *size_cflags(sizes)],
                                programs, headers)


def _compile(programs: list[dict], bpffs: Path, sizes: MapSizes, stage: Path) -> list | str:
    """Compiles with bcc and pins each program into the stage. Returns what the program
    cache records of each, or why they cannot be recorded."""
    from bcc import BPF
    from bcc.libbcc import lib as bcc_lib

    compiled, records, why_not = {}, [], ""
    for p in programs:
        if p["source"] not in compiled:
            compiled[p["source"]] = bpf = compile_program(bpf_dir() / p["source"], bpffs, sizes)
            check_bcc_layout(bpf)
        bpf = compiled[p["source"]]
        kwargs = {} if p["attach_type"] is None else {"attach_type": p["attach_type"]}
        prog_type = getattr(BPF, p["prog_type"])
        fn = bpf.load_func(p["name"].encode(), prog_type, **kwargs)
        libbpf.obj_pin(fn.fd, str(stage / p["name"]))
        if why_not:
            continue
        try:
            fd_of = {mid: bcc_lib.bpf_table_fd(bpf.module, spec.base.encode())
                     for mid, spec in MAPS.items()}
            progcache.check_bcc_maps(fd_of, sizes)
            records.append({
                "name": p["name"], "prog_type": prog_type, "attach_type": p["attach_type"],
                "license": bcc_lib.bpf_module_license(bpf.module).decode(),
                "kern_version": bcc_lib.bpf_module_kern_version(bpf.module),
                "insns": bpf.dump_func(p["name"].encode()),
                "refs": progcache.map_refs(bpf.dump_func(p["name"].encode()),
                                           {fd: mid for mid, fd in fd_of.items()})})
        except progcache.CacheMiss as exc:
            why_not = f"{p['name']}: {exc}"
    return why_not or records


def _die_with_parent() -> None:
    """The child is no use once the agent that wanted it is gone (PR_SET_PDEATHSIG)."""
    parent = os.getppid()
    ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    if os.getppid() != parent:       # the parent died before prctl
        sys.exit(1)


def main() -> None:
    _die_with_parent()
    try:
        print(json.dumps(_child(json.loads(sys.argv[1]))), flush=True)
    except LayoutMismatch as exc:
        print(f"{exc}", file=sys.stderr)
        sys.exit(EXIT_LAYOUT)
    except Exception as exc:     # noqa: BLE001 - the parent reports it
        import traceback

        traceback.print_exc()
        print(f"{type(exc).__name__}: {exc}", file=sys.stderr)
        sys.exit(1)


if __name__ == "__main__":
    main()
