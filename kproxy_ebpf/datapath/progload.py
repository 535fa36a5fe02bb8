"""Compiling and loading the BPF programs in a child process.

bcc links LLVM: importing it maps ~60 MiB and a compile leaves ~25 MiB more of heap that glibc
does not give back, all resident in the agent for its whole life although it is needed for one
second at start. So a child process does the bcc part and exits: it compiles each program file
against the maps pinned in the bpffs directory (adopting them, or creating and pinning them),
checks bcc's view of every map against layout.py, loads the programs and pins each one into a
private staging directory. The agent opens those pins with BPF_OBJ_GET (datapath/libbpf.py),
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
from . import libbpf
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

    def __init__(self, bpffs_dir: Path, programs: list[Program], sizes: MapSizes):
        self.bpffs_dir = bpffs_dir
        self.stage = bpffs_dir / f"stage_{os.getpid()}_{time.monotonic_ns()}"
        self.programs = programs
        request = {"bpffs_dir": str(bpffs_dir), "stage": str(self.stage),
                   "sizes": asdict(sizes), "programs": [asdict(p) for p in programs]}
        self.started = time.monotonic()
        # stderr into a file, not a pipe: a chatty compile must never block on a full pipe
        # while the agent is busy listing.
        self._err = tempfile.TemporaryFile(mode="w+")
        self._proc = subprocess.Popen([sys.executable, "-m", __name__, json.dumps(request)],
                                      stdout=subprocess.DEVNULL, stderr=self._err)
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
        finally:
            self._err.close()
            remove_stage(self.stage)
        log.info("compiled and loaded %d programs in %.2f s (child process)",
                 len(self.programs), time.monotonic() - self.started)
        self._fds = fds
        return fds

    def cancel(self) -> None:
        """Stops a child that is no longer wanted (start-up failed elsewhere)."""
        if self._proc.poll() is None:
            self._proc.kill()
        self._proc.wait()
        self._err.close()
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


def spawn(bpffs_dir: Path, programs: list[Program], sizes: MapSizes | None = None) -> LoadJob:
    """Starts the child. bpffs is made ready here, so the child only compiles."""
    from .loader import ensure_bpffs

    ensure_bpffs(bpffs_dir)
    remove_stale_stages(bpffs_dir)
    return LoadJob(bpffs_dir, programs, sizes or MapSizes())


# -- the child -----------------------------------------------------------------------------
def check_bcc_layout(bpf) -> None:
    """Refuses to run if bcc's view of a map (from the compiled C) differs from layout.py."""
    from .layout import MAPS, STRUCTS

    for spec in MAPS.values():
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


def _child(request: dict) -> None:
    from bcc import BPF

    from .loader import compile_program
    from .paths import bpf_dir

    bpffs, stage = Path(request["bpffs_dir"]), Path(request["stage"])
    sizes = MapSizes(**request["sizes"])
    stage.mkdir()
    compiled = {}
    for p in request["programs"]:
        if p["source"] not in compiled:
            compiled[p["source"]] = bpf = compile_program(bpf_dir() / p["source"], bpffs, sizes)
            check_bcc_layout(bpf)
        kwargs = {} if p["attach_type"] is None else {"attach_type": p["attach_type"]}
        fn = compiled[p["source"]].load_func(p["name"].encode(), getattr(BPF, p["prog_type"]),
                                             **kwargs)
        libbpf.obj_pin(fn.fd, str(stage / p["name"]))


def _die_with_parent() -> None:
    """The child is no use once the agent that wanted it is gone (PR_SET_PDEATHSIG)."""
    parent = os.getppid()
    ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    if os.getppid() != parent:       # the parent died before prctl
        sys.exit(1)


def main() -> None:
    _die_with_parent()
    try:
        _child(json.loads(sys.argv[1]))
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
