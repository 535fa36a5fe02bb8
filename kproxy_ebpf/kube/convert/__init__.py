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

What this package does not do: apply kube-proxy's defaults for unset endpoint conditions, or
decide which Services to skip (headless, ExternalName, service-proxy-name). Those are policy and
live in proxy/, which sees the raw "unset" as None. Addresses of both families are kept, in
canonical text and in API order, so a dual-stack Service keeps its primary family first; proxy/
plans each family apart, as kube-proxy runs a proxier per family.

    by_kind.py        from_api(kind, raw): the one entry point of the LIST and WATCH paths
    service.py        Services
    endpointslice.py  EndpointSlices (and the short path for endpoints as the API writes them)
    cluster.py        the Node and ServiceCIDRs
    addresses.py      addresses and CIDRs (IPv4-mapped IPv6 refused)
    fields.py         Rejection and the checks every kind shares
"""
from .addresses import cidr_sloppy
from .by_kind import Converted, ObjectKey, deleted, from_api
from .cluster import node_from_api, service_cidr_from_api
from .endpointslice import slice_from_api
from .fields import Rejection
from .service import DEFAULT_AFFINITY_TIMEOUT, MAX_AFFINITY_TIMEOUT, service_from_api

__all__ = [
    "DEFAULT_AFFINITY_TIMEOUT", "MAX_AFFINITY_TIMEOUT", "Converted", "ObjectKey", "Rejection",
    "cidr_sloppy", "deleted", "from_api", "node_from_api", "service_cidr_from_api",
    "service_from_api", "slice_from_api",
]
