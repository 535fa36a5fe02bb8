"""One sync's input to the node's datapath (NodeDatapath.apply): what compute() produced and
what the sync policy decided, frozen, so the write order in node_datapath.py reads nothing of
the agent's state while it writes."""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from kproxy_ebpf.model.desired import Frontend, FrontendKey, ServiceCIDRSet

from .established import Serving

# The ServiceCIDR rows to write: the whole set, or the ranges and the ClusterIPs that changed.
CidrInput = ServiceCIDRSet | tuple[frozenset[str], Mapping[str, str | None]]


@dataclass(frozen=True)
class Step:
    frontends: Mapping[FrontendKey, Frontend]   # the whole desired table
    keys: frozenset[FrontendKey] | None         # the frontends to diff; None: all of them
    recomputed: frozenset[FrontendKey]          # frontends of the Services compute() re-ran
    # Changed or recomputed (a draining endpoint that goes changes no frontend): the
    # frontends whose TC flows the purge looks at after a partial sync.
    touched: frozenset[FrontendKey]
    cidrs: CidrInput                            # a whole ServiceCIDRSet, or what changed
    reread: bool                                # re-read the maps first (after drift)
    purge_conntrack: bool                       # the TC conntrack purge runs after the writes
    serving: Serving

    @property
    def full(self) -> bool:
        return self.keys is None
