"""Where the agent's Services, EndpointSlices and Node come from: the API server (list+watch)
or static YAML manifests. Both deliver converted model objects to a Sink, so the agent's sync
loop cannot tell them apart.

A malformed object is reported (Sink.rejected) and otherwise ignored: the last good version
stays programmed, because dropping a working Service over a bad update would turn an operator's
typo into an outage.
"""
from __future__ import annotations

import functools
import logging
import threading
from collections.abc import Callable, Collection
from pathlib import Path
from typing import Any, NamedTuple, Protocol

from kproxy_ebpf.model.objects import EndpointSlice, Kind, Node, Service

from .convert import Converted, Rejection, deleted, from_api
from .manifests import load_manifests
from .reflector.event import Decode, Event, EventType

log = logging.getLogger(__name__)

# kube-proxy v1.36 (cmd/kube-proxy/app/server.go) lists EndpointSlices with
# "!service.kubernetes.io/headless" and Services with "!service.kubernetes.io/service-proxy-name".
# We list every Service instead: proxy/ skips the labelled ones just the same, but it must know
# their ClusterIPs so that the ServiceCIDR check leaves them to the proxy that owns them.
SLICE_LABEL_SELECTOR = "!service.kubernetes.io/headless"


class ApiCounters(NamedTuple):
    """One watched resource's history, for the metrics."""
    relists: int        # after 410 Gone
    restarts: int       # lists or watches retried after an error (stalls included)
    stalls: int         # watches that stopped delivering without closing
    synced: bool        # listed once


class Sink(Protocol):
    def replace(self, kind: Kind, objs: list[Any], keep: Collection[tuple[str, str]] = ...) -> None:
        """The whole set of `kind`; keys in `keep` (objects that failed conversion) are not
        deleted: their last good version stays."""
    def upsert(self, kind: Kind, obj: Any) -> None: ...
    def delete(self, kind: Kind, namespace: str, name: str) -> None: ...
    def rejected(self, rejections: list[Rejection]) -> None: ...


def _selection(resource: str, node_name: str) -> dict[str, Any]:
    """What of a resource the agent reads: its own Node; Services and slices for this proxy."""
    if resource == "node":
        return {"node_name": node_name}
    # kube-proxy 1.36 lists every Service (proxy/ skips those another proxy owns, whose
    # ClusterIPs the ServiceCIDR check still needs) and drops headless-labelled slices.
    return {"label_selector": SLICE_LABEL_SELECTOR} if resource == "endpointslices" else {}


def list_cluster(api_client: Any, node_name: str
                 ) -> tuple[Node | None, list[Service], list[EndpointSlice], list[Rejection]]:
    """One complete list of what ApiSource watches (same selectors, same paginated LIST, same
    conversion), for one-shot readers such as `kproxy-ebpf check`. The Node is None when the
    API server does not know it (the agent then runs with the bare configured name)."""
    from .reflector import list_once

    out: dict[str, list] = {}
    bad: list[Rejection] = []
    for resource, kind in ApiSource.RESOURCES.items():
        out[kind] = []
        for _, obj, rej in list_once(api_client, resource, transform=functools.partial(from_api, kind),
                                     **_selection(resource, node_name)):
            bad += rej
            if obj is not None:
                out[kind].append(obj)
    nodes = out[Kind.NODE]
    return (nodes[0] if nodes else None), out[Kind.SERVICE], out[Kind.ENDPOINT_SLICE], bad


def list_service_cidrs(api_client: Any) -> list | None:
    """The ServiceCIDRs, listed once; None where the API server does not serve them (before
    Kubernetes 1.33, or without RBAC for them), as the agent then enforces none."""
    from kubernetes.client.exceptions import ApiException

    from .reflector import list_once

    try:
        listed = list_once(api_client, "servicecidrs",
                           transform=functools.partial(from_api, Kind.SERVICE_CIDR))
    except ApiException as exc:
        if exc.status in (403, 404):
            return None
        raise
    return [obj for _, obj, _ in listed if obj is not None]


def decoder(kind: Kind) -> Decode:
    """The reflectors' decode for `kind`: every object through from_api() on the reflector's
    thread, a listed one while its page is at hand (so the JSON of a whole LIST is never
    held); a deleted one needs only its key."""
    def decode(etype: EventType, raw: dict) -> Converted:
        return deleted(raw) if etype is EventType.DELETED else from_api(kind, raw)
    return decode


class ApiSource:
    """One reflector per resource; `synced` once each required one has delivered its first list.

    ServiceCIDRs are optional, as in kube-proxy (its proxier waits for Services and
    EndpointSlices only): until they are listed, or on an API server without
    networking.k8s.io/v1 ServiceCIDR, no address is treated as an unallocated ClusterIP.
    """

    RESOURCES = {"services": Kind.SERVICE, "endpointslices": Kind.ENDPOINT_SLICE,
                 "node": Kind.NODE}
    OPTIONAL = {"servicecidrs": Kind.SERVICE_CIDR}

    def __init__(self, api_client: Any, node_name: str, sink: Sink,
                 progress_timeout: float = 150.0):
        from .reflector import reflector_for

        self.sink = sink
        self.reflectors = {}
        for resource, kind in self.RESOURCES.items():
            self.reflectors[resource] = reflector_for(
                api_client, resource, self._handler(kind), on_contact=self._wake_all,
                decode=decoder(kind), progress_timeout=progress_timeout,
                **_selection(resource, node_name))
        self.reflectors["servicecidrs"] = service_cidr_reflector(
            api_client, self._handler(Kind.SERVICE_CIDR), on_contact=self._wake_all,
            decode=decoder(Kind.SERVICE_CIDR), progress_timeout=progress_timeout)

    def _wake_all(self) -> None:
        """One reflector got through after failures: the API server is back, so the others
        retry now instead of sleeping out a backoff that grew during the outage."""
        for r in self.reflectors.values():
            r.wake()

    def _handler(self, kind: Kind) -> Callable[[Event], None]:
        def on_event(event: Event[Converted]) -> None:
            sink = self.sink
            if event.type is EventType.DELETED:
                for c in event.objects:
                    sink.delete(kind, *c.key)
                return
            bad = [r for c in event.objects for r in c.rejections]
            if bad:
                sink.rejected(bad)
            if event.type is EventType.SYNC:
                # An object that failed conversion is kept (its last good version stays).
                sink.replace(kind, [c.obj for c in event.objects if c.obj is not None],
                             {c.key for c in event.objects if c.obj is None})
            else:
                for c in event.objects:
                    if c.obj is not None:
                        sink.upsert(kind, c.obj)
        return on_event

    @property
    def synced(self) -> bool:
        return all(self.reflectors[name].synced.is_set() for name in self.RESOURCES)

    def wait_synced(self, timeout: float | None = None) -> bool:
        for name in self.RESOURCES:
            if not self.reflectors[name].synced.wait(timeout):
                return False
        return True

    def start(self) -> None:
        for r in self.reflectors.values():
            r.start()

    def stop(self) -> None:
        for r in self.reflectors.values():
            r.stop()

    def counters(self) -> dict[str, ApiCounters]:
        return {name: ApiCounters(r.relists, r.restarts, r.stalls, r.synced.is_set())
                for name, r in self.reflectors.items()}


def service_cidr_reflector(api_client: Any, on_event: Callable[[Event], None], **options: Any):
    """A Reflector for networking.k8s.io/v1 ServiceCIDRs (cluster-scoped). The agent needs RBAC
    list and watch on servicecidrs.networking.k8s.io, as kube-proxy's ClusterRole has."""
    from kubernetes import client

    from .reflector import Reflector

    fn = client.NetworkingV1Api(api_client).list_service_cidr
    return Reflector("servicecidrs", fn, fn, on_event, **options)


class ManifestSource:
    """Services and EndpointSlices from YAML files, re-read when a file changes; the Node is
    made from the configured name (no zone, no addresses: nothing NodePort-specific)."""

    def __init__(self, paths: list[str], node: Node, sink: Sink, poll: float = 0.5):
        self.paths, self.node, self.sink, self.poll = [Path(p) for p in paths], node, sink, poll
        self._stop = threading.Event()
        self._stamp: tuple = ()
        self._thread: threading.Thread | None = None

    def _files(self) -> list[Path]:
        out = []
        for p in self.paths:
            out.extend(sorted(p.glob("*.y*ml")) if p.is_dir() else [p])
        return out

    def _stamps(self) -> tuple:
        stamps: list[tuple[str, int | None, int | None]] = []
        for f in self._files():
            try:
                st = f.stat()
                stamps.append((str(f), st.st_mtime_ns, st.st_size))
            except FileNotFoundError:
                stamps.append((str(f), None, None))
        return tuple(stamps)

    def load(self) -> None:
        self._stamp = self._stamps()
        try:
            services, slices, bad = load_manifests([str(p) for p in self.paths])
        except (OSError, ValueError) as exc:    # keep what is programmed; say why
            log.error("cannot read manifests %s: %s", [str(p) for p in self.paths], exc)
            return
        if bad:
            self.sink.rejected(bad)
        keep = {(r.namespace, r.name) for r in bad}   # as with the API: keep the last good one
        self.sink.replace(Kind.NODE, [self.node])
        self.sink.replace(Kind.SERVICE, list(services), keep)
        self.sink.replace(Kind.ENDPOINT_SLICE, list(slices), keep)
        log.info("manifests: %d services, %d endpoint slices", len(services), len(slices))

    synced = True

    def wait_synced(self, timeout: float | None = None) -> bool:
        return True

    def start(self) -> None:
        self.load()
        self._thread = threading.Thread(target=self._watch, name="manifests", daemon=True)
        self._thread.start()

    def _watch(self) -> None:
        while not self._stop.wait(self.poll):
            if self._stamps() != self._stamp:
                self.load()

    def stop(self) -> None:
        self._stop.set()

    def counters(self) -> dict[str, ApiCounters]:
        return {}

