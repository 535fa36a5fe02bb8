"""The agent: sources -> ProxyState -> (runner) -> MapWriter, with health and metrics.

Start-up order matters for "a restart loses no connection": the maps pinned by the previous
agent are adopted first (nothing is rewritten), the new programs replace the old ones through
the pinned links, and only after every source has delivered its first complete list does a sync
run, so a half-listed cluster never garbage-collects a live service.

Partial syncs look only at the frontends of services that changed (plus those that failed
last time), and everything they do is proportional to that change: the desired table is handed
to the writer as a view, problems are reported from what compute() re-evaluated, and the map
row gauges are refreshed at most every ROW_COUNT_EVERY seconds. A sync runs at least every
syncPeriod; every KERNEL_CHECK_EVERY-th of those periodic syncs is a full one that re-reads the
kernel maps, diffs the whole table against them and repairs any drift, the others are partial
(at rest they find nothing to do), as kube-proxy's nftables proxier syncs partially on its
syncPeriod and fully once an hour (v1.36 pkg/proxy/util FullSyncPeriod). The policy itself is
recomputed for every Service only after a failed sync, since a Service's cached result changes
only with its inputs.
The objects themselves live in ProxyState alone: it answers which keys it holds.
"""
from __future__ import annotations

import ctypes
import ctypes.util
import gc
import logging
import os
import signal
import threading
import time
from pathlib import Path
from typing import Any


from . import health, httpserve
from .config import AgentConfig
from .datapath import reader
from .datapath.cidr_writer import CidrWriter
from .datapath.sock_hooks import SockDatapath
from .datapath import conntrack, tc
from .datapath.tc import TcDatapath
from .datapath.writer import ApplyResult, MapWriter
from .desired import Problem
from .kube.convert import Rejection
from .kube.sources import ApiSource, ManifestSource
from .metrics import Metrics
from .model import Node
from .proxy.state import ProxyState
from .runner import Runner, Schedule
from .service_health import ServiceHealthServers

log = logging.getLogger(__name__)

KERNEL_CHECK_EVERY = 10     # periodic syncs per full one with a map re-read (5 min by default)
ROW_COUNT_EVERY = 5.0       # seconds between two refreshes of the map row gauges (O(frontends))
# A frontend that did not fit into a full map is retried by partial syncs at most this often
# (full syncs retry everything anyway): retrying thousands of them on every 200 ms sync while the
# map stays full cost a whole core and a log line per frontend per sync.
FULL_MAP_RETRY_EVERY = 5.0
ERROR_LINES = 5             # write errors logged one by one per sync; the rest are counted


def release_heap() -> None:
    """Give freed C heap back to the kernel. bcc's compile (LLVM) frees ~50 MiB and a first LIST
    of a large cluster frees its JSON, but glibc keeps such memory in its arenas, so the
    agent's resident size would stay at its peak for good; malloc_trim returns what is free.
    A no-op where the C library has no malloc_trim (musl)."""
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        libc.malloc_trim(0)
    except (OSError, AttributeError):
        pass


M_ARENA_MAX = -8            # mallopt parameter (glibc malloc.h)
MALLOC_ARENAS = 2


def limit_malloc_arenas(arenas: int = MALLOC_ARENAS) -> None:
    """glibc gives each thread that meets contention an arena of its own, up to 8 per core,
    and memory freed in one arena serves only that arena, so the JSON pages each reflector
    thread decodes leave free heap scattered over several arenas that malloc_trim cannot
    always return. The agent's threads mostly wait on sockets: two arenas cost no measurable
    contention. Must run before the threads start; MALLOC_ARENA_MAX in the environment, if an
    operator sets it, wins."""
    if os.environ.get("MALLOC_ARENA_MAX"):
        return
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        libc.mallopt(M_ARENA_MAX, arenas)
    except (OSError, AttributeError):
        pass


# The cyclic GC is paused from start() until the first sync has programmed the node, at most
# this long (an API server that never answers must not let cyclic garbage pile up for good).
GC_PAUSE_MAX = 120.0


def pause_gc() -> bool:
    """Pause Python's cyclic garbage collector; False if it was off already.

    A cold start allocates millions of objects that all stay alive (the LIST's JSON, the model
    objects, the desired table), and every 700 allocations CPython's collector scans the young
    ones, every so often all of them: at 10k Services x 10 endpoints that was a third of the
    compute and of the LIST's conversion, for no garbage found. Reference counting still frees
    everything that is not a cycle."""
    if not gc.isenabled():
        return False
    gc.disable()
    return True


def resume_gc() -> float:
    """End the pause; returns the CPU seconds spent. Everything the cold start made is frozen
    (gc.freeze: moved where no collection ever scans it) instead of collected: at 10k
    Services x 10 the collection scanned ~550,000 live objects for ~1,800 cyclic ones (import
    leftovers) and held the GIL for ~230 ms just after the node was programmed, so /metrics
    and /healthz answered late and the first change waited; later collections skip those
    objects too. The price is bounded: cycles among frozen objects are never freed, and the
    state's own objects (frozen dataclasses, tuples, strings) form none; replaced ones still
    go by reference counting."""
    cpu0 = time.thread_time()
    gc.freeze()
    gc.enable()
    return time.thread_time() - cpu0


class Agent:
    def __init__(self, cfg: AgentConfig):
        self.cfg = cfg
        self.metrics = Metrics()
        self.health = health.ProxyHealth(cfg.health_timeout)
        self.health.on_response = self.metrics.health_response
        self.state = ProxyState(Node(cfg.node_name), prefer_same_node=cfg.prefer_same_node,
                                node_port_addresses=tuple(cfg.node_port_addresses)
                                if cfg.north_south else None,
                                external_ip_allowlist=None if cfg.external_ip_allowlist is None
                                else tuple(cfg.external_ip_allowlist))
        self.datapath = SockDatapath(Path(cfg.bpffs_dir), Path(cfg.cgroup), cfg.map_sizes,
                                 Path(cfg.program_cache) if cfg.program_cache else None)
        self.tc: TcDatapath | None = None
        self.svc_health = ServiceHealthServers(
            lambda: self.health.status(with_node=False)[0] == 200)
        self.writer: MapWriter | None = None
        self.cidrs: CidrWriter | None = None   # ServiceCIDR rows (datapath/cidr_writer.py)
        self.source: ApiSource | ManifestSource | None = None
        self.events = None
        self._lock = threading.Lock()        # guards state
        self._retry: set = set()              # frontend keys a failed write left behind
        self._retry_at = 0.0                  # monotonic time from which _retry is retried
        self._retry_map_full = False          # ...and whether they failed on a full map
        self._triggers: list[float] = []      # trigger times of slice changes not yet synced
        self._started_at = time.time()
        # Current problems per Service, already logged (only Services that have some).
        self._reported: dict[tuple[str, str], set[tuple]] = {}
        self._rows_counted = 0.0              # monotonic time of the last row gauge refresh
        self._recompute = False               # a sync failed: recompute every Service
        self._cidrs_incomplete = False        # a ServiceCIDR row failed: write them all next
        self._stop = threading.Event()
        self._synced_once = False
        self._periodic_syncs = 0
        self._force_full = False
        self._recheck_kernel = False
        self._attach_pending = False
        self._sync_lock = threading.Lock()
        self._gc_lock = threading.Lock()
        self._gc_paused = False               # pause_gc() until the first sync (start())
        self._gc_timer: threading.Timer | None = None
        self.gc_resume_cpu = 0.0              # CPU of the collection that ended the pause
        self.runner = Runner(self._sync, Schedule(cfg.min_sync_period, cfg.sync_period))

    # -- lifecycle ---------------------------------------------------------------------------
    def start(self) -> None:
        # Until a first sync lands the node is only as fresh as the pinned maps: if none lands
        # within the health timeout (say the API server is unreachable), /healthz says so.
        self.health.queued_update()
        limit_malloc_arenas()
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
            self._resume_gc()
            raise
        release_heap()
        self.writer = MapWriter(self.datapath.maps)
        adopted = self.writer.restore()
        self.cidrs = CidrWriter(self.datapath.maps)
        self.cidrs.restore()
        log.info("adopted %d frontends from %s", adopted, self.cfg.bpffs_dir)
        # Programs that would read empty maps (a fresh node, a cleanup, maps of a new layout
        # version) are attached only after the first sync has filled them: until then the
        # previous programs, if any, keep serving from their own maps.
        self._attach_pending = adopted == 0
        if not self._attach_pending:
            self._attach()
        # Socket and TC counters share kp_stats (the TC ones are named tc_*).
        self.metrics.watch_datapath(lambda: reader.counters(self.datapath.maps["stats"]))
        self._serve()
        threading.Thread(target=self._start_runner, name="wait-synced", daemon=True).start()

    def pause_gc(self) -> None:
        """No cyclic GC until the first sync is done (or GC_PAUSE_MAX has passed)."""
        with self._gc_lock:
            if pause_gc():
                self._gc_paused = True
                self._gc_timer = threading.Timer(GC_PAUSE_MAX, self._resume_gc)
                self._gc_timer.daemon = True
                self._gc_timer.start()

    def _resume_gc(self) -> None:
        with self._gc_lock:
            if not self._gc_paused:
                return
            self._gc_paused = False
            if self._gc_timer is not None:
                self._gc_timer.cancel()
            self.gc_resume_cpu = resume_gc()
        log.info("cyclic GC resumed (startup objects frozen: %.0f ms CPU)", self.gc_resume_cpu * 1000)

    def _tc_target(self) -> tuple[list[str], str | None] | None:
        """The external devices and the SNAT address for tc_lb.c (north-south), and with
        socketLB false the pod devices. No external device is logged, not fatal: the socket
        path (or the pod path) still serves everything that starts on this node."""
        candidates = self.cfg.devices or tc.detect_devices()
        snat = next((a for a in map(tc.device_address, candidates) if a), None)
        devices = candidates if self.cfg.north_south and snat is not None else []
        if self.cfg.north_south and not devices:
            log.error("north-south datapath off: no external device with an IPv4 address "
                      "(devices %s); set `devices`", candidates or "none found")
        if not devices and self.cfg.socket_lb:
            return None
        if snat is None:
            log.warning("no node address found: a pod reaching itself through a Service "
                        "(hairpin) is dropped on the per-packet path")
        return devices, snat

    def _load_tc(self, job, devices: list[str], snat: str | None) -> TcDatapath:
        dp = TcDatapath(Path(self.cfg.bpffs_dir), devices, snat, self.cfg.snat_ports,
                        self.cfg.map_sizes,
                        pod_globs=None if self.cfg.socket_lb else tuple(self.cfg.pod_devices))
        dp.load(job)
        if devices:
            log.info("north-south on %s, SNAT to %s ports %d-%d", ", ".join(devices), snat,
                     *self.cfg.snat_ports)
        if not self.cfg.socket_lb:
            log.info("socket LB off: ClusterIPs per packet on devices matching %s",
                     ", ".join(self.cfg.pod_devices))
        return dp

    def _purge_conntrack(self, frontends=None) -> None:
        """Flows whose backend left their frontend (one of `frontends`, None: any) lose their
        TC conntrack entries."""
        res = conntrack.purge(self.datapath.maps, self.writer.programmed, frontends)
        if res.removed:
            log.info("purged %d conntrack entries of removed backends", res.removed)
        ct = self.datapath.maps["ct"]
        self.metrics.map_entries.labels("ct").set(res.entries)
        self.metrics.map_capacity.labels("ct").set(ct.max_entries)

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

    def _make_source(self) -> ApiSource | ManifestSource:
        if self.cfg.manifests:
            return ManifestSource(self.cfg.manifests, Node(self.cfg.node_name), self)
        from .kube.client import make_api_client
        from .kube.events import EventRecorder

        api = make_api_client(kubeconfig=self.cfg.kubeconfig, master=self.cfg.master)
        self.events = EventRecorder(api, host=self.cfg.node_name)
        return ApiSource(api, self.cfg.node_name, self)

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
        self._resume_gc()
        if self.source:
            self.source.stop()
        self.runner.stop()
        if self.events:
            self.events.stop()
        with self._sync_lock:          # never close map fds under a sync still writing
            self.datapath.close()
            self.svc_health.close()
            if self.tc is not None:
                self.tc.close()

    def run_until_signalled(self) -> None:
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, lambda *_: self._stop.set())
        self.start()
        self._stop.wait()
        log.info("stopping; the datapath stays programmed")
        self.stop()

    # -- Sink: what the sources deliver ----------------------------------------------------------
    def replace(self, kind: str, objs: list[Any], keep: set[tuple[str, str]] = frozenset()
                ) -> None:
        with self._lock:
            if kind == "Node":
                changed = bool(objs) and self._set_node(objs[0])
            else:
                new = {o.key for o in objs}
                held = {"Service": self.state.service_keys, "EndpointSlice": self.state.slice_keys,
                        "ServiceCIDR": self.state.service_cidr_keys}[kind]()
                changed = False
                # An object that failed conversion keeps its last good version, as on a watch.
                for ns, name in [k for k in held if k not in new and k not in keep]:
                    changed |= self._delete(kind, ns, name)
                for o in objs:
                    changed |= self._upsert(kind, o)
        self._changed(changed)

    def upsert(self, kind: str, obj: Any) -> None:
        with self._lock:
            if kind == "Node":
                changed = self._set_node(obj)
            else:
                changed = self._upsert(kind, obj)
        self._changed(changed)

    def delete(self, kind: str, namespace: str, name: str) -> None:
        if kind == "Node":
            log.warning("node %s was deleted; keeping the datapath as it is", name)
            return
        with self._lock:
            changed = self._delete(kind, namespace, name)
        self._changed(changed)

    def rejected(self, rejections: list[Rejection]) -> None:
        for r in rejections:
            log.warning("rejected %s %s/%s: %s (%s)", r.kind, r.namespace, r.name, r.message, r.reason)
            self.metrics.rejected.labels(r.kind, r.reason).inc()
        if self.events:
            self.events.rejected(rejections)

    def _upsert(self, kind: str, obj: Any) -> bool:
        if kind == "Service":
            return self.state.upsert_service(obj)
        if kind == "ServiceCIDR":
            return self.state.upsert_service_cidr(obj)
        changed = self.state.upsert_slice(obj)
        # As kube-proxy: changes older than this agent are not its programming latency.
        if changed and obj.trigger_time and obj.trigger_time >= self._started_at:
            self._triggers.append(obj.trigger_time)
        return changed

    def _set_node(self, node: Node) -> bool:
        self.health.node_eligible = not node.deleting
        return self.state.set_node(node)

    def _delete(self, kind: str, ns: str, name: str) -> bool:
        if kind == "Service":
            return self.state.delete_service(ns, name)
        if kind == "ServiceCIDR":
            return self.state.delete_service_cidr(name)
        return self.state.delete_slice(ns, name)

    def _changed(self, changed: bool) -> None:
        if changed:
            self.health.queued_update()
            self.metrics.sync_queued.set_to_current_time()
            with self._lock:               # reflector threads mutate the state
                self.metrics.pending.set(self.state.pending)
            self.runner.run()

    # -- sync --------------------------------------------------------------------------------
    def _sync(self, full: bool) -> bool:
        with self._sync_lock:
            if self._stop.is_set():
                return True
            # The runner asks for a full sync every syncPeriod: such a periodic sync is made
            # partial between two map re-reads (_sync_locked); its CPU is periodic work all the
            # same (the scale run takes it out of its per-change windows).
            periodic = full and not self._force_full
            full = full or self._force_full
            cpu0 = time.thread_time()
            try:
                return self._sync_locked(full, periodic=periodic)
            except Exception:
                # Whatever the writer did not finish is redone by a full sync: the changes
                # compute() handed over are not lost with the exception.
                log.exception("sync failed; the next one will be a full sync")
                self._force_full = self._recheck_kernel = self._recompute = True
                return False
            finally:
                if full:
                    self.metrics.full_sync_cpu.inc(time.thread_time() - cpu0)

    def _sync_locked(self, full: bool, periodic: bool = False) -> bool:
        assert self.writer is not None
        reread = False
        if periodic and self._synced_once and not self._recheck_kernel:
            # A full diff between two re-reads found nothing the partial syncs had not
            # written and cost ~0.2 s of CPU every 30 s at 10k Services: these periodic syncs
            # only retry what failed and apply what changed.
            self._periodic_syncs += 1
            reread = self._periodic_syncs % KERNEL_CHECK_EVERY == 0
            full = reread
        self._force_full = False
        started = time.time()
        t0 = time.monotonic()
        with self._lock:
            # A Service's result is cached until its inputs change, so a periodic full sync
            # recomputes only the changed ones; after a failure (say, compute() itself raised
            # half-way) every Service is recomputed.
            recompute, self._recompute = self._recompute, False
            changes = self.state.compute(full=recompute)
            checks = self.state.health_checks() if full or changes.changed_services else None
            triggers, self._triggers = self._triggers, []
            problem_counts = dict(self.state.problem_counts())
        if full:
            # Re-reading the kernel (drift repair) costs ~1 s of CPU at 10k services x 10
            # endpoints, so only every KERNEL_CHECK_EVERY-th periodic sync, or after a failure.
            # (A full map is no reason to re-read the kernel: the rows that fit are there.)
            if reread or self._recheck_kernel or (self._retry and not self._retry_map_full):
                cpu0 = time.thread_time()
                self.writer.restore()
                self.cidrs.restore()
                self._recheck_kernel = False
                self.metrics.drift_checks.inc()
                self.metrics.drift_check_cpu.inc(time.thread_time() - cpu0)
            result = self.writer.apply(changes.frontends)
            retried = True
        else:
            retried = time.monotonic() >= self._retry_at
            result = self.writer.apply(changes.frontends, changes.changed_keys | (
                self._retry if retried else set()))
        self._apply_service_cidrs(result, full)
        self._retry = set(result.failed) | (set() if retried else self._retry)
        self._retry_map_full = bool(result.full_maps) or (not retried and self._retry_map_full)
        if retried:
            self._retry_at = time.monotonic() + (FULL_MAP_RETRY_EVERY if result.full_maps else 0)
        if checks is not None:
            self.svc_health.sync(checks)
        # Scope-EXT keys are 4-tuples; with socketLB false pods' flows follow SOCK frontends.
        if self.tc is not None and (full or any(len(k) == 4 or not self.cfg.socket_lb
                                                for k in changes.changed_keys)):
            self._purge_conntrack(None if full else changes.changed_keys)
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
            for t in triggers:
                self.metrics.programming.observe(max(0.0, done - t))
        else:
            self.metrics.sync_failures.inc()
            with self._lock:       # measured again once a sync gets them in
                self._triggers.extend(triggers)
        self._report_problems(changes.problems, changes.reported, problem_counts)
        self._report_writes(result)
        first = not self._synced_once
        self._record(full, elapsed, len(changes.frontends), result)
        if first:
            self._resume_gc()   # the node is programmed: the cold start is over
        if full or first:
            release_heap()      # the first LIST's JSON, or a relist's: a few ms at 10k Services
        return result.ok

    def _apply_service_cidrs(self, result: ApplyResult, full: bool) -> None:
        """After the frontends (a new Service's frontend exists before its ClusterIP row). A
        partial sync writes only the ClusterIPs touched since the last one; after a failed
        write the next sync writes the whole set."""
        full = full or self._cidrs_incomplete
        with self._lock:
            if full:
                wanted = self.state.service_cidr_set()
            else:
                cidrs, touched = self.state.service_cidr_changes()
        if full:
            done = self.cidrs.apply(wanted, result)
        else:
            done = self.cidrs.apply_changes(cidrs, touched, result)
        self._cidrs_incomplete = not done

    def _record(self, full: bool, elapsed: float, desired: int, result: ApplyResult) -> None:
        """Metrics and the log line of one sync."""
        self.metrics.observe_sync(full, elapsed)
        with self._lock:
            self.metrics.pending.set(self.state.pending)
        stats = self.writer.stats()
        self.metrics.frontends.set(stats["frontends"])
        self.metrics.backends.set(stats["backends"])
        now = time.monotonic()
        if full or now - self._rows_counted >= ROW_COUNT_EVERY:
            self._rows_counted = now
            for name, count in {**self.writer.row_counts(), **self.cidrs.row_counts()}.items():
                self.metrics.map_entries.labels(name).set(count)
                self.metrics.map_capacity.labels(name).set(self.datapath.maps[name].max_entries)
        if result.updated or result.deleted or not result.ok or not self._synced_once:
            log.info("%s sync: %d frontends desired, %d written, %d removed, %d map writes "
                     "in %.1f ms%s", "first" if not self._synced_once else
                     "full" if full else "partial", desired, result.updated,
                     result.deleted, result.writes, elapsed * 1000,
                     "" if result.ok else " (with errors)")
        self._synced_once = True

    def _report_problems(self, problems: list[Problem], reported: frozenset[tuple[str, str]],
                         counts: dict[str, int]) -> None:
        """Current problems by reason as a gauge; each new one once as a log line and Event.
        Only current problems are remembered, so one that goes and comes back is told again.
        O(services re-evaluated): the others' problems did not change."""
        self.metrics.problems.clear()
        for reason, n in counts.items():
            self.metrics.problems.labels(reason).set(n)
        current: dict[tuple[str, str], list[Problem]] = {}
        for p in problems:
            current.setdefault((p.namespace, p.name), []).append(p)
        for svc in sorted(reported):
            told = self._reported.pop(svc, set())
            now = {(p.reason, p.message): p for p in current.get(svc, ())}
            for key, p in now.items():
                if key not in told:
                    log.warning("service %s/%s: %s (%s)", p.namespace, p.name, p.message, p.reason)
                    if self.events:
                        self.events.warn(p.kind, p.namespace, p.name, p.reason, p.message)
            if now:
                self._reported[svc] = set(now)

    def _report_writes(self, result: ApplyResult) -> None:
        for name in result.full_maps:
            self.metrics.map_full.labels(name).inc()
        for err in result.errors[:ERROR_LINES]:
            log.error("datapath write failed: %s", err)
        if len(result.errors) > ERROR_LINES:
            log.error("datapath writes failed for %d more frontends%s", len(result.errors) - ERROR_LINES,
                      f" (map(s) {', '.join(sorted(result.full_maps))} full: raise their size)"
                      if result.full_maps else "")
        if not result.full_maps:
            self.metrics.map_errors.inc(len(result.errors))
        if self.events and result.full_maps:
            for fkey, spn in result.failed.items():
                if spn is not None:
                    self.events.warn("Service", spn.namespace, spn.name, "BPFMapFull",
                                     f"frontend {fkey[0]}:{fkey[1]}/{fkey[2].value} not programmed: "
                                     f"map(s) {', '.join(sorted(result.full_maps))} full")
