"""Prometheus metrics of the agent, named after kube-proxy's where one exists
(pkg/proxy/metrics: sync_proxy_rules_duration_seconds, sync_proxy_rules_last_timestamp_seconds,
..._changes_pending) with our own prefix, and those again under kube-proxy's own names
(kubeproxy_names.py), plus what only a BPF datapath has: map fill, map-full errors and the
programs' own counters (read from the per-CPU stats map at scrape time).

Labels follow kube-proxy v1.36 (pkg/proxy/metrics/metrics.go): the per-proxier metrics (sync
durations, full and partial, last sync and last queued timestamps, network programming latency,
sync failures) carry `ip_family` (kube-proxy's v1.IPFamily); the node-wide ones (changes
pending, healthz/livez answers) do not. This agent is both families' proxier at once (one sync
programs both, as kube-proxy's dual-stack metaproxier drives its two proxiers together), so
each per-proxier metric has a child per family and a sync is recorded in both; network
programming latency goes to the family of the EndpointSlice that changed. Callers just
observe/set/inc.
"""
from __future__ import annotations

from collections.abc import Callable, Sequence

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from kproxy_ebpf.datapath.maps.svc_counters import ServiceCounters, ServicePortId
from kproxy_ebpf.kube.sources import ApiCounters
from kproxy_ebpf.model.objects import IPFamily

from .conn_metrics import BackendConnsCollector
from .kubeproxy_names import K, KubeProxyNames

P = "kproxy_"
IP_FAMILIES = tuple(IPFamily)     # each per-proxier metric has a child per family
SYNC_BUCKETS = [0.001 * 2 ** i for i in range(15)]           # 1 ms .. 16 s, as kube-proxy's
# kube-proxy's network programming buckets: 0.25 s, 0.5 s, 1..59 s, 60..115 s, 2..5 min.
PROGRAMMING_BUCKETS = ([0.25, 0.5] + [float(i) for i in range(1, 60)]
                       + [60.0 + 5 * i for i in range(12)] + [120.0 + 30 * i for i in range(7)])


class PerFamily:
    """The children of one per-proxier metric, for every family: what a sync records goes to
    each."""

    def __init__(self, metric):
        self.metric = metric
        self.children = [metric.labels(f) for f in IP_FAMILIES]

    def observe(self, value: float) -> None:
        for c in self.children:
            c.observe(value)

    def set(self, value: float) -> None:
        for c in self.children:
            c.set(value)

    def set_to_current_time(self) -> None:
        for c in self.children:
            c.set_to_current_time()

    def inc(self, amount: float = 1) -> None:
        for c in self.children:
            c.inc(amount)


class Metrics:
    def __init__(self, registry: CollectorRegistry | None = None):
        self.registry = registry or CollectorRegistry()
        r = self.registry
        fam = ["ip_family"]
        self.sync_duration = PerFamily(Histogram(
            P + "sync_proxy_rules_duration_seconds", "Time a sync took (full or partial).",
            fam, registry=r, buckets=SYNC_BUCKETS))
        self.sync_full_duration = PerFamily(Histogram(
            P + "sync_full_proxy_rules_duration_seconds", "Time a full sync took.",
            fam, registry=r, buckets=SYNC_BUCKETS))
        self.sync_partial_duration = PerFamily(Histogram(
            P + "sync_partial_proxy_rules_duration_seconds", "Time a partial sync took.",
            fam, registry=r, buckets=SYNC_BUCKETS))
        # The periodic re-read of the maps (drift repair) is the one O(N) step of the idle
        # agent: its CPU is counted apart so an operator (and the scale run) can tell it
        # from the per-change work.
        self.program_loads = Counter(P + "program_cache_loads_total",
                                     "Program loads at start, by how: hit (from the program "
                                     "cache), miss (no entry: compiled), fallback (a bad entry: "
                                     "compiled), off.", ["result"], registry=r)
        self.drift_checks = Counter(P + "datapath_drift_checks_total",
                                    "Checks of the maps against what was written (drift).",
                                    registry=r)
        self.drift_check_cpu = Counter(P + "datapath_drift_check_cpu_seconds_total",
                                       "CPU time the drift checks took (their own thread).",
                                       registry=r)
        # Periodic work's CPU (the syncPeriod ticks, full syncs, the drift checks): the
        # benchmarks take it out of their per-change windows exactly.
        self.full_sync_cpu = Counter(P + "sync_full_cpu_seconds_total",
                                     "CPU time of periodic work: full syncs, the syncPeriod "
                                     "ticks (partial) and the drift checks.", registry=r)
        self.programming = Histogram(
            P + "network_programming_duration_seconds",
            "From the change that triggered an EndpointSlice update (its last-change-trigger-"
            "time) to the datapath holding it; kube-proxy's network programming latency SLI.",
            fam, registry=r, buckets=PROGRAMMING_BUCKETS)
        self.sync_last = PerFamily(Gauge(P + "sync_proxy_rules_last_timestamp_seconds",
                                         "When the last successful sync finished.", fam,
                                         registry=r))
        self.sync_queued = PerFamily(Gauge(P + "sync_proxy_rules_last_queued_timestamp_seconds",
                                           "When a sync was last asked for (a change arrived).",
                                           fam, registry=r))
        self.sync_failures = PerFamily(Counter(P + "sync_proxy_rules_failures_total",
                                               "Syncs that left something unprogrammed.", fam,
                                               registry=r))
        # By the family's string (IPFamily is a StrEnum): an FQDN slice's finds none.
        self._programming: dict[str, Histogram] = {f: self.programming.labels(f) for f in IP_FAMILIES}
        self.healthz = Counter(P + "proxy_healthz_total", "/healthz answers, by HTTP code.",
                               ["code"], registry=r)
        self.livez = Counter(P + "proxy_livez_total", "/livez answers, by HTTP code.",
                             ["code"], registry=r)
        self.pending = Gauge(P + "service_changes_pending",
                             "Services changed since the last sync.", registry=r)
        self.frontends = Gauge(P + "frontends", "Frontends programmed.", registry=r)
        self.backends = Gauge(P + "backends", "Backends programmed.", registry=r)
        self.map_entries = Gauge(P + "bpf_map_entries", "Rows the agent keeps in a map.", ["map"],
                                 registry=r)
        self.map_capacity = Gauge(P + "bpf_map_capacity", "max_entries of a map.", ["map"],
                                  registry=r)
        self.map_full = Counter(P + "bpf_map_full_total",
                                "Writes refused because a map was full.", ["map"], registry=r)
        self.map_errors = Counter(P + "bpf_map_errors_total", "Other failed map writes.",
                                  registry=r)
        self.unprogrammed = Gauge(
            P + "frontends_unprogrammed",
            "Frontends the maps do not hold yet (a full map or a failed write), retried "
            "automatically; 0 when the node holds the whole desired table.", registry=r)
        self.rejected = Counter(P + "rejected_objects_total",
                                "API objects (or parts) rejected as invalid.", ["kind", "reason"],
                                registry=r)
        self.problems = Gauge(P + "service_problems", "Current problems with Services.",
                              ["reason"], registry=r)
        self.service_pending = Gauge(P + "sync_proxy_rules_service_changes_pending",
                                     "Services changed (not their EndpointSlices) since the "
                                     "last sync.", registry=r)
        self.endpoint_pending = Gauge(P + "sync_proxy_rules_endpoint_changes_pending",
                                      "Services whose EndpointSlices changed since the last "
                                      "sync.", registry=r)
        self.no_local_endpoints = Gauge(
            P + "sync_proxy_rules_no_local_endpoints_total",
            "Service ports with a Local traffic policy whose endpoints are all on other nodes "
            "(their traffic of that policy is dropped).", ["traffic_policy", "ip_family"],
            registry=r)
        # Sockets connected to a backend that left their Service (datapath/stale_sockets.py).
        self.stale_sockets = Counter(
            P + "stale_sockets_total",
            "Sockets the hooks had connected to a backend that left their Service, by protocol "
            "and outcome: moved (UDP: connected again to its Service, in place), destroyed "
            "(TCP reset, UDP disconnected), gone (ended first), unsupported (the kernel cannot "
            "destroy sockets), failed.",
            ["protocol", "outcome"], registry=r)
        self.stale_socket_scan = Histogram(
            P + "stale_socket_scan_duration_seconds",
            "Time a search for stale sockets took (the namespaces holding sockets to the "
            "backends concerned).", registry=r, buckets=SYNC_BUCKETS)
        self.stale_socket_namespaces = Counter(
            P + "stale_socket_namespaces_total",
            "Network namespaces the stale-socket searches looked into.", registry=r)
        self.stale_socket_dumps = Counter(
            P + "stale_socket_dumps_total",
            "sock_diag dumps the stale-socket searches made (one per namespace, protocol and "
            "socket family concerned).", registry=r)
        self.socket_destroy_supported = Gauge(
            P + "socket_destroy_supported",
            "1 if this kernel can destroy sockets (sock_diag SOCK_DESTROY), 0 if not.",
            registry=r)
        # loadBalancerSourceRanges on the socket path (datapath/netns_sources.py).
        self.source_namespaces = Gauge(
            P + "source_range_namespaces",
            "Network namespaces whose source address the agent wrote for the socket path's "
            "loadBalancerSourceRanges checks (0 while no Service has ranges).", registry=r)
        self.source_scan = Histogram(
            P + "source_range_namespace_scan_duration_seconds",
            "Time a pass over the node's network namespaces for their source addresses took.",
            registry=r, buckets=SYNC_BUCKETS)
        r.register(KubeProxyNames([
            (self.sync_duration.metric, K + "sync_proxy_rules_duration_seconds"),
            (self.sync_full_duration.metric, K + "sync_full_proxy_rules_duration_seconds"),
            (self.sync_partial_duration.metric, K + "sync_partial_proxy_rules_duration_seconds"),
            (self.programming, K + "network_programming_duration_seconds"),
            (self.sync_last.metric, K + "sync_proxy_rules_last_timestamp_seconds"),
            (self.sync_queued.metric, K + "sync_proxy_rules_last_queued_timestamp_seconds"),
            (self.sync_failures.metric, K + "sync_proxy_rules_nftables_sync_failures_total"),
            (self.healthz, K + "proxy_healthz_total"),
            (self.livez, K + "proxy_livez_total"),
            (self.service_pending, K + "sync_proxy_rules_service_changes_pending"),
            (self.endpoint_pending, K + "sync_proxy_rules_endpoint_changes_pending"),
            (self.no_local_endpoints, K + "sync_proxy_rules_no_local_endpoints_total"),
        ]))

    def observe_programming(self, family: str, seconds: float) -> None:
        """Network programming latency of a change to an EndpointSlice of `family` (an FQDN
        slice, which nothing programs, is not counted)."""
        child = self._programming.get(family)
        if child is not None:
            child.observe(seconds)

    def observe_sync(self, full: bool, seconds: float) -> None:
        self.sync_duration.observe(seconds)
        (self.sync_full_duration if full else self.sync_partial_duration).observe(seconds)

    def zero_series(self, written_maps: Sequence[str], outcomes: Sequence[str]) -> None:
        """Every series a dashboard rate()s exported from the start at 0 (a labelled counter
        has none until its first increment, so a panel would show "no data"): health codes,
        full maps (`written_maps`: the pin names the agent writes), stale-socket outcomes."""
        for code in ("200", "503"):
            self.healthz.labels(code)
            self.livez.labels(code)
        for name in written_maps:
            self.map_full.labels(name)
        for proto in ("TCP", "UDP"):
            for outcome in outcomes:
                self.stale_sockets.labels(proto, outcome)

    def health_response(self, path: str, code: int) -> None:
        """health.ProxyHealth.on_response: count /healthz and /livez answers."""
        (self.healthz if path == "/healthz" else self.livez).labels(str(code)).inc()

    def watch_datapath(self, read_counters: Callable[[], dict[str, int]]) -> None:
        """Exports the BPF programs' per-CPU counters (summed) at every scrape."""
        self.registry.register(_DatapathCollector(read_counters))


    def watch_services(self, read: Callable[[], Sequence[tuple[ServicePortId, ServiceCounters]]],
                       limit: int) -> None:
        """Exports the per-Service datapath counters (kp_svcstat) of the first `limit` service
        ports by name at every scrape (0: none)."""
        if limit > 0:
            self.registry.register(_ServiceCollector(read, limit))

    def watch_backends(self, read: Callable[[], Sequence[tuple[str, str, int]]],
                       limit: int) -> None:
        """Exports each backend's sockets connected through the hooks (conn_metrics.py)."""
        if limit > 0:
            self.registry.register(BackendConnsCollector(read, limit))

    def watch_changes(self, read: Callable[[], tuple[int, int]]) -> None:
        """Exports the Service and EndpointSlice changes seen so far, (services, slices), at
        every scrape: kube-proxy's sync_proxy_rules_{service,endpoint}_changes_total."""
        changes = _ChangesCollector(read)
        self.registry.register(changes)
        self.registry.register(KubeProxyNames([(changes, {
            P + "sync_proxy_rules_service_changes": K + "sync_proxy_rules_service_changes_total",
            P + "sync_proxy_rules_endpoint_changes": K + "sync_proxy_rules_endpoint_changes_total",
        })]))

    def set_pending(self, services: int, endpoints: int, dirty: int) -> None:
        """Changes waiting for the next sync: Services, Services whose slices changed, and
        every Service either made dirty."""
        self.service_pending.set(services)
        self.endpoint_pending.set(endpoints)
        self.pending.set(dirty)

    def set_no_local_endpoints(self, counts: dict[tuple[str, IPFamily], int]) -> None:
        for (policy, family), n in counts.items():
            self.no_local_endpoints.labels(policy, str(family)).set(n)

    def watch_api(self, read: Callable[[], dict[str, ApiCounters]]) -> None:
        """Exports each watched resource's counters at every scrape."""
        self.registry.register(_ApiCollector(read))


class _Families(Collector):
    """A collector whose families are known without reading anything: describe() names them,
    so the registry knows which collector a `name[]` query needs and collects no other (the
    per-Service one reads a map and builds 8 series per service port)."""

    def _families(self) -> tuple:
        raise NotImplementedError

    def _fill(self, *families) -> None:
        raise NotImplementedError

    def describe(self):
        return list(self._families())

    def collect(self):
        families = self._families()
        self._fill(*families)
        return families


class _ChangesCollector(_Families):
    def __init__(self, read: Callable[[], tuple[int, int]]):
        self._read = read

    def _families(self):
        return (CounterMetricFamily(P + "sync_proxy_rules_service_changes",
                                    "Service changes seen (adds, updates, deletes)."),
                CounterMetricFamily(P + "sync_proxy_rules_endpoint_changes",
                                    "EndpointSlice changes seen (adds, updates, deletes)."))

    def _fill(self, services, slices):
        n_services, n_slices = self._read()
        services.add_metric([], n_services)
        slices.add_metric([], n_slices)


class _ServiceCollector(_Families):
    """kproxy_service_*: 8 series per service port (connections; packets and bytes each way;
    refusals by reason), bounded by `limit` service ports."""

    LABELS = ["namespace", "name", "port", "protocol"]

    def __init__(self, read: Callable[[], Sequence[tuple[ServicePortId, ServiceCounters]]],
                 limit: int):
        self._read, self._limit = read, limit

    def _families(self):
        labels = self.LABELS
        return (
            CounterMetricFamily(
                P + "service_connections", "Connections the datapath balanced to the service "
                "port's backends: connect()s, new flows of unconnected UDP sockets, new TC "
                "flows.", labels=labels),
            CounterMetricFamily(
                P + "service_packets", "Packets of the service port's flows, by direction "
                "(to_backend: TC packets and unconnected UDP datagrams; reply: TC replies).",
                labels=[*labels, "direction"]),
            CounterMetricFamily(
                P + "service_bytes", "Bytes of those packets on the TC path (a socket hook "
                "sees no payload), by direction.", labels=[*labels, "direction"]),
            CounterMetricFamily(
                P + "service_refusals", "Connections and packets refused, by reason: "
                "no_endpoints (refused), no_local_endpoints (dropped: a Local traffic policy), "
                "source_range (loadBalancerSourceRanges).", labels=[*labels, "reason"]),
            GaugeMetricFamily(
                P + "service_metrics_omitted", "Service ports past serviceMetricsLimit, "
                "without kproxy_service_* series (`kproxy-ebpf services -o wide` shows them "
                "all)."))

    def _fill(self, conns, packets, nbytes, refusals, omitted):
        try:
            rows = self._read()
        except OSError:
            rows = []
        for who, c in rows[:self._limit]:
            ids = [who.namespace, who.name, who.port, who.protocol]
            conns.add_metric(ids, c.conns)
            for direction, n, b in (("to_backend", c.packets, c.bytes),
                                    ("reply", c.reply_packets, c.reply_bytes)):
                packets.add_metric([*ids, direction], n)
                nbytes.add_metric([*ids, direction], b)
            for reason, n in (("no_endpoints", c.refused), ("no_local_endpoints", c.dropped),
                              ("source_range", c.denied)):
                refusals.add_metric([*ids, reason], n)
        omitted.add_metric([], max(0, len(rows) - self._limit))


class _ApiCollector(_Families):
    def __init__(self, read: Callable[[], dict[str, ApiCounters]]):
        self._read = read

    def _families(self):
        return (CounterMetricFamily(P + "api_relists", "Relists after 410 Gone.",
                                    labels=["resource"]),
                CounterMetricFamily(P + "api_watch_restarts",
                                    "Lists or watches retried after an error.",
                                    labels=["resource"]),
                CounterMetricFamily(P + "api_watch_stalls",
                                    "Watches that stopped delivering without closing (no event "
                                    "or bookmark for watchProgressTimeout), re-established.",
                                    labels=["resource"]),
                GaugeMetricFamily(P + "api_synced", "1 once the resource was listed.",
                                  labels=["resource"]))

    def _fill(self, relists, restarts, stalls, synced):
        for resource, c in sorted(self._read().items()):
            relists.add_metric([resource], c.relists)
            restarts.add_metric([resource], c.restarts)
            stalls.add_metric([resource], c.stalls)
            synced.add_metric([resource], 1 if c.synced else 0)


class _DatapathCollector(_Families):
    def __init__(self, read: Callable[[], dict[str, int]]):
        self._read = read

    def _families(self):
        return (CounterMetricFamily(P + "datapath_events", "Socket-hook decisions, by event.",
                                    labels=["event"]),
                GaugeMetricFamily(P + "datapath_readable", "1 if the stats map could be read."))

    def _fill(self, fam, up):
        try:
            values = self._read()
            up.add_metric([], 1)
        except OSError:
            values = {}
            up.add_metric([], 0)
        for event, value in sorted(values.items()):
            fam.add_metric([event], value)
