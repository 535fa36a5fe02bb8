"""List+watch of one resource, fed to a callback: the agent's view of the API server.

Why our own reflector instead of `kubernetes.watch.Watch`: the proxy must see the raw stream.
`Watch` deserializes every object into the client's models (slow, and lossy for fields the
client does not know), swallows BOOKMARK events, and turns a 410 into an exception that looks
like any other. Here every request runs with `_preload_content=False` and we parse the JSON
lines ourselves, so the consumer gets plain dicts (see convert.py) and we can act on each
event type exactly.

The protocol, as client-go's reflector does it:

1. LIST, paginated (limit/continue), then `on_event("SYNC", objects)`: the complete set as of
   the list's resourceVersion. The consumer *replaces* what it knew, so objects deleted while
   we were not watching disappear, and a relist never duplicates anything. With a `transform`
   (client-go's informer transform), each listed object is converted as its page arrives and
   the SYNC carries the results: a LIST of 10,000 EndpointSlices never holds all their JSON at
   once (that peak alone cost ~115 MiB of resident memory, which Python keeps afterwards).
2. WATCH from that resourceVersion with bookmarks and a server-side timeout (5 min plus
   jitter, so that many agents do not reconnect in step). ADDED/MODIFIED/DELETED go to
   `on_event(type, obj)`; BOOKMARK only advances the stored resourceVersion, which keeps the
   next resume cheap for the server.
3. When the watch ends (timeout, dropped connection, error), watch again from the last
   resourceVersion; errors wait for an exponential backoff with jitter first.
4. When the server says that resourceVersion is gone (410 Gone / Expired, as an HTTP error or
   as an ERROR event in the stream), history is lost: go back to 1.

While the API server is away nothing is reported as deleted: the consumer keeps programming
what it last knew, and only a successful relist replaces the set. That is the behaviour a
proxy needs: an API server restart must not drop traffic.

The callback runs on the reflector's thread; it must be quick (queue work for the sync loop)
and thread-safe with respect to its readers. An exception in it is logged and counted, never
allowed to kill the watch.
"""
from __future__ import annotations

import json
import logging
import random
import re
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

from urllib3.exceptions import ReadTimeoutError

SYNC = "SYNC"
WATCH_TYPES = ("ADDED", "MODIFIED", "DELETED")

EventHandler = Callable[[str, Any], None]
# The client's generated list method (or a partial of it), called with keyword arguments only.
ListFunc = Callable[..., Any]
# One LIST request: keyword arguments (limit, _continue) -> the raw JSON body.
PageFunc = Callable[..., bytes]

RESOURCES = ("services", "endpointslices", "node")

log = logging.getLogger("kproxy_ebpf.kube.reflector")


class ResourceExpired(Exception):
    """The server no longer has history from our resourceVersion (410): relist."""


class WatchError(Exception):
    """The watch stream failed in a way that a resumed watch may fix."""


class WatchStalled(WatchError):
    """Neither an event nor a bookmark for progress_timeout: the connection is taken as dead
    (dropped by something on the path without a FIN or RST) and a new watch resumes."""


class Reflector:
    """Keeps `on_event` in step with one resource on the API server, from a daemon thread.

    list_fn / watch_fn: the client's list method for the resource (the same method serves both
    with watch=True), already bound to any selectors. They are called with keyword arguments
    (limit, _continue, watch, resource_version, allow_watch_bookmarks, timeout_seconds,
    _preload_content=False, _request_timeout) and must return a urllib3 response.

    Public state, read from other threads (plain attributes, updated by the reflector thread):
      synced           threading.Event, set once the first complete LIST was delivered
      resource_version the last resourceVersion seen (list, event or bookmark)
      last_error       the last exception that cost a reconnect or relist, None before any
      lists            successful complete LISTs (the first one included)
      relists          LISTs forced by an expired resourceVersion (410)
      restarts         watch/list attempts that failed and were retried after a backoff
      bookmarks, events, handler_errors   counters of what the stream delivered
    """

    def __init__(
        self,
        resource: str,
        list_fn: ListFunc,
        watch_fn: ListFunc | None,
        on_event: EventHandler,
        *,
        page_size: int = 500,
        watch_timeout: float = 300.0,
        progress_timeout: float = 150.0,
        watch_jitter: float = 0.25,
        backoff_initial: float = 0.5,
        backoff_max: float = 30.0,
        connect_timeout: float = 10.0,
        list_read_timeout: float = 60.0,
        on_contact: Callable[[], None] | None = None,
        transform: Callable[[dict], Any] | None = None,
    ) -> None:
        """on_contact: called when the server answers again after a failed attempt (the
        ApiSource uses it to wake its other reflectors out of their backoff). transform:
        applied to each listed object as its page arrives; the SYNC carries its results
        (watch events still carry the JSON object)."""
        self.resource = resource
        self._transform = transform
        self._on_contact = on_contact
        self._failing = False
        self._list_fn = list_fn
        self._watch_fn = watch_fn or list_fn
        self._on_event = on_event
        self.page_size = page_size
        self.watch_timeout = watch_timeout
        # The API server sends a bookmark about every minute to a watch that asks for them
        # (defaultBookmarkFrequency, k8s.io/apiserver/pkg/storage/cacher/cacher.go): 2.5
        # periods without a line is a stream that stopped delivering.
        self.progress_timeout = progress_timeout
        self.watch_jitter = watch_jitter
        self.backoff_initial = backoff_initial
        self.backoff_max = backoff_max
        self.connect_timeout = connect_timeout
        self.list_read_timeout = list_read_timeout

        self.synced = threading.Event()
        self.resource_version = ""
        self.last_error: BaseException | None = None
        self.lists = 0
        self.relists = 0
        self.restarts = 0
        self.stalls = 0
        self.bookmarks = 0
        self.events = 0
        self.handler_errors = 0

        self._log = logging.getLogger(f"kproxy_ebpf.kube.reflector.{resource}")
        self._stop = threading.Event()
        # Backoff waits on this event: stop() and wake() cut a wait short.
        self._pause = threading.Event()
        self._lock = threading.Lock()
        self._response: Any = None      # the in-flight urllib3 response, to cut it on stop()
        self._thread: threading.Thread | None = None
        self._listed = False        # this round of the loop completed a LIST
        self._streamed = False      # this round's watch delivered at least one event

    # -- lifecycle ------------------------------------------------------------------------------

    def start(self) -> Reflector:
        if self._thread is not None:
            raise RuntimeError(f"reflector for {self.resource} already started")
        self._thread = threading.Thread(target=self.run, name=f"kproxy-reflector-{self.resource}",
                                        daemon=True)
        self._thread.start()
        return self

    def stop(self, timeout: float | None = 5.0) -> None:
        """Stop the loop, cutting the in-flight request, and wait up to `timeout` for the thread."""
        self._stop.set()
        self._pause.set()
        self._cut()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout)

    def wake(self) -> None:
        """Ends a backoff wait now: another reflector of the same API server just got through,
        so the server is back and this one need not sleep out a backoff grown during the
        outage (up to backoff_max). Harmless when not waiting."""
        self._pause.set()

    def _contact(self) -> None:
        if self._failing:
            self._failing = False
            if self._on_contact is not None:
                self._on_contact()

    def _sleep(self, delay: float) -> None:
        self._pause.wait(delay)
        self._pause.clear()

    @property
    def alive(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def _cut(self) -> None:
        """Shut down the in-flight connection so that a blocked read returns now.

        shutdown() rather than close(): closing a socket does not wake a thread blocked in
        recv() on it, shutting it down does.
        """
        with self._lock:
            resp = self._response
        if resp is None:
            return
        try:
            shutdown = getattr(resp, "shutdown", None)
            if shutdown is not None:
                shutdown()
            else:
                resp.close()
        except Exception:  # noqa: BLE001 - the connection may already be gone; nothing to do then
            pass

    # -- main loop ------------------------------------------------------------------------------

    def run(self) -> None:
        """The loop: list, watch, resume, relist, until stop(). Runs on the caller's thread."""
        backoff = self.backoff_initial
        need_list = True
        expired_in_a_row = 0
        while not self._stop.is_set():
            self._listed = self._streamed = False
            try:
                if need_list:
                    self._list()
                    need_list = False
                    if self._stop.is_set():
                        break
                started = time.monotonic()
                self._watch()
                if self._streamed or time.monotonic() - started >= 1.0:
                    backoff = self.backoff_initial
                    expired_in_a_row = 0
                    continue
                # A stream that ends at once with nothing in it would make us spin.
                raise WatchError("the watch ended immediately without any event")
            except ResourceExpired as exc:
                if self._stop.is_set():
                    break
                self.last_error = exc
                self.relists += 1
                self._failing = True
                need_list = True
                if self._streamed:
                    backoff, expired_in_a_row = self.backoff_initial, 0
                expired_in_a_row += 1
                # The first expiry relists at once. Repeated ones without a working watch in
                # between (a server that expires what it just listed) back off like errors.
                delay = 0.0
                if expired_in_a_row > 1:
                    delay = self._jitter(backoff)
                    backoff = min(backoff * 2, self.backoff_max)
                self._log.info("%s: resourceVersion %s expired (%s); relisting%s", self.resource,
                               self.resource_version or "-", exc,
                               f" in {delay:.1f}s" if delay else "")
                if delay:
                    self._sleep(delay)
            except Exception as exc:  # noqa: BLE001 - every other failure means "retry later"
                if self._stop.is_set():
                    break
                self.last_error = exc
                self.restarts += 1
                self._failing = True
                if self._listed or self._streamed:
                    backoff = self.backoff_initial    # it worked for a while: start over
                if self._streamed:
                    # A working watch broke: a 410 when it resumes is a first expiry again.
                    expired_in_a_row = 0
                delay = self._jitter(backoff)
                backoff = min(backoff * 2, self.backoff_max)
                what = "list" if need_list else f"watch from resourceVersion {self.resource_version}"
                self._log.warning("%s: %s failed: %s; retrying in %.1fs (failure %d)", self.resource,
                                  what, _describe(exc), delay, self.restarts)
                self._sleep(delay)
        self._log.debug("%s: reflector stopped", self.resource)

    def _jitter(self, delay: float) -> float:
        return min(self.backoff_max, delay * random.uniform(0.8, 1.2))

    # -- LIST -----------------------------------------------------------------------------------

    def _list(self) -> None:
        listed = list_pages(lambda **kw: self._request_body(self._list_fn, **kw),
                            page_size=self.page_size, transform=self._transform,
                            stopped=self._stop.is_set)
        if listed is None:
            return
        items, rv, pages = listed
        self.resource_version = rv
        self.lists += 1
        self._log.info("%s: listed %d objects at resourceVersion %s (%d page%s)", self.resource,
                       len(items), rv, pages, "" if pages == 1 else "s")
        self._listed = True
        self._contact()
        self._deliver(SYNC, items)
        self.synced.set()

    def _request_body(self, fn: ListFunc, **kwargs: Any) -> bytes:
        resp = self._call(fn, _request_timeout=(self.connect_timeout, self.list_read_timeout), **kwargs)
        complete = False
        try:
            data = resp.data
            complete = True
        finally:
            # A connection with an unread rest of a body must not go back to the pool.
            self._release(resp, reuse=complete)
        return data

    def _call(self, fn: ListFunc, **kwargs: Any) -> Any:
        """Call the client, mapping HTTP 410 to ResourceExpired, and track the response."""
        try:
            resp = fn(_preload_content=False, **kwargs)
        except Exception as exc:
            if _is_expired(getattr(exc, "status", None), getattr(exc, "body", None)):
                reason = getattr(exc, "reason", "") or ""
                raise ResourceExpired(f"HTTP {exc.status} {reason}".strip()) from exc  # type: ignore[attr-defined]
            raise
        with self._lock:
            self._response = resp
        if self._stop.is_set():     # stop() ran between the call and the line above
            self._cut()
        return resp

    def _release(self, resp: Any, reuse: bool = True) -> None:
        with self._lock:
            if self._response is resp:
                self._response = None
        try:
            if reuse:
                resp.release_conn()
            else:
                resp.close()
        except Exception:  # noqa: BLE001 - as in _abort(): a connection already gone needs nothing
            pass

    # -- WATCH ----------------------------------------------------------------------------------

    def _watch(self) -> None:
        """One watch request, until the server ends it or it fails."""
        timeout = int(self.watch_timeout * random.uniform(1.0, 1.0 + self.watch_jitter))
        timeout = max(timeout, 1)
        resp = self._call(
            self._watch_fn,
            watch=True,
            resource_version=self.resource_version,
            allow_watch_bookmarks=True,
            timeout_seconds=timeout,
            # The server ends the stream after `timeout` and sends bookmarks meanwhile; a read
            # that waits longer than the progress timeout is a stream that stopped delivering.
            _request_timeout=(self.connect_timeout, min(timeout + 30, self.progress_timeout)),
        )
        self._log.debug("%s: watching from resourceVersion %s (timeout %ds)", self.resource,
                        self.resource_version, timeout)
        clean = False
        try:
            try:
                for line in _lines(resp):
                    if self._stop.is_set():
                        return
                    self._handle_line(line)
                    self._streamed = True
                    self._contact()
            except ReadTimeoutError as exc:
                if self._stop.is_set():
                    return
                self.stalls += 1
                raise WatchStalled(f"no event or bookmark for {self.progress_timeout:.0f}s: "
                                   "the stream stopped delivering") from exc
            clean = True
            self._log.debug("%s: watch ended by the server at resourceVersion %s", self.resource,
                            self.resource_version)
        finally:
            self._release(resp, reuse=clean)

    def _handle_line(self, line: bytes) -> None:
        event = _json_object(line, "watch line")
        etype = event.get("type")
        obj = event.get("object")
        if etype in WATCH_TYPES:
            if not isinstance(obj, dict):
                raise WatchError(f"{etype} event without an object")
            self.events += 1
            self._deliver(etype, obj)
            self._advance(obj)
        elif etype == "BOOKMARK":
            self.bookmarks += 1
            self._advance(obj)
        elif etype == "ERROR":
            status = obj if isinstance(obj, dict) else {}
            code = status.get("code")
            text = f"{code} {status.get('reason', '')}: {status.get('message', '')}"
            if _is_expired(code, status):
                raise ResourceExpired(text)
            raise WatchError(f"error event in the watch stream: {text}")
        else:
            self._log.warning("%s: ignoring a watch event of unknown type %r", self.resource, etype)

    def _advance(self, obj: Any) -> None:
        meta = obj.get("metadata") if isinstance(obj, dict) else None
        rv = meta.get("resourceVersion") if isinstance(meta, dict) else None
        if isinstance(rv, str) and rv:
            self.resource_version = rv

    def _deliver(self, etype: str, payload: Any) -> None:
        try:
            self._on_event(etype, payload)
        except Exception:  # noqa: BLE001 - a handler bug is counted and logged; the watch goes on
            self.handler_errors += 1
            self._log.exception("%s: the event handler failed on a %s event", self.resource, etype)


def list_pages(fetch: PageFunc, *, page_size: int = 500,
               transform: Callable[[dict], Any] | None = None,
               stopped: Callable[[], bool] = lambda: False) -> tuple[list, str, int] | None:
    """A complete LIST in pages of `page_size` (limit/continue), as client-go's pager does.

    fetch(limit=, _continue=) returns one page's raw JSON body. Returns (items,
    resourceVersion, pages), each item passed through `transform` while its page is at hand,
    or None when `stopped()` turned true between two pages. Raises WatchError on a malformed
    response; fetch's own errors (a 410 for an expired continue token) pass.

    The next page is requested as soon as this one has arrived, on a thread of its own, while
    this one is decoded and transformed: its continue token is read from the head of the raw
    body (the API server writes the list's metadata before its items), so the server encodes
    page k+1 on the other core while we decode page k instead of both waiting in turn. The
    token is checked against the decoded one; should they differ (another server's layout),
    the early request is dropped and the page fetched again in order.
    """
    items: list[Any] = []
    pages = 0
    rv = ""
    ahead: _Ahead | None = _Ahead(fetch, {"limit": page_size})
    while True:
        assert ahead is not None
        raw = ahead.result()
        pages += 1
        peeked = _peek_continue(raw)
        ahead = _Ahead(fetch, {"limit": page_size, "_continue": peeked}) if peeked else None
        try:
            body = _json_object(raw, "list response")
            del raw
            meta = body.get("metadata") if isinstance(body.get("metadata"), dict) else {}
            page = body.get("items")
            if page is not None and not isinstance(page, list):
                raise WatchError(f"list response items is a {type(page).__name__}, not a list")
            items.extend(map(transform, page or ()) if transform else page or ())
            del body, page
            rv = str(meta.get("resourceVersion") or rv)
            cont = meta.get("continue") or None
        except BaseException:
            if ahead is not None:
                ahead.discard()
            raise
        if ahead is not None and cont != peeked:
            ahead.discard()
            ahead = None
        if not cont:
            break
        if stopped():
            if ahead is not None:
                ahead.discard()
            return None
        if ahead is None:
            ahead = _Ahead(fetch, {"limit": page_size, "_continue": cont})
    if not rv:
        raise WatchError("list response carries no resourceVersion")
    return items, rv, pages


class _Ahead:
    """One page request running on its own thread while the caller decodes the page before
    it (the socket reads release the GIL)."""

    def __init__(self, fetch: PageFunc, kwargs: dict[str, Any]) -> None:
        self._value: bytes | None = None
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, args=(fetch, kwargs),
                                        name=f"{threading.current_thread().name}-page",
                                        daemon=True)
        self._thread.start()

    def _run(self, fetch: PageFunc, kwargs: dict[str, Any]) -> None:
        try:
            self._value = fetch(**kwargs)
        except BaseException as exc:  # noqa: BLE001 - re-raised on the caller's thread by result()
            self._error = exc

    def result(self) -> bytes:
        self._thread.join()
        if self._error is not None:
            raise self._error
        assert self._value is not None
        return self._value

    def discard(self) -> None:
        """Wait for the request and forget it, whatever it gave: at most one is in flight."""
        self._thread.join()


# The list's metadata.continue, ahead of its items, as the API server writes it. A token is
# base64 (no quotes, no escapes); anything else reads as "no token" and is fetched in order.
_CONTINUE = re.compile(rb'"continue"\s*:\s*"([A-Za-z0-9+/=_-]+)"')
_PEEK_BYTES = 4096


def _peek_continue(raw: bytes) -> str | None:
    """The continue token from the head of a raw list body, if it stands before the items."""
    items = raw.find(b'"items"', 0, _PEEK_BYTES)
    m = _CONTINUE.search(raw, 0, items) if items > 0 else None
    return m.group(1).decode() if m else None


def _json_object(data: bytes, what: str) -> dict:
    try:
        value = json.loads(data)
    except ValueError as exc:
        raise WatchError(f"{what} is not JSON: {exc}") from exc
    if not isinstance(value, dict):
        raise WatchError(f"{what} is not a JSON object")
    return value


def _lines(resp: Any) -> Iterator[bytes]:
    """Split a chunked watch response into its newline-terminated JSON events."""
    buf = bytearray()
    for chunk in resp.stream(amt=65536, decode_content=True):
        buf += chunk
        start = 0
        while True:
            end = buf.find(b"\n", start)
            if end < 0:
                break
            if end > start:
                yield bytes(buf[start:end])
            start = end + 1
        del buf[:start]
    if buf.strip():
        yield bytes(buf)


def _is_expired(code: Any, body: Any) -> bool:
    """410 Gone/Expired; or 504 ResourceVersionTooLarge, a resourceVersion this API server has
    not reached yet (a lagging server behind a load balancer): client-go relists on both."""
    if code == 410:
        return True
    if code != 504:
        return False
    if isinstance(body, bytes):
        body = body.decode("utf-8", "replace")
    elif isinstance(body, dict):
        body = json.dumps(body)
    return isinstance(body, str) and "ResourceVersionTooLarge" in body


def _describe(exc: BaseException) -> str:
    status = getattr(exc, "status", None)
    if status is not None and hasattr(exc, "reason"):
        return f"HTTP {status} {getattr(exc, 'reason', '')}".strip()
    text = " ".join(str(exc).split())
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


def reflector_for(
    api_client: Any,
    resource: str,
    on_event: EventHandler,
    *,
    node_name: str | None = None,
    label_selector: str | None = None,
    **options: Any,
) -> Reflector:
    """A Reflector for one of RESOURCES, bound to the official client's list methods.

    services: core/v1 Services in all namespaces; endpointslices: discovery.k8s.io/v1
    EndpointSlices in all namespaces; node: the single Node `node_name` (field selector
    metadata.name). label_selector narrows services/endpointslices server-side (kube-proxy
    uses "!service.kubernetes.io/service-proxy-name,!service.kubernetes.io/headless"; an
    object that stops matching arrives as DELETED). Other options go to Reflector.
    """
    bound = list_function(api_client, resource, node_name=node_name, label_selector=label_selector)
    return Reflector(resource, bound, bound, on_event, **options)


def list_function(api_client: Any, resource: str, *, node_name: str | None = None,
                  label_selector: str | None = None) -> ListFunc:
    """The client's list method for one of RESOURCES, bound to its selectors (see
    reflector_for); serves LIST and, with watch=True, WATCH."""
    import functools

    from kubernetes import client

    selectors: dict[str, str] = {}
    if label_selector:
        selectors["label_selector"] = label_selector
    if resource == "services":
        fn = client.CoreV1Api(api_client).list_service_for_all_namespaces
    elif resource == "endpointslices":
        fn = client.DiscoveryV1Api(api_client).list_endpoint_slice_for_all_namespaces
    elif resource == "servicecidrs":
        fn = client.NetworkingV1Api(api_client).list_service_cidr
    elif resource == "node":
        if not node_name:
            raise ValueError("the node reflector needs node_name")
        fn = client.CoreV1Api(api_client).list_node
        selectors["field_selector"] = f"metadata.name={node_name}"
    else:
        raise ValueError(f"unknown resource {resource!r}; expected one of {', '.join(RESOURCES)}")
    return functools.partial(fn, **selectors) if selectors else fn


def list_once(api_client: Any, resource: str, *, node_name: str | None = None,
              label_selector: str | None = None, transform: Callable[[dict], Any] | None = None,
              page_size: int = 500, timeout: tuple[float, float] = (10.0, 60.0)) -> list:
    """One complete, paginated LIST of a resource (the reflector's LIST without the watch):
    for one-shot readers such as `kproxy-ebpf check`."""
    fn = list_function(api_client, resource, node_name=node_name, label_selector=label_selector)

    def fetch(**kwargs: Any) -> bytes:
        resp = fn(_preload_content=False, _request_timeout=timeout, **kwargs)
        try:
            return resp.data
        finally:
            resp.release_conn()

    listed = list_pages(fetch, page_size=page_size, transform=transform)
    assert listed is not None       # never stopped
    return listed[0]
