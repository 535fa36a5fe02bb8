"""The reflector's loop: LIST, then WATCH from the list's resourceVersion, resume or relist,
until stop(); the in-flight request is tracked so that stop() can cut it (see __init__.py for
the protocol)."""
from __future__ import annotations

import functools
import logging
import random
import threading
import time
from collections.abc import Callable
from typing import Any

from urllib3.exceptions import ReadTimeoutError

from .event import WATCH_TYPES, Decode, Event, EventHandler, EventType
from .pager import list_pages
from .request import InFlight
from .retry import Retry
from .wire import ResourceExpired, WatchError, WatchStalled, describe, is_expired, json_object, lines

# The client's generated list method (or a partial of it), called with keyword arguments only.
ListFunc = Callable[..., Any]


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
        decode: Decode | None = None,
    ) -> None:
        """on_contact: called when the server answers again after a failed attempt (the
        ApiSource uses it to wake its other reflectors out of their backoff). decode: applied
        to every object delivered, listed ones as their page arrives (so a LIST's JSON is never
        held whole) and watched ones before on_event; without it, Events carry the JSON."""
        self.resource = resource
        self._decode = decode
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
        self._request = InFlight(self._stop)
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

    @property
    def _response(self) -> Any:
        """The in-flight response (None between requests): tests wait for a watch to open."""
        return self._request.response

    def _cut(self) -> None:
        self._request.cut()

    # -- main loop ------------------------------------------------------------------------------

    def run(self) -> None:
        """The loop: list, watch, resume, relist, until stop(). Runs on the caller's thread."""
        retry = Retry(self.backoff_initial, self.backoff_max)
        need_list = True
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
                    retry.worked()
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
                delay = retry.expired(self._streamed)
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
                delay = retry.failed(self._listed, self._streamed)
                what = "list" if need_list else f"watch from resourceVersion {self.resource_version}"
                self._log.warning("%s: %s failed: %s; retrying in %.1fs (failure %d)", self.resource,
                                  what, describe(exc), delay, self.restarts)
                self._sleep(delay)
        self._log.debug("%s: reflector stopped", self.resource)

    # -- LIST -----------------------------------------------------------------------------------

    def _list(self) -> None:
        listed = list_pages(lambda **kw: self._request_body(self._list_fn, **kw),
                            page_size=self.page_size, transform=self._listed_decode(),
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
        self._deliver(EventType.SYNC, items)
        self.synced.set()

    def _listed_decode(self) -> Callable[[dict], Any] | None:
        return functools.partial(self._decode, EventType.SYNC) if self._decode else None

    def _request_body(self, fn: ListFunc, **kwargs: Any) -> bytes:
        resp = self._request.call(fn, _request_timeout=(self.connect_timeout, self.list_read_timeout), **kwargs)
        complete = False
        try:
            data = resp.data
            complete = True
        finally:
            # A connection with an unread rest of a body must not go back to the pool.
            self._request.release(resp, reuse=complete)
        return data

    # -- WATCH ----------------------------------------------------------------------------------

    def _watch(self) -> None:
        """One watch request, until the server ends it or it fails."""
        timeout = int(self.watch_timeout * random.uniform(1.0, 1.0 + self.watch_jitter))
        timeout = max(timeout, 1)
        resp = self._request.call(
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
                for line in lines(resp):
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
            self._request.release(resp, reuse=clean)

    def _handle_line(self, line: bytes) -> None:
        event = json_object(line, "watch line")
        etype = event.get("type")
        obj = event.get("object")
        known = WATCH_TYPES.get(etype) if isinstance(etype, str) else None
        if known is not None:
            if not isinstance(obj, dict):
                raise WatchError(f"{etype} event without an object")
            self.events += 1
            self._deliver(known, obj)
            self._advance(obj)
        elif etype == "BOOKMARK":
            self.bookmarks += 1
            self._advance(obj)
        elif etype == "ERROR":
            status = obj if isinstance(obj, dict) else {}
            code = status.get("code")
            text = f"{code} {status.get('reason', '')}: {status.get('message', '')}"
            if is_expired(code, status):
                raise ResourceExpired(text)
            raise WatchError(f"error event in the watch stream: {text}")
        else:
            self._log.warning("%s: ignoring a watch event of unknown type %r", self.resource, etype)

    def _advance(self, obj: Any) -> None:
        meta = obj.get("metadata") if isinstance(obj, dict) else None
        rv = meta.get("resourceVersion") if isinstance(meta, dict) else None
        if isinstance(rv, str) and rv:
            self.resource_version = rv

    def _deliver(self, etype: EventType, payload: Any) -> None:
        """SYNC's payload is the decoded list; a watch event's, its JSON object, decoded here
        (inside the try: a decode that fails counts as the handler's failure, as it always did)."""
        try:
            if etype is not EventType.SYNC and self._decode is not None:
                payload = self._decode(etype, payload)
            self._on_event(Event(etype, payload if etype is EventType.SYNC else [payload]))
        except Exception:  # noqa: BLE001 - a handler bug is counted and logged; the watch goes on
            self.handler_errors += 1
            self._log.exception("%s: the event handler failed on a %s event", self.resource, etype)
