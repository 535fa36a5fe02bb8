"""The node agent: it wires the sources (kube/) into ProxyState (through state_sink.py), the
runner into the sync loop (sync.py: compute -> apply -> report), and the node's datapath
(node_datapath.py) into both; health, metrics and the lifecycle of the datapath (load, adopt,
attach, close) are around that loop.

Start-up order matters for "a restart loses no connection": the maps pinned by the previous
agent are adopted first (nothing is rewritten), the new programs replace the old ones through
the pinned links, and only after every source has delivered its first complete list does a sync
run, so a half-listed cluster never garbage-collects a live service.
"""
from __future__ import annotations

import logging
import signal
import threading
import time

from kproxy_ebpf.config import AgentConfig
from kproxy_ebpf.datapath.flows import conn_counts
from kproxy_ebpf.datapath.load.sock_hooks import AGENT_FILLED
from kproxy_ebpf.datapath.maps import reader, svc_counters
from kproxy_ebpf.datapath.sockets.stale_sockets import Outcome as SweepOutcome
from kproxy_ebpf.datapath.write.drift import DriftCheck
from kproxy_ebpf.kube.owner import OwnerWatch
from kproxy_ebpf.kube.sources import ApiSource, ManifestSource
from kproxy_ebpf.model.objects import LBAlgorithm, Node
from kproxy_ebpf.proxy.state import ProxyState
from kproxy_ebpf.serve import health, httpserve
from kproxy_ebpf.serve.metrics import Metrics
from kproxy_ebpf.serve.port_wait import Listener, PortWaits

from . import conntrack_sysctl, uninstall
from .drift_watch import DriftWatch
from .flow_repair import FlowRepair
from .kubeproxy_handover import Handover, Mode
from .node_datapath import NodeDatapath
from .process_tuning import GcPause, limit_malloc_arenas, release_heap
from .reporting import Reporter
from .runner import Runner, Schedule
from .self_check import SelfCheck
from .state_sink import StateSink
from .sync import SyncLoop
from .sync_policy import KERNEL_CHECK_EVERY

log = logging.getLogger("kproxy_ebpf.agent")   # the agent's lines under one name, as before the split


class Agent:
    def __init__(self, cfg: AgentConfig):
        self.cfg = cfg
        self.metrics = Metrics()
        self.health = health.ProxyHealth(cfg.health_timeout)
        self.health.on_response = self.metrics.health_response
        self.state = ProxyState(Node(cfg.node_name), **cfg.planning)
        self.node = NodeDatapath(cfg, self.metrics)
        self.source: ApiSource | ManifestSource | None = None
        self.reporter = Reporter(self.metrics)
        self.metrics.watch_changes(lambda: (self.state.service_changes_total,
                                            self.state.endpoint_changes_total))
        self._lock = threading.Lock()        # guards state
        self.sink = StateSink(self.state, self._lock, started_at=time.time(),
                              on_change=self._changed, on_node=self._node_seen,
                              on_rejected=self.reporter.rejected)
        self.gc_pause = GcPause()             # from start() until the first sync
        self.loop = SyncLoop(cfg, self.state, self._lock, self.sink, self.node, self.metrics,
                             self.health, self.reporter, self.gc_pause,
                             request=lambda: self.runner.run())
        self.health.checkz = SelfCheck(self.loop.check_input, self.loop.drift_found)
        self._stop = self.loop.stopped
        self.runner = Runner(self.loop.sync, Schedule(cfg.min_sync_period, cfg.sync_period))
        self.api = None                      # the API client, once there is one
        self.owner: OwnerWatch | None = None  # its own DaemonSet, watched (uninstall.py)
        self.ports = PortWaits(self.metrics.registry, told=self._tell)
        self.healthz: Listener | None = None
        self.handover = Handover(Mode(cfg.kube_proxy_cleanup), self.metrics.registry,
                                 synced=lambda: self.health.last_updated is not None,
                                 port_free=lambda: self.healthz is None
                                 or self.healthz.serving.is_set(), told=self._tell)

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
        try:
            # The cold start's two long parts run side by side: bcc compiles (or loads from the
            # program cache) in a child process (progload.py; LLVM never enters this process)
            # while the sources list the cluster. On a small cluster the load is the longer
            # part; on a large one the LIST is, and what follows it (the client's import,
            # netlink for the TC devices) runs while it waits on the API server. Listing only
            # fills ProxyState; nothing syncs before the maps are adopted below (the runner
            # starts after the first complete list, and after start()).
            job = self.node.start_load()
            self.source = self._make_source()
            self.metrics.watch_api(self.source.counters)
            self.source.start()
            self.node.load(job)
        except BaseException:
            if job is not None:
                job.cancel()
            if self.source:
                self.source.stop()
            self.gc_pause.resume()
            raise
        release_heap()
        adopted = self.node.adopt()
        log.info("adopted %d frontends from %s", adopted, self.cfg.bpffs_dir)
        self.metrics.zero_series([m.spec.name for mid, m in self.node.maps.items()
                                  if mid in AGENT_FILLED], [o.value for o in SweepOutcome])
        if self.node.client_sources is not None:
            self.node.client_sources.start(self._stop)
        # Programs that would read empty maps (a fresh node, a cleanup, maps of a new layout
        # version beside adopted ones) are attached only after the first sync has filled
        # them: until then the previous programs, if any, keep serving from their own maps.
        fresh = self.node.sock.new_agent_maps()
        self.loop.attach_pending = adopted == 0 or bool(fresh)
        if adopted and fresh:
            log.info("new maps %s: the programs are replaced after the first sync fills them",
                     ", ".join(fresh))
        if not self.loop.attach_pending:
            self.node.attach()
        # Socket and TC counters share kp_stats (the TC ones are named tc_*).
        self.metrics.watch_datapath(lambda: reader.counters(self.node.maps["stats"]))
        self.metrics.watch_services(lambda: svc_counters.by_service(self.node.maps),
                                    self.cfg.service_metrics_limit)
        self.metrics.watch_backends(lambda: conn_counts.counts_by_backend(self.node.maps),
                                    self.cfg.service_metrics_limit)
        self._serve()
        self.handover.start(self._stop)
        threading.Thread(target=self._start_runner, name="wait-synced", daemon=True).start()
        assert self.node.writer is not None and self.node.cidrs is not None     # adopt() made them
        FlowRepair(lambda: self.node.maps, self.metrics, self._least_conn).start(self._stop)
        DriftWatch(DriftCheck(self.node.writer, self.node.cidrs), self.loop.lock, self.metrics,
                   self.loop.kernel_drift, self.node.sweep_service_counters).start(
            self.cfg.sync_period * KERNEL_CHECK_EVERY, self._stop)

    def _least_conn(self) -> bool:
        """Whether a frontend is least-conn (list(): one step under the GIL, while the sync
        thread may be changing the table)."""
        writer = self.node.writer
        return writer is not None and any(
            p.algorithm is LBAlgorithm.LEAST_CONN for p in list(writer.programmed.values()))

    def pause_gc(self) -> None:
        """No cyclic GC until the first sync is done (or GC_PAUSE_MAX has passed)."""
        self.gc_pause.pause()

    def _make_source(self) -> ApiSource | ManifestSource:
        if self.cfg.manifests:
            return ManifestSource(self.cfg.manifests, Node(self.cfg.node_name), self.sink)
        from kproxy_ebpf.kube.client import make_api_client
        from kproxy_ebpf.kube.events import EventRecorder

        api = self.api = make_api_client(kubeconfig=self.cfg.kubeconfig, master=self.cfg.master)
        self.reporter.events = EventRecorder(api, host=self.cfg.node_name)
        if self.cfg.daemonset_name and self.cfg.daemonset_namespace:
            self.owner = OwnerWatch(api, self.cfg.daemonset_namespace, self.cfg.daemonset_name,
                                    progress_timeout=self.cfg.watch_progress_timeout)
            self.owner.start()
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
        """The health and metrics servers; a port another process holds (kube-proxy, during a
        migration) is waited for, not fatal (serve/port_wait.py)."""
        if self.cfg.healthz_bind_address:
            self.healthz = self.ports.serve(httpserve.host_port(self.cfg.healthz_bind_address),
                                            health.handler(self.health), "healthz", self._stop)
        if self.cfg.metrics_bind_address:
            self.ports.serve(httpserve.host_port(self.cfg.metrics_bind_address),
                             httpserve.metrics_handler(self.metrics.registry), "metrics",
                             self._stop)

    def _tell(self, reason: str, message: str) -> None:
        """An Event on this agent's Node, when there is an API server. A healthz port come free
        may mean kube-proxy left: its leftovers are looked at now."""
        if reason == "PortFree":
            self.handover.wake()
        if self.reporter.events:
            record = (self.reporter.events.warn if reason == "PortInUse"
                      else self.reporter.events.normal)
            record("Node", "", self.cfg.node_name, reason, message)

    def stop(self) -> None:
        """Stops watching and syncing; the programs and maps stay (the datapath outlives us)."""
        self._stop.set()
        self.handover.wake()
        self.gc_pause.resume()
        if self.source:
            self.source.stop()
        if self.owner:
            self.owner.stop()
        self.runner.stop()
        if self.reporter.events:
            self.reporter.events.stop()
        with self.loop.lock:          # never close map fds under a sync still writing
            self.node.close()
            self.loop.svc_health.close()

    def run_until_signalled(self) -> None:
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, lambda *_: self._stop.set())
        self.start()
        self._stop.wait()
        leave, why = uninstall.decide(self.api, self.cfg.daemonset_namespace,
                                      self.cfg.daemonset_name, self.cfg.node_name,
                                      self.owner.state() if self.owner else (False, None))
        log.info("stopping and removing the datapath from this node: %s" if leave else
                 "stopping; the datapath stays programmed: %s", why)
        self.stop()
        if leave:
            self.node.remove()

    # -- what the sink calls -----------------------------------------------------------------
    def _node_seen(self, node: Node) -> None:
        self.health.node_eligible = not node.deleting

    def _changed(self) -> None:
        self.health.queued_update()
        self.metrics.sync_queued.set_to_current_time()
        with self._lock:               # reflector threads mutate the state
            self.loop.set_pending()
        self.runner.run()
