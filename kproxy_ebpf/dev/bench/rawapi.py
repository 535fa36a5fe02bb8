"""A thin, thread-safe JSON client for the API server, for the bench's bulk writes.

The official client builds and validates a model object per request, which costs more CPU
than the request itself: filling 10,000 Services that way would measure the bench, and on 2
cores it would steal CPU from the proxies being measured. This one posts prepared JSON over a
pooled urllib3 connection, with the admin credentials of the lab's kubeconfig.
"""
from __future__ import annotations

import json
import time

import urllib3


class ApiError(RuntimeError):
    def __init__(self, method: str, path: str, status: int, body: str):
        super().__init__(f"{method} {path}: HTTP {status}: {body[:300]}")
        self.status = status


def _etcd_timeout(r) -> bool:
    """An etcd write that timed out under load: the ClusterIP allocator reports it as 422
    Invalid ("failed to allocate IP: etcdserver: request timed out"), though the request was
    fine; kube-proxy nftables at 40,000 Services held the lab's 2 cores long enough."""
    return r.status == 422 and b"etcdserver: request timed out" in r.data


class RawApi:
    def __init__(self, kubeconfig: str, pool_size: int = 32):
        from kubernetes import client, config

        cfg = client.Configuration()
        config.load_kube_config(config_file=kubeconfig, client_configuration=cfg)
        self.host = cfg.host.rstrip("/")
        self.pool = urllib3.PoolManager(
            num_pools=2, maxsize=pool_size, block=True, cert_reqs="CERT_REQUIRED",
            ca_certs=cfg.ssl_ca_cert, cert_file=cfg.cert_file, key_file=cfg.key_file,
            timeout=urllib3.Timeout(connect=5, read=60), retries=False)

    def request(self, method: str, path: str, body: object | None = None,
                content_type: str = "application/json", retries: int = 5) -> dict:
        """One request; retries only what an overloaded API server answers (429, 5xx,
        connection errors), with a short backoff."""
        data = None if body is None else json.dumps(body, separators=(",", ":")).encode()
        for attempt in range(retries + 1):
            try:
                r = self.pool.request(method, self.host + path, body=data,
                                      headers={"Content-Type": content_type,
                                               "Accept": "application/json"})
            except urllib3.exceptions.HTTPError:
                if attempt == retries:
                    raise
                time.sleep(0.2 * (attempt + 1))
                continue
            if r.status < 300:
                return json.loads(r.data) if r.data else {}
            if attempt < retries and (r.status in (429, 500, 503, 504) or _etcd_timeout(r)):
                time.sleep(0.2 * (attempt + 1))
                continue
            raise ApiError(method, path, r.status, r.data.decode(errors="replace"))
        raise AssertionError("unreachable")

    def create(self, path: str, obj: dict, exist_ok: bool = True) -> dict | None:
        try:
            return self.request("POST", path, obj)
        except ApiError as e:
            if e.status == 409 and exist_ok:
                return None
            raise

    def get(self, path: str) -> dict:
        return self.request("GET", path)

    def json_patch(self, path: str, ops: list[dict]) -> dict:
        return self.request("PATCH", path, ops, "application/json-patch+json")

    def delete(self, path: str) -> None:
        try:
            self.request("DELETE", path)
        except ApiError as e:
            if e.status != 404:
                raise
