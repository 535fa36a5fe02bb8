"""`kproxy-ebpf check`: does this node's datapath hold what the cluster says it should?

kube-proxy's operators grep iptables-save for a missing KUBE-SVC chain ("a failure to
reconcile"). Here the question is answered exactly: the cluster is listed once through the
agent's own list code (or its manifests read), with the agent's own configuration (--config),
the same policy code the agent runs computes the desired frontends (both scopes: the socket
hooks' rows and, with northSouth, the TC path's), and they are compared with what the pinned
maps hold, source ranges included. Every difference is one line.
"""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from .config import AgentConfig
from .datapath import layout as L
from .desired import Frontend, FrontendKey
from .model import Node, hostport
from .proxy.state import ProxyState


@dataclass(frozen=True)
class Drift:
    what: str          # "missing", "stale" or "different"
    frontend: str      # "10.96.0.10:80/TCP"
    detail: str

    def __str__(self) -> str:
        return f"{self.what:<9} {self.frontend:<24} {self.detail}"


def _name(ip: str, port: int, proto: str, scope: int) -> str:
    """A frontend as the report names it; a scope-EXT one (the TC path) says so."""
    return f"{hostport(ip, port)}/{proto}" + (" (from outside)" if scope == L.SCOPE_EXT else "")


def _wanted(fe: Frontend) -> dict:
    return {"service": str(fe.service), "type": fe.kind.value, "action": fe.action.value,
            "affinity_timeout": fe.affinity_timeout,
            "backends": sorted(hostport(b.ip, b.port) for b in fe.backends),
            "source_ranges": sorted(fe.source_ranges)}


def _held(entry: dict) -> dict:
    return {"service": entry["service"], "type": entry["type"], "action": entry["action"],
            "affinity_timeout": entry["affinity_timeout"],
            "backends": sorted(hostport(str(b.get('address')), b.get('port'))
                               for b in entry["backends"]),
            "source_ranges": sorted(entry.get("source_ranges", []))}


def compare(desired: Mapping[FrontendKey, Frontend], kernel: list[dict]) -> list[Drift]:
    """desired: ProxyState frontends of both scopes by key; kernel: reader.services(). Each
    frontend's service, type, verdict, affinity, backends and (LoadBalancer IPs from outside)
    enforced source ranges."""
    held = {(e["address"], e["port"], e["protocol"], e["scope"]): e for e in kernel}
    drifts = []
    for fkey, fe in sorted(desired.items()):
        key = (fkey.ip, fkey.port, fkey.protocol.value, L.SCOPE_NUM[fkey.scope])
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


def desired_for(cfg: AgentConfig) -> Mapping[FrontendKey, Frontend]:
    """The frontends the agent configured by `cfg` should hold: from its manifests, or from
    one list of its API server (its kubeconfig and master, its node name)."""
    if cfg.manifests:
        return desired_from_manifests(cfg.manifests, cfg.node_name, **cfg.planning)
    import urllib3
    from kubernetes.client.exceptions import ApiException

    from .kube.client import make_api_client

    api = make_api_client(kubeconfig=cfg.kubeconfig, master=cfg.master)
    try:
        return desired_from_api(api, cfg.node_name, **cfg.planning)
    except urllib3.exceptions.MaxRetryError as exc:
        raise ApiUnreachable(api.configuration.host, str(exc.reason or exc)) from exc
    except (urllib3.exceptions.HTTPError, OSError) as exc:
        raise ApiUnreachable(api.configuration.host, str(exc)) from exc
    except ApiException as exc:
        raise ApiUnreachable(api.configuration.host, f"HTTP {exc.status} {exc.reason}") from exc


class ApiUnreachable(RuntimeError):
    """The API server could not be listed: a sentence for the user, saying where and what to
    do, instead of the client library's traceback."""

    def __init__(self, host: str, reason: str):
        super().__init__(
            f"cannot list the cluster at {host}: {reason}. Run check where that address is "
            "reachable, or pass --kubeconfig or --master with an API server address this "
            "network namespace reaches (a lab node reaches the lab's API server at its "
            "underlay address, not at the host's 127.0.0.1).")


def desired_from_api(api_client, node_name: str, **planning) -> Mapping[FrontendKey, Frontend]:
    """Lists the cluster once, as the agent's sources do (kube/: paginated, same selectors,
    same conversion), and computes the desired frontends with the agent's policy code."""
    from .kube.sources import list_cluster

    node, services, slices, _ = list_cluster(api_client, node_name)
    return _desired(node or Node(node_name), services, slices, **planning)


def desired_from_manifests(paths: list[str], node_name: str,
                           **planning) -> Mapping[FrontendKey, Frontend]:
    from .kube.manifests import load_manifests

    services, slices, _ = load_manifests(paths)
    return _desired(Node(node_name), services, slices, **planning)


def _desired(node: Node, services, slices, **planning) -> Mapping[FrontendKey, Frontend]:
    """`planning`: AgentConfig.planning (or ProxyState's defaults)."""
    state = ProxyState(node, **planning)
    state.load(services, slices)
    return state.compute(full=True).frontends
