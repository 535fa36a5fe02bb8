"""The agent's one job: run the node's sync. It wires the sources (kube/) into ProxyState
(through state_sink.py), lets the runner call a sync, and in each sync computes the desired
table and hands it to the map writers, as sync_policy.py plans; health, metrics and the
lifecycle of the datapath (adopt, attach, close) are around that loop.

Start-up order matters for "a restart loses no connection": the maps pinned by the previous
agent are adopted first (nothing is rewritten), the new programs replace the old ones through
the pinned links, and only after every source has delivered its first complete list does a sync
run, so a half-listed cluster never garbage-collects a live service.

Partial syncs look only at the frontends of services that changed (plus those that failed
last time), and everything they do is proportional to that change: the desired table is handed
to the writer as a view, problems are reported from what compute() re-evaluated, and the map
row gauges are refreshed at most every ROW_COUNT_EVERY seconds. The objects themselves live in
ProxyState alone: it answers which keys it holds.
"""
from __future__ import annotations

import logging
import signal
import threading
import time
from collections.abc import Mapping
from pathlib import Path

from kproxy_ebpf.serve import health, httpserve
from kproxy_ebpf.config import AgentConfig
from kproxy_ebpf.datapath.flows import conntrack
from kproxy_ebpf.datapath.upgrade import downgrade
from kproxy_ebpf.datapath.maps import reader, svc_counters
from kproxy_ebpf.datapath.load import tc
from kproxy_ebpf.datapath.write.cidr_writer import CidrWriter
from kproxy_ebpf.datapath.write.drift import DriftCheck
from . import conntrack_sysctl
from kproxy_ebpf.datapath.sockets.netns_sources import NetnsSources
from kproxy_ebpf.datapath.load.sock_hooks import AGENT_FILLED, SockDatapath
from kproxy_ebpf.datapath.sockets.stale_sockets import Outcome, StaleSockets
from kproxy_ebpf.datapath.load.tc import TcDatapath
from kproxy_ebpf.datapath.write.apply_result import ApplyResult
from kproxy_ebpf.datapath.write.writer import MapWriter
from .client_sources import ClientSources
from kproxy_ebpf.model.desired import Frontend, FrontendKey
from .drift_watch import DriftWatch
from .established import Established
from kproxy_ebpf.kube.sources import ApiSource, ManifestSource
from kproxy_ebpf.serve.metrics import Metrics
from kproxy_ebpf.model.objects import Node
from .process_tuning import FullCollections, GcPause, limit_malloc_arenas, release_heap
from kproxy_ebpf.proxy.no_local import NoLocalEndpoints
from kproxy_ebpf.proxy.state import ProxyState
from .reporting import Reporter
from .runner import Runner, Schedule
from .self_check import CheckInput, SelfCheck
from kproxy_ebpf.serve.service_health import ServiceHealthServers
from .socket_sweep import SocketSweep
from .state_sink import StateSink
from .sync_policy import KERNEL_CHECK_EVERY, SyncPlan, SyncPolicy

log = logging.getLogger(__name__)

ROW_COUNT_EVERY = 5.0       # seconds between two refreshes of the map row gauges (O(frontends))


class Agent:
    def __init__(self, cfg: AgentConfig):
        self.cfg = cfg
        self.metrics = Metrics()
        self.health = health.ProxyHealth(cfg.health_timeout)
        self.health.on_response = self.metrics.health_response
        self._desired: Mapping[FrontendKey, Frontend] = {}   # the last sync's frontends
        self.health.checkz = SelfCheck(self._check_input, self._drift_found)
        self.state = ProxyState(Node(cfg.node_name), **cfg.planning)
        self.datapath = SockDatapath(Path(cfg.bpffs_dir), Path(cfg.cgroup), cfg.map_sizes,
                                 Path(cfg.program_cache) if cfg.program_cache else None)
        self.tc: TcDatapath | None = None
        self.svc_health = ServiceHealthServers(
            lambda: self.health.status(with_node=False)[0] == 200)
        self.writer: MapWriter | None = None
        self.cidrs: CidrWriter | None = None   # ServiceCIDR rows (datapath/cidr_writer.py)
        self.sweep: SocketSweep | None = None  # sockets of backends gone (socket path only)
        self.client_sources: ClientSources | None = None  # kp_nssrc (socket path only)
        self._full_maps: set[str] = set()      # maps found full since the last full retry
        self.source: ApiSource | ManifestSource | None = None
        self.reporter = Reporter(self.metrics)
        self.no_local = NoLocalEndpoints()   # kube-proxy's no_local_endpoints, per sync
        self.metrics.watch_changes(lambda: (self.state.service_changes_total,
                                            self.state.endpoint_changes_total))
        self._lock = threading.Lock()        # guards state
        self.sink = StateSink(self.state, self._lock, started_at=time.time(),
                              on_change=self._changed, on_node=self._node_seen,
                              on_rejected=self.reporter.rejected)
        self.policy = SyncPolicy()
        self._rows_counted = 0.0              # monotonic time of the last row gauge refresh
        self._stop = threading.Event()
        self._attach_pending = False
        self._sync_lock = threading.Lock()
        self.gc_pause = GcPause()             # from start() until the first sync
        self.full_collections = FullCollections.install()
        self.runner = Runner(self._sync, Schedule(cfg.min_sync_period, cfg.sync_period))

    # -- lifecycle ---------------------------------------------------------------------------
    def start(self) -> None:
        # Until a first sync lands the node is only as fresh as the pinned maps: if none lands
        # within the health timeout (say the API server is unreachable), /healthz says so.
        self.health.queued_update()
        limit_malloc_arenas()
        conntrack_sysctl.apply({name: int(getattr(self.cfg, name))
                                for name in conntrack_sysctl.SYSCTLS})
        self.pause_gc()          # until the first sync: the LIST and the first sync are cold work
        job = None
        want_tc = self.cfg.north_south or not self.cfg.socket_lb
        try:
            # The cold start's two long parts run side by side: bcc compiles (or loads from the
            # program cache) in a child process (datapath/progload.py; LLVM never enters this
            # process) while the sources list the cluster. The child starts first, from the
            # configuration alone: on a small cluster the load is the longer part; on a large
            # one the LIST is, and what follows it here (the client's import, netlink for the
            # TC devices) runs while it waits on the API server. Listing only fills
            # ProxyState; nothing syncs before the maps are adopted below (the runner starts
            # after the first complete list, and after start()).
            job = self.datapath.start_load(tc.tc_programs() if want_tc else [])
            self.source = self._make_source()
            self.metrics.watch_api(self.source.counters)
            self.source.start()
            target = self._tc_target() if want_tc else None
            self.datapath.load(job)
            self.metrics.program_loads.labels(job.cache_result).inc()
            if target:
                self.tc = self._load_tc(job, *target)
            elif want_tc:
                job.release(tc.PROGRAMS)     # no device to attach to (_tc_target logged why)
        except BaseException:
            if job is not None:
                job.cancel()
            if self.source:
                self.source.stop()
            self.gc_pause.resume()
            raise
        release_heap()
        self.writer = MapWriter(self.datapath.maps)
        adopted = self.writer.restore()
        self._sweep_service_counters()
        self.cidrs = CidrWriter(self.datapath.maps)
        self.cidrs.restore()
        log.info("adopted %d frontends from %s", adopted, self.cfg.bpffs_dir)
        self.metrics.zero_series([m.spec.name for mid, m in self.datapath.maps.items()
                                  if mid in AGENT_FILLED], [o.value for o in Outcome])
        if self.cfg.socket_lb:
            stale = StaleSockets.of(self.datapath.maps, self.cfg.cgroup,
                                    reset_tcp=self.cfg.stale_sockets_tcp)
            self.sweep = SocketSweep(stale, self.metrics,
                                     new_where=self.datapath.made_beside_adopted("skwhere"))
            self.client_sources = ClientSources(
                NetnsSources.of(self.datapath.maps, self.cfg.cgroup), self.metrics)
            self.client_sources.start(self._stop)
        # Programs that would read empty maps (a fresh node, a cleanup, maps of a new layout
        # version beside adopted ones) are attached only after the first sync has filled
        # them: until then the previous programs, if any, keep serving from their own maps.
        fresh = self.datapath.new_agent_maps()
        self._attach_pending = adopted == 0 or bool(fresh)
        if adopted and fresh:
            log.info("new maps %s: the programs are replaced after the first sync fills them",
                     ", ".join(fresh))
        if not self._attach_pending:
            self._attach()
        # Socket and TC counters share kp_stats (the TC ones are named tc_*).
        self.metrics.watch_datapath(lambda: reader.counters(self.datapath.maps["stats"]))
        self.metrics.watch_services(lambda: svc_counters.by_service(self.datapath.maps),
                                    self.cfg.service_metrics_limit)
        self._serve()
        threading.Thread(target=self._start_runner, name="wait-synced", daemon=True).start()
        DriftWatch(DriftCheck(self.writer, self.cidrs), self._sync_lock, self.metrics,
                   self._kernel_drift, self._sweep_service_counters).start(
            self.cfg.sync_period * KERNEL_CHECK_EVERY, self._stop)

    def pause_gc(self) -> None:
        """No cyclic GC until the first sync is done (or GC_PAUSE_MAX has passed)."""
        self.gc_pause.pause()

    def _tc_target(self) -> tuple[list[str], tuple[str, ...]] | None:
        """The external devices and the SNAT addresses (one per family) for tc_lb.c
        (north-south), and with socketLB false the pod devices. No external device is logged,
        not fatal: the socket path (or the pod path) still serves everything that starts on
        this node."""
        candidates = self.cfg.devices or tc.detect_devices()
        snat = tc.snat_addresses(candidates)
        devices = candidates if self.cfg.north_south and snat else []
        if self.cfg.north_south and not devices:
            log.error("north-south datapath off: no external device with an IP address "
                      "(devices %s); set `devices`", candidates or "none found")
        if not devices and self.cfg.socket_lb:
            return None
        if not snat:
            log.warning("no node address found: a pod reaching itself through a Service "
                        "(hairpin) is dropped on the per-packet path")
        return devices, snat

    def _load_tc(self, job, devices: list[str], snat: tuple[str, ...]) -> TcDatapath:
        dp = TcDatapath(Path(self.cfg.bpffs_dir), devices, snat, self.cfg.snat_ports,
                        self.cfg.map_sizes,
                        pod_globs=None if self.cfg.socket_lb else tuple(self.cfg.pod_devices))
        dp.load(job)
        if devices:
            log.info("north-south on %s, SNAT to %s ports %d-%d", ", ".join(devices),
                     " and ".join(snat) or "no address", *self.cfg.snat_ports)
        if not self.cfg.socket_lb:
            log.info("socket LB off: ClusterIPs per packet on devices matching %s",
                     ", ".join(self.cfg.pod_devices))
        return dp

    def _purge_conntrack(self, keeps: conntrack.Keeps, frontends=None) -> None:
        """Flows of `frontends` (None: any) whose backend does not keep them lose their TC
        conntrack entries."""
        res = conntrack.purge(self.datapath.maps, keeps, frontends)
        if res.removed:
            log.info("purged %d conntrack entries of removed backends", res.removed)
        ct = self.datapath.maps["ct"]
        self.metrics.map_entries.labels("ct").set(res.entries)
        self.metrics.map_capacity.labels("ct").set(ct.max_entries)

    def _forget_service_counters(self, ids: list[int]) -> None:
        """Freed service ids lose their counter rows, so a later holder starts from zero."""
        try:
            svc_counters.forget(self.datapath.maps["svcstat"], ids)
        except OSError as exc:
            log.warning("could not delete the counters of %d freed service ids (%s); the "
                        "next drift check removes them", len(ids), exc)

    def _sweep_service_counters(self) -> None:
        """Counter rows of ids no frontend holds (created a moment before their id was freed,
        or left by an agent stopped before it deleted them)."""
        try:
            n = svc_counters.sweep(self.datapath.maps["svcstat"], self.writer.svc_ids_held())
        except OSError as exc:
            log.warning("could not sweep the per-Service counters (%s); retried at the next "
                        "drift check", exc)
            return
        if n:
            log.info("removed %d per-Service counter rows of freed service ids", n)

    def _report_unprogrammed(self, result: ApplyResult) -> None:
        """How many frontends wait for a retry (they did not fit or their write failed), and
        which maps were full: a gauge, and the /healthz body `status` shows."""
        waiting = len(self.policy.retry)
        if result.full_maps:
            self._full_maps = set(result.full_maps)
        elif not waiting:
            self._full_maps = set()
        self.metrics.unprogrammed.set(waiting)
        self.health.set_unprogrammed(waiting, sorted(self._full_maps))

    def _attach(self) -> None:
        """Attaches this mode's programs, then removes the other mode's (a previous agent's),
        so no instant has neither path."""
        if self.cfg.socket_lb:
            self.datapath.attach()
        if self.tc is not None:
            self.tc.attach()
        if self.cfg.socket_lb:
            for what in tc.detach_all(tc.POD_PROGRAMS):
                log.info("removed %s: the per-packet ClusterIP path is off", what)
        else:
            self.datapath.detach()
            self.datapath.remove_stale_maps()
        self.datapath.finish_resize()

    def _make_source(self) -> ApiSource | ManifestSource:
        if self.cfg.manifests:
            return ManifestSource(self.cfg.manifests, Node(self.cfg.node_name), self.sink)
        from kproxy_ebpf.kube.client import make_api_client
        from kproxy_ebpf.kube.events import EventRecorder

        api = make_api_client(kubeconfig=self.cfg.kubeconfig, master=self.cfg.master)
        self.reporter.events = EventRecorder(api, host=self.cfg.node_name)
        return ApiSource(api, self.cfg.node_name, self.sink,
                         progress_timeout=self.cfg.watch_progress_timeout)

    def _start_runner(self) -> None:
        assert self.source is not None
        while not self._stop.is_set():
            if self.source.wait_synced(timeout=5):
                log.info("all sources listed; starting the sync loop")
                self.runner.start()
                return
            log.info("waiting for the first list of every resource")

    def _serve(self) -> None:
        if self.cfg.healthz_bind_address:
            health.serve(self.health, self.cfg.healthz_bind_address)
        if self.cfg.metrics_bind_address:
            host, _, port = self.cfg.metrics_bind_address.rpartition(":")
            httpserve.serve((host or "0.0.0.0", int(port)),
                            httpserve.metrics_handler(self.metrics.registry), "metrics")

    def stop(self) -> None:
        """Stops watching and syncing; the programs and maps stay (the datapath outlives us)."""
        self._stop.set()
        self.gc_pause.resume()
        if self.source:
            self.source.stop()
        self.runner.stop()
        if self.reporter.events:
            self.reporter.events.stop()
        with self._sync_lock:          # never close map fds under a sync still writing
            self._write_previous_layouts()
            self.datapath.close()
            self.svc_health.close()
            if self.tc is not None:
                self.tc.close()

    def _write_previous_layouts(self) -> None:
        """The previous release's copy of the maps this one re-laid out (datapath/downgrade.py):
        a rollback then starts with their rows."""
        try:
            downgrade.write_previous(Path(self.cfg.bpffs_dir))
        except OSError as exc:             # libbpf.BpfError among them
            log.warning("could not write the previous release's maps (%s): a rollback to it "
                        "starts them empty, and its LoadBalancer source ranges drop new flows "
                        "from outside until its first sync", exc)

    def run_until_signalled(self) -> None:
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, lambda *_: self._stop.set())
        self.start()
        self._stop.wait()
        log.info("stopping; the datapath stays programmed")
        self.stop()

    # -- what the sink calls -----------------------------------------------------------------
    def _node_seen(self, node: Node) -> None:
        self.health.node_eligible = not node.deleting

    def _changed(self) -> None:
        self.health.queued_update()
        self.metrics.sync_queued.set_to_current_time()
        with self._lock:               # reflector threads mutate the state
            self._set_pending()
        self.runner.run()

    def _set_pending(self) -> None:
        """The pending-change gauges, from the state (the caller holds self._lock)."""
        self.metrics.set_pending(self.state.service_changes_pending,
                                 self.state.endpoint_changes_pending, self.state.pending)

    # -- sync --------------------------------------------------------------------------------
    def _sync(self, full: bool) -> bool:
        """One sync; `full`: the runner's syncPeriod tick (see sync_policy.py for what that
        makes this sync do)."""
        with self._sync_lock:
            if self._stop.is_set():
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
        assert self.writer is not None
        full = plan.diff_all
        started = time.time()
        t0 = time.monotonic()
        with self._lock:
            # A Service's result is cached until its inputs change, so a periodic full sync
            # recomputes only the changed ones; after a failure (say, compute() itself raised
            # half-way) every Service is recomputed.
            changes = self.state.compute(full=plan.recompute)
            self._desired = changes.frontends
            self.no_local.update(changes.frontends,
                                 None if full or plan.recompute else changes.changed_keys)
            checks = self.state.health_checks() if full or changes.changed_services else None
            triggers, self.sink.triggers = self.sink.triggers, []
            problem_counts = dict(self.state.problem_counts())
            # After a failed write the next sync writes the whole ServiceCIDR set.
            cidr_input = (self.state.service_cidr_set() if plan.cidrs_all
                          else self.state.service_cidr_changes())
        if plan.reread:
            self.writer.restore()
            self.cidrs.restore()
            self._sweep_service_counters()
        keys = None if full else changes.changed_keys | plan.retry
        sockets = (self.sweep.before(self.writer, None if full else
                                     changes.recomputed_keys | keys)
                   if self.sweep is not None else None)
        if self.client_sources is not None:
            self.client_sources.before_apply(changes.frontends, keys)
        cidr_changes = (self.cidrs.whole(cidr_input) if plan.cidrs_all
                        else self.cidrs.changes(*cidr_input))
        result = ApplyResult()
        # A new Service's ClusterIP row before its frontends, a deleted one's after: while a
        # ClusterIP answers on its ports, the ports it lacks are refused (bpf/lib/servicecidr.h).
        cidrs_done = self.cidrs.write_additions(cidr_changes, result)
        result = self.writer.apply(changes.frontends, keys, result)
        self._forget_service_counters(self.writer.take_freed_svc_ids())
        established = Established(self.writer, changes.frontends, self.state, self._lock)
        if self.sweep is not None and sockets is not None:
            self.sweep.after(sockets, established, full, self.writer.holds)
        cidrs_done &= self.cidrs.write_removals(cidr_changes, result)
        self.policy.cidrs_written(cidrs_done)
        if self.policy.applied(plan, result.failed, bool(result.full_maps),
                               freed=result.deleted > 0):
            self.runner.run()           # room was freed: what did not fit is tried again now
        self._report_unprogrammed(result)
        if checks is not None:
            self.svc_health.sync(checks)
        # The recomputed Services' frontends too: a draining endpoint that goes changes none.
        touched = changes.changed_keys | changes.recomputed_keys
        if self.tc is not None and plan.purges_conntrack(touched, pod_path=not self.cfg.socket_lb):
            self._purge_conntrack(established.keeps, None if full else touched)
        elapsed = time.monotonic() - t0
        if self._attach_pending:
            # The maps hold what could be written (a full map must not keep every other
            # service of the node untranslated): now the hooks may read them.
            self._attach()
            self._attach_pending = False
        if result.ok:
            self.health.updated(started)
            done = time.time()
            self.metrics.sync_last.set(done)
            for t, family in triggers:
                self.metrics.observe_programming(family, max(0.0, done - t))
        else:
            self.metrics.sync_failures.inc()
            with self._lock:       # measured again once a sync gets them in
                self.sink.triggers.extend(triggers)
        self.metrics.set_no_local_endpoints(self.no_local.counts())
        self.reporter.problems(changes.problems, changes.reported, problem_counts)
        self.reporter.writes(result)
        first = not self.policy.synced_once
        self._record(full, elapsed, len(changes.frontends), result)
        if first:
            self.gc_pause.resume()   # the node is programmed: the cold start is over
        if full or first:
            release_heap()      # the first LIST's JSON, or a relist's: a few ms at 10k Services
        self.full_collections.settle()
        return result.ok

    def _check_input(self) -> CheckInput:
        """/checkz's view, taken between syncs: the last computed frontends and the maps."""
        with self._sync_lock:
            if not self.policy.synced_once or self.writer is None:
                return CheckInput(node=self.cfg.node_name, desired={}, kernel=[], hooks=[],
                                  hooks_expected=self.cfg.socket_lb, synced=False)
            return CheckInput(node=self.cfg.node_name, desired=self._desired,
                              kernel=reader.services(self.datapath.maps),
                              hooks=reader.hooks(Path(self.cfg.bpffs_dir)),
                              hooks_expected=self.cfg.socket_lb, synced=True,
                              unprogrammed=len(self.policy.retry),
                              cidrs_written=self.cidrs.written(), cidrs_held=self.cidrs.held(),
                              tc_missing=self._tc_missing())

    def _tc_missing(self) -> tuple[str, ...]:
        if self.tc is None:
            return ()
        try:
            return tuple(tc.missing_filters(self.tc.devices))
        except Exception as exc:   # noqa: BLE001 - pyroute2's NetlinkError is no OSError
            return (f"(the filters could not be listed: {exc})",)

    def _kernel_drift(self, drift: list[str]) -> None:
        """The drift check found the maps changed behind this agent (drift_watch.py)."""
        with self._sync_lock:
            self.policy.drift_found()
        self.runner.run()

    def _drift_found(self, body: dict) -> None:
        """A self-check found the datapath changed behind this agent: the next sync re-reads
        the maps and rewrites the difference; missing TC filters are attached again now."""
        log.warning("self-check: %s; the next sync re-reads the maps and rewrites the "
                    "difference", "; ".join(body["problems"]))
        with self._sync_lock:
            self.policy.drift_found()
            if body["tcMissing"] and self.tc is not None:
                try:
                    self.tc.reattach()
                except Exception as exc:   # noqa: BLE001 - pyroute2's NetlinkError is no OSError
                    log.error("could not attach the TC filters again: %s", exc)
        self.runner.run()

    def _record(self, full: bool, elapsed: float, desired: int, result: ApplyResult) -> None:
        """Metrics and the log line of one sync."""
        self.metrics.observe_sync(full, elapsed)
        with self._lock:
            self._set_pending()
        stats = self.writer.stats()
        self.metrics.frontends.set(stats["frontends"])
        self.metrics.backends.set(stats["backends"])
        now = time.monotonic()
        if full or now - self._rows_counted >= ROW_COUNT_EVERY:
            self._rows_counted = now
            for name, count in {**self.writer.row_counts(), **self.cidrs.row_counts()}.items():
                self.metrics.map_entries.labels(name).set(count)
                self.metrics.map_capacity.labels(name).set(self.datapath.maps[name].max_entries)
        if result.updated or result.deleted or not result.ok or not self.policy.synced_once:
            log.info("%s sync: %d frontends desired, %d written, %d removed, %d map writes "
                     "in %.1f ms%s", "first" if not self.policy.synced_once else
                     "full" if full else "partial", desired, result.updated,
                     result.deleted, result.writes, elapsed * 1000,
                     "" if result.ok else " (with errors)")
        self.policy.finished()
