"""Warning Events for API objects the proxy rejected, so `kubectl describe` shows why (and a
few Normal ones about the node: kube-proxy's leftovers removed, its healthz port free again).

A rejected Service port is otherwise visible only in one node's agent log. Posting a core/v1
Event against the object puts the reason where its owner looks. kube-proxy does the same for
the few errors it reports.

Three rules keep this from hurting the cluster or the agent:
- De-duplication: the same (object, reason, message) is one Event whose `count` grows, as
  client-go's event correlator does. Every node converts the same objects, so one agent
  must not add a new Event per resync; a count update is sent at most once per
  `repeat_interval`.
- Rate limiting: a token bucket (a burst, then a steady trickle) caps the calls one agent
  makes, however many objects are bad at once.
- Never in the way: posting happens on a background thread fed by a bounded queue; record()
  returns at once, a full queue drops the post, and a failed post is logged at debug level.
  Events are a courtesy, not part of the proxy's correctness.
"""
from __future__ import annotations

import datetime as _dt
import logging
import queue
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from .convert import Rejection

log = logging.getLogger("kproxy_ebpf.kube.events")

# Kinds we can point an Event at, with their apiVersion; other rejections (a manifest file
# that does not parse) have no API object and are only logged by the caller.
_API_VERSIONS = {"Service": "v1", "EndpointSlice": "discovery.k8s.io/v1", "Node": "v1",
                 "ServiceCIDR": "networking.k8s.io/v1"}
_CLUSTER_SCOPED = {"Node", "ServiceCIDR"}
_MAX_MESSAGE = 1024     # the API server's limit for Event.message

_Key = tuple[str, str, str, str, str]   # kind, namespace, name, reason, message


@dataclass
class _Entry:
    uid: str
    count: int = 0              # occurrences recorded
    posted_count: int = 0       # count carried by the Event on the server
    event_name: str = ""        # "" until created
    first_time: str = ""        # RFC 3339, first occurrence
    last_time: str = ""         # RFC 3339, last occurrence
    last_post: float = float("-inf")
    last_seen: float = 0.0
    pending: bool = False       # queued for the worker
    type: str = "Warning"       # or "Normal"


def _now_rfc3339() -> str:
    return _dt.datetime.now(_dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


class EventRecorder:
    """Posts de-duplicated, rate-limited Warning Events; api_client None records nothing.

    warn(...) / rejected(...) may be called from any thread. stop() ends the worker.
    Counters (plain ints): posted, updated, dropped, failed.
    """

    def __init__(
        self,
        api_client: Any,
        component: str = "kproxy-ebpf",
        host: str | None = None,
        *,
        repeat_interval: float = 60.0,
        burst: int = 25,
        per_second: float = 0.2,
        queue_size: int = 1000,
        forget_after: float = 3600.0,
        clock: Callable[[], float] = time.monotonic,   # injectable for tests
    ) -> None:
        self.component = component
        self.host = host
        self.repeat_interval = repeat_interval
        self.burst = burst
        self.per_second = per_second
        self.forget_after = forget_after
        self._clock = clock
        self.posted = self.updated = self.dropped = self.failed = 0

        self._entries: dict[_Key, _Entry] = {}
        self._lock = threading.Lock()
        self._queue: queue.Queue[_Key | None] = queue.Queue(maxsize=queue_size)
        self._tokens = float(burst)
        self._refilled = clock()
        self._stop = threading.Event()
        self._records = 0
        self._api = None
        self._thread: threading.Thread | None = None
        if api_client is not None:
            from kubernetes import client
            self._api = client.CoreV1Api(api_client)
            self._thread = threading.Thread(target=self._work, name="kproxy-events", daemon=True)
            self._thread.start()

    # -- recording (any thread) -----------------------------------------------------------------

    def rejected(self, rejections: Iterable[Rejection]) -> None:
        for r in rejections:
            self.warn(r.kind, r.namespace, r.name, r.reason, r.message, uid=r.uid)

    def normal(self, kind: str, namespace: str, name: str, reason: str, message: str) -> None:
        """An Event of type Normal: something the operator may want to see happened."""
        self.warn(kind, namespace, name, reason, message, event_type="Normal")

    def warn(self, kind: str, namespace: str, name: str, reason: str, message: str,
             uid: str = "", event_type: str = "Warning") -> None:
        if self._api is None or kind not in _API_VERSIONS or not name:
            return
        if kind in _CLUSTER_SCOPED:
            namespace = ""
        key: _Key = (kind, namespace, name, reason, message[:_MAX_MESSAGE])
        now = self._clock()
        with self._lock:
            entry = self._entries.get(key)
            if entry is None:
                entry = self._entries[key] = _Entry(uid=uid, first_time=_now_rfc3339(),
                                                    type=event_type)
            entry.count += 1
            entry.last_seen = now
            entry.last_time = _now_rfc3339()
            if uid and uid != entry.uid:
                # A new object under the same name: its Event must point at the new uid.
                entry.uid, entry.event_name, entry.posted_count = uid, "", 0
                entry.count, entry.first_time, entry.last_post = 1, entry.last_time, float("-inf")
            due = not entry.event_name or now - entry.last_post >= self.repeat_interval
            enqueue = due and not entry.pending
            if enqueue:
                entry.pending = True
            self._records += 1
            if self._records % 256 == 0:
                self._forget_locked(now)
        if enqueue:
            try:
                self._queue.put_nowait(key)
            except queue.Full:
                with self._lock:
                    entry.pending = False
                self.dropped += 1
                log.debug("event queue full; dropped a %s event for %s %s/%s", reason, kind,
                          namespace, name)

    def _forget_locked(self, now: float) -> None:
        stale = [k for k, e in self._entries.items()
                 if not e.pending and now - e.last_seen > self.forget_after]
        for k in stale:
            del self._entries[k]

    def stop(self, timeout: float | None = 5.0) -> None:
        self._stop.set()
        if self._thread is not None:
            try:
                self._queue.put_nowait(None)
            except queue.Full:
                pass
            self._thread.join(timeout)

    # -- posting (worker thread) ----------------------------------------------------------------

    def _take_token(self) -> bool:
        """Wait for a token of the bucket; False when stopping."""
        while not self._stop.is_set():
            now = self._clock()
            self._tokens = min(float(self.burst), self._tokens + (now - self._refilled) * self.per_second)
            self._refilled = now
            if self._tokens >= 1.0:
                self._tokens -= 1.0
                return True
            self._stop.wait((1.0 - self._tokens) / self.per_second)
        return False

    def _work(self) -> None:
        while not self._stop.is_set():
            key = self._queue.get()
            if key is None or not self._take_token():
                break
            with self._lock:
                entry = self._entries.get(key)
                if entry is None:
                    continue
                snapshot = _Entry(**vars(entry))
            try:
                name = self._post(key, snapshot)
            except Exception as exc:  # noqa: BLE001 - an Event is never worth failing for
                self.failed += 1
                name = None
                log.debug("could not post a %s event for %s %s/%s: %s", key[3], key[0], key[1],
                          key[2], exc)
            with self._lock:
                entry.pending = False
                if name is not None:
                    entry.event_name = name
                    entry.posted_count = snapshot.count
                    entry.last_post = self._clock()

    def _post(self, key: _Key, entry: _Entry) -> str:
        assert self._api is not None      # record() queues nothing without a client
        kind, namespace, name, reason, message = key
        event_ns = namespace or "default"    # Events of cluster-scoped objects live in "default"
        timeout = (5.0, 10.0)
        if entry.event_name:
            body = {"count": entry.count, "lastTimestamp": entry.last_time}
            try:
                resp = self._api.patch_namespaced_event(
                    entry.event_name, event_ns, body, _preload_content=False, _request_timeout=timeout)
                _drain(resp)
                self.updated += 1
                return entry.event_name
            except Exception as exc:
                if getattr(exc, "status", None) != 404:
                    raise
                # The Event expired (the API server keeps them for an hour): create a new one.
        event_name = f"{name}.{time.time_ns():x}"
        involved: dict[str, str] = {"kind": kind, "name": name, "apiVersion": _API_VERSIONS[kind]}
        if namespace:
            involved["namespace"] = namespace
        if entry.uid:
            involved["uid"] = entry.uid
        source = {"component": self.component}
        if self.host:
            source["host"] = self.host
        body = {
            "apiVersion": "v1",
            "kind": "Event",
            "metadata": {"name": event_name, "namespace": event_ns},
            "involvedObject": involved,
            "type": entry.type,
            "reason": reason,
            "message": message,
            "source": source,
            "count": entry.count,
            "firstTimestamp": entry.first_time,
            "lastTimestamp": entry.last_time,
            "reportingComponent": self.component,
            "reportingInstance": (self.host or self.component)[:128],
        }
        resp = self._api.create_namespaced_event(event_ns, body, _preload_content=False,
                                                 _request_timeout=timeout)
        _drain(resp)
        self.posted += 1
        return event_name


def _drain(resp: Any) -> None:
    """Read and release a raw response (we never need the created object back)."""
    try:
        _ = resp.data       # the property reads the whole body
    finally:
        resp.release_conn()
