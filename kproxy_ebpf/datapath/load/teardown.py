"""Everything kproxy put on a node, removed: the TC filters of this network namespace, the
socket hooks (their pinned links), the pinned maps, the compiled-program cache and the
nftables table that held kube-proxy's NAT (nat_hold.py). What
`kproxy-ebpf cleanup` does, and what an agent leaving its node for good does at exit
(agent/uninstall.py). Services on the node stop being translated by kproxy."""
from __future__ import annotations

import logging
from pathlib import Path

from . import ct_handoff, nat_hold
from .bpffs import open_pinned_maps, remove_pins
from .progcache import remove as remove_program_cache
from .tc import detach_all

log = logging.getLogger("kproxy_ebpf.agent")


def hand_over_flows(bpffs_dir: Path) -> None:
    """The TC path's established TCP flows into the kernel's conntrack, with their NAT, so
    that they outlive its programs (ct_handoff.py); said in the log, never fatal."""
    maps: dict = {}
    try:
        maps = open_pinned_maps(bpffs_dir)
        written, problems = ct_handoff.handoff(maps)
    except Exception as exc:   # noqa: BLE001 - a removal goes on whatever this meets
        log.warning("the TC path's flows were not handed to conntrack: %s", exc)
        return
    finally:
        for m in maps.values():
            m.close()
    if written:
        log.info("handed %d TCP flows of the TC path to the kernel's conntrack", written)
    for p in problems:
        log.warning("%s", p)


def remove_all(bpffs_dir: Path, program_cache: Path | None) -> list[str]:
    """Returns what was removed, one line each. The program cache goes first (it can never
    serve wrong programs, but an operator cleaning up expects nothing of kproxy left); the
    filters before the pins, so no filter runs a program whose maps are already unpinned;
    before the filters, the TC path's TCP flows are handed to the kernel's conntrack."""
    removed = []
    if program_cache is not None and program_cache.is_dir():
        removed += [str(p) for p in remove_program_cache(program_cache)]
    if bpffs_dir.exists():
        hand_over_flows(bpffs_dir)
        removed += detach_all()
        removed += remove_pins(bpffs_dir)
    removed += nat_hold.remove()
    return removed
