"""The agent's own drift check, served as /checkz on its health port for `check --all-nodes`.

An agent compares the frontends it last computed (its view of the API) with what the pinned
maps hold now (check.compare, the code `kproxy-ebpf check` runs), the ServiceCIDR rows it wrote
with those the maps hold (check.compare_cidrs), and looks at its socket hooks' pinned links
and its external devices' TC filters. Drift found makes the agent re-read the maps and rewrite
the difference at once (the periodic re-read would come only every few minutes), and attach
missing TC filters again, so a node is clean again after the next sync.
The body holds names and counts only: no cluster objects beyond what `services` shows to
anyone on the node.

Checks are not free (one walk of every map: ~1 s at 10,000 Services): one runs at a time, and a
request within MIN_INTERVAL_S of the last check gets that check's answer.
"""
from __future__ import annotations

import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from kproxy_ebpf.model.desired import Frontend, FrontendKey, ServiceCIDRSet

MIN_INTERVAL_S = 1.0
DRIFT_LINES = 50          # a node with more says how many and shows the first ones


@dataclass(frozen=True)
class CheckInput:
    """What one check compares, taken while no sync runs."""
    node: str
    desired: Mapping[FrontendKey, Frontend]     # the last computed
    kernel: list[dict]               # reader.services()
    hooks: list[dict]                # reader.hooks()
    hooks_expected: bool             # socketLB: the socket hooks must be attached
    synced: bool                     # a sync has run to its end
    unprogrammed: int = 0            # frontends a write left behind (a full map): known
    # The ServiceCIDR rows as the agent wrote them (its CidrWriter's bookkeeping) and as the
    # maps hold them (ip -> "reject" | "pass", ranges); None: not compared.
    cidrs_written: ServiceCIDRSet | None = None
    cidrs_held: tuple[Mapping[str, str], set[str]] | None = None
    tc_missing: tuple[str, ...] = ()   # the external devices' TC filters not attached


@dataclass(frozen=True)
class CheckVerdict:
    """One check's answer; body() is its /checkz JSON (check_nodes.py reads it there)."""
    node: str
    frontends: int | None            # the frontends computed; None before a first sync
    drift: tuple[str, ...]           # the first DRIFT_LINES lines of it
    drift_count: int
    unprogrammed: int
    hooks_attached: int
    hooks_detached: tuple[str, ...]
    tc_missing: tuple[str, ...]
    problems: tuple[str, ...]
    checked_at: float

    @property
    def clean(self) -> bool:
        return not self.problems

    @property
    def repair(self) -> bool:
        """Whether the agent must re-read and rewrite now: frontends that did not fit are
        retried by the agent already, more than those is drift behind its back."""
        return self.drift_count > self.unprogrammed or bool(self.tc_missing)

    def body(self) -> dict:
        return {"node": self.node, "frontends": self.frontends, "drift": list(self.drift),
                "driftCount": self.drift_count, "unprogrammed": self.unprogrammed,
                "hooksAttached": self.hooks_attached, "hooksDetached": list(self.hooks_detached),
                "tcMissing": list(self.tc_missing), "clean": self.clean,
                "problems": list(self.problems), "checkedAt": self.checked_at}


def evaluate(inp: CheckInput) -> CheckVerdict:
    from kproxy_ebpf.inspect.check import compare, compare_cidrs

    drifts = [str(d) for d in compare(inp.desired, inp.kernel)] if inp.synced else []
    if inp.synced and inp.cidrs_written is not None and inp.cidrs_held is not None:
        drifts += [str(d) for d in compare_cidrs(inp.cidrs_written, *inp.cidrs_held)]
    detached = [h["hook"] for h in inp.hooks if not h["pinned"]] if inp.hooks_expected else []
    problems = []
    if not inp.synced:
        problems.append("not synced yet")
    if drifts:
        problems.append(f"{len(drifts)} frontends differ from the API")
    if detached:
        problems.append(f"hooks not attached: {', '.join(detached)}")
    if inp.tc_missing:
        problems.append(f"TC filters not attached: {', '.join(inp.tc_missing)}")
    return CheckVerdict(node=inp.node, frontends=len(inp.desired) if inp.synced else None,
                        drift=tuple(drifts[:DRIFT_LINES]), drift_count=len(drifts),
                        unprogrammed=inp.unprogrammed,
                        hooks_attached=sum(1 for h in inp.hooks if h["pinned"]),
                        hooks_detached=tuple(detached), tc_missing=tuple(inp.tc_missing),
                        problems=tuple(problems), checked_at=time.time())


class SelfCheck:
    """Runs `take()` (which gathers a CheckInput under the agent's sync lock), evaluates it,
    and calls `on_drift(verdict)` when the datapath differs, at most once per MIN_INTERVAL_S.
    Called, it answers /checkz's body."""

    def __init__(self, take: Callable[[], CheckInput], on_drift: Callable[[CheckVerdict], None],
                 clock: Callable[[], float] = time.monotonic):
        self._take, self._on_drift, self._clock = take, on_drift, clock
        self._lock = threading.Lock()
        self._last: tuple[float, CheckVerdict] | None = None

    def __call__(self) -> dict:
        return self.check().body()

    def check(self) -> CheckVerdict:
        with self._lock:
            now = self._clock()
            if self._last is not None and now - self._last[0] < MIN_INTERVAL_S:
                return self._last[1]
            verdict = evaluate(self._take())
            self._last = (now, verdict)
        if verdict.repair:
            self._on_drift(verdict)
        return verdict
