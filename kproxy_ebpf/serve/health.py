"""/healthz and /livez with kube-proxy v1.36's semantics (pkg/proxy/healthcheck/proxy_health.go).

Unhealthy (503) when a change has waited for a sync longer than the health timeout. /healthz
is also 503 while the Node is not eligible: not seen yet, being deleted (deletionTimestamp) or
tainted ToBeDeletedByClusterAutoscaler, so that load balancers drain the node first; /livez
ignores the Node (a draining node's proxy must not be restarted for it).

Bodies are kube-proxy's JSON, field for field, so the same probes and dashboards work:
  {"lastUpdated": T, "currentTime": T, "nodeEligible": bool (/healthz only), "healthy": bool,
   "status": {"IPv4": {"lastUpdated": T, "healthy": bool}, "IPv6": {...}}}
"healthy" is the proxier's own health (not the node's); "lastUpdated" reads as now while the
response is 200, as kube-proxy keeps it for old clients; times are Go's RFC 3339 in UTC.
"""
from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable
from datetime import UTC, datetime
from http.server import BaseHTTPRequestHandler

from kproxy_ebpf.model.objects import IPFamily

from . import httpserve

# The proxiers this agent is (kube-proxy's per-family status): one sync programs both.
IP_FAMILIES = tuple(IPFamily)


def go_time(ts: float | None) -> str:
    """A timestamp as Go's time.Time marshals to JSON (RFC 3339, trailing zeros trimmed);
    unset is Go's zero time."""
    if not ts:
        return "0001-01-01T00:00:00Z"
    dt = datetime.fromtimestamp(ts, UTC)
    frac = f"{dt.microsecond:06d}".rstrip("0")
    return dt.strftime("%Y-%m-%dT%H:%M:%S") + (f".{frac}" if frac else "") + "Z"


class ProxyHealth:
    def __init__(self, timeout: float, clock=time.time):
        self.timeout = timeout
        self._clock = clock
        self._lock = threading.Lock()
        self.last_updated: float | None = None
        self.oldest_pending: float | None = None
        # None until the Node is seen: kube-proxy's NodeEligible() is false without a Node.
        self.node_eligible: bool | None = None
        self.on_response: Callable[[str, int], None] | None = None   # (path, code): metrics
        self.checkz: Callable[[], dict] | None = None    # /checkz: the agent's drift check
        # Frontends waiting for room (kproxy's own; in the body only while there are some).
        self.unprogrammed: tuple[int, list[str]] = (0, [])

    def queued_update(self) -> None:
        """A change arrived that the datapath does not hold yet."""
        with self._lock:
            if self.oldest_pending is None:
                self.oldest_pending = self._clock()

    def updated(self, started: float) -> None:
        """A sync that began at `started` succeeded: changes queued before it are applied."""
        with self._lock:
            self.last_updated = self._clock()
            if self.oldest_pending is not None and self.oldest_pending <= started:
                self.oldest_pending = None

    def set_unprogrammed(self, frontends: int, full_maps: list[str]) -> None:
        with self._lock:
            self.unprogrammed = (frontends, full_maps)

    def status(self, with_node: bool) -> tuple[int, dict]:
        with self._lock:
            now = self._clock()
            proxier_ok = self.oldest_pending is None or now - self.oldest_pending < self.timeout
            healthy = proxier_ok
            body: dict = {"lastUpdated": None, "currentTime": go_time(now)}
            if with_node:
                body["nodeEligible"] = self.node_eligible is True
                healthy = healthy and self.node_eligible is True
            body["lastUpdated"] = go_time(now if healthy else self.last_updated)
            body["healthy"] = proxier_ok
            if self.last_updated is not None:
                body["status"] = {f: {"lastUpdated": go_time(self.last_updated),
                                      "healthy": proxier_ok} for f in IP_FAMILIES}
            waiting, full_maps = self.unprogrammed
            if waiting:
                body["unprogrammed"] = {"frontends": waiting, "fullMaps": full_maps}
        return (200 if healthy else 503), body


def json_response(handler: BaseHTTPRequestHandler, code: int, body: dict) -> None:
    """A JSON answer with the headers kube-proxy's health servers send."""
    data = json.dumps(body).encode()
    handler.send_response(code)
    handler.send_header("Content-Type", "application/json")
    handler.send_header("X-Content-Type-Options", "nosniff")
    handler.send_header("Content-Length", str(len(data)))
    handler.end_headers()
    handler.wfile.write(data)


def serve(health: ProxyHealth, address: str) -> httpserve.LocalHTTPServer:
    """Starts the health server on host:port in a daemon thread (the agent itself waits for a
    port in use: port_wait.py)."""
    return httpserve.serve(httpserve.host_port(address), handler(health), "healthz")


def handler(health: ProxyHealth) -> type[BaseHTTPRequestHandler]:
    """/healthz, /livez and /checkz of `health`."""

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self):
            path = self.path.split("?")[0]
            if path == "/checkz" and health.checkz is not None:
                # The agent's own drift check (self_check.py), for `check --all-nodes`.
                json_response(self, 200, health.checkz())
                return
            if path not in ("/healthz", "/livez"):
                self.send_error(404)
                return
            code, body = health.status(with_node=path == "/healthz")
            if health.on_response:
                health.on_response(path, code)
            json_response(self, code, body)

        def log_message(self, *args):   # probes every few seconds would flood the log
            pass

    return Handler
