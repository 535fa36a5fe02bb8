"""kproxy_backend_connections: each backend's connections through least-conn Services on this
node, what least-conn compares (ipvsadm's ActiveConn): sockets from connect to close and TC
flows from first packet to FIN/RST or expiry (datapath/flows/flow_fix.py), bounded like the
per-Service series by serviceMetricsLimit (busiest backends first); `services -o wide` shows
them all, with every frontend's TC flows."""
from __future__ import annotations

from collections.abc import Callable, Sequence

from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

P = "kproxy_"


class BackendConnsCollector(Collector):
    def __init__(self, read: Callable[[], Sequence[tuple[str, str, int]]], limit: int):
        self._read, self._limit = read, limit

    def _families(self) -> tuple[GaugeMetricFamily, GaugeMetricFamily]:
        return (GaugeMetricFamily(P + "backend_connections", "Connections on this node to the "
                                  "backend through least-conn frontends: sockets from connect "
                                  "to close plus TC flows open (least-conn's count).", labels=["backend", "protocol"]),
                GaugeMetricFamily(P + "backend_metrics_omitted", "Backends with connections "
                                  "past serviceMetricsLimit, without a series."))

    def describe(self):
        return list(self._families())

    def collect(self):
        conns, omitted = self._families()
        try:
            rows = self._read()
        except OSError:
            rows = []
        for backend, proto, n in rows[:self._limit]:
            conns.add_metric([backend, proto], n)
        omitted.add_metric([], max(0, len(rows) - self._limit))
        return [conns, omitted]
