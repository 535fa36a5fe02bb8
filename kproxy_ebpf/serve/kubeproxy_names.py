"""kube-proxy's own metric names (`kubeproxy_*`, pkg/proxy/metrics/metrics.go of v1.36), beside
ours, so that dashboards and alerts written for kube-proxy work unchanged.

Each is the same series as ours, renamed at scrape time (one source of truth: nothing is
recorded twice), with kube-proxy's labels (`ip_family`, `code`, `traffic_policy`) and buckets
(metrics.py uses kube-proxy's). Left out, because nothing here has their meaning: the
iptables rule counts and restore failures (`sync_proxy_rules_iptables_*`: no iptables), the
nftables cleanup failures (no nftables table), `iptables_ct_state_invalid_dropped_packets_total`
and `localhost_nodeports_accepted_packets_total` (iptables/nftables rule counters of features
this datapath does not have), and the conntrack reconciler's duration and deletions
(`conntrack_reconciler_*`: kernel conntrack flows, which we do not write; our own conntrack's
purge is `kproxy_bpf_map_entries{map="ct"}`). `sync_proxy_rules_nftables_sync_failures_total`
carries our sync failures (a sync that left something unprogrammed), the nearest meaning.
"""
from __future__ import annotations

from collections.abc import Iterable, Mapping

from prometheus_client.metrics_core import Metric
from prometheus_client.registry import Collector

K = "kubeproxy_"


def _family_name(name: str, typ: str) -> str:
    """A counter's family is named without `_total` (prometheus_client adds it to samples)."""
    return name.removesuffix("_total") if typ == "counter" else name


class KubeProxyNames(Collector):
    """Re-exports each source's metric families under kube-proxy's names at every scrape.
    `pairs`: (a metric or collector, kube-proxy's name for its one family, or a mapping from
    the names of its families to kube-proxy's)."""

    def __init__(self, pairs: Iterable[tuple[object, str | Mapping[str, str]]]):
        self._pairs = list(pairs)

    def collect(self):
        for source, names in self._pairs:
            for fam in source.collect():
                name = names if isinstance(names, str) else names.get(fam.name)
                if name is None:
                    continue
                new_name = _family_name(name, fam.type)
                out = Metric(new_name, fam.documentation, fam.type)
                out.samples = [s._replace(name=new_name + s.name[len(fam.name):])
                               for s in fam.samples]
                yield out
