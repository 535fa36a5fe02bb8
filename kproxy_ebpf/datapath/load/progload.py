"""Loading the BPF programs through a child process: the parent's side.

bcc links LLVM: importing it maps ~60 MiB and a compile leaves ~25 MiB more of heap that glibc
does not give back, all resident in the agent for its whole life although it is needed for one
second at start. So a child process (compile_child.py) does the bcc part and exits, leaving
each program pinned in a private staging directory of the bpffs directory. The agent opens
those pins with BPF_OBJ_GET (datapath/libbpf.py), unpins them and attaches the programs itself;
it never imports bcc. The child runs while the agent lists the cluster, so the compile is off
the cold start's critical path.
"""
from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from kproxy_ebpf.datapath.maps.map_sizes import MapSizes
from kproxy_ebpf.datapath.maps.pinned import LayoutMismatch

from . import compile_child, libbpf
from .bpffs import ensure_bpffs, remove_stage, remove_stale_stages

log = logging.getLogger(__name__)

# program types (enum bpf_prog_type, as bcc's BPF.<NAME> constants)
SCHED_CLS = "SCHED_CLS"
CGROUP_SOCK_ADDR = "CGROUP_SOCK_ADDR"
CGROUP_SOCK = "CGROUP_SOCK"


class LoadError(RuntimeError):
    """The child could not compile or load a program; the message is its error."""


@dataclass(frozen=True)
class Program:
    source: str           # file under bpf/
    name: str             # function name in the source
    prog_type: str        # SCHED_CLS, CGROUP_SOCK_ADDR or CGROUP_SOCK
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
        self._proc = subprocess.Popen([sys.executable, "-m", compile_child.__name__,
                                       json.dumps(request)],
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
                if self._proc.returncode == compile_child.EXIT_LAYOUT:
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


def spawn(bpffs_dir: Path, programs: list[Program], sizes: MapSizes | None = None,
          cache_dir: Path | None = None) -> LoadJob:
    """Starts the child. bpffs is made ready here, so the child only compiles."""
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
