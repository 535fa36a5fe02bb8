"""The sync: compute -> apply -> report. ProxyState computes the desired table (under the
lock the reflector threads share), NodeDatapath.apply writes it in its own order and returns
a frozen Outcome, and the policy, health, metrics and events are told what happened; the
policy (sync_policy.py) decides what each sync diffs, re-reads and retries.

Partial syncs look only at the frontends of services that changed (plus those that failed
last time), and everything they do is proportional to that change: the desired table is handed
to the writer as a view, problems are reported from what compute() re-evaluated, and the map
row gauges are refreshed at most every ROW_COUNT_EVERY seconds (sync_report.py). The objects
themselves live in ProxyState alone: it answers which keys it holds.
"""
from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping

from kproxy_ebpf.config import AgentConfig
from kproxy_ebpf.model.desired import Frontend, FrontendKey, ServicePortName
from kproxy_ebpf.model.objects import IPFamily
from kproxy_ebpf.proxy.no_local import NoLocalEndpoints
from kproxy_ebpf.proxy.state import ProxyState
from kproxy_ebpf.serve.health import ProxyHealth
from kproxy_ebpf.serve.metrics import Metrics
from kproxy_ebpf.serve.service_health import ServiceHealthServers

from .node_datapath import NodeDatapath
from .process_tuning import FullCollections, GcPause, release_heap
from .reporting import Reporter
from .self_check import CheckInput, CheckVerdict
from .state_sink import StateSink
from .step import Step
from .sync_policy import SyncPlan, SyncPolicy
from .sync_report import SyncReport

log = logging.getLogger("kproxy_ebpf.agent")   # the agent's lines under one name, as before the split


class SyncLoop:
    """`lock` (the state's) is the one the reflector threads take; `request` asks the runner
    for another sync."""

    def __init__(self, cfg: AgentConfig, state: ProxyState, lock: threading.Lock,
                 sink: StateSink, node: NodeDatapath, metrics: Metrics, health: ProxyHealth,
                 reporter: Reporter, gc_pause: GcPause, request: Callable[[], None]) -> None:
        self.cfg, self.state, self._lock, self.sink, self.node = cfg, state, lock, sink, node
        self.metrics, self.health, self.reporter = metrics, health, reporter
        self.gc_pause, self.request = gc_pause, request
        self.lock = threading.Lock()      # one sync at a time; map fds stay open under it
        self.policy = SyncPolicy()
        self.report = SyncReport(metrics, health)
        self.no_local = NoLocalEndpoints()   # kube-proxy's no_local_endpoints, per sync
        self.svc_health = ServiceHealthServers(
            lambda: self.health.status(with_node=False)[0] == 200)
        self.full_collections = FullCollections.install()
        self.desired: Mapping[FrontendKey, Frontend] = {}   # the last sync's frontends
        self.attach_pending = False
        self.stopped = threading.Event()

    def set_pending(self) -> None:
        """The pending-change gauges, from the state (the caller holds the state's lock)."""
        self.metrics.set_pending(self.state.service_changes_pending,
                                 self.state.endpoint_changes_pending, self.state.pending)

    def _serving(self, spn: ServicePortName, family: IPFamily) -> frozenset[tuple[str, int]]:
        with self._lock:
            return self.state.serving_endpoints(spn, family)

    def sync(self, full: bool) -> bool:
        """One sync; `full`: the runner's syncPeriod tick (see sync_policy.py for what that
        makes this sync do)."""
        with self.lock:
            if self.stopped.is_set():
                return True
            plan = self.policy.plan(full)
            cpu0 = time.thread_time()
            try:
                return self._sync_locked(plan)
            except Exception:
                log.exception("sync failed; the next one will be a full sync")
                self.policy.failed()
                return False
            finally:
                if plan.scheduled_full:
                    self.metrics.full_sync_cpu.inc(time.thread_time() - cpu0)

    def _sync_locked(self, plan: SyncPlan) -> bool:
        full = plan.diff_all
        started = time.time()
        t0 = time.monotonic()
        with self._lock:
            # A Service's result is cached until its inputs change, so a periodic full sync
            # recomputes only the changed ones; after a failure (say, compute() itself raised
            # half-way) every Service is recomputed.
            changes = self.state.compute(full=plan.recompute)
            self.desired = changes.frontends
            self.no_local.update(changes.frontends,
                                 None if full or plan.recompute else changes.changed_keys)
            checks = self.state.health_checks() if full or changes.changed_services else None
            triggers, self.sink.triggers = self.sink.triggers, []
            problem_counts = dict(self.state.problem_counts())
            # After a failed write the next sync writes the whole ServiceCIDR set.
            cidrs = (self.state.service_cidr_set() if plan.cidrs_all
                     else self.state.service_cidr_changes())
        touched = changes.changed_keys | changes.recomputed_keys
        outcome = self.node.apply(Step(
            frontends=changes.frontends,
            keys=None if full else frozenset(changes.changed_keys | plan.retry),
            recomputed=frozenset(changes.recomputed_keys), touched=frozenset(touched),
            cidrs=cidrs, reread=plan.reread,
            purge_conntrack=plan.purges_conntrack(touched, pod_path=not self.cfg.socket_lb),
            serving=self._serving))
        self.policy.cidrs_written(outcome.cidrs_written)
        if self.policy.applied(plan, outcome.failed, bool(outcome.full_maps),
                               freed=outcome.deleted > 0):
            self.request()           # room was freed: what did not fit is tried again now
        self.report.unprogrammed(len(self.policy.retry), outcome)
        if checks is not None:
            self.svc_health.sync(checks)
        elapsed = time.monotonic() - t0
        if self.attach_pending:
            # The maps hold what could be written (a full map must not keep every other
            # service of the node untranslated): now the hooks may read them.
            self.node.attach()
            self.attach_pending = False
        if not self.report.programmed(outcome, started, triggers):
            with self._lock:       # measured again once a sync gets them in
                self.sink.triggers.extend(triggers)
        self.metrics.set_no_local_endpoints(self.no_local.counts())
        self.reporter.problems(changes.problems, changes.reported, problem_counts)
        self.reporter.writes(outcome)
        first = not self.policy.synced_once
        with self._lock:
            self.set_pending()
        assert self.node.writer is not None     # adopted before the first sync (Agent.start)
        self.report.record(full, first, elapsed, len(changes.frontends), outcome,
                           self.node.writer.stats(), self.node.row_counts)
        self.policy.finished()
        if first:
            self.gc_pause.resume()   # the node is programmed: the cold start is over
        if full or first:
            release_heap()      # the first LIST's JSON, or a relist's: a few ms at 10k Services
        self.full_collections.settle()
        return outcome.ok

    # -- self-check and drift ----------------------------------------------------------------
    def check_input(self) -> CheckInput:
        """/checkz's view, taken between syncs: the last computed frontends and the maps."""
        with self.lock:
            node, writer = self.node, self.node.writer
            if not self.policy.synced_once or writer is None:
                return CheckInput(node=self.cfg.node_name, desired={}, kernel=[], hooks=[],
                                  hooks_expected=self.cfg.socket_lb, synced=False)
            assert node.cidrs is not None       # adopt() made it with the writer
            return CheckInput(node=self.cfg.node_name, desired=self.desired,
                              kernel=node.kernel_services(), hooks=node.hooks(),
                              hooks_expected=self.cfg.socket_lb, synced=True,
                              unprogrammed=len(self.policy.retry),
                              cidrs_written=node.cidrs.written(), cidrs_held=node.cidrs.held(),
                              tc_missing=node.tc_missing())

    def kernel_drift(self, drift: list[str]) -> None:
        """The drift check found the maps changed behind this agent (drift_watch.py)."""
        with self.lock:
            self.policy.drift_found()
        self.request()

    def drift_found(self, verdict: CheckVerdict) -> None:
        """A self-check found the datapath changed behind this agent: the next sync re-reads
        the maps and rewrites the difference; missing TC filters are attached again now."""
        log.warning("self-check: %s; the next sync re-reads the maps and rewrites the "
                    "difference", "; ".join(verdict.problems))
        with self.lock:
            self.policy.drift_found()
            if verdict.tc_missing:
                self.node.reattach_tc()
        self.request()
