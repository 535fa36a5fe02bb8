"""The cluster-scoped objects: the agent's own core/v1 Node and networking.k8s.io/v1
ServiceCIDRs."""
from __future__ import annotations

from typing import Any

from kproxy_ebpf.model.objects import Node, ServiceCIDR

from .addresses import _ip, _mapped_net, _network
from .fields import Rejection, _dict, _identity, _labels, _list, _short, _str

LABEL_ZONE = "topology.kubernetes.io/zone"
TAINT_TO_BE_DELETED = "ToBeDeletedByClusterAutoscaler"


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
