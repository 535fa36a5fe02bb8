"""Per-Service counters (kp_svcstat, bpf/lib/stats.h): read and summed over CPUs, joined with
the service port names of kp_meta, and kept tidy. A service port has a row per scope of the
frontends that carried its traffic (the node's own sockets, packets from outside): the CLI
shows each, the metrics their sum.

The programs create a service port's row at its first event; this side deletes rows whose
svc_id was freed (after each sync) or is held by no frontend (after a restart or a drift
check: a row a program created for an id a moment before it was freed), so an id handed out
again starts from zero.
"""
from __future__ import annotations

import dataclasses
from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass
from typing import NamedTuple

from kproxy_ebpf.model.desired import Scope

from . import layout as L
from .encode import text_of
from .pinned import PinnedMap


@dataclass(frozen=True)
class ServiceCounters:
    """One service port's counters (kproxy.h struct kp_svc_stat), over every CPU."""
    conns: int = 0
    packets: int = 0
    bytes: int = 0
    reply_packets: int = 0
    reply_bytes: int = 0
    refused: int = 0
    dropped: int = 0
    denied: int = 0

    @classmethod
    def summed(cls, per_cpu: Iterable) -> ServiceCounters:
        names = [f.name for f in dataclasses.fields(cls)]
        totals = dict.fromkeys(names, 0)
        for value in per_cpu:
            for name in names:
                totals[name] += getattr(value, name)
        return cls(**totals)

    def as_dict(self) -> dict[str, int]:
        return dataclasses.asdict(self)

    def __add__(self, other: ServiceCounters) -> ServiceCounters:
        return ServiceCounters(**{f.name: getattr(self, f.name) + getattr(other, f.name)
                                  for f in dataclasses.fields(self)})


class CounterKey(NamedTuple):
    """A kp_svcstat row's key: the service port and the scope of its frontends."""
    svc_id: int
    scope: Scope

    def raw(self):
        return L.MAPS["svcstat"].key(svc_id=self.svc_id, scope=L.SCOPE_NUM[self.scope])


@dataclass(frozen=True)
class ServicePortId:
    """Who a row counts for, from kp_meta: the labels of its metrics."""
    namespace: str
    name: str
    port: str          # the port's name ("" for a single unnamed port)
    protocol: str

    @property
    def text(self) -> str:
        base = f"{self.namespace}/{self.name}"
        return f"{base}:{self.port}" if self.port else base


def read(m: PinnedMap) -> dict[CounterKey, ServiceCounters]:
    """Every row, by service port and scope."""
    return {CounterKey(key.svc_id, L.SCOPE_BY_NUM.get(key.scope, Scope.EXT)):
            ServiceCounters.summed(value) for key, value in m.items()}


def per_port(counts: dict[CounterKey, ServiceCounters]) -> dict[int, ServiceCounters]:
    """The rows of each service port summed over its scopes."""
    out: dict[int, ServiceCounters] = {}
    for key, c in counts.items():
        out[key.svc_id] = out.get(key.svc_id, ServiceCounters()) + c
    return out


def port_id(meta) -> ServicePortId:
    proto = L.PROTO_BY_NUM.get(meta.proto)
    return ServicePortId(text_of(meta.namespace), text_of(meta.name), text_of(meta.port_name),
                         proto.value if proto else str(meta.proto))


def by_service(maps: Mapping[str, PinnedMap]) -> list[tuple[ServicePortId, ServiceCounters]]:
    """The counters of every named service port (one without traffic yet reads zero), sorted
    by name. A row whose id has no name (freed a moment ago) is left out."""
    counts = per_port(read(maps["svcstat"]))
    names = {key.value: port_id(meta) for key, meta in maps["meta"].items()}
    rows = [(who, counts.get(sid, ServiceCounters())) for sid, who in names.items()]
    rows.sort(key=lambda r: (r[0].namespace, r[0].name, r[0].port, r[0].protocol))
    return rows


def forget(m: PinnedMap, ids: Iterable[int]) -> None:
    """Deletes the rows of freed ids, every scope's (rows never created are skipped by
    delete_batch)."""
    keys = [CounterKey(i, scope).raw() for i in ids for scope in Scope]
    if keys:
        m.delete_batch(keys)


def sweep(m: PinnedMap, held: Collection[int]) -> int:
    """Deletes rows of ids no frontend holds; returns how many."""
    stale = [key for key in m.keys() if key.svc_id not in held]
    if stale:
        m.delete_batch(stale)
    return len(stale)
