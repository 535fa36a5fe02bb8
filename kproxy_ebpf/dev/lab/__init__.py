"""The local simulated cluster: nodes and pods as network namespaces, one cgroup per node.

Public surface for the CLI and the tests: `Lab` (namespaces.py) and the info types it returns;
procs.run_in / kill_recorded for process control; probe.py and echo.py are also scripts that
run inside the lab's namespaces.
"""
from .namespaces import (
    CONTROL_PLANE_IP,
    EXTERNAL_IP,
    POD_GATEWAY,
    POD_SUPERNET,
    ROUTER_IP,
    SERVICE_CIDR,
    DownReport,
    ExternalInfo,
    Lab,
    NodeInfo,
    PodInfo,
    Target,
    node_ip,
    pod_cidr,
)
from .nsutil import LabError

__all__ = [
    "CONTROL_PLANE_IP",
    "EXTERNAL_IP",
    "POD_GATEWAY",
    "POD_SUPERNET",
    "ROUTER_IP",
    "SERVICE_CIDR",
    "DownReport",
    "ExternalInfo",
    "Lab",
    "LabError",
    "NodeInfo",
    "PodInfo",
    "Target",
    "node_ip",
    "pod_cidr",
]
