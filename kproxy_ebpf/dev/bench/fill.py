"""The cluster the proxies are measured against: N filler Services with E endpoints each,
created through the API as real Service and EndpointSlice objects, and endpoint churn.

The slices are written directly, labelled `endpointslice.kubernetes.io/managed-by` with our
own value, on Services without a selector, so kube-controller-manager's EndpointSlice
controller leaves them alone (it manages only slices of selector Services that carry its own
managed-by value). Filler endpoints are ready addresses in 10.128.0.0/10 (fd00:128::/32 in
an IPv6 lab), which no lab namespace routes: they are programmed by every proxy, and never
contacted.
"""
from __future__ import annotations

import ipaddress
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

from .rawapi import RawApi

NAMESPACE = "kpbench"
MANAGED_BY = "kpbench.kproxy.invalid"
PART_OF = {"app.kubernetes.io/part-of": "kpbench"}
FILLER_BASE = int(ipaddress.IPv4Address("10.128.0.0"))     # N x E addresses from here
CHURN_BASE = int(ipaddress.IPv4Address("10.160.0.0"))      # replacement addresses
# The same in an IPv6 lab (unique local, outside every range of lab/addressing.py).
FILLER_BASE6 = int(ipaddress.IPv6Address("fd00:128::"))
CHURN_BASE6 = int(ipaddress.IPv6Address("fd00:160::"))
SERVICE_PORT = 80
TARGET_PORT = 8080
SINK_PORT = 8081
SINK_SERVICE_PORT = 81


def filler_name(i: int) -> str:
    return f"fill-{i:05d}"


def filler_address(i: int, j: int, endpoints: int, v6: bool = False) -> str:
    offset = 1 + i * endpoints + j
    return str(ipaddress.IPv6Address(FILLER_BASE6 + offset) if v6
               else ipaddress.IPv4Address(FILLER_BASE + offset))


def churn_address(k: int, v6: bool = False) -> str:
    return str(ipaddress.IPv6Address(CHURN_BASE6 + 1 + k) if v6
               else ipaddress.IPv4Address(CHURN_BASE + 1 + k))


def _proto(port: tuple) -> str:
    """A port tuple's protocol: (name, port, targetPort[, protocol]), TCP unless given."""
    return port[3] if len(port) > 3 else "TCP"


def service_obj(name: str, ports: Sequence[tuple] = (("", SERVICE_PORT, TARGET_PORT),),
                service_type: str = "ClusterIP", annotations: dict | None = None) -> dict:
    """A selector-less Service; ports are (name, port, targetPort[, protocol])."""
    meta = {"name": name, "namespace": NAMESPACE, "labels": dict(PART_OF)}
    if annotations:
        meta["annotations"] = dict(annotations)
    return {"apiVersion": "v1", "kind": "Service", "metadata": meta,
            "spec": {"type": service_type,
                     "ports": [{**({"name": p[0]} if p[0] else {}), "port": p[1],
                                "targetPort": p[2], "protocol": _proto(p)} for p in ports]}}


def service_cidr_obj(name: str, cidrs: Sequence[str]) -> dict:
    return {"apiVersion": "networking.k8s.io/v1", "kind": "ServiceCIDR",
            "metadata": {"name": name}, "spec": {"cidrs": list(cidrs)}}


def slice_obj(service: str, addresses: Sequence[str],
              ports: Sequence[tuple] = (("", TARGET_PORT),),
              name: str | None = None) -> dict:
    """ports are (name, port[, protocol])."""
    return {"apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
            "metadata": {"name": name or f"{service}-kpbench", "namespace": NAMESPACE,
                         "labels": {**PART_OF, "kubernetes.io/service-name": service,
                                    "endpointslice.kubernetes.io/managed-by": MANAGED_BY}},
            "addressType": "IPv6" if addresses and ":" in addresses[0] else "IPv4",
            "endpoints": [{"addresses": [a], "conditions": {"ready": True}} for a in addresses],
            "ports": [{**({"name": p[0]} if p[0] else {}), "port": p[1],
                       "protocol": p[2] if len(p) > 2 else "TCP"} for p in ports]}


def services_path(name: str | None = None) -> str:
    base = f"/api/v1/namespaces/{NAMESPACE}/services"
    return f"{base}/{name}" if name else base


def slices_path(name: str | None = None) -> str:
    base = f"/apis/discovery.k8s.io/v1/namespaces/{NAMESPACE}/endpointslices"
    return f"{base}/{name}" if name else base


def ensure_namespace(api: RawApi) -> None:
    api.create("/api/v1/namespaces", {"apiVersion": "v1", "kind": "Namespace",
                                      "metadata": {"name": NAMESPACE}})


def create_service(api: RawApi, name: str, addresses: Sequence[str],
                   ports: Sequence[tuple] = (("", SERVICE_PORT, TARGET_PORT),),
                   annotations: dict | None = None) -> str:
    """Service + its slice; ports are (name, port, targetPort[, protocol]). Returns the
    ClusterIP the API server allocated."""
    return create_service_obj(api, name, addresses, ports,
                              annotations=annotations)["spec"]["clusterIP"]


def create_service_obj(api: RawApi, name: str, addresses: Sequence[str],
                       ports: Sequence[tuple], service_type: str = "ClusterIP",
                       annotations: dict | None = None) -> dict:
    """Service + its slice; returns the Service as the API server stored it (ClusterIP,
    nodePorts allocated)."""
    svc = api.create(services_path(), service_obj(name, ports, service_type, annotations))
    if svc is None:
        svc = api.get(services_path(name))
    api.create(slices_path(), slice_obj(name, addresses,
                                        [(p[0], p[2], _proto(p)) for p in ports]))
    return svc


@dataclass
class FillResult:
    created: int
    seconds: float
    rate: float


def fill(api: RawApi, start: int, stop: int, endpoints: int, workers: int = 12,
         progress: Callable[[int], None] | None = None, v6: bool = False) -> FillResult:
    """Create fillers start..stop-1 (Service, then its slice) with a thread pool; v6: of
    IPv6 endpoints (the lab's Services are then IPv6 too)."""
    t0 = time.monotonic()
    done = [0]
    lock = threading.Lock()

    def one(i: int) -> None:
        create_service(api, filler_name(i),
                       [filler_address(i, j, endpoints, v6) for j in range(endpoints)])
        with lock:
            done[0] += 1
            if progress and done[0] % 1000 == 0:
                progress(done[0])

    with ThreadPoolExecutor(max_workers=workers) as pool:
        for f in [pool.submit(one, i) for i in range(start, stop)]:
            f.result()
    secs = time.monotonic() - t0
    n = stop - start
    return FillResult(n, secs, n / secs if secs > 0 else 0.0)


def replace_endpoint_op(index: int, address: str) -> list[dict]:
    return [{"op": "replace", "path": f"/endpoints/{index}/addresses/0", "value": address}]


@dataclass
class ChurnResult:
    requested_rate: float
    changes: int
    errors: int
    seconds: float
    max_lateness_s: float
    error_samples: list[str] = field(default_factory=list)

    @property
    def achieved_rate(self) -> float:
        return self.changes / self.seconds if self.seconds > 0 else 0.0

    def to_json(self) -> dict:
        return {"requested_per_s": self.requested_rate, "changes": self.changes,
                "achieved_per_s": round(self.achieved_rate, 2), "errors": self.errors,
                "max_lateness_s": round(self.max_lateness_s, 3), "seconds": self.seconds,
                "error_samples": self.error_samples[:3]}


def churn_summary(results: list[ChurnResult]) -> dict:
    """Several churn windows as one ChurnResult (changes, errors and seconds added up)."""
    merged = ChurnResult(results[0].requested_rate if results else 0.0,
                         sum(r.changes for r in results), sum(r.errors for r in results),
                         round(sum(r.seconds for r in results), 3),
                         max((r.max_lateness_s for r in results), default=0.0),
                         [e for r in results for e in r.error_samples])
    return {**merged.to_json(), "windows": len(results)}


class Churner:
    """Applies change(k) for k = 0, 1, ... at a fixed rate, from a background thread with a
    small pool (an API write takes a few ms; at 100/s one thread would fall behind)."""

    def __init__(self, api: RawApi, rate: float, change: Callable[[int], tuple[str, list]],
                 workers: int = 6):
        self.api, self.rate, self.change, self.workers = api, rate, change, workers
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.result: ChurnResult | None = None

    def __enter__(self) -> Churner:
        self._thread = threading.Thread(target=self._run, name="kpbench-churn", daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        if self._thread:
            self._thread.join()

    def _run(self) -> None:
        errors: list[str] = []
        ok = [0]
        lock = threading.Lock()
        lateness = 0.0

        def apply(k: int) -> None:
            path, ops = self.change(k)
            try:
                self.api.json_patch(path, ops)
                with lock:
                    ok[0] += 1
            except Exception as e:  # noqa: BLE001 - counted and reported, the churn goes on
                with lock:
                    errors.append(str(e))

        t0 = time.monotonic()
        k = 0
        with ThreadPoolExecutor(max_workers=self.workers) as pool:
            while not self._stop.is_set():
                due = t0 + k / self.rate
                now = time.monotonic()
                if due > now:
                    self._stop.wait(due - now)
                    continue
                lateness = max(lateness, now - due)
                pool.submit(apply, k)
                k += 1
        secs = time.monotonic() - t0
        self.result = ChurnResult(self.rate, ok[0], len(errors), secs, lateness, errors)
