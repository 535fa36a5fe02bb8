"""Idle pods: what a real node holds beside the few pods a benchmark measures (the kubelet's
default is up to 110 per node). Each is what a pod is to a proxy: a network namespace with a
veth to the node, a cgroup under the node's, and a process in both (one `sleep`, as a pod's
pause container). Nothing talks to them. A proxy whose work grows with the pods of its node
shows it here; kube-proxy's does not."""
from __future__ import annotations

from .namespaces import Lab

PREFIX = "kpidle"


def pods_on(lab: Lab, node: str) -> list[str]:
    return [p.name for p in lab.pods() if p.node == node]


def set_pods(lab: Lab, node: str, total: int, log=print) -> int:
    """Adds or removes idle pods until `node` holds `total` pods in all (the measured ones
    included; never fewer than those). Returns the idle pods on the node now."""
    idle = sorted((n for n in pods_on(lab, node) if n.startswith(f"{PREFIX}-{node}-")),
                  key=lambda n: int(n.rsplit("-", 1)[1]))
    want = max(0, total - (len(pods_on(lab, node)) - len(idle)))
    if want != len(idle):
        log(f"{node}: {len(idle)} -> {want} idle pods ({total} pods on the node)")
    for i in range(len(idle), want):
        name = f"{PREFIX}-{node}-{i}"
        lab.create_pod(name, node, ports=(), echo=False)
        lab.spawn(f"pod/{name}", ["sleep", "infinity"], f"idle-{name}")
    for name in idle[want:]:
        lab.delete_pod(name)
    return want
