"""Create the API objects a kubelet and scheduler would normally maintain.

The lab runs no kubelet and no scheduler. These helpers write Nodes and Pods directly (pods
already bound with spec.nodeName) and then patch their status subresource the way a kubelet
would, so the real EndpointSlice controller sees Ready nodes and running, ready pods with IPs.
All functions take a kubernetes.client.ApiClient.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping, Sequence
from datetime import UTC, datetime

from kubernetes import client
from kubernetes.client import ApiClient
from kubernetes.client.exceptions import ApiException

ZONE_LABEL = "topology.kubernetes.io/zone"
SERVICE_NAME_LABEL = "kubernetes.io/service-name"
POD_IMAGE = "kproxy.invalid/echo"  # never pulled: no kubelet runs
TERMINATING_GRACE_SECONDS = 24 * 3600

# A container port: 8080, ("http", 8080) or ("dns", 53, "UDP").
PortSpec = int | tuple[str, int] | tuple[str, int, str] | client.V1ContainerPort

_STRATEGIC = "application/strategic-merge-patch+json"


def _now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def ensure_namespace(api: ApiClient, name: str) -> None:
    try:
        client.CoreV1Api(api).create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=name)))
    except ApiException as e:
        if e.status != 409:
            raise


def create_node(
    api: ApiClient,
    name: str,
    internal_ip: str | Sequence[str],
    zone: str | None = None,
    pod_cidrs: Sequence[str] = (),
    labels: Mapping[str, str] | None = None,
) -> client.V1Node:
    """Create a Node and mark it Ready with its InternalIPs (one per family, primary first)
    and podCIDRs, as a kubelet and the node IPAM controller would.

    kube-proxy takes its node IP from status.addresses and exits when it later changes, so
    never edit the addresses of a Node that a running kube-proxy uses.
    """
    core = client.CoreV1Api(api)
    all_labels = {"kubernetes.io/hostname": name, "kubernetes.io/os": "linux", **(labels or {})}
    if zone:
        all_labels[ZONE_LABEL] = zone
    spec = {"podCIDR": pod_cidrs[0], "podCIDRs": list(pod_cidrs)} if pod_cidrs else {}
    ips = [internal_ip] if isinstance(internal_ip, str) else list(internal_ip)
    core.create_node({"apiVersion": "v1", "kind": "Node",
                      "metadata": {"name": name, "labels": all_labels}, "spec": spec})
    now = _now()
    status = {"status": {
        "addresses": [{"type": "InternalIP", "address": ip} for ip in ips]
                     + [{"type": "Hostname", "address": name}],
        "conditions": [{
            "type": "Ready", "status": "True", "reason": "KubeletReady", "message": "kproxy lab node",
            "lastHeartbeatTime": now, "lastTransitionTime": now,
        }],
    }}
    return core.patch_node_status(name, status, _content_type=_STRATEGIC)


def _container_port(api: ApiClient, p: PortSpec) -> dict:
    if isinstance(p, client.V1ContainerPort):
        return api.sanitize_for_serialization(p)
    if isinstance(p, int):
        return {"containerPort": p, "protocol": "TCP"}
    name, port, *proto = p
    return {"name": name, "containerPort": port, "protocol": proto[0] if proto else "TCP"}


def _ready_conditions(ready: bool, now: str) -> list[dict]:
    flag = "True" if ready else "False"
    return [
        {"type": "PodScheduled", "status": "True", "lastTransitionTime": now},
        {"type": "Initialized", "status": "True", "lastTransitionTime": now},
        {"type": "ContainersReady", "status": flag, "lastTransitionTime": now},
        {"type": "Ready", "status": flag, "lastTransitionTime": now},
    ]


def create_pod(
    api: ApiClient,
    namespace: str,
    name: str,
    node_name: str,
    ip: str | Sequence[str],
    labels: Mapping[str, str] | None = None,
    ports: Iterable[PortSpec] = (),
    *,
    ready: bool = True,
    host_ip: str | None = None,
) -> client.V1Pod:
    """Create a pod bound to `node_name`, then patch its status to Running with `ip`.

    `ip` may be a list (dual-stack: first one is status.podIP). The create resets status, so
    the status patch is a second request; until it lands the EndpointSlice controller skips
    the pod (it has no IP yet).
    """
    core = client.CoreV1Api(api)
    ips = [ip] if isinstance(ip, str) else list(ip)
    body = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": namespace, "labels": dict(labels or {})},
        "spec": {
            "nodeName": node_name,
            "terminationGracePeriodSeconds": 30,
            "containers": [{
                "name": "app",
                "image": POD_IMAGE,
                "imagePullPolicy": "Never",
                "ports": [_container_port(api, p) for p in ports],
            }],
        },
    }
    core.create_namespaced_pod(namespace, body)
    now = _now()
    status: dict = {
        "phase": "Running",
        "podIP": ips[0],
        "podIPs": [{"ip": a} for a in ips],
        "startTime": now,
        "conditions": _ready_conditions(ready, now),
    }
    if host_ip:
        status["hostIP"] = host_ip
        status["hostIPs"] = [{"ip": host_ip}]
    return core.patch_namespaced_pod_status(name, namespace, {"status": status}, _content_type=_STRATEGIC)


def set_pod_ready(api: ApiClient, namespace: str, name: str, ready: bool) -> client.V1Pod:
    """Flip the pod's Ready and ContainersReady conditions (merged by condition type)."""
    now = _now()
    flag = "True" if ready else "False"
    conditions = [{"type": t, "status": flag, "lastTransitionTime": now} for t in ("ContainersReady", "Ready")]
    return client.CoreV1Api(api).patch_namespaced_pod_status(
        name, namespace, {"status": {"conditions": conditions}}, _content_type=_STRATEGIC
    )


def mark_pod_terminating(
    api: ApiClient, namespace: str, name: str, grace_seconds: int = TERMINATING_GRACE_SECONDS
) -> None:
    """Delete gracefully with a long grace period: the pod gets a deletionTimestamp and, with
    no kubelet to finish the deletion, stays terminating until delete_pod(force=True)."""
    client.CoreV1Api(api).delete_namespaced_pod(name, namespace, grace_period_seconds=grace_seconds)


def delete_pod(api: ApiClient, namespace: str, name: str, force: bool = True) -> None:
    """Delete a pod; force (grace 0) removes it at once, also one left terminating. 404 is fine."""
    try:
        client.CoreV1Api(api).delete_namespaced_pod(name, namespace, grace_period_seconds=0 if force else None)
    except ApiException as e:
        if e.status != 404:
            raise


def slice_endpoints(slices: Iterable[client.V1EndpointSlice]) -> list[client.V1Endpoint]:
    return [ep for s in slices for ep in (s.endpoints or [])]


def wait_for_slice_endpoints(
    api: ApiClient,
    namespace: str,
    service: str,
    count: int,
    timeout: float = 10.0,
    *,
    ready: bool | None = None,
) -> list[client.V1EndpointSlice]:
    """Poll until the Service's EndpointSlices hold exactly `count` endpoints; return the slices.

    With ready=True/False only endpoints whose conditions.ready matches are counted.
    Raises TimeoutError describing what the slices held last.
    """
    disc = client.DiscoveryV1Api(api)
    deadline = time.monotonic() + timeout
    while True:
        slices = disc.list_namespaced_endpoint_slice(
            namespace, label_selector=f"{SERVICE_NAME_LABEL}={service}"
        ).items
        eps = slice_endpoints(slices)
        if ready is not None:
            eps = [e for e in eps if bool(e.conditions and e.conditions.ready) == ready]
        if len(eps) == count:
            return slices
        if time.monotonic() > deadline:
            seen = [(e.addresses, e.conditions.to_dict() if e.conditions else None) for e in slice_endpoints(slices)]
            raise TimeoutError(
                f"{namespace}/{service}: wanted {count} endpoints (ready={ready}), "
                f"have {len(eps)} after {timeout}s: {seen}"
            )
        time.sleep(0.05)
