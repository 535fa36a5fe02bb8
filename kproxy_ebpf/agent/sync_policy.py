"""What each sync does: the agent's sync policy, pure and clock-injected. runner.Schedule
decides when a sync runs and whether the runner calls it full (its syncPeriod tick); this
decides what that sync then does, from the outcome of the syncs before it.

A "full" sync was three things at once; here they are three decisions of one SyncPlan:
- diff_all: the writers diff the whole desired table against what they hold (otherwise only
  the frontends of changed Services, and those a failed write left behind, when their retry
  is due);
- reread: before that, the writers re-read the kernel maps (drift repair, ~1 s of CPU at
  10k Services x 10 endpoints);
- recompute: the policy recomputes every Service, not only the changed ones.

The runner's ticks are partial syncs (at rest they find nothing to do), as kube-proxy's
nftables proxier syncs partially on its syncPeriod (v1.36 pkg/proxy/util FullSyncPeriod makes
its full ones hourly). Whether the maps still hold what was written is checked every
KERNEL_CHECK_EVERY ticks' time off the sync thread (datapath/drift.py); drift it finds, or a
self-check finds, makes the next sync re-read the maps and diff everything. A sync that raised
makes the next one do all three at once. A frontend that failed on a full map is retried by
partial syncs at most every FULL_MAP_RETRY_EVERY seconds; any other failure makes the next
full diff re-read the maps.
"""
from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from kproxy_ebpf.model.desired import FrontendKey, Scope

KERNEL_CHECK_EVERY = 10     # syncPeriods between two drift checks (5 min by default)
# Retrying thousands of frontends that did not fit on every 200 ms sync while the map stays
# full cost a whole core and a log line per frontend per sync.
FULL_MAP_RETRY_EVERY = 5.0


@dataclass(frozen=True)
class SyncPlan:
    """What one sync does."""
    # The runner's tick or a forced full sync, made partial or not: periodic work, whose CPU
    # the full-sync counter takes (the scale run subtracts it from its per-change windows).
    scheduled_full: bool
    diff_all: bool
    reread: bool
    recompute: bool
    retry: frozenset[FrontendKey]      # partial syncs: the failed keys retried now
    retry_due: bool                    # the failed keys are retried by this sync
    cidrs_all: bool                    # the ServiceCIDR rows are written whole

    def purges_conntrack(self, changed: Iterable[FrontendKey], pod_path: bool) -> bool:
        """Whether the TC conntrack is purged after this sync: after a full diff (every flow),
        else when a changed frontend may have TC flows: scope EXT, or with the per-packet
        ClusterIP path (`socketLB: false`) a socket-scope one too."""
        return self.diff_all or any(k.scope is Scope.EXT or pod_path for k in changed)


@dataclass
class SyncPolicy:
    clock: Callable[[], float] = time.monotonic
    full_map_retry_every: float = FULL_MAP_RETRY_EVERY
    synced_once: bool = False          # a sync has run to its end
    force_full: bool = False           # a sync raised: the next one diffs everything...
    recheck_kernel: bool = False       # ...after re-reading the maps...
    recompute: bool = False            # ...and recomputing every Service
    retry: frozenset[FrontendKey] = frozenset()   # keys a failed write left behind
    retry_at: float = 0.0              # monotonic time from which they are retried
    retry_map_full: bool = False       # ...and whether they failed on a full map
    cidrs_incomplete: bool = False     # a ServiceCIDR row failed: write them all next

    def plan(self, tick: bool) -> SyncPlan:
        """The next sync's plan; `tick`: the runner called it full (syncPeriod elapsed).
        A periodic full diff found nothing the partial syncs had not written and cost ~0.2 s
        of CPU every 30 s at 10k Services: only the first sync, a failure and drift diff
        everything."""
        diff_all = self.force_full or (tick and not self.synced_once)
        # A full map is no reason to re-read the kernel: the rows that fit are there.
        reread = diff_all and (self.recheck_kernel
                               or bool(self.retry and not self.retry_map_full))
        retry_due = diff_all or self.clock() >= self.retry_at
        plan = SyncPlan(scheduled_full=tick or self.force_full, diff_all=diff_all, reread=reread,
                        recompute=self.recompute,
                        retry=self.retry if retry_due and not diff_all else frozenset(),
                        retry_due=retry_due, cidrs_all=diff_all or self.cidrs_incomplete)
        self.force_full = self.recompute = False
        if reread:
            self.recheck_kernel = False
        return plan

    def applied(self, plan: SyncPlan, failed: Iterable[FrontendKey], full_maps: bool,
                freed: bool = False) -> bool:
        """The writes of `plan` are done: `failed` keys are left behind (`full_maps`: some
        write met a full map). Keys not retried by this sync stay as they were. `freed`: the
        sync removed rows, so frontends waiting for room may fit now: they are due at once,
        and True asks the caller for a sync (without it they would wait for the next change
        or syncPeriod)."""
        if plan.retry_due:
            self.retry = frozenset(failed)
            self.retry_map_full = full_maps
            self.retry_at = self.clock() + (self.full_map_retry_every if full_maps else 0)
        else:
            self.retry = self.retry | frozenset(failed)
            self.retry_map_full = full_maps or self.retry_map_full
        if freed and self.retry and self.retry_map_full:
            self.retry_at = 0.0
            return True
        return False

    def cidrs_written(self, complete: bool) -> None:
        self.cidrs_incomplete = not complete

    def finished(self) -> None:
        """A sync ran to its end (with or without write errors)."""
        self.synced_once = True

    def drift_found(self) -> None:
        """The maps differ from what was written (a self-check saw it): the next sync re-reads
        them and diffs everything, without recomputing the Services."""
        self.force_full = self.recheck_kernel = True

    def failed(self) -> None:
        """A sync raised: whatever the writer did not finish is redone by a full sync, from
        the maps and every Service (the changes compute() handed over are not lost)."""
        self.force_full = self.recheck_kernel = self.recompute = True
