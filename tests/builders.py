"""Builders of the objects tests feed the agent, one per call, in three kinds:

- model objects (svc, ep, sl, fe, table) with the conventions most tests share (namespace
  "ns", Service "svc" on ClusterIP 172.30.0.10 port 80/TCP, slice "s1" with target port
  8080/TCP);
- numbered model objects (numbered_svc, numbered_slice): cluster i of N for scale tests;
- API objects as JSON dicts (api_service, api_slice, api_ep): what the API server sends or
  a test creates through it; a LIST page of them (api_list, ListPage).

A module that needs other defaults binds them once with functools.partial; every field is a
keyword."""
from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from typing import Any

from kproxy_ebpf.model.desired import Action, Backend, Frontend, FrontendKind, Scope, ServicePortName
from kproxy_ebpf.model.objects import Endpoint, EndpointPort, EndpointSlice, Protocol, Service, ServicePort

TCP, UDP = Protocol.TCP, Protocol.UDP
CLUSTER_IP = "172.30.0.10"
PORT_80 = (ServicePort("", TCP, 80),)
TARGET_8080 = (EndpointPort("", TCP, 8080),)


def svc(name: str = "svc", ip: str | Iterable[str] = CLUSTER_IP, *, ns: str = "ns",
        ports: Iterable[ServicePort] = PORT_80, **fields) -> Service:
    """Service ns/name on ClusterIP `ip` (several: a tuple; none: ()); `fields` are Service's."""
    ips = (ip,) if isinstance(ip, str) else tuple(ip)
    fields.setdefault("cluster_ips", ips)
    return Service(namespace=ns, name=name, ports=tuple(ports), **fields)


def ep(ip: str | None, node: str | None = None, **fields) -> Endpoint:
    """One endpoint on `node`; a falsy `ip` makes one without addresses. Conditions unset
    unless given (ready=..., serving=..., terminating=...)."""
    return Endpoint.of(ip or None, node_name=node, **fields)


def sl(*eps: Endpoint, name: str = "s1", svc: str | None = "svc", ns: str = "ns",
       ports: Iterable[EndpointPort] = TARGET_8080, family: str = "IPv4",
       rv: str = "") -> EndpointSlice:
    """EndpointSlice ns/name of Service `svc` (None: without the label) holding `eps`."""
    return EndpointSlice(namespace=ns, name=name, service_name=svc, address_type=family,
                         ports=tuple(ports), endpoints=tuple(eps), resource_version=rv)


def fe(ip: str = "10.96.0.10", port: int = 80, backends: Iterable[str | Backend] = (),
       action: Action = Action.FORWARD, *, kind: FrontendKind = FrontendKind.CLUSTER_IP,
       name: str = "web", service: ServicePortName | None = None, affinity: int = 0,
       scope: Scope = Scope.SOCK, ranges: Iterable[str] = (), maglev: int = 0) -> Frontend:
    """A TCP frontend of `service` (default/<name>:http unless given); backends are addresses
    (target port 8080) or Backends, kept sorted as the proxy hands them to the writer."""
    service = service or ServicePortName("default", name, "http", TCP)
    bs = tuple(sorted(Backend.of(b, 8080, TCP) if isinstance(b, str) else b for b in backends))
    return Frontend(ip, port, TCP, kind, service, action, bs, affinity, scope,
                    source_ranges=tuple(ranges), maglev=maglev)


def table(*fes: Frontend) -> dict:
    """Frontends by key, as MapWriter.apply takes them."""
    return {f.key: f for f in fes}


# -- numbered model objects -------------------------------------------------------------------

def numbered_svc(i: int, **fields) -> Service:
    """Service ns/svc-<i> on a ClusterIP of its own (172.30.0.0/15 holds 131,072), port http
    80/TCP unless `fields` say otherwise."""
    fields.setdefault("ports", (ServicePort("http", TCP, 80),))
    fields.setdefault("resource_version", "1")
    return svc(f"svc-{i}", f"172.{30 + (i >> 16)}.{(i >> 8) & 255}.{i & 255}", **fields)


def numbered_slice(i: int, ready: Iterable[bool] = (True, True, True),
                   node: str = "node-b") -> EndpointSlice:
    """Slice ns/svc-<i>-abc of numbered_svc(i): one endpoint per `ready` on `node`, target port
    http 8080/TCP."""
    return sl(*(ep(f"10.{i >> 8 & 255}.{i & 255}.{e + 1}", node, ready=r)
                for e, r in enumerate(ready)),
              name=f"svc-{i}-abc", svc=f"svc-{i}", ports=(EndpointPort("http", TCP, 8080),))


# -- API objects (JSON dicts) -------------------------------------------------------------------

SERVICE_NAME = "kubernetes.io/service-name"


def _meta(name: str, ns: str | None, meta: Mapping[str, Any] | None) -> dict[str, Any]:
    """metadata: `ns` None leaves the namespace out (a create body takes the call's)."""
    return {"name": name, **({} if ns is None else {"namespace": ns}), **(meta or {})}


def api_service(name: str = "svc", ns: str | None = "ns", *, ports: Any = ({"port": 80},),
                meta: Mapping[str, Any] | None = None, status: dict | None = None,
                typed: bool = False, **spec: Any) -> dict[str, Any]:
    """A Service's JSON: metadata name, namespace and `meta`; spec ports (a list, or any
    value a test wants the converter to meet) and `spec`; `typed`: with apiVersion and kind.
    A tuple of ports (the default) is copied, so a test may change what it gets."""
    obj: dict[str, Any] = {"apiVersion": "v1", "kind": "Service"} if typed else {}
    obj["metadata"] = _meta(name, ns, meta)
    obj["spec"] = {"ports": [dict(p) for p in ports] if isinstance(ports, tuple) else ports,
                   **spec}
    if status is not None:
        obj["status"] = status
    return obj


def api_ep(ip: str, node: str | None = None, conditions: dict | None = None,
           **fields: Any) -> dict[str, Any]:
    """One endpoint of an EndpointSlice's JSON (`conditions` None: the key is left out)."""
    return {"addresses": [ip], **({} if conditions is None else {"conditions": conditions}),
            **({} if node is None else {"nodeName": node}), **fields}


def api_slice(name: str = "s1", service: str | None = "svc", ns: str | None = "ns", *,
              endpoints: Any = (), ports: Any = ({"port": 8080},), address_type: str = "IPv4",
              labels: Mapping[str, str] | None = None, meta: Mapping[str, Any] | None = None,
              typed: bool = False) -> dict[str, Any]:
    """An EndpointSlice's JSON, labelled with `service` (None: no label) and `labels`."""
    obj: dict[str, Any] = ({"apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice"}
                           if typed else {})
    all_labels = {**({} if service is None else {SERVICE_NAME: service}), **(labels or {})}
    obj["metadata"] = _meta(name, ns, {**(meta or {}), "labels": all_labels})
    obj["addressType"] = address_type
    obj["ports"] = [dict(p) for p in ports] if isinstance(ports, tuple) else ports
    obj["endpoints"] = list(endpoints) if isinstance(endpoints, tuple) else endpoints
    return obj


def api_list(items: list, rv: str = "", cont: str = "", kind: str | None = None) -> dict[str, Any]:
    """A LIST response's body: metadata (resourceVersion and continue where given) before
    the items, in the order the API server sends them (the pager reads them in that order)."""
    meta = {k: v for k, v in (("resourceVersion", rv), ("continue", cont)) if v}
    return {**({} if kind is None else {"kind": kind}), "metadata": meta, "items": items}


class ListPage:
    """A LIST response as the reflector reads it without preloading: raw JSON bytes."""

    def __init__(self, body: dict[str, Any]) -> None:
        self.data = json.dumps(body).encode()

    def release_conn(self) -> None:
        pass
