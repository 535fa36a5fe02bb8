"""A new mapSizes entry takes effect at the next start, without `kproxy-ebpf cleanup`.

A BPF map cannot change its max_entries. So before the load child runs, the pin of a map whose
size differs from the configured one moves aside (kp_svc_v3 -> kp_svc_v3_resize): the running
programs hold the old map by fd and keep serving from it, and the child creates the map anew at
the configured size under the usual name. From there it is a layout version bump in small:
the rows only the programs write (flows, UDP reverse translations, affinities) are carried over
(carry.py), the agent's own rows come with the first sync, the programs that read the new maps
are attached after it (sock_hooks.py new_agent_maps), and the pin set aside goes with the other
maps no longer read. An agent stopped half-way leaves the pin aside; the next one resumes (and
puts a pin back whose successor was never created).
"""
from __future__ import annotations

import logging
import os
from pathlib import Path

from kproxy_ebpf.datapath.maps.layout import MAPS
from kproxy_ebpf.datapath.maps.map_sizes import MapSizes
from kproxy_ebpf.datapath.maps.pinned import PinnedMap

from .carry import Pair, RowCarry

log = logging.getLogger(__name__)

SUFFIX = "_resize"
# Rows the programs write themselves: carried to the new map (the agent rewrites its own).
CARRIED = ("sknat", "skwhere", "affinity", "flow", "ct", "rnat")


def aside(bpffs_dir: Path, name: str) -> Path:
    return Path(bpffs_dir) / (MAPS[name].name + SUFFIX)


# Maps whose rows name each other's (slots name backends and service ids, range and filter rows
# name frontends): one of them made anew makes all of them anew, so the old programs keep a
# consistent set until the switch, and the writer never meets a half-adopted one (its restore
# would collect the rows whose frontend it cannot find, from under the old programs). The
# per-Service counters are keyed by service id, which a new meta map hands out afresh: they
# start from zero with it (a counter reset, as after a restart of kube-proxy).
TOGETHER = (frozenset({"svc", "backend", "meta", "srcrange", "extaddr", "extbe", "svcstat",
                       "maglev"}),
            frozenset({"clusterip", "servicecidr"}))


def _size_differs(pin: Path, spec, want: int | None) -> bool:
    if not want or not pin.exists():
        return False
    with PinnedMap(pin, spec) as m:
        return m.max_entries != want


def stage(bpffs_dir: Path, sizes: MapSizes) -> list[str]:
    """Moves aside the pins of maps whose size is not the configured one (and of the maps
    that go with them, TOGETHER); returns the ids of every map with a pin aside, moved now or
    by an agent that stopped half-way."""
    bpffs_dir = Path(bpffs_dir)
    for name in MAPS:
        pin, old = bpffs_dir / MAPS[name].name, aside(bpffs_dir, name)
        if old.exists() and not pin.exists():
            os.replace(old, pin)            # set aside, never recreated: start over
    differ = {name for name, spec in MAPS.items()
              if _size_differs(bpffs_dir / spec.name, spec, getattr(sizes, name, None))}
    for group in TOGETHER:
        if differ & group:
            differ |= group
    staged = []
    for name, spec in MAPS.items():
        pin, old = bpffs_dir / spec.name, aside(bpffs_dir, name)
        if old.exists():
            staged.append(name)
        elif name in differ and pin.exists():
            os.replace(pin, old)
            log.info("map %s: made anew at %d entries (the running programs keep the old "
                     "one until the new one is filled)", spec.name,
                     getattr(sizes, name, None) or spec.default_size)
            staged.append(name)
    return staged


def carry(bpffs_dir: Path, staged: list[str]) -> RowCarry:
    """The copy of the program-written rows of the staged maps into their new ones."""
    pairs = []
    for name in staged:
        if name in CARRIED:
            spec = MAPS[name]
            pairs.append(Pair(PinnedMap(aside(bpffs_dir, name), spec),
                              PinnedMap(Path(bpffs_dir) / spec.name, spec)))
    return RowCarry(pairs)


def remove_aside(bpffs_dir: Path) -> list[str]:
    """Unpins every map set aside (safe once the new programs are attached)."""
    removed = []
    for name in MAPS:
        old = aside(bpffs_dir, name)
        if old.exists():
            old.unlink()
            removed.append(old.name)
            log.info("removed %s: the map before its resize, no longer read", old)
    return removed
