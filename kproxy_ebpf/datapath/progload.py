"""Compiling and loading the BPF programs in a child process.

bcc links LLVM: importing it maps ~60 MiB and a compile leaves ~25 MiB more of heap that glibc
does not give back, all resident in the agent for its whole life although it is needed for one
second at start. So a child process does the bcc part and exits: it compiles each program file
against the maps pinned in the bpffs directory (adopting them, or creating and pinning them),
checks bcc's view of every map against layout.py, loads the programs and pins each one into a
private staging directory. With a program cache (datapath/progcache.py) the child first tries
to load the programs recorded by an earlier compile with the same inputs, without bcc or clang,
and records them after a compile otherwise. The agent opens those pins with BPF_OBJ_GET (datapath/libbpf.py),
unpins them and attaches the programs itself; it never imports bcc. The child runs while the
agent lists the cluster, so the compile is off the cold start's critical path.

    python -m kproxy_ebpf.datapath.progload REQUEST_JSON     (the child; see spawn())
"""
from __future__ import annotations

import ctypes
import json
import logging
import os
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from ..config import MapSizes
from . import libbpf, progcache
from .pinned import LayoutMismatch

log = logging.getLogger(__name__)

# program types (enum bpf_prog_type, as bcc's BPF.<NAME> constants)
SCHED_CLS = "SCHED_CLS"
CGROUP_SOCK_ADDR = "CGROUP_SOCK_ADDR"
PR_SET_PDEATHSIG = 1
EXIT_LAYOUT = 3           # the child's exit code for a layout mismatch (re-raised as such)


class LoadError(RuntimeError):
    """The child could not compile or load a program; the message is its error."""


@dataclass(frozen=True)
class Program:
    source: str           # file under bpf/
    name: str             # function name in the source
    prog_type: str        # SCHED_CLS or CGROUP_SOCK_ADDR
    attach_type: int | None = None     # expected attach type (sock_addr programs need one)


class LoadJob:
    """A running child; result() waits for it and hands back an fd per program name."""

    def __init__(self, bpffs_dir: Path, programs: list[Program], sizes: MapSizes,
                 cache_dir: Path | None = None):
        self.bpffs_dir = bpffs_dir
        self.stage = bpffs_dir / f"stage_{os.getpid()}_{time.monotonic_ns()}"
        self.programs = programs
        self.cache_result = "off"     # hit, miss (no entry yet), fallback (a bad entry) or off
        request = {"bpffs_dir": str(bpffs_dir), "stage": str(self.stage),
                   "sizes": asdict(sizes), "programs": [asdict(p) for p in programs],
                   "cache_dir": str(cache_dir) if cache_dir else None}
        self.started = time.monotonic()
        # stderr into a file, not a pipe: a chatty compile must never block on a full pipe
        # while the agent is busy listing.
        self._err = tempfile.TemporaryFile(mode="w+")
        self._out = tempfile.TemporaryFile(mode="w+")     # the child's status line
        self._proc = subprocess.Popen([sys.executable, "-m", __name__, json.dumps(request)],
                                      stdout=self._out, stderr=self._err)
        self._fds: dict[str, int] | None = None

    def result(self) -> dict[str, int]:
        if self._fds is not None:
            return self._fds
        try:
            self._proc.wait()
            self._err.seek(0)
            err = self._err.read()
            if self._proc.returncode != 0:
                msg = err.strip().splitlines()[-1] if err.strip() else \
                    f"exit code {self._proc.returncode}"
                if self._proc.returncode == EXIT_LAYOUT:
                    raise LayoutMismatch(msg)
                raise LoadError(f"compiling the BPF programs failed: {msg}\n{err.strip()}")
            fds: dict[str, int] = {}
            try:
                for p in self.programs:
                    fds[p.name] = libbpf.obj_get(str(self.stage / p.name))
            except BaseException:
                for fd in fds.values():
                    os.close(fd)
                raise
            self._out.seek(0)
            status = _status(self._out.read())
        finally:
            self._err.close()
            self._out.close()
            remove_stage(self.stage)
        self._report(status, time.monotonic() - self.started)
        self._fds = fds
        return fds

    def release(self, names) -> None:
        """Closes the fds of programs loaded but not wanted after all."""
        for name in names:
            fd = (self._fds or {}).pop(name, None)
            if fd is not None:
                os.close(fd)

    def _report(self, status: dict, seconds: float) -> None:
        """One log line on how the programs were loaded, and why not from the cache."""
        self.cache_result = status.get("cache", "off")
        n = len(self.programs)
        if self.cache_result == "hit":
            log.info("loaded %d programs from the program cache in %.2f s (no compile; "
                     "entry %s)", n, seconds, status.get("key", "?")[:12])
            return
        if self.cache_result == "fallback":
            log.warning("program cache not used, compiling instead: %s", status.get("reason"))
        elif self.cache_result == "miss":
            log.info("program cache: %s; compiling", status.get("reason"))
        log.info("compiled and loaded %d programs in %.2f s (child process)", n, seconds)
        if status.get("stored"):
            log.info("program cache: stored %s for the next start", status["stored"])
        elif status.get("store_error"):
            log.warning("program cache: this compile was not stored: %s", status["store_error"])

    def cancel(self) -> None:
        """Stops a child that is no longer wanted (start-up failed elsewhere)."""
        if self._proc.poll() is None:
            self._proc.kill()
        self._proc.wait()
        self._err.close()
        self._out.close()
        remove_stage(self.stage)


def remove_stage(stage: Path) -> None:
    if stage.is_dir():
        for entry in stage.iterdir():
            entry.unlink()
        stage.rmdir()


def remove_stale_stages(bpffs_dir: Path, keep_live: bool = True) -> list[str]:
    """Staging directories of load children whose agent is gone (killed mid-load): their pins
    would hold programs nobody uses. With keep_live=False (cleanup), every one."""
    removed = []
    for stage in bpffs_dir.glob("stage_*") if bpffs_dir.is_dir() else ():
        pid = stage.name.split("_")[1]
        if keep_live and pid.isdigit() and Path(f"/proc/{pid}").exists():
            continue
        remove_stage(stage)
        removed.append(str(stage))
    return removed


def spawn(bpffs_dir: Path, programs: list[Program], sizes: MapSizes | None = None,
          cache_dir: Path | None = None) -> LoadJob:
    """Starts the child. bpffs is made ready here, so the child only compiles."""
    from .loader import ensure_bpffs

    ensure_bpffs(bpffs_dir)
    remove_stale_stages(bpffs_dir)
    return LoadJob(bpffs_dir, programs, sizes or MapSizes(), cache_dir)


def _status(out: str) -> dict:
    """The child's last stdout line (JSON); {} if it printed none (an old child, a crash)."""
    for line in reversed(out.strip().splitlines()):
        try:
            status = json.loads(line)
        except ValueError:
            continue
        if isinstance(status, dict):
            return status
    return {}


# -- the child -----------------------------------------------------------------------------
def check_bcc_layout(bpf) -> None:
    """Refuses to run if bcc's view of a map (from the compiled C) differs from layout.py."""
    from .layout import MAPS, STRUCTS

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
            if ours in STRUCTS.values():
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
    from .loader import size_cflags
    from .paths import bpf_dir, kernel_headers

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

    from .layout import MAPS
    from .loader import compile_program
    from .paths import bpf_dir

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
