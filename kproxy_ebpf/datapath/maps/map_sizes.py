"""The configured max_entries of each map (`mapSizes`), defaults from bpf/kproxy.h.

A datapath type, not an agent one: the load child passes them to the compiler as the -D knobs
of KP_MAPS and the program cache keys on them; config.py parses them from the settings.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from .layout import MAPS


def _default_size(name: str):
    return field(default_factory=lambda: MAPS[name].default_size)


@dataclass
class MapSizes:
    """max_entries of each map (defaults from bpf/kproxy.h; a pinned map of another size is
    made anew at the next start, resize.py)."""
    svc: int = _default_size("svc")            # frontends plus one row per backend slot
    backend: int = _default_size("backend")
    sknat: int = _default_size("sknat")        # reverse translation per UDP socket (LRU)
    skwhere: int = _default_size("skwhere")    # (backend, client netns) with a socket (LRU)
    affinity: int = _default_size("affinity")  # ClientIP affinity (LRU)
    flow: int = _default_size("flow")          # unconnected-UDP flows (LRU)
    meta: int = _default_size("meta")          # service-port names for the CLI
    clusterip: int = _default_size("clusterip")  # allocated ClusterIPs (ServiceCIDR checks)
    servicecidr: int = _default_size("servicecidr")  # ServiceCIDR ranges (LPM trie)
    ct: int = _default_size("ct")              # TC connection tracking (LRU)
    rnat: int = _default_size("rnat")          # TC reply tuple -> original tuple (LRU)
    srcrange: int = _default_size("srcrange")  # loadBalancerSourceRanges (LPM trie)
    extaddr: int = _default_size("extaddr")    # addresses of scope-EXT frontends (TC filter)
    extbe: int = _default_size("extbe")        # their local backends (TC filter)
    svcstat: int = _default_size("svcstat")    # per-Service counters (per-CPU, rows as used)
    maglev: int = _default_size("maglev")      # Maglev table rows (~1 KiB each, as used)
