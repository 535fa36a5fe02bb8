"""`kproxy-ebpf check`: does this node's datapath hold what the cluster says it should?

kube-proxy's operators grep iptables-save for a missing KUBE-SVC chain ("a failure to
reconcile"). Here the question is answered exactly: the cluster is listed once (or manifests
read), the same policy code the agent runs computes the desired frontends, and they are
compared with what the pinned maps hold. Every difference is one line.
"""
from __future__ import annotations

import json
from dataclasses import dataclass

from .desired import Frontend
from .kube.convert import node_from_api, service_from_api, slice_from_api
from .kube.sources import SLICE_LABEL_SELECTOR
from .model import Node
from .proxy.state import ProxyState


@dataclass(frozen=True)
class Drift:
    what: str          # "missing", "stale" or "different"
    frontend: str      # "10.96.0.10:80/TCP"
    detail: str

    def __str__(self) -> str:
        return f"{self.what:<9} {self.frontend:<24} {self.detail}"


def _name(ip: str, port: int, proto: str) -> str:
    return f"{ip}:{port}/{proto}"


def _wanted(fe: Frontend) -> dict:
    return {"service": str(fe.service), "type": fe.kind.value, "action": fe.action.value,
            "affinity_timeout": fe.affinity_timeout,
            "backends": sorted(f"{b.ip}:{b.port}" for b in fe.backends)}


def _held(entry: dict) -> dict:
    return {"service": entry["service"], "type": entry["type"], "action": entry["action"],
            "affinity_timeout": entry["affinity_timeout"],
            "backends": sorted(f"{b.get('address')}:{b.get('port')}" for b in entry["backends"])}


def compare(desired: dict, kernel: list[dict]) -> list[Drift]:
    """desired: ProxyState frontends by (ip, port, Protocol); kernel: reader.services()."""
    held = {(e["address"], e["port"], e["protocol"]): e for e in kernel if e["scope"] == 0}
    drifts = []
    for (ip, port, proto), fe in sorted(desired.items()):
        key = (ip, port, proto.value)
        if key not in held:
            drifts.append(Drift("missing", _name(*key), f"{fe.service} ({fe.action.value})"))
            continue
        want, have = _wanted(fe), _held(held.pop(key))
        diff = [f"{k}: kernel {have[k]} != cluster {want[k]}" for k in want if want[k] != have[k]]
        if diff:
            drifts.append(Drift("different", _name(*key), "; ".join(diff)))
    for key, entry in sorted(held.items()):
        drifts.append(Drift("stale", _name(*key), f"{entry['service']}: not in the cluster"))
    return drifts


def desired_from_api(api_client, node_name: str, prefer_same_node: bool = True) -> dict:
    """Lists Services, EndpointSlices and the Node once and computes the desired frontends."""
    from kubernetes import client

    core, disc = client.CoreV1Api(api_client), client.DiscoveryV1Api(api_client)

    def items(fn, **kw) -> list[dict]:
        resp = fn(_preload_content=False, **kw)
        return json.loads(resp.data)["items"]

    state = ProxyState(node_from_api(json.loads(core.read_node(
        node_name, _preload_content=False).data)), prefer_same_node=prefer_same_node)
    for raw in items(core.list_service_for_all_namespaces):
        svc, _ = service_from_api(raw)
        if svc:
            state.upsert_service(svc)
    for raw in items(disc.list_endpoint_slice_for_all_namespaces,
                     label_selector=SLICE_LABEL_SELECTOR):
        sl, _ = slice_from_api(raw)
        if sl:
            state.upsert_slice(sl)
    return state.compute(full=True).frontends


def desired_from_manifests(paths: list[str], node_name: str) -> dict:
    from .kube.manifests import load_manifests

    services, slices, _ = load_manifests(paths)
    state = ProxyState(Node(node_name))
    state.load(services, slices)
    return state.compute(full=True).frontends
