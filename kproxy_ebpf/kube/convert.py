"""Conversion of API objects (plain JSON dicts) into the lean types of kproxy_ebpf.model.objects.

The reflector hands us objects exactly as the API server sent them, parsed by `json` and nothing
else: the official client's model deserialization costs far more than the proxy's whole
computation, and it would hide the fields we need behind snake_case attributes. Manifests loaded
from YAML files go through the same functions, so a file and a cluster can never disagree.

Input is untrusted. The API server validates what it stores, but manifests do not go through it,
a newer server can send values we do not know, and a proxy that crashes on one odd object takes
every Service on the node down with it. So the functions here never raise on bad input: they
return what can be used (None when nothing can) together with a list of `Rejection`s that the
agent logs and posts as Events. Dropping one bad port keeps the other ports of that Service
working, which is what an operator expects.

What this module does not do: apply kube-proxy's defaults for unset endpoint conditions, or decide
which Services to skip (headless, ExternalName, service-proxy-name). Those are policy and live in
proxy/, which sees the raw "unset" as None. Addresses of both families are kept, in canonical
text (dotted quad; RFC 5952 for IPv6) and in API order, so a dual-stack Service keeps its primary
family first; proxy/ plans each family apart, as kube-proxy runs a proxier per family. An
IPv4-mapped IPv6 address (::ffff:a.b.c.d) is refused everywhere: the datapath holds IPv4 in
exactly that form (bpf/lib/ip.h), so such an "IPv6" address would alias an IPv4 one.
"""
from __future__ import annotations

import ipaddress
import socket
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from kproxy_ebpf.model.objects import (
    NO_ENDPOINTS,
    Endpoint,
    EndpointHints,
    EndpointPort,
    Endpoints,
    EndpointSlice,
    LBAlgorithm,
    LoadBalancerIngress,
    Node,
    Protocol,
    Service,
    ServiceCIDR,
    ServicePort,
    ServiceType,
    conditions,
    family_of,
)

# kube's default for sessionAffinityConfig.clientIP.timeoutSeconds (3 hours), and its maximum.
DEFAULT_AFFINITY_TIMEOUT = 10800
MAX_AFFINITY_TIMEOUT = 86400

LABEL_SERVICE_NAME = "kubernetes.io/service-name"
LABEL_PROXY_NAME = "service.kubernetes.io/service-proxy-name"
LABEL_HEADLESS = "service.kubernetes.io/headless"
LABEL_ZONE = "topology.kubernetes.io/zone"
ANNOTATION_TRIGGER_TIME = "endpoints.kubernetes.io/last-change-trigger-time"
ANNOTATION_LB_ALGORITHM = "kproxy-ebpf.io/lb-algorithm"
TAINT_TO_BE_DELETED = "ToBeDeletedByClusterAutoscaler"


@dataclass(frozen=True)
class Rejection:
    """Something in an API object that the proxy cannot use, and why.

    `reason` is a CamelCase word (as in a Kubernetes Event), `message` a sentence for humans that
    names the offending field and value. `uid` is the object's metadata.uid when known: an Event
    carrying it shows up in `kubectl describe` of the object.
    """
    kind: str
    namespace: str
    name: str
    reason: str
    message: str
    uid: str = ""

    def __str__(self) -> str:
        where = f"{self.namespace}/{self.name}" if self.namespace else self.name
        return f"{self.kind} {where or '<unnamed>'}: {self.reason}: {self.message}"


# ---------------------------------------------------------------------------------------------
# Small tolerant accessors: a wrong type reads as "absent", and the caller decides whether that
# deserves a rejection. Booleans are excluded from ints on purpose (True is an int in Python).

def _dict(value: Any) -> dict:
    return value if isinstance(value, dict) else {}


def _list(value: Any) -> list:
    return value if isinstance(value, list) else []


def _str(value: Any) -> str | None:
    return value if isinstance(value, str) else None


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _ipv4(value: Any) -> str | None:
    """The canonical IPv4 text of `value`, or None when it is not an IPv4 address string."""
    if not isinstance(value, str):
        return None
    try:
        # Fast path (an endpoint address is parsed 100,000 times at 10k Services): inet_pton
        # takes only a canonical dotted quad (no leading zeros, no blanks), so it is returned
        # as it is; anything else gets ipaddress's slower, lenient parse below.
        socket.inet_pton(socket.AF_INET, value)
        return value
    except (OSError, ValueError):      # ValueError: a NUL in the text (found by fuzzing)
        pass
    try:
        return str(ipaddress.IPv4Address(value.strip()))
    except ValueError:
        return None


def _ipv6(value: Any) -> str | None:
    """The canonical (RFC 5952) text of an IPv6 address string, or None: also for an
    IPv4-mapped one (see the module docstring) and one with a zone (fe80::1%eth0)."""
    if not isinstance(value, str):
        return None
    try:
        addr = ipaddress.IPv6Address(value.strip())
    except ValueError:
        return None
    if addr.ipv4_mapped is not None or addr.scope_id is not None:
        return None
    return addr.compressed


def _ip(value: Any) -> str | None:
    """The canonical text of an address of either family, or None."""
    return _ipv4(value) or _ipv6(value)


def _is_mapped(value: Any) -> bool:
    try:
        return isinstance(value, str) and ipaddress.IPv6Address(value.strip()).ipv4_mapped is not None
    except ValueError:
        return False


def _not_an_ip(value: Any) -> str:
    """Why `value` is refused as an address, for a rejection message."""
    if _is_mapped(value):
        return f"{_short(value)} is an IPv4-mapped IPv6 address (write the IPv4 address)"
    return f"{_short(value)} is not an IP address"


# Endpoint addresses kube's EndpointSlice validation refuses (ValidateEndpointIP, v1.36
# pkg/apis/discovery/validation: unspecified, loopback, link-local, link-local multicast): no
# proxy may send a Service's traffic there, whatever wrote the slice.
def _endpoint_ip_refused(ip: str) -> bool:
    if ":" not in ip:       # canonical dotted quad: prefixes, at the cost of a string compare
        return ip == "0.0.0.0" or ip.startswith(_REFUSED_V4)
    addr = ipaddress.IPv6Address(ip)
    return addr.is_unspecified or addr.is_loopback or addr.is_link_local or ip.startswith("ff02:")


_REFUSED_V4 = ("127.", "169.254.", "224.0.0.")


def _network(value: Any) -> ipaddress.IPv4Network | ipaddress.IPv6Network | None:
    """A CIDR string as a network (host bits tolerated: "10.0.0.1/8" is 10.0.0.0/8), or None."""
    text = value.strip() if isinstance(value, str) else None
    try:
        return ipaddress.ip_network(text, strict=False) if text else None
    except ValueError:
        return None


_MAPPED = ipaddress.IPv6Network("::ffff:0:0/96")


def _mapped_net(net: ipaddress.IPv4Network | ipaddress.IPv6Network) -> bool:
    """An IPv6 range reaching into IPv4-mapped space (see the module docstring)."""
    return net.version == 6 and net.overlaps(_MAPPED)


def _short(value: Any, limit: int = 60) -> str:
    """repr() of a bad value, cut short so one garbage field cannot flood a log or an Event."""
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


class _Collector:
    """Accumulates rejections for one object, filling in its identity."""

    def __init__(self, kind: str, namespace: str, name: str, uid: str) -> None:
        self.kind, self.namespace, self.name, self.uid = kind, namespace, name, uid
        self.items: list[Rejection] = []

    def add(self, reason: str, message: str) -> None:
        self.items.append(Rejection(self.kind, self.namespace, self.name, reason, message, self.uid))


def _objects(raw: Any, where: str, reason: str, what: str,
             col: _Collector) -> Iterator[tuple[str, dict]]:
    """(path, entry) for each object of a list field; a non-list field or a non-object entry
    is reported once under `reason` and skipped."""
    if raw is not None and not isinstance(raw, list):
        col.add(reason, f"{where} is not a list: {_short(raw)}")
        return
    for i, entry in enumerate(_list(raw)):
        path = f"{where}[{i}]"
        if not isinstance(entry, dict):
            col.add(reason, f"{path} is not an object: {_short(entry)}, {what} ignored")
            continue
        yield path, entry


def _identity(obj: Any, kind: str) -> tuple[dict, _Collector, bool]:
    """Read metadata; returns (metadata, collector, ok). Not ok: no usable name."""
    if not isinstance(obj, dict):
        col = _Collector(kind, "", "", "")
        col.add("InvalidObject", f"expected a JSON object, got {type(obj).__name__}")
        return {}, col, False
    meta = obj.get("metadata")
    # Interned: thousands of objects share a few namespaces.
    ns = sys.intern(_str(_dict(meta).get("namespace")) or "default")  # kubectl's default
    name = _str(_dict(meta).get("name")) or ""
    uid = _str(_dict(meta).get("uid")) or ""
    col = _Collector(kind, ns, name, uid)
    if not isinstance(meta, dict):
        col.add("InvalidMetadata", "metadata is missing or not an object")
        return {}, col, False
    if not name:
        col.add("InvalidMetadata", f"metadata.name is missing or not a string: {_short(meta.get('name'))}")
        return meta, col, False
    return meta, col, True


def _labels(meta: dict) -> dict[str, str]:
    return {k: v for k, v in _dict(meta.get("labels")).items() if isinstance(k, str) and isinstance(v, str)}


def _protocol(value: Any, where: str, col: _Collector) -> Protocol | None:
    if value is None:
        return Protocol.TCP
    try:
        return Protocol(value)
    except ValueError:
        col.add("InvalidProtocol", f"{where}: unknown protocol {_short(value)}, entry ignored")
        return None


# ---------------------------------------------------------------------------------------------
# Service

def service_from_api(obj: Any) -> tuple[Service | None, list[Rejection]]:
    """Convert a core/v1 Service. None (plus rejections) when it has no usable identity or spec.

    A partial Service is returned when only some fields are bad (bad ports are dropped, bad
    addresses are skipped): the rest of it still works.
    """
    meta, col, ok = _identity(obj, "Service")
    if not ok:
        return None, col.items
    spec = obj.get("spec")
    if not isinstance(spec, dict):
        col.add("InvalidSpec", "spec is missing or not an object")
        return None, col.items
    status = _dict(obj.get("status"))

    raw_type = spec.get("type", "ClusterIP")
    try:
        svc_type = ServiceType(raw_type if raw_type is not None else "ClusterIP")
    except ValueError:
        col.add("InvalidServiceType", f"spec.type: unknown type {_short(raw_type)}")
        return None, col.items

    headless, cluster_ips = _cluster_ips(spec, col)
    if not cluster_ips and not headless and svc_type is not ServiceType.EXTERNAL_NAME:
        col.add("NoClusterIP", "the Service has no usable clusterIP, so none of its addresses is "
                "programmed")
    _check_families(spec, cluster_ips, col)

    labels = _labels(meta)
    svc = Service(
        namespace=col.namespace,
        name=col.name,
        type=svc_type,
        cluster_ips=cluster_ips,
        headless=headless,
        ports=_service_ports(spec.get("ports"), col),
        external_ips=_ip_list(spec.get("externalIPs"), "spec.externalIPs", col),
        load_balancer_ingress=_lb_ingress(status, col),
        session_affinity_timeout=_affinity_timeout(spec, col),
        external_traffic_local=_policy_local(spec, "externalTrafficPolicy", col),
        internal_traffic_local=_policy_local(spec, "internalTrafficPolicy", col),
        health_check_node_port=_port_field(spec.get("healthCheckNodePort"), "spec.healthCheckNodePort", col),
        load_balancer_source_ranges=_source_ranges(spec.get("loadBalancerSourceRanges"), col),
        traffic_distribution=_str(spec.get("trafficDistribution")),
        proxy_name=labels.get(LABEL_PROXY_NAME),
        resource_version=_str(meta.get("resourceVersion")) or "",
        lb_algorithm=_lb_algorithm(_dict(meta.get("annotations")), col),
    )
    return svc, col.items


def _lb_algorithm(annotations: dict, col: _Collector) -> LBAlgorithm | None:
    value = annotations.get(ANNOTATION_LB_ALGORITHM)
    if value is None:
        return None
    try:
        return LBAlgorithm(value)
    except ValueError:
        col.add("InvalidLBAlgorithm", f"annotation {ANNOTATION_LB_ALGORITHM}: {_short(value)} is "
                f"neither maglev nor random; the node's default (lbAlgorithm) is used")
        return None


def _cluster_ips(spec: dict, col: _Collector) -> tuple[bool, tuple[str, ...]]:
    """(headless, cluster IPs of either family, primary first). clusterIPs wins over
    clusterIP, as the API defines it."""
    raw = spec.get("clusterIPs")
    if not isinstance(raw, list) or not raw:
        single = spec.get("clusterIP")
        raw = [single] if single not in (None, "") else []
    if raw and raw[0] == "None":
        return True, ()
    ips = _ip_list(raw, "spec.clusterIPs", col, reason="InvalidClusterIP", suffix="")
    if len({family_of(ip) for ip in ips}) < len(ips):
        col.add("InvalidClusterIP", f"spec.clusterIPs: {_short(raw)} holds two addresses of one "
                "family; the first of each family is used")
        ips = tuple(ip for i, ip in enumerate(ips)
                    if family_of(ip) not in {family_of(x) for x in ips[:i]})
    return False, ips


def _check_families(spec: dict, cluster_ips: tuple[str, ...], col: _Collector) -> None:
    """spec.ipFamilies names the families of spec.clusterIPs in order (the API server keeps
    them so); an object where they disagree is reported, and its clusterIPs are what counts,
    as kube-proxy reads only those."""
    families = spec.get("ipFamilies")
    if not isinstance(families, list) or not cluster_ips:
        return
    have = [family_of(ip).value for ip in cluster_ips]
    if families != have:
        col.add("IPFamilyMismatch", f"spec.ipFamilies {_short(families)} does not match the families "
                f"of spec.clusterIPs ({', '.join(have)}); the clusterIPs are used")


def _port_entry(entry: dict, where: str, col: _Collector, *,
                unset_ok: bool) -> tuple[str | None, int | None, Protocol] | None:
    """(name, port, protocol) of one port entry, or None (reported) when it is unusable.
    unset_ok: a slice port may leave name and port unset (proxy/ ignores such ports); a
    Service port must have a port in 1..65535 and its unset name means ""."""
    name = entry.get("name")
    if name is not None and not isinstance(name, str):
        col.add("InvalidPort", f"{where}.name is not a string: {_short(name)}, port ignored")
        return None
    port = entry.get("port")
    lowest = 0 if unset_ok else 1
    if not (unset_ok and port is None) and (not _is_int(port) or not lowest <= port <= 65535):
        col.add("InvalidPort", f"{where}.port must be an integer in 1..65535, got {_short(port)}; "
                "port ignored")
        return None
    protocol = _protocol(entry.get("protocol"), f"{where}.protocol", col)
    if protocol is None:
        return None
    # Interned: a few names ("http", "dns") repeat in every Service and slice, 100,000 copies
    # at 50,000 Services.
    return (sys.intern(name) if name else name), port, protocol


def _service_ports(raw: Any, col: _Collector) -> tuple[ServicePort, ...]:
    ports: list[ServicePort] = []
    for where, entry in _objects(raw, "spec.ports", "InvalidPort", "port", col):
        parsed = _port_entry(entry, where, col, unset_ok=False)
        if parsed is None:
            continue
        name, port, protocol = parsed
        node_port = _port_field(entry.get("nodePort"), f"{where}.nodePort", col)
        ports.append(ServicePort(name=name or "", protocol=protocol, port=port or 0,
                                 node_port=node_port))
    return tuple(ports)


def _port_field(value: Any, where: str, col: _Collector) -> int:
    """An optional port number (nodePort, healthCheckNodePort): 0 when unset or invalid."""
    if value is None or value == 0:
        return 0
    if _is_int(value) and 1 <= value <= 65535:
        return value
    col.add("InvalidPort", f"{where} must be an integer in 1..65535, got {_short(value)}; ignored")
    return 0


def _ip_list(raw: Any, where: str, col: _Collector, reason: str = "InvalidIP",
             suffix: str = ", ignored") -> tuple[str, ...]:
    """The addresses of a list, canonical and deduplicated, in list order; anything that is no
    address (or an IPv4-mapped one) is reported."""
    if raw is not None and not isinstance(raw, list):
        col.add(reason, f"{where} is not a list: {_short(raw)}")
        return ()
    out: list[str] = []
    for i, value in enumerate(_list(raw)):
        ip = _ip(value)
        if ip is None:
            col.add(reason, f"{where}[{i}]: {_not_an_ip(value)}{suffix}")
        elif ip not in out:
            out.append(ip)
    return tuple(out)


def _lb_ingress(status: dict, col: _Collector) -> tuple[LoadBalancerIngress, ...]:
    raw = _dict(status.get("loadBalancer")).get("ingress")
    out: list[LoadBalancerIngress] = []
    for i, entry in enumerate(_list(raw)):
        if not isinstance(entry, dict):
            col.add("InvalidIP", f"status.loadBalancer.ingress[{i}] is not an object, ignored")
            continue
        ip = entry.get("ip")
        if ip in (None, ""):
            continue    # hostname-only ingress: nothing for a proxy to program
        canonical = _ip(ip)
        if canonical is None:
            col.add("InvalidIP", f"status.loadBalancer.ingress[{i}].ip: {_not_an_ip(ip)}, ignored")
            continue
        out.append(LoadBalancerIngress(ip=canonical, ip_mode=_str(entry.get("ipMode"))))
    return tuple(out)


def _affinity_timeout(spec: dict, col: _Collector) -> int:
    affinity = spec.get("sessionAffinity")
    if affinity in (None, "None"):
        return 0
    if affinity != "ClientIP":
        col.add("InvalidSessionAffinity", f"spec.sessionAffinity: unknown value {_short(affinity)}, "
                "treated as None")
        return 0
    timeout = _dict(_dict(spec.get("sessionAffinityConfig")).get("clientIP")).get("timeoutSeconds")
    if timeout is None:
        return DEFAULT_AFFINITY_TIMEOUT
    if _is_int(timeout) and 1 <= timeout <= MAX_AFFINITY_TIMEOUT:
        return timeout
    col.add("InvalidSessionAffinity", "spec.sessionAffinityConfig.clientIP.timeoutSeconds must be in "
            f"1..{MAX_AFFINITY_TIMEOUT}, got {_short(timeout)}; using {DEFAULT_AFFINITY_TIMEOUT}")
    return DEFAULT_AFFINITY_TIMEOUT


def _policy_local(spec: dict, field_name: str, col: _Collector) -> bool:
    value = spec.get(field_name)
    if value in (None, "Cluster"):
        return False
    if value == "Local":
        return True
    col.add("InvalidTrafficPolicy", f"spec.{field_name}: unknown value {_short(value)}, treated as Cluster")
    return False


def cidr_sloppy(value: Any) -> ipaddress.IPv4Network | ipaddress.IPv6Network | None:
    """A CIDR as kube-proxy parses loadBalancerSourceRanges (v1.36 pkg/proxy/util
    MapCIDRsByIPFamily: strings.TrimSpace, then netutils.ParseCIDRSloppy): surrounding
    whitespace trimmed, the "/bits" required (a bare address is no CIDR), IPv4 octets with
    leading zeros read as decimal, host bits tolerated ("10.0.0.1/8" is 10.0.0.0/8)."""
    if not isinstance(value, str):
        return None
    addr, sep, bits = value.strip().partition("/")
    if not sep or not bits.isdigit():
        return None
    octets = addr.split(".")
    if len(octets) == 4 and all(o.isdigit() for o in octets):
        addr = ".".join(str(int(o)) for o in octets)
    try:
        return ipaddress.ip_network(f"{addr}/{int(bits)}", strict=False)
    except ValueError:
        return None


def _source_ranges(raw: Any, col: _Collector) -> tuple[str, ...]:
    """CIDRs of loadBalancerSourceRanges (both families; each family's frontends use their
    own, proxy/external.py), normalised to their network address.

    Like kube-proxy: an empty entry is skipped
    silently, and one that does not parse is ignored (reported here: a log line, a metric and
    an Event, where kube-proxy logs "Invalid CIDR ignored"); the valid ones still apply.
    """
    if raw is not None and not isinstance(raw, list):
        col.add("InvalidSourceRange", f"spec.loadBalancerSourceRanges is not a list: {_short(raw)}")
        return ()
    out: list[str] = []
    for i, value in enumerate(_list(raw)):
        if isinstance(value, str) and not value.strip():
            continue
        net = cidr_sloppy(value)
        if net is None or _mapped_net(net):
            col.add("InvalidSourceRange", f"spec.loadBalancerSourceRanges[{i}]: {_short(value)} is not "
                    "a CIDR" + (" of either family (IPv4-mapped)" if net else "") + ", ignored")
        elif str(net) not in out:
            out.append(str(net))
    return tuple(out)


# ---------------------------------------------------------------------------------------------
# EndpointSlice

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
            for column, value in zip((addrs, conds, nodes, zones, hints), ep, strict=True):
                column.append(value)
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


# ---------------------------------------------------------------------------------------------
# Node

def node_from_api(obj: Any) -> Node:
    """Convert a core/v1 Node. Never fails: a garbage object gives a Node with an empty name.

    Addresses are the InternalIPs, then the ExternalIPs, each group in API order, both
    families (proxy/ takes each family's own).
    """
    meta = _dict(_dict(obj).get("metadata"))
    labels = _labels(meta)
    raw_addresses = _list(_dict(_dict(obj).get("status")).get("addresses"))
    addresses: list[str] = []
    for wanted in ("InternalIP", "ExternalIP"):
        for entry in raw_addresses:
            entry = _dict(entry)
            if entry.get("type") != wanted:
                continue
            ip = _ip(entry.get("address"))
            if ip is not None and ip not in addresses:
                addresses.append(ip)
    taints = _list(_dict(_dict(obj).get("spec")).get("taints"))
    return Node(
        name=_str(meta.get("name")) or "",
        addresses=tuple(addresses),
        zone=labels.get(LABEL_ZONE) or None,
        labels=tuple(sorted(labels.items())),
        deleting=meta.get("deletionTimestamp") is not None or any(
            _dict(t).get("key") == TAINT_TO_BE_DELETED for t in taints),
    )


# ---------------------------------------------------------------------------------------------
# ServiceCIDR

def service_cidr_from_api(obj: Any) -> tuple[ServiceCIDR | None, list[Rejection]]:
    """Convert a networking.k8s.io/v1 ServiceCIDR: its spec.cidrs (both families), canonical.

    Like kube-proxy (pkg/proxy/config ServiceCIDRConfig), every object counts whatever its
    status: a range being deleted still holds allocated ClusterIPs. A range that does not parse
    is rejected.
    """
    meta, col, ok = _identity(obj, "ServiceCIDR")
    if not ok:
        return None, col.items
    col.namespace = ""                   # cluster-scoped: no kubectl default namespace
    raw = _dict(obj.get("spec")).get("cidrs")
    if raw is not None and not isinstance(raw, list):
        col.add("InvalidCIDR", f"spec.cidrs is not a list: {_short(raw)}")
        raw = []
    cidrs: list[str] = []
    for i, value in enumerate(_list(raw)):
        net = _network(value)
        if net is None or _mapped_net(net):
            col.add("InvalidCIDR", f"spec.cidrs[{i}]: {_short(value)} is not a CIDR of either family, "
                    "ignored")
        elif str(net) not in cidrs:
            cidrs.append(str(net))
    return ServiceCIDR(name=col.name, cidrs=tuple(cidrs),
                       resource_version=_str(meta.get("resourceVersion")) or ""), col.items
