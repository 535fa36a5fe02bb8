"""/healthz and /livez with kube-proxy's semantics (pkg/proxy/healthcheck/proxier_health.go):
unhealthy (503) when a change has waited for a sync longer than the health timeout; /healthz is
also 503 while the Node is being deleted, /livez ignores the Node. Bodies are JSON with
lastUpdated and currentTime, as kube-proxy's, so the same probes and dashboards work.
"""
from __future__ import annotations

import json
import threading
import time
from datetime import datetime, timezone
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


def _iso(ts: float | None) -> str:
    if not ts:
        return ""
    return datetime.fromtimestamp(ts, timezone.utc).isoformat(timespec="milliseconds")


class ProxyHealth:
    def __init__(self, timeout: float, clock=time.time):
        self.timeout = timeout
        self._clock = clock
        self._lock = threading.Lock()
        self.last_updated: float | None = None
        self.oldest_pending: float | None = None
        self.node_eligible = True

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

    def status(self, with_node: bool) -> tuple[int, dict]:
        with self._lock:
            now = self._clock()
            healthy = self.oldest_pending is None or now - self.oldest_pending < self.timeout
            body = {"lastUpdated": _iso(self.last_updated), "currentTime": _iso(now)}
            if with_node:
                body["nodeEligible"] = self.node_eligible
                healthy = healthy and self.node_eligible
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


def serve(health: ProxyHealth, address: str) -> ThreadingHTTPServer:
    """Starts the health server on host:port in a daemon thread."""
    host, _, port = address.rpartition(":")

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802 (http.server's naming)
            path = self.path.split("?")[0]
            if path not in ("/healthz", "/livez"):
                self.send_error(404)
                return
            json_response(self, *health.status(with_node=path == "/healthz"))

        def log_message(self, *args):   # probes every few seconds would flood the log
            pass

    server = ThreadingHTTPServer((host or "0.0.0.0", int(port)), Handler)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, name="healthz", daemon=True).start()
    return server
