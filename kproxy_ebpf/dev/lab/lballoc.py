"""The lab's cloud: a LoadBalancer allocator, as cloud-provider-kind or MetalLB on kind.

It watches Services and gives every Service of type LoadBalancer of the pool's family (without a
spec.loadBalancerClass: that names another implementation, which the default cloud controller
leaves alone too) one address of a pool, written to status.loadBalancer.ingress[].ip. ipMode is
not set: the API server's default (VIP) is what a VIP-like load balancer means, and the
proxies then serve the address themselves. spec.loadBalancerIP is honoured when it lies in the
pool and is free, otherwise the Service gets no address and a log line says why (MetalLB does
the same). An address is released when its Service is deleted or stops being a LoadBalancer
(its status is cleared then). State lives in the API only: at start every Service whose status
already holds a pool address keeps it, so a restarted allocator changes nothing.

The lab's external client routes the pool via node1 (`lab route` moves it); the allocator
itself only talks to the API server on the host's loopback.

Run as: python -m kproxy_ebpf.dev.lab.lballoc --kubeconfig FILE --pool CIDR
"""
from __future__ import annotations

import argparse
import ipaddress
import json
import logging
import random
import signal
import sys
import threading
from collections.abc import Iterable

log = logging.getLogger("kproxy.lballoc")

DEFAULT_POOL = "10.250.200.0/24"
DEFAULT_POOL6 = "fd00:250:200::/112"     # an IPv6 lab's (`lab up --ip-family ipv6`)

Key = tuple[str, str]   # (namespace, name)


def wants_address(svc: dict, family: str = "IPv4") -> bool:
    """Whether this allocator serves the Service: type LoadBalancer, no loadBalancerClass,
    the pool's family among its families."""
    spec = svc.get("spec") or {}
    families = spec.get("ipFamilies") or ["IPv4"]
    return (spec.get("type") == "LoadBalancer" and not spec.get("loadBalancerClass")
            and family in families)


def status_ips(svc: dict) -> list[str]:
    ingress = ((svc.get("status") or {}).get("loadBalancer") or {}).get("ingress") or []
    return [i["ip"] for i in ingress if isinstance(i, dict) and i.get("ip")]


def key_of(svc: dict) -> Key:
    meta = svc.get("metadata") or {}
    return meta.get("namespace", ""), meta.get("name", "")


class Pool:
    """Addresses of a CIDR (network and broadcast addresses left out below /31) and who holds
    them. Pure bookkeeping, no API calls."""

    def __init__(self, cidr: str):
        self.net = ipaddress.ip_network(cidr)
        self.family = "IPv6" if self.net.version == 6 else "IPv4"
        hosts = self.net.hosts() if self.net.prefixlen < 31 else iter(self.net)
        # Never the network address: in IPv6 the Subnet-Router anycast (RFC 4291 2.6.1),
        # which some Python versions' hosts() still lists.
        self.free = [str(ip) for ip in hosts
                     if self.net.version == 4 or ip != self.net.network_address]
        self._order = {ip: i for i, ip in enumerate(self.free)}
        self.owner: dict[str, Key] = {}     # ip -> Service
        self.held: dict[Key, str] = {}      # Service -> ip

    def __contains__(self, ip: str) -> bool:
        try:
            return ipaddress.ip_address(ip) in self.net and ip in self._order
        except ValueError:
            return False

    def claim(self, key: Key, ip: str) -> bool:
        """Gives `ip` to `key` if it is in the pool and free (or already key's)."""
        if ip not in self or self.owner.get(ip, key) != key:
            return False
        self.release(key)
        self.free.remove(ip)
        self.owner[ip], self.held[key] = key, ip
        return True

    def take(self, key: Key) -> str | None:
        """The lowest free address for `key` (its own if it holds one); None when exhausted."""
        if key in self.held:
            return self.held[key]
        if not self.free:
            return None
        ip = self.free[0]
        self.claim(key, ip)
        return ip

    def release(self, key: Key) -> str | None:
        ip = self.held.pop(key, None)
        if ip is not None:
            del self.owner[ip]
            self.free.append(ip)
            self.free.sort(key=self._order.__getitem__)
        return ip


class Decision:
    """What one Service's status must become: `ips` to write (None: leave it alone)."""

    def __init__(self, ips: list[str] | None, reason: str = ""):
        self.ips, self.reason = ips, reason


def decide(pool: Pool, svc: dict) -> Decision:
    """Updates the pool for one Service as the API shows it and says what its status needs."""
    key, current = key_of(svc), status_ips(svc)
    if not wants_address(svc, pool.family):
        released = pool.release(key)
        # Our address still in the status of a Service that is no LoadBalancer any more (also
        # one that changed while the allocator was down): clear it. A Service of another
        # loadBalancerClass is left to its own controller.
        not_lb = (svc.get("spec") or {}).get("type") != "LoadBalancer"
        if released is not None or (not_lb and any(ip in pool for ip in current)):
            return Decision([], "no longer a LoadBalancer of this allocator")
        return Decision(None)
    requested = (svc.get("spec") or {}).get("loadBalancerIP") or ""
    if requested:
        if pool.held.get(key) == requested or pool.claim(key, requested):
            ip = requested
        else:
            pool.release(key)
            why = ("is outside the pool " + str(pool.net)) if requested not in pool \
                else f"is held by {'/'.join(pool.owner[requested])}"
            return Decision([] if current else None,
                            f"spec.loadBalancerIP {requested} {why}; no address given")
    else:
        # An address already in the status (a restarted allocator) is kept if still free.
        mine = [ip for ip in current if ip in pool]
        if key not in pool.held and mine:
            pool.claim(key, mine[0])
        ip = pool.take(key)
        if ip is None:
            return Decision(None, f"pool {pool.net} is exhausted; no address given")
    return Decision(None if current == [ip] else [ip])


class Allocator:
    """list+watch Services on the official client and reconcile each one."""

    def __init__(self, api_client, pool: Pool):
        from kubernetes import client

        self.core = client.CoreV1Api(api_client)
        self.pool = pool
        self.stop = threading.Event()

    def _write(self, svc: dict, ips: list[str]) -> None:
        ns, name = key_of(svc)
        body = {"status": {"loadBalancer": {"ingress": [{"ip": ip} for ip in ips] or None}}}
        # A merge patch: the ingress list is replaced whole, null removes it.
        self.core.patch_namespaced_service_status(
            name, ns, body, _content_type="application/merge-patch+json")
        log.info("%s/%s: status.loadBalancer.ingress = %s", ns, name, ips or "[]")

    def reconcile(self, svc: dict) -> None:
        d = decide(self.pool, svc)
        if d.reason:
            log.warning("%s/%s: %s", *key_of(svc), d.reason)
        if d.ips is not None:
            try:
                self._write(svc, d.ips)
            except Exception as exc:   # noqa: BLE001 - a deleted Service, a conflict: log, go on
                log.warning("%s/%s: status not written: %s", *key_of(svc), exc)

    def _list(self) -> tuple[list[dict], str]:
        resp = self.core.list_service_for_all_namespaces(_preload_content=False)
        body = json.loads(resp.data)
        return body.get("items") or [], body["metadata"]["resourceVersion"]

    def resync(self) -> str:
        """Adopts every pool address already in a status first, then reconciles all, so a
        restart never moves an address."""
        items, rv = self._list()
        self.pool = Pool(str(self.pool.net))
        for svc in items:
            if (wants_address(svc, self.pool.family)
                    and not (svc.get("spec") or {}).get("loadBalancerIP")):
                for ip in status_ips(svc):
                    if self.pool.claim(key_of(svc), ip):
                        break
        for svc in sorted(items, key=lambda s: (s["metadata"].get("creationTimestamp", ""),
                                                key_of(s))):
            self.reconcile(svc)
        return rv

    def run(self) -> None:
        from kubernetes import watch
        from kubernetes.client.exceptions import ApiException

        backoff = 0.5
        rv = None
        while not self.stop.is_set():
            try:
                if rv is None:
                    rv = self.resync()
                    log.info("synced: %d addresses held of %s", len(self.pool.held), self.pool.net)
                w = watch.Watch()
                for ev in w.stream(self.core.list_service_for_all_namespaces,
                                   resource_version=rv, timeout_seconds=60,
                                   allow_watch_bookmarks=True):
                    if self.stop.is_set():
                        w.stop()
                        break
                    obj = ev["raw_object"]
                    rv = obj.get("metadata", {}).get("resourceVersion", rv)
                    if ev["type"] == "BOOKMARK":
                        continue
                    if ev["type"] == "ERROR":
                        rv = None          # 410 Gone and the like: list again
                        break
                    if ev["type"] == "DELETED":
                        self.pool.release(key_of(obj))
                    else:
                        self.reconcile(obj)
                backoff = 0.5
            except ApiException as exc:
                if exc.status == 410:
                    rv = None
                    continue
                log.warning("watch failed: %s; retrying in %.1fs", exc, backoff)
                self._pause(backoff)
                backoff = min(backoff * 2, 10.0)
            except Exception as exc:   # noqa: BLE001 - API server away: back off, resume
                log.warning("watch failed: %s; retrying in %.1fs", exc, backoff)
                self._pause(backoff)
                backoff = min(backoff * 2, 10.0)

    def _pause(self, seconds: float) -> None:
        self.stop.wait(seconds * (0.8 + 0.4 * random.random()))


def main(argv: Iterable[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description="the lab's LoadBalancer address allocator")
    ap.add_argument("--kubeconfig", required=True)
    ap.add_argument("--pool", default=DEFAULT_POOL)
    args = ap.parse_args(list(argv) if argv is not None else None)
    logging.basicConfig(level=logging.INFO,
                        format="%(asctime)s %(levelname).1s %(name)s: %(message)s")
    from kubernetes import config

    alloc = Allocator(config.new_client_from_config(args.kubeconfig), Pool(args.pool))
    signal.signal(signal.SIGTERM, lambda *_: alloc.stop.set())
    signal.signal(signal.SIGINT, lambda *_: alloc.stop.set())
    worker = threading.Thread(target=alloc.run, name="lballoc", daemon=True)
    worker.start()
    alloc.stop.wait()
    log.info("stopping")
    return 0


if __name__ == "__main__":
    sys.exit(main())
