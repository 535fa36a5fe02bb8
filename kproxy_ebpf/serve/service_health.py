"""The healthCheckNodePort servers: one HTTP server per port proxy/healthcheck.py names.

Answers any path (as kube-proxy does) with 200 when the Service has local Ready endpoints and
the proxy is healthy, 503 otherwise, and kube-proxy's JSON body:
{"service": {"namespace": ..., "name": ...}, "localEndpoints": N, "serviceProxyHealthy": bool}.
Servers are started and stopped as Services come and go; a port that cannot be bound is logged
and retried at the next sync, never fatal.
"""
from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler

from kproxy_ebpf.proxy.healthcheck import HealthCheck

from . import httpserve
from .health import json_response

log = logging.getLogger(__name__)


class ServiceHealthServers:
    def __init__(self, proxy_healthy: Callable[[], bool],
                 address: str = httpserve.ALL_FAMILIES):
        self._healthy = proxy_healthy
        self._address = address
        self._lock = threading.Lock()
        self._checks: dict[int, HealthCheck] = {}
        self._servers: dict[int, httpserve.LocalHTTPServer] = {}

    def status(self, port: int) -> tuple[int, dict]:
        with self._lock:
            hc = self._checks.get(port)
        if hc is None:
            return 404, {}
        healthy = self._healthy()
        body = {"service": {"namespace": hc.namespace, "name": hc.name},
                "localEndpoints": hc.local_endpoints, "serviceProxyHealthy": healthy}
        return (200 if hc.local_endpoints > 0 and healthy else 503), body

    def sync(self, checks: dict[int, HealthCheck]) -> None:
        """Makes the running servers match `checks` (port -> what to report)."""
        with self._lock:
            self._checks = dict(checks)
        for port in sorted(set(self._servers) - set(checks)):
            server = self._servers.pop(port)
            server.shutdown()
            server.server_close()
            log.info("stopped the health check server on port %d", port)
        for port in sorted(set(checks) - set(self._servers)):
            try:
                self._servers[port] = self._serve(port)
            except OSError as exc:
                log.error("health check server for %s/%s on port %d: %s (retried next sync)",
                          checks[port].namespace, checks[port].name, port, exc)

    def close(self) -> None:
        self.sync({})

    def _serve(self, port: int) -> httpserve.LocalHTTPServer:
        owner = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self):
                json_response(self, *owner.status(port))

            def log_message(self, *args):   # load balancers probe every few seconds
                pass

        server = httpserve.serve((self._address, port), Handler, f"hc-{port}")
        log.info("health check server on port %d", port)
        return server
