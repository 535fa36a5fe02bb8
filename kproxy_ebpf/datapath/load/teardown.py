"""Everything kproxy put on a node, removed: the TC programs of this network namespace (tcx
links, an older agent's cls_bpf filters), the socket hooks (their pinned links), the pinned
maps, the compiled-program cache and the nftables table that held kube-proxy's NAT
(nat_hold.py). What `kproxy-ebpf cleanup` does, and what an agent leaving its node for good
does at exit (agent/uninstall.py). Services on the node stop being translated by kproxy."""
from __future__ import annotations

from pathlib import Path

from . import nat_hold
from .bpffs import remove_pins
from .progcache import remove as remove_program_cache
from .tc import detach_all


def remove_all(bpffs_dir: Path, program_cache: Path | None) -> list[str]:
    """Returns what was removed, one line each. The program cache goes first (it can never
    serve wrong programs, but an operator cleaning up expects nothing of kproxy left); the
    TC programs before the pins, so none runs a program whose maps are already unpinned."""
    removed = []
    if program_cache is not None and program_cache.is_dir():
        removed += [str(p) for p in remove_program_cache(program_cache)]
    if bpffs_dir.exists():
        removed += detach_all()
        removed += remove_pins(bpffs_dir)
    removed += nat_hold.remove()
    return removed
