"""Which scheduler a Service's frontends use for a new connection (kproxy-ebpf.io/lb-algorithm,
else the node's lbAlgorithm): round robin and least connection apply to every frontend, on
both paths; Maglev only to frontends with a table (traffic from outside the node), the others
pick at random, as they always did."""
from __future__ import annotations

from dataclasses import replace

from kproxy_ebpf.model.desired import Frontend
from kproxy_ebpf.model.objects import LBAlgorithm, Service

# The algorithms slot 0 carries as a flag (bpf/lib/sched.h); the others are not a scheduler
# of their own: random is what a frontend does by default, Maglev is its table.
SCHEDULED = frozenset({LBAlgorithm.ROUND_ROBIN, LBAlgorithm.LEAST_CONN})


def effective(svc: Service, node_default: LBAlgorithm) -> LBAlgorithm:
    return svc.lb_algorithm or node_default


def with_scheduler(fronts: list[Frontend], algorithm: LBAlgorithm) -> list[Frontend]:
    """fronts with their `algorithm` set; unchanged (no copies) for random and Maglev, which
    nearly every Service uses."""
    if algorithm not in SCHEDULED:
        return fronts
    return [replace(fe, algorithm=algorithm) for fe in fronts]


def shown(fe: Frontend) -> LBAlgorithm:
    """What picks a backend for a new connection to fe, as the CLI names it."""
    return LBAlgorithm.MAGLEV if fe.maglev else fe.algorithm
