"""Endpoint selection: the Cluster set, the Local set and "has any endpoint" (semantics 1.3-1.6).

Reference semantics: kube-proxy pkg/proxy/topology.go CategorizeEndpoints and
topologyModeFromHints. Both sets are always computed, whatever the Service's policies are,
because the socket path needs the Cluster set even for externalTrafficPolicy: Local (rule 1.7
short-circuits pod- and node-sourced traffic to it) and the TC path needs the Local set.
"""
from __future__ import annotations

import enum
from collections.abc import Sequence
from dataclasses import dataclass

from .endpoints import EndpointInfo


class TopologyMode(enum.StrEnum):
    NONE = "none"            # no filtering
    SAME_NODE = "node"       # keep Ready endpoints hinted for this node
    SAME_ZONE = "zone"       # keep Ready endpoints hinted for this node's zone


@dataclass(frozen=True)
class PortEndpoints:
    """The endpoint sets of one service port, as seen from this node."""
    cluster: tuple[EndpointInfo, ...]   # for policy Cluster
    local: tuple[EndpointInfo, ...]     # for policy Local (eTP on external traffic, iTP)
    has_any: bool                       # a Ready or serving-terminating endpoint exists anywhere
    topology: TopologyMode = TopologyMode.NONE


def topology_mode(endpoints: Sequence[EndpointInfo], node_name: str, zone: str | None, *,
                  prefer_same_node: bool = True) -> TopologyMode:
    """Pick the hint filter, or none when hints are incomplete or none is meant for us.

    Only Ready endpoints count: an unready endpoint without hints must not switch topology off,
    and it would not be used anyway. Filtering is applied only when at least one Ready endpoint
    is hinted for us, so a filtered Cluster set is never empty while Ready endpoints exist.
    prefer_same_node mirrors kube-proxy's PreferSameTrafficDistribution feature gate.
    """
    ready = [e for e in endpoints if e.ready]
    if not ready:
        return TopologyMode.NONE
    if (prefer_same_node and node_name and all(e.hint_nodes for e in ready)
            and any(node_name in e.hint_nodes for e in ready)):
        return TopologyMode.SAME_NODE
    if (zone and all(e.hint_zones for e in ready)
            and any(zone in e.hint_zones for e in ready)):
        return TopologyMode.SAME_ZONE
    return TopologyMode.NONE


def _passes(e: EndpointInfo, mode: TopologyMode, node_name: str, zone: str | None) -> bool:
    if mode is TopologyMode.SAME_NODE:
        return node_name in e.hint_nodes
    if mode is TopologyMode.SAME_ZONE:
        return zone in e.hint_zones
    return True


def categorize(endpoints: Sequence[EndpointInfo], node_name: str, zone: str | None, *,
               prefer_same_node: bool = True) -> PortEndpoints:
    """Split one service port's endpoints into the Cluster and Local sets.

    Cluster: Ready endpoints passing the topology filter; if none, every serving-terminating
    endpoint (local or remote, topology ignored). Local: local Ready endpoints; if none, local
    serving-terminating ones (topology never applies). An endpoint that is not Ready, serving
    and not terminating (e.g. failing its readiness probe) is in neither set.
    """
    mode = topology_mode(endpoints, node_name, zone, prefer_same_node=prefer_same_node)
    if mode is TopologyMode.NONE:        # no filter: no call per endpoint
        cluster = tuple([e for e in endpoints if e.ready])
    else:
        cluster = tuple([e for e in endpoints if e.ready and _passes(e, mode, node_name, zone)])
    if not cluster:
        cluster = tuple(e for e in endpoints if e.serving_terminating)
    local = tuple(e for e in endpoints if e.local and e.ready)
    if not local:
        local = tuple(e for e in endpoints if e.local and e.serving_terminating)
    has_any = any(e.ready or e.serving_terminating for e in endpoints)
    return PortEndpoints(cluster=cluster, local=local, has_any=has_any, topology=mode)
