"""EndpointSlice ingestion: a Service's slices -> usable endpoints per (port name, protocol).

This is the one place where the API's "unset" values get kube-proxy's meaning (semantics 1.1,
reference: kube-proxy pkg/proxy/endpointslicecache.go addEndpoints). Everything downstream works
on EndpointInfo, whose conditions are plain booleans.

Ports are matched by (name, protocol), never by number: the same Service port may map to a
different target port number in each slice (pods of one Deployment rolled to a new port), and
the slice port's number is the backend port.
"""
from __future__ import annotations

from collections.abc import Iterable
from operator import attrgetter
from typing import NamedTuple

from kproxy_ebpf.model.objects import Endpoint, EndpointSlice, IPFamily, Protocol

#: (service port name, protocol); an unnamed port is "".
PortKey = tuple[str, Protocol]


class EndpointInfo(NamedTuple):
    """One endpoint of one service port, with conditions already defaulted. A NamedTuple for
    its construction cost, as model.Endpoint."""
    ip: str
    port: int
    ready: bool
    serving: bool
    terminating: bool
    node_name: str | None
    zone: str | None
    hint_zones: frozenset[str]
    hint_nodes: frozenset[str]
    local: bool

    @property
    def serving_terminating(self) -> bool:
        """Usable only as a fallback: still serving while the pod shuts down."""
        return self.serving and self.terminating


_NONE: frozenset[str] = frozenset()


# Endpoint.conditions -> (ready, serving, terminating) with kube-proxy's defaults, read through
# the model's own decoding: an unset ready or serving counts as true, an unset terminating as
# false.
_DEFAULTED = tuple((e.ready is not False, e.serving is not False, e.terminating is True)
                   for e in (Endpoint(None, c) for c in range(64)))
_IP_PORT = attrgetter("ip", "port")


def _valid_port(port: int | None) -> bool:
    # kube-proxy ignores nil and 0; anything outside 1..65535 cannot be encoded either.
    return port is not None and 0 < port <= 65535


def endpoints_by_port(slices: Iterable[EndpointSlice], node_name: str,
                      family: IPFamily = IPFamily.IPV4) -> dict[PortKey, tuple[EndpointInfo, ...]]:
    """Merge one Service's slices into its usable endpoints, per (port name, protocol).

    Only slices of addressType `family` count (kube-proxy's per-family proxier). Slices are
    read in name order so that the result does not depend on event order. The same
    ip:port in two slices (an endpoint moving between slices) is kept once; a local copy wins
    over a remote one, otherwise the first one seen stays. Each list is sorted by (ip, port).
    """
    merged: dict[PortKey, dict[tuple[str, int], EndpointInfo]] = {}
    named, defaulted = bool(node_name), _DEFAULTED
    for sl in sorted(slices, key=lambda s: (s.namespace, s.name)):
        # A slice labelled service.kubernetes.io/headless is outside kube-proxy's informer
        # (its label selector, cmd/kube-proxy/app/server.go): its endpoints do not count.
        if sl.service_name is None or sl.address_type != family or sl.headless_label:
            continue
        for sport in sl.ports:
            if sport.name is None or not _valid_port(sport.port):
                continue
            assert sport.port is not None
            bucket = merged.setdefault((sport.name, sport.protocol), {})
            port = sport.port
            # The slice's columns, not Endpoint records (Endpoints.rows).
            for ip, conds, ep_node, zone, hints in sl.endpoints.rows():
                if not ip:                      # kube-proxy uses only the first address
                    continue
                local = named and ep_node == node_name
                seen = bucket.get((ip, port))
                if seen is not None and (seen.local or not local):
                    continue
                # Positional (this runs per endpoint and port), in field order: ip, port,
                # ready, serving, terminating, node_name, zone, hint_zones, hint_nodes, local.
                ready, serving, terminating = defaulted[conds]
                bucket[(ip, port)] = EndpointInfo(
                    ip, port, ready, serving, terminating, ep_node, zone,
                    frozenset(hints.zones) if hints and hints.zones else _NONE,
                    frozenset(hints.nodes) if hints and hints.nodes else _NONE,
                    local,
                )
    return {pk: tuple(sorted(b.values(), key=_IP_PORT))
            for pk, b in merged.items()}
