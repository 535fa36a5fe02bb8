"""The node's datapath as the agent drives it: the socket hooks and the TC programs, the map
writers, the stale-socket sweep and the client sources; loaded and adopted at start, closed
at stop, and written by one typed entry, apply(Step) -> Outcome, which owns the write order.

The order of apply(): the ServiceCIDR rows a new Service needs before its frontends (while a
ClusterIP answers on its ports, the ports it lacks are refused, bpf/lib/servicecidr.h); the
frontends (writer.py, make-before-break per frontend); the counters of freed service ids; the
sockets of backends that left (socket_sweep.py); the ServiceCIDR rows that went; the TC
conntrack of flows whose backend does not keep them.
"""
from __future__ import annotations

import logging
from pathlib import Path

from kproxy_ebpf.config import AgentConfig
from kproxy_ebpf.datapath.flows import conntrack
from kproxy_ebpf.datapath.load import tc, teardown
from kproxy_ebpf.datapath.load.progload import LoadJob
from kproxy_ebpf.datapath.load.sock_hooks import SockDatapath
from kproxy_ebpf.datapath.load.tc import TcDatapath
from kproxy_ebpf.datapath.maps import reader, svc_counters
from kproxy_ebpf.datapath.sockets.netns_sources import NetnsSources
from kproxy_ebpf.datapath.sockets.stale_sockets import StaleSockets
from kproxy_ebpf.datapath.upgrade import downgrade
from kproxy_ebpf.datapath.write.apply_result import ApplyResult, Outcome
from kproxy_ebpf.datapath.write.cidr_writer import CidrWriter
from kproxy_ebpf.datapath.write.writer import MapWriter
from kproxy_ebpf.model.desired import ServiceCIDRSet
from kproxy_ebpf.serve.metrics import Metrics

from .client_sources import ClientSources
from .established import Established
from .socket_sweep import SocketSweep
from .step import Step

log = logging.getLogger("kproxy_ebpf.agent")   # the agent's lines under one name, as before the split


class NodeDatapath:
    def __init__(self, cfg: AgentConfig, metrics: Metrics) -> None:
        self.cfg, self.metrics = cfg, metrics
        assert cfg.cgroup is not None       # AgentConfig.validate() requires it
        self.sock = SockDatapath(Path(cfg.bpffs_dir), Path(cfg.cgroup), cfg.map_sizes,
                                 Path(cfg.program_cache) if cfg.program_cache else None)
        self.tc: TcDatapath | None = None
        self.writer: MapWriter | None = None
        self.cidrs: CidrWriter | None = None
        self.sweep: SocketSweep | None = None      # sockets of backends gone (socket path)
        self.client_sources: ClientSources | None = None  # kp_nssrc (socket path)
        self.want_tc = cfg.north_south or not cfg.socket_lb

    @property
    def maps(self):
        return self.sock.maps

    # -- start -------------------------------------------------------------------------------
    def start_load(self) -> LoadJob:
        """The load child starts first, from the configuration alone (progload.py)."""
        return self.sock.start_load(tc.tc_programs() if self.want_tc else [])

    def load(self, job: LoadJob) -> None:
        """Waits for the load child; the TC programs go on their devices once found."""
        target = self._tc_target() if self.want_tc else None
        self.sock.load(job)
        self.metrics.program_loads.labels(job.cache_result).inc()
        if target:
            self.tc = self._load_tc(job, *target)
        elif self.want_tc:
            job.release(tc.PROGRAMS)     # no device to attach to (_tc_target logged why)

    def adopt(self) -> int:
        """The writers over the maps, their Ledgers read back from what the kernel holds;
        returns the frontends found."""
        self.writer = MapWriter(self.maps)
        adopted = self.writer.restore()
        self.sweep_service_counters()
        self.cidrs = CidrWriter(self.maps)
        self.cidrs.restore()
        if self.cfg.socket_lb:
            assert self.cfg.cgroup is not None
            stale = StaleSockets.of(self.maps, self.cfg.cgroup,
                                    reset_tcp=self.cfg.stale_sockets_tcp)
            self.sweep = SocketSweep(stale, self.metrics,
                                     new_where=self.sock.made_beside_adopted("skwhere"))
            self.client_sources = ClientSources(NetnsSources.of(self.maps, self.cfg.cgroup),
                                                self.metrics)
        return adopted

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

    def _load_tc(self, job: LoadJob, devices: list[str], snat: tuple[str, ...]) -> TcDatapath:
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

    def attach(self) -> None:
        """Attaches this mode's programs, then removes the other mode's (a previous agent's),
        so no instant has neither path."""
        if self.cfg.socket_lb:
            self.sock.attach()
        if self.tc is not None:
            self.tc.attach()
        if self.cfg.socket_lb:
            for what in tc.detach_all(tc.POD_PROGRAMS, Path(self.cfg.bpffs_dir)):
                log.info("removed %s: the per-packet ClusterIP path is off", what)
        else:
            self.sock.detach()
            self.sock.remove_stale_maps()
        self.sock.finish_resize()

    # -- one sync's writes -------------------------------------------------------------------
    def apply(self, step: Step) -> Outcome:
        """Makes the maps hold `step`, in the order of the module docstring."""
        writer, cidrs = self.writer, self.cidrs
        assert writer is not None and cidrs is not None
        if step.reread:
            writer.restore()
            cidrs.restore()
            self.sweep_service_counters()
        keys = step.keys
        sockets = (self.sweep.before(writer.held, None if keys is None else step.recomputed | keys)
                   if self.sweep is not None else None)
        if self.client_sources is not None:
            self.client_sources.before_apply(step.frontends, keys)
        cidr_changes = (cidrs.whole(step.cidrs) if isinstance(step.cidrs, ServiceCIDRSet)
                        else cidrs.changes(*step.cidrs))
        result = ApplyResult()
        cidrs_done = cidrs.write_additions(cidr_changes, result)
        writer.apply(step.frontends, keys, result)
        self._forget_service_counters(writer.take_freed_svc_ids())
        established = Established(writer.held, step.frontends, step.serving)
        if self.sweep is not None and sockets is not None:
            self.sweep.after(sockets, established, step.full, writer.held.holds)
        cidrs_done &= cidrs.write_removals(cidr_changes, result)
        if self.tc is not None and step.purge_conntrack:
            self._purge_conntrack(established.keeps, None if step.full else step.touched)
        return result.outcome(cidrs_done)

    def _purge_conntrack(self, keeps: conntrack.Keeps, frontends=None) -> None:
        """Flows of `frontends` (None: any) whose backend does not keep them lose their TC
        conntrack entries."""
        res = conntrack.purge(self.maps, keeps, frontends)
        if res.removed:
            log.info("purged %d conntrack entries of removed backends", res.removed)
        self.metrics.map_entries.labels("ct").set(res.entries)
        self.metrics.map_capacity.labels("ct").set(self.maps["ct"].max_entries)

    def _forget_service_counters(self, ids: list[int]) -> None:
        """Freed service ids lose their counter rows, so a later holder starts from zero."""
        try:
            svc_counters.forget(self.maps["svcstat"], ids)
        except OSError as exc:
            log.warning("could not delete the counters of %d freed service ids (%s); the "
                        "next drift check removes them", len(ids), exc)

    def sweep_service_counters(self) -> None:
        """Counter rows of ids no frontend holds (created a moment before their id was freed,
        or left by an agent stopped before it deleted them)."""
        assert self.writer is not None
        try:
            n = svc_counters.sweep(self.maps["svcstat"], self.writer.held.svc_ids_held())
        except OSError as exc:
            log.warning("could not sweep the per-Service counters (%s); retried at the next "
                        "drift check", exc)
            return
        if n:
            log.info("removed %d per-Service counter rows of freed service ids", n)

    def row_counts(self) -> dict[str, tuple[int, int]]:
        """Rows and capacity of each map the writers own, from their Ledgers."""
        assert self.writer is not None and self.cidrs is not None
        return {name: (count, self.maps[name].max_entries)
                for name, count in {**self.writer.row_counts(),
                                    **self.cidrs.row_counts()}.items()}

    # -- what /checkz and the self-check see -------------------------------------------------
    def kernel_services(self):
        return reader.services(self.maps)

    def hooks(self):
        return reader.hooks(Path(self.cfg.bpffs_dir))

    def tc_missing(self) -> tuple[str, ...]:
        if self.tc is None:
            return ()
        try:
            return tuple(tc.missing_filters(self.tc.devices))
        except Exception as exc:   # noqa: BLE001 - pyroute2's NetlinkError is no OSError
            return (f"(the filters could not be listed: {exc})",)

    def reattach_tc(self) -> None:
        if self.tc is None:
            return
        try:
            self.tc.reattach()
        except Exception as exc:   # noqa: BLE001 - pyroute2's NetlinkError is no OSError
            log.error("could not attach the TC filters again: %s", exc)

    # -- stop --------------------------------------------------------------------------------
    def close(self) -> None:
        """The previous release's copy of the maps this one re-laid out first (downgrade.py):
        a rollback then starts with their rows. The programs and maps stay pinned."""
        try:
            downgrade.write_previous(Path(self.cfg.bpffs_dir))
        except OSError as exc:             # libbpf.BpfError among them
            log.warning("could not write the previous release's maps (%s): a rollback to it "
                        "starts them empty, and its LoadBalancer source ranges drop new flows "
                        "from outside until its first sync", exc)
        self.sock.close()
        if self.tc is not None:
            self.tc.close()

    def remove(self) -> None:
        """After close(): everything this agent put on the node goes (agent/uninstall.py
        decides when), each item logged."""
        try:
            removed = teardown.remove_all(Path(self.cfg.bpffs_dir), Path(self.cfg.program_cache)
                                          if self.cfg.program_cache else None)
        except Exception as exc:   # noqa: BLE001 - pyroute2's NetlinkError is no OSError
            log.error("could not remove the datapath (%s): run `kproxy-ebpf cleanup` on the "
                      "node", exc)
            return
        for what in removed:
            log.info("removed %s", what)
        log.info("removed %d items: nothing of kproxy-ebpf is left on this node", len(removed))
