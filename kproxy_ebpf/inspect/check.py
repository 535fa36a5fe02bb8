"""`kproxy-ebpf check`: does this node's datapath hold what the cluster says it should?

kube-proxy's operators grep iptables-save for a missing KUBE-SVC chain ("a failure to
reconcile"). Here the question is answered exactly: the cluster is listed once through the
agent's own list code (or its manifests read), with the agent's own configuration (--config),
the same policy code the agent runs computes the desired frontends (both scopes: the socket
hooks' rows and, with northSouth, the TC path's), and they are compared with what the pinned
maps hold, source ranges included; so are the ServiceCIDR rows (each allocated ClusterIP's
reject or pass row, the ranges). Every difference is one line.
"""
from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass

from kproxy_ebpf.config import AgentConfig
from kproxy_ebpf.datapath.maps import layout as L
from kproxy_ebpf.model.desired import Frontend, FrontendKey, ServiceCIDRSet
from kproxy_ebpf.model.objects import Node, hostport
from kproxy_ebpf.proxy.state import ProxyState


class DriftKind(enum.StrEnum):
    MISSING = "missing"        # the cluster wants it, the maps lack it
    STALE = "stale"            # the maps hold it, the cluster does not want it
    DIFFERENT = "different"    # both have it, with other values


@dataclass(frozen=True)
class Drift:
    what: DriftKind
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
            "source_ranges": sorted(fe.source_ranges),
            "maglev": fe.maglev}          # proxy/external.py plans a table for FORWARD only


def _held(entry: dict) -> dict:
    return {"service": entry["service"], "type": entry["type"], "action": entry["action"],
            "affinity_timeout": entry["affinity_timeout"],
            "backends": sorted(hostport(str(b.get('address')), b.get('port'))
                               for b in entry["backends"]),
            "source_ranges": sorted(entry.get("source_ranges", [])),
            "maglev": entry.get("maglev", 0)}


def compare(desired: Mapping[FrontendKey, Frontend], kernel: list[dict]) -> list[Drift]:
    """desired: ProxyState frontends of both scopes by key; kernel: reader.services(). Each
    frontend's service, type, verdict, affinity, backends, (LoadBalancer IPs from outside)
    enforced source ranges and (from outside) the size of its Maglev table."""
    held = {(e["address"], e["port"], e["protocol"], e["scope"]): e for e in kernel}
    drifts = []
    for fkey, fe in sorted(desired.items()):
        key = (fkey.ip, fkey.port, fkey.protocol.value, L.SCOPE_NUM[fkey.scope])
        if key not in held:
            drifts.append(Drift(DriftKind.MISSING, _name(*key), f"{fe.service} ({fe.action.value})"))
            continue
        want, have = _wanted(fe), _held(held.pop(key))
        diff = [f"{k}: kernel {have[k]} != cluster {want[k]}" for k in want if want[k] != have[k]]
        if diff:
            drifts.append(Drift(DriftKind.DIFFERENT, _name(*key), "; ".join(diff)))
    for key, entry in sorted(held.items()):
        drifts.append(Drift(DriftKind.STALE, _name(*key), f"{entry['service']}: not in the cluster"))
    return drifts


def desired_for(cfg: AgentConfig) -> Mapping[FrontendKey, Frontend]:
    """The frontends the agent configured by `cfg` should hold."""
    return wanted_for(cfg)[0]


def wanted_for(cfg: AgentConfig) -> tuple[Mapping[FrontendKey, Frontend], ServiceCIDRSet | None]:
    """The frontends the agent configured by `cfg` should hold, and its ServiceCIDR rows (None
    when it enforces none: manifests, or an API server without ServiceCIDRs): from its
    manifests, or from one list of its API server (its kubeconfig and master, its node name)."""
    if cfg.manifests:
        return desired_from_manifests(cfg.manifests, cfg.node_name, **cfg.planning), None
    return _from_api(cfg, lambda api: wanted_from_api(api, cfg.node_name, **cfg.planning))


def list_nodes(cfg: AgentConfig) -> list:
    """The cluster's Nodes (V1Node), for check --all-nodes."""
    from kubernetes import client

    return _from_api(cfg, lambda api: client.CoreV1Api(api).list_node().items)


def _from_api(cfg: AgentConfig, fn):
    """fn(api client) with the agent's kubeconfig and master; any failure to reach the API
    server is ApiUnreachable (a sentence, not the client library's traceback)."""
    import urllib3
    from kubernetes.client.exceptions import ApiException

    from kproxy_ebpf.kube.client import make_api_client

    api = make_api_client(kubeconfig=cfg.kubeconfig, master=cfg.master)
    try:
        return fn(api)
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


def wanted_from_api(api_client, node_name: str, **planning
                    ) -> tuple[Mapping[FrontendKey, Frontend], ServiceCIDRSet | None]:
    """Lists the cluster once, as the agent's sources do (kube/: paginated, same selectors,
    same conversion), and computes the desired frontends and ServiceCIDR rows with the
    agent's policy code."""
    from kproxy_ebpf.kube.sources import list_cluster, list_service_cidrs

    node, services, slices, _ = list_cluster(api_client, node_name)
    cidrs = list_service_cidrs(api_client)
    state = ProxyState(node or Node(node_name), **planning)
    state.load(services, slices)
    for sc in cidrs or ():
        state.upsert_service_cidr(sc)
    return state.compute(full=True).frontends, (None if cidrs is None else state.service_cidr_set())


def compare_cidrs(want: ServiceCIDRSet, cluster_ips: Mapping[str, str],
                  cidrs: set[str]) -> list[Drift]:
    """The allocated ClusterIPs' rows (ip -> "reject" | "pass") and the ranges the maps hold
    (CidrWriter.restore()'s view) against `want`."""
    wanted = {**dict.fromkeys(want.foreign_ips, "pass"), **dict.fromkeys(want.cluster_ips, "reject")}
    drifts = [Drift(DriftKind.MISSING, f"ClusterIP {ip}", f"no {a} row")
              for ip, a in sorted(wanted.items()) if ip not in cluster_ips]
    drifts += [Drift(DriftKind.DIFFERENT, f"ClusterIP {ip}", f"kernel {cluster_ips[ip]} != cluster {a}")
               for ip, a in sorted(wanted.items()) if cluster_ips.get(ip, a) != a]
    drifts += [Drift(DriftKind.STALE, f"ClusterIP {ip}", "not allocated in the cluster")
               for ip in sorted(cluster_ips.keys() - wanted.keys())]
    drifts += [Drift(DriftKind.MISSING, f"ServiceCIDR {c}", "range not enforced")
               for c in sorted(want.cidrs - cidrs)]
    drifts += [Drift(DriftKind.STALE, f"ServiceCIDR {c}", "no such ServiceCIDR in the cluster")
               for c in sorted(cidrs - want.cidrs)]
    return drifts


def desired_from_manifests(paths: list[str], node_name: str,
                           **planning) -> Mapping[FrontendKey, Frontend]:
    from kproxy_ebpf.kube.manifests import load_manifests

    services, slices, _ = load_manifests(paths)
    return _desired(Node(node_name), services, slices, **planning)


def _desired(node: Node, services, slices, **planning) -> Mapping[FrontendKey, Frontend]:
    """`planning`: AgentConfig.planning (or ProxyState's defaults)."""
    state = ProxyState(node, **planning)
    state.load(services, slices)
    return state.compute(full=True).frontends
