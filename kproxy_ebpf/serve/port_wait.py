"""The agent's servers (/healthz, /metrics) on a port another process holds: the agent keeps
running, waits for the port and serves once it is free.

During a migration kube-proxy may still run on the node for a moment, on the same healthz port
(10256, which cloud load balancers probe) and metrics port (10249). An agent that died on
EADDRINUSE would restart in a loop until kube-proxy left, and the node would have no proxy
restarting cleanly at all (Cilium's agents did that: terraform-hcloud-kube-hetzner#2288). So a
port in use is told once (a log sentence, the gauge kproxy_listen_port_in_use{server}, and
through `told` an Event on the Node), bound again every `retry` seconds, and when it binds the
server starts and says so. The datapath does not wait for it: the agent programs the node
meanwhile. Other bind errors (an address the node does not have, a port below 1024 without
the right) still stop the agent, with the reason.
"""
from __future__ import annotations

import errno
import logging
import threading
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler

from prometheus_client import CollectorRegistry, Gauge

from . import httpserve

log = logging.getLogger("kproxy_ebpf.serve")


class Listener:
    """One server, bound now or later: `serving` is set once it is."""

    def __init__(self, name: str, address: tuple[str, int],
                 handler: type[BaseHTTPRequestHandler]) -> None:
        self.name, self.address, self.handler = name, address, handler
        self.server: httpserve.LocalHTTPServer | None = None
        self.serving = threading.Event()

    @property
    def where(self) -> str:
        host, port = self.address
        return f"{host or '*'}:{port}"


class PortWaits:
    def __init__(self, registry: CollectorRegistry | None, retry: float = 1.0,
                 told: Callable[[str, str], None] | None = None) -> None:
        self.retry = retry
        self.told = told               # (reason, message): an Event, when there is an API
        self.in_use = Gauge("kproxy_listen_port_in_use",
                            "1 while a server of the agent waits for its port, held by another "
                            "process (kube-proxy during a migration).", ["server"],
                            registry=registry)

    def serve(self, address: tuple[str, int], handler: type[BaseHTTPRequestHandler], name: str,
              stop: threading.Event) -> Listener:
        """Serves at once when the port is free, else in the background once it is."""
        listener = Listener(name, address, handler)
        self.in_use.labels(name).set(0)
        if self._bind(listener):
            listener.serving.set()
            return listener
        self.in_use.labels(name).set(1)
        message = (f"{name}: port {listener.where} is in use by another process (kube-proxy "
                   f"still running on this node?); the agent keeps running and serves {name} "
                   f"as soon as the port is free")
        log.warning("%s (retrying every %gs)", message, self.retry)
        if self.told:
            self.told("PortInUse", message)
        threading.Thread(target=self._wait, args=(listener, stop), name=f"{name}-port-wait",
                         daemon=True).start()
        return listener

    def _bind(self, listener: Listener) -> bool:
        try:
            listener.server = httpserve.serve(listener.address, listener.handler,
                                              listener.name)
        except OSError as exc:
            if exc.errno != errno.EADDRINUSE:
                raise
            return False
        return True

    def _wait(self, listener: Listener, stop: threading.Event) -> None:
        while not stop.wait(self.retry):
            try:
                if not self._bind(listener):
                    continue
            except OSError as exc:
                log.error("%s: binding %s failed (%s); %s stays off", listener.name,
                          listener.where, exc, listener.name)
                return
            self.in_use.labels(listener.name).set(0)
            message = f"{listener.name}: port {listener.where} is free now; serving {listener.name}"
            log.info("%s", message)
            listener.serving.set()
            if self.told:
                self.told("PortFree", message)
            return
