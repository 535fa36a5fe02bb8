"""Pure policy: cluster state (model.py) -> desired datapath state (desired.py).

No I/O, no kernel, no network: everything here is a function of its inputs, which is why most
of the project's tests live at this layer. Imports only kproxy_ebpf.model.objects, kproxy_ebpf.model.desired
and the standard library.

    endpoints.py  EndpointSlices -> usable endpoints per (port name, protocol)   (semantics 1.1)
    topology.py   Cluster set, Local set, has-any, topology hints               (1.3-1.6)
    frontends.py  one Service -> its frontends and verdicts for local traffic   (1.2, 1.5, 1.7)
    state.py      all objects + dirty tracking -> the whole frontend table
    claims.py     the Services' own frontends -> one table (first claimant wins), problems
"""
from .endpoints import EndpointInfo, PortKey, endpoints_by_port
from .frontends import ServicePortPlan, is_proxied, service_frontends, service_port_endpoints
from .state import ChangeSet, ProxyState, ServiceKey
from .topology import PortEndpoints, TopologyMode, categorize, topology_mode

__all__ = [
    "ChangeSet", "EndpointInfo", "PortEndpoints",
    "PortKey", "ProxyState", "ServiceKey", "ServicePortPlan", "TopologyMode", "categorize",
    "endpoints_by_port", "is_proxied", "service_frontends", "service_port_endpoints",
    "topology_mode",
]
