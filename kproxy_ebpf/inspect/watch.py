"""`kproxy-ebpf watch`: frontends and backends changing as the agent writes them.

Each poll reads the pinned maps afresh (reader.services: what the kernel holds, reopened so an
agent that swaps its maps is followed) and diffs that against the previous poll. A change is a
frontend added or removed, its verdict or affinity changed, or a backend added, removed or
changing state (ready, terminating, serving). The first poll is the baseline. A poll reads
until two reads in a row agree, since one walk of the whole map can fall between the writer's
slot rows and their head row (docs/architecture.md, "No torn reads": a lookup never sees that,
a walk can).
"""
from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from enum import Enum

from kproxy_ebpf.model.objects import hostport


class ChangeKind(Enum):
    ADDED = "+"
    REMOVED = "-"
    CHANGED = "~"


@dataclass(frozen=True)
class FrontendView:
    """One frontend as the maps hold it, reduced to what an operator follows."""
    service: str
    type: str
    frontend: str                       # "10.96.0.10:80/TCP"
    scope: int
    action: str
    affinity_timeout: int
    backends: Mapping[str, str] = field(default_factory=dict)    # "addr:port" -> state

    @property
    def key(self) -> tuple[str, int]:
        return self.frontend, self.scope

    @classmethod
    def of(cls, row: dict) -> FrontendView:
        backends = {f"<missing {b['id']}>" if b.get("missing") else hostport(b["address"], b["port"]):
                    "missing" if b.get("missing") else b["state"] for b in row["backends"]}
        return cls(row["service"], row["type"],
                   f"{hostport(row['address'], row['port'])}/{row['protocol']}", row["scope"],
                   row["action"], row["affinity_timeout"], backends)


@dataclass(frozen=True)
class Change:
    kind: ChangeKind
    view: FrontendView
    details: tuple[str, ...] = ()       # what changed, in words: "+10.244.1.7:8080 (ready)"

    def line(self) -> str:
        v = self.view
        head = f"{self.kind.value} {v.service} {v.type} {v.frontend}"
        if self.kind is ChangeKind.REMOVED:
            return head
        if self.kind is ChangeKind.ADDED:
            bes = ", ".join(f"{a} ({s})" for a, s in v.backends.items()) or "none"
            return f"{head} {v.action} backends: {bes}"
        return f"{head} " + ", ".join(self.details)


Snapshot = dict[tuple[str, int], FrontendView]


def snapshot(rows: list[dict], service: str | None = None) -> Snapshot:
    """reader.services() rows by frontend (only `service`'s, NS/NAME, when given)."""
    views = (FrontendView.of(r) for r in rows
             if service is None or r["service"].split(":")[0] == service)
    return {v.key: v for v in views}


def _details(old: FrontendView, new: FrontendView) -> tuple[str, ...]:
    out = []
    if old.action != new.action:
        out.append(f"verdict {old.action} -> {new.action}")
    if old.affinity_timeout != new.affinity_timeout:
        out.append(f"affinity {old.affinity_timeout}s -> {new.affinity_timeout}s")
    for addr in sorted(old.backends.keys() - new.backends.keys()):
        out.append(f"-{addr}")
    for addr in sorted(new.backends.keys() - old.backends.keys()):
        out.append(f"+{addr} ({new.backends[addr]})")
    for addr in sorted(old.backends.keys() & new.backends.keys()):
        if old.backends[addr] != new.backends[addr]:
            out.append(f"{addr} {old.backends[addr]} -> {new.backends[addr]}")
    return tuple(out)


def diff(old: Snapshot, new: Snapshot) -> list[Change]:
    """What turned `old` into `new`, in frontend order."""
    out = []
    for key in sorted(old.keys() | new.keys()):
        before, after = old.get(key), new.get(key)
        if before is None:
            assert after is not None        # the key is old's or new's
            out.append(Change(ChangeKind.ADDED, after))
        elif after is None:
            out.append(Change(ChangeKind.REMOVED, before))
        elif before != after:
            out.append(Change(ChangeKind.CHANGED, after, _details(before, after)))
    return out


SETTLE_S = 0.05       # between the reads of one poll: longer than a sync's writes take


def settled(read: Callable[[], Snapshot], sleep: Callable[[float], None] = time.sleep,
            tries: int = 3) -> Snapshot:
    """A snapshot two reads in a row agree on (the last one read after `tries`)."""
    last = read()
    for _ in range(tries):
        sleep(SETTLE_S)
        now = read()
        if now == last:
            break
        last = now
    return last


def follow(read: Callable[[], Snapshot], interval: float, deadline: float | None = None,
           sleep: Callable[[float], None] = time.sleep,
           clock: Callable[[], float] = time.monotonic) -> Iterator[tuple[Snapshot, list[Change]]]:
    """(the current snapshot, its changes) after each poll that changed something, the first
    with none; stops at `deadline` (clock time) if given."""
    shown = settled(read, sleep)
    yield shown, []
    while deadline is None or clock() < deadline:
        sleep(interval)
        now = settled(read, sleep)
        if now != shown:
            changes, shown = diff(shown, now), now
            yield shown, changes
