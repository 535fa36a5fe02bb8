"""The agent's small HTTP servers (/healthz, /metrics, healthCheckNodePorts), each in a daemon
thread.

http.server's bind does a reverse DNS lookup of the listen address (socket.getfqdn) only to
fill a name nobody reads. Where no resolver answers (a node's namespace in the lab, a
hostNetwork pod with a dead resolver) that lookup waits out the resolver's 5 s timeout before
the server exists, and it ran in the agent's start-up and in the sync that opens a
healthCheckNodePort; so the servers here skip it.
"""
from __future__ import annotations

import errno
import socket
import socketserver
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

# Every address of both families (a dual-stack socket: IPv4 clients arrive IPv4-mapped), as
# Go's net.Listen("tcp", ":port") that kube-proxy's healthCheckNodePort servers use.
ALL_FAMILIES = ""


class LocalHTTPServer(ThreadingHTTPServer):
    daemon_threads = True

    def server_bind(self) -> None:
        socketserver.TCPServer.server_bind(self)
        host, port = self.server_address[:2]
        assert isinstance(host, str)        # getsockname()'s: text, never bytes
        self.server_name, self.server_port = host, port


class LocalHTTPServer6(LocalHTTPServer):
    """An IPv6 listener; on "::" it also takes IPv4 (IPV6_V6ONLY off)."""
    address_family = socket.AF_INET6

    def server_bind(self) -> None:
        self.socket.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
        super().server_bind()


def host_port(address: str) -> tuple[str, int]:
    """"host:port" (host empty: 0.0.0.0) as serve() takes it."""
    host, _, port = address.rpartition(":")
    return host or "0.0.0.0", int(port)


def serve(address: tuple[str, int], handler: type[BaseHTTPRequestHandler],
          name: str) -> LocalHTTPServer:
    """Binds now (errors reach the caller) and serves in a daemon thread named `name`.
    Host ALL_FAMILIES: "::" for both families, or 0.0.0.0 where the node has no IPv6."""
    host, port = address
    if host == ALL_FAMILIES:
        try:
            server: LocalHTTPServer = LocalHTTPServer6(("::", port), handler)
        except OSError as exc:
            if exc.errno not in (errno.EAFNOSUPPORT, errno.EADDRNOTAVAIL):
                raise
            server = LocalHTTPServer(("0.0.0.0", port), handler)
    else:
        server = (LocalHTTPServer6 if ":" in host else LocalHTTPServer)(address, handler)
    threading.Thread(target=server.serve_forever, name=name, daemon=True).start()
    return server


def metrics_handler(registry) -> type[BaseHTTPRequestHandler]:
    """/metrics in the Prometheus text format (what prometheus_client's own server sends).
    `?name[]=a&name[]=b` answers those metric families only, as prometheus_client's server
    does: the per-Service families (8 series per service port) are collected only when asked
    for, so a probe of one gauge does not pay for a page that grows with the Services."""
    from urllib.parse import parse_qs, urlsplit

    from prometheus_client.exposition import CONTENT_TYPE_LATEST, generate_latest

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self):
            names = parse_qs(urlsplit(self.path).query).get("name[]")
            data = generate_latest(registry.restricted_registry(names) if names else registry)
            self.send_response(200)
            self.send_header("Content-Type", CONTENT_TYPE_LATEST)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, *args):   # scraped every few seconds
            pass

    return Handler
