"""discovery.k8s.io/v1 EndpointSlice -> model EndpointSlice, unset conditions kept as None
(kube-proxy's defaults for them are policy, in proxy/). Bad ports and endpoints are dropped one
by one."""
from __future__ import annotations

import sys
from datetime import datetime
from typing import Any

from kproxy_ebpf.model.objects import (
    NO_ENDPOINTS,
    Endpoint,
    EndpointHints,
    EndpointPort,
    Endpoints,
    EndpointSlice,
    conditions,
)

from .addresses import _endpoint_ip_refused, _ipv4, _ipv6
from .fields import Rejection, _Collector, _dict, _identity, _labels, _list, _objects, _port_entry, _short, _str

LABEL_SERVICE_NAME = "kubernetes.io/service-name"
LABEL_HEADLESS = "service.kubernetes.io/headless"
ANNOTATION_TRIGGER_TIME = "endpoints.kubernetes.io/last-change-trigger-time"


def slice_from_api(obj: Any) -> tuple[EndpointSlice | None, list[Rejection]]:
    """Convert a discovery.k8s.io/v1 EndpointSlice, keeping unset fields as None.

    None (plus rejections) when it has no usable identity or addressType. Bad ports and bad
    endpoints are dropped one by one.
    """
    meta, col, ok = _identity(obj, "EndpointSlice")
    if not ok:
        return None, col.items
    address_type = obj.get("addressType")
    if not isinstance(address_type, str) or not address_type:
        col.add("InvalidAddressType", f"addressType is missing or not a string: {_short(address_type)}")
        return None, col.items

    labels = _labels(meta)
    service_name = labels.get(LABEL_SERVICE_NAME)
    eps = EndpointSlice(
        namespace=col.namespace,
        name=col.name,
        service_name=service_name,
        address_type=address_type,
        ports=_slice_ports(obj.get("ports"), col),
        endpoints=_endpoints(obj.get("endpoints"), address_type, col),
        resource_version=_str(meta.get("resourceVersion")) or "",
        headless_label=LABEL_HEADLESS in labels,
        trigger_time=_timestamp(_dict(meta.get("annotations")).get(ANNOTATION_TRIGGER_TIME)),
    )
    return eps, col.items


def _timestamp(value: Any) -> float | None:
    """RFC 3339 (as the API writes it) -> epoch seconds; None if absent or unparseable."""
    if not isinstance(value, str):
        return None
    try:
        return datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp()
    except ValueError:
        return None


def _slice_ports(raw: Any, col: _Collector) -> tuple[EndpointPort, ...]:
    out: list[EndpointPort] = []
    for where, entry in _objects(raw, "ports", "InvalidPort", "port", col):
        parsed = _port_entry(entry, where, col, unset_ok=True)
        if parsed is not None:
            name, port, protocol = parsed
            out.append(EndpointPort(name=name, protocol=protocol, port=port))
    return tuple(out)


def _condition(conditions: dict, key: str, where: str, col: _Collector) -> bool | None:
    value = conditions.get(key)
    if value is None or isinstance(value, bool):
        return value
    col.add("InvalidEndpoint", f"{where}.conditions.{key} is not a boolean: {_short(value)}; treated as unset")
    return None


def _hint_names(hints: dict, key: str) -> tuple[str, ...]:
    names = (_str(_dict(h).get("name")) for h in _list(hints.get(key)))
    return tuple(n for n in names if n)


def _interned(value: Any) -> str | None:
    """Node and zone names repeat on every endpoint: one string object per name, not per
    endpoint (100,000 endpoints name a handful of nodes)."""
    return sys.intern(value) if isinstance(value, str) and value else None


def _endpoints(raw: Any, address_type: str, col: _Collector) -> Endpoints:
    """The endpoints of a slice. This runs per endpoint of every slice (100,000 at 10k
    Services x 10), so an entry shaped as the API server writes it (one address, boolean or
    unset conditions, no hints) takes a short path straight into the columns (no Endpoint
    record); any other entry goes through _endpoint(), which checks and reports field by
    field. Both give the same fields."""
    if raw is not None and not isinstance(raw, list):
        col.add("InvalidEndpoint", f"endpoints is not a list: {_short(raw)}")
        return NO_ENDPOINTS
    addrs: list[str | None] = []
    conds: list[int] = []
    nodes: list[str | None] = []
    zones: list[str | None] = []
    hints: list[EndpointHints | None] = []
    parse = _SLICE_PARSE.get(address_type)
    intern = sys.intern
    for i, entry in enumerate(_list(raw)):
        if type(entry) is dict and entry.get("hints") is None:
            addresses, cond = entry.get("addresses"), entry.get("conditions")
            if type(addresses) is list and len(addresses) == 1 and type(cond) is dict:
                addr = addresses[0]
                ready, serving = cond.get("ready"), cond.get("serving")
                terminating = cond.get("terminating")
                if (type(addr) is str and (ready is None or ready is True or ready is False)
                        and (serving is None or serving is True or serving is False)
                        and (terminating is None or terminating is True or terminating is False)
                        and (parse is None or ((addr := parse(addr)) is not None
                                               and not _endpoint_ip_refused(addr)))):
                    node, zone = entry.get("nodeName"), entry.get("zone")
                    addrs.append(addr)
                    conds.append(conditions(ready, serving, terminating))
                    nodes.append(intern(node) if type(node) is str and node else None)
                    zones.append(intern(zone) if type(zone) is str and zone else None)
                    hints.append(None)
                    continue
        ep = _endpoint(f"endpoints[{i}]", entry, address_type, col)
        if ep is not None:
            addr, cond, node, zone, hint = ep
            addrs.append(addr)
            conds.append(cond)
            nodes.append(node)
            zones.append(zone)
            hints.append(hint)
    if not addrs:
        return NO_ENDPOINTS
    return Endpoints(addrs, conds, nodes, zones, hints)


# The address parser of each slice addressType the datapath programs (FQDN slices are not).
_SLICE_PARSE = {"IPv4": _ipv4, "IPv6": _ipv6}


def _endpoint(where: str, entry: Any, address_type: str, col: _Collector) -> Endpoint | None:
    """One endpoints[] entry, each field checked; None (reported) when it is unusable."""
    if not isinstance(entry, dict):
        col.add("InvalidEndpoint", f"{where} is not an object: {_short(entry)}, endpoint ignored")
        return None
    addresses = entry.get("addresses")
    if not isinstance(addresses, list) or not all(isinstance(a, str) for a in addresses):
        col.add("InvalidEndpoint", f"{where}.addresses is not a list of strings: {_short(addresses)}, "
                "endpoint ignored")
        return None
    parse = _SLICE_PARSE.get(address_type)
    if parse is not None:
        # Only IPv4 and IPv6 slices are programmed, so only their addresses must parse. A bad
        # address drops the whole endpoint: kube-proxy uses addresses[0], and shifting the
        # list would silently pick a different address.
        canonical = [parse(a) for a in addresses]
        if any(a is None for a in canonical):
            col.add("InvalidEndpoint", f"{where}.addresses: {_short(addresses)} holds an address that "
                    f"is no {address_type} address (IPv4-mapped ones are refused) in an "
                    f"{address_type} slice, endpoint ignored")
            return None
        refused = [a for a in canonical if a is not None and _endpoint_ip_refused(a)]
        if refused:
            col.add("InvalidEndpoint", f"{where}.addresses: {refused[0]} is a loopback, link-local, "
                    "unspecified or link-local multicast address, which no endpoint may have; "
                    "endpoint ignored")
            return None
        addresses = canonical
    conditions = _dict(entry.get("conditions"))
    hints = _dict(entry.get("hints"))
    return Endpoint.of(
        address=addresses[0] if addresses else None,
        ready=_condition(conditions, "ready", where, col),
        serving=_condition(conditions, "serving", where, col),
        terminating=_condition(conditions, "terminating", where, col),
        node_name=_interned(entry.get("nodeName")),
        zone=_interned(entry.get("zone")),
        hint_zones=_hint_names(hints, "forZones") if hints else (),
        hint_nodes=_hint_names(hints, "forNodes") if hints else (),
    )
