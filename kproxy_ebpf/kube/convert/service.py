"""core/v1 Service -> model Service. A bad field drops that field (a bad port, that port), not
the Service: its other ports keep working."""
from __future__ import annotations

from typing import Any

from kproxy_ebpf.model.objects import (
    LBAlgorithm,
    LoadBalancerIngress,
    Service,
    ServicePort,
    ServiceType,
    family_of,
)

from .addresses import _ip, _mapped_net, _not_an_ip, cidr_sloppy
from .fields import (
    Rejection,
    _Collector,
    _dict,
    _identity,
    _is_int,
    _labels,
    _list,
    _objects,
    _port_entry,
    _short,
    _str,
)

# kube's default for sessionAffinityConfig.clientIP.timeoutSeconds (3 hours), and its maximum.
DEFAULT_AFFINITY_TIMEOUT = 10800
MAX_AFFINITY_TIMEOUT = 86400

LABEL_PROXY_NAME = "service.kubernetes.io/service-proxy-name"
ANNOTATION_LB_ALGORITHM = "kproxy-ebpf.io/lb-algorithm"


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
                f"not one of {', '.join(a.value for a in LBAlgorithm)}; the node's default "
                "(lbAlgorithm) is used")
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
