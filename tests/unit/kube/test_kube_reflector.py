"""The list+watch Reflector, driven by a scripted fake API server (no network, no sleeping).

Each test gives a script: the responses (or exceptions) that successive LIST and WATCH calls
get, in order. When a script runs out, the fake holds the next request open like an idle watch;
in the synchronous tests (`drive`, which runs `Reflector.run()` on the test thread) it first
calls stop(), so the script's end is the end of the run. Backoff waits go through the
reflector's pause event; `drive` swaps in one that records the delay and returns at once, so the
backoff sequence is asserted exactly and nothing sleeps. The threaded tests wait (bounded) on
events the fakes set where the reflector's thread blocks (FakeResponse.blocked, WatchedPause),
and a fixture stops every reflector and checks that no thread is left behind.

The fakes model what the reflector uses of a urllib3 response with _preload_content=False:
`.data` (a LIST body), `.stream(amt, decode_content)` (a WATCH body), `.release_conn()`,
`.close()`, `.shutdown()`. Like the real client, HTTP errors are raised by the call itself as
kubernetes ApiException, transport errors as urllib3 exceptions.
"""
from __future__ import annotations

import json
import logging
import threading
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from kubernetes.client.exceptions import ApiException
from urllib3.exceptions import MaxRetryError, ProtocolError, ReadTimeoutError

from kproxy_ebpf.kube import reflector as reflector_mod
from kproxy_ebpf.kube.reflector import Event, EventType, Reflector, ResourceExpired, WatchError, WatchStalled

from ...builders import api_list
from ...support import wait_until

pytestmark = pytest.mark.timeout(10)

BACKOFF_INITIAL = 0.001
BACKOFF_MAX = 0.004
FAST = {"backoff_initial": BACKOFF_INITIAL, "backoff_max": BACKOFF_MAX, "page_size": 2}
HOLD_LIMIT = 5.0     # a held request that nobody cuts fails the test instead of hanging it


# -- fake API server ------------------------------------------------------------------------------

class FakeResponse:
    """A urllib3 response, as far as the reflector reads it."""

    def __init__(self, *, body: bytes = b"", chunks: tuple[bytes, ...] = (),
                 error: BaseException | None = None, hold: bool = False) -> None:
        self.status = 200
        self._body = body
        self._chunks = chunks
        self._error = error     # raised after the chunks (or by .data): a connection that broke
        self._hold = hold       # block after the chunks until the connection is cut
        self.cut = threading.Event()
        self.blocked = threading.Event()   # a reader waits in it for the cut
        self.released = False   # went back to the pool (release_conn)
        self.closed = False     # was discarded (close)

    @property
    def data(self) -> bytes:
        if self._hold:
            self._wait_for_cut()
        if self._error is not None:
            raise self._error
        return self._body

    def stream(self, amt: int = 2 ** 16, decode_content: bool | None = None) -> Iterator[bytes]:
        for chunk in self._chunks:
            if self.cut.is_set():
                raise ProtocolError("Connection broken: connection was shut down")
            yield chunk
        if self._error is not None:
            raise self._error
        if self._hold:
            self._wait_for_cut()

    def _wait_for_cut(self) -> None:
        self.blocked.set()
        if not self.cut.wait(HOLD_LIMIT):
            raise AssertionError("a held request was never cut")
        # A socket shut down under a blocked read surfaces as a broken connection.
        raise ProtocolError("Connection broken: connection was shut down")

    def release_conn(self) -> None:
        self.released = True

    def close(self) -> None:
        self.closed = True
        self.cut.set()

    def shutdown(self) -> None:
        self.cut.set()


class NoShutdownResponse(FakeResponse):
    """An older urllib3 response without shutdown(): stop() must fall back to close()."""

    shutdown = None   # type: ignore[assignment]


Step = FakeResponse | BaseException


class FakeAPI:
    """Scripted LIST and WATCH endpoints that record every call's keyword arguments."""

    def __init__(self, lists: list[Step], watches: list[Step] | None = None) -> None:
        self.lists = list(lists)
        self.watches = list(watches or [])
        self.list_calls: list[dict[str, Any]] = []
        self.watch_calls: list[dict[str, Any]] = []
        self.handed_out: list[FakeResponse] = []
        self.reflector: Reflector | None = None   # set by drive(): stop it when the script ends

    def list_fn(self, **kwargs: Any) -> FakeResponse:
        self.list_calls.append(kwargs)
        return self._next(self.lists)

    def watch_fn(self, **kwargs: Any) -> FakeResponse:
        self.watch_calls.append(kwargs)
        return self._next(self.watches)

    def _next(self, script: list[Step]) -> FakeResponse:
        if not script:
            if self.reflector is not None:
                self.reflector.stop()
            resp = FakeResponse(hold=True)
        else:
            step = script.pop(0)
            if isinstance(step, BaseException):
                raise step
            resp = step
        self.handed_out.append(resp)
        return resp

    @property
    def watch_rvs(self) -> list[str]:
        return [c["resource_version"] for c in self.watch_calls]


class RecordingStop(threading.Event):
    """The reflector's backoff event, with wait() recording the delay instead of sleeping."""

    def __init__(self) -> None:
        super().__init__()
        self.waits: list[float] = []

    def wait(self, timeout: float | None = None) -> bool:
        assert timeout is not None
        self.waits.append(timeout)
        return self.is_set()


class WatchedPause(threading.Event):
    """The reflector's backoff event, waiting for real, and telling the test when a wait began
    and whether each ended by the event (True) or by its timeout (False)."""

    def __init__(self) -> None:
        super().__init__()
        self.entered = threading.Event()
        self.woken: list[bool] = []

    def wait(self, timeout: float | None = None) -> bool:
        self.entered.set()
        woken = super().wait(timeout)
        self.woken.append(woken)
        return woken


def obj(name: str, rv: str, **extra: Any) -> dict[str, Any]:
    return {"metadata": {"name": name, "namespace": "ns1", "resourceVersion": rv}, **extra}


def ev(etype: str, o: Any) -> bytes:
    return json.dumps({"type": etype, "object": o}).encode() + b"\n"


def status(code: int, reason: str, message: str = "", **extra: Any) -> dict[str, Any]:
    return {"kind": "Status", "apiVersion": "v1", "status": "Failure", "code": code,
            "reason": reason, "message": message, **extra}


def page(items: list[dict], rv: str = "", cont: str = "") -> FakeResponse:
    return FakeResponse(body=json.dumps(api_list(items, rv, cont, kind="ServiceList")).encode())


def watch(*lines: bytes, error: BaseException | None = None, hold: bool = False) -> FakeResponse:
    """A watch response with one chunk per line; then the server ends it (or `error`)."""
    return FakeResponse(chunks=lines, error=error, hold=hold)


def api_error(code: int, reason: str, body: Any = None) -> ApiException:
    exc = ApiException(status=code, reason=reason)
    if body is not None:
        exc.body = json.dumps(body).encode()
    return exc


def conn_refused() -> MaxRetryError:
    return MaxRetryError(None, "/api/v1/services",
                         reason=ConnectionRefusedError(111, "Connection refused"))


SYNC = EventType.SYNC
Seen = list[Event]


def drive(api: FakeAPI, on_event: Callable[[Event], None] | None = None,
          **options: Any) -> tuple[Reflector, Seen]:
    """Run a reflector over the script on this thread, until the script is used up."""
    seen: Seen = []
    refl = Reflector("services", api.list_fn, api.watch_fn,
                     on_event or seen.append, **{**FAST, **options})
    refl._pause = RecordingStop()   # see the module docstring: backoff without sleeping
    api.reflector = refl
    refl.run()
    return refl, seen


def waits(refl: Reflector) -> list[float]:
    return refl._pause.waits  # type: ignore[attr-defined]


def names(payload: list[dict]) -> list[str]:
    return [o["metadata"]["name"] for o in payload]


def summary(seen: Seen) -> list[tuple[str, Any]]:
    """Events as (type, name) and (SYNC, [names]) for compact assertions."""
    return [(t, names(p)) if t == SYNC else (t, p[0]["metadata"]["name"]) for t, p in seen]


def assert_backoff(actual: list[float], expected: list[float]) -> None:
    """Each wait is the expected delay with +-20% jitter, never above backoff_max."""
    assert len(actual) == len(expected), (actual, expected)
    for got, want in zip(actual, expected, strict=True):
        assert want * 0.8 - 1e-9 <= got <= min(want * 1.2, BACKOFF_MAX) + 1e-9, (actual, expected)


@pytest.fixture(autouse=True)
def no_leaked_threads():
    before = set(threading.enumerate())
    yield
    leaked = [t for t in threading.enumerate()
              if t not in before and t.name.startswith("kproxy-reflector-") and t.is_alive()]
    assert not leaked, f"reflector threads left running: {leaked}"


@pytest.fixture
def started():
    """Start reflectors in the background; stop (and check) every one at teardown."""
    running: list[Reflector] = []

    def start(refl: Reflector) -> Reflector:
        running.append(refl)
        return refl.start()

    yield start
    for refl in running:
        refl.stop(timeout=2.0)
    assert not [r for r in running if r.alive]


# -- LIST -------------------------------------------------------------------------------------------

def test_paginated_list_delivers_exactly_one_sync_with_all_items():
    api = FakeAPI(lists=[
        page([obj("a", "5"), obj("b", "7")], rv="100", cont="tok-1"),
        page([obj("c", "9"), obj("d", "3")], rv="100", cont="tok-2"),
        page([obj("e", "8")], rv="100"),
    ])
    refl, seen = drive(api)

    assert summary(seen) == [(SYNC, ["a", "b", "c", "d", "e"])]
    assert [(c["limit"], c.get("_continue")) for c in api.list_calls] == [
        (2, None), (2, "tok-1"), (2, "tok-2")]
    for call in api.list_calls:
        # A LIST is a consistent read (no resourceVersion) and returns the raw response.
        assert call["_preload_content"] is False and "resource_version" not in call
        assert call["_request_timeout"] == (refl.connect_timeout, refl.list_read_timeout)
    assert all(r.released and not r.closed for r in api.handed_out[:3])
    assert refl.synced.is_set() and refl.lists == 1 and refl.resource_version == "100"
    assert (refl.relists, refl.restarts, refl.events, refl.handler_errors) == (0, 0, 0, 0)
    # The watch starts where the list ended, with bookmarks and a jittered server-side timeout.
    (first_watch,) = api.watch_calls
    assert first_watch["watch"] is True and first_watch["resource_version"] == "100"
    assert first_watch["allow_watch_bookmarks"] is True and first_watch["_preload_content"] is False
    assert 300 <= first_watch["timeout_seconds"] <= 375
    # A read waits at most the progress timeout (2.5 bookmark periods), never past the end.
    assert first_watch["_request_timeout"] == (refl.connect_timeout, refl.progress_timeout)


def test_decode_converts_each_page_as_it_arrives_and_each_watched_object():
    """With a decode, every Event carries its results: the SYNC's objects are decoded as their
    page arrives (the LIST of 10k slices is never held as JSON), each watched object before
    on_event, told the event it came in. The next page is requested while this one is
    decoded: page 1's objects wait here until that request has come, so a LIST that asks in
    turn fails the test."""
    converted: list[tuple[str, str, int]] = []

    def decode(etype: EventType, o: dict) -> str:
        assert type(etype) is EventType
        if o["metadata"]["name"] in ("a", "b"):
            wait_until(lambda: len(api.list_calls) >= 2, 2.0, "the request for page 2")
        converted.append((etype, o["metadata"]["name"], len(api.list_calls)))
        return o["metadata"]["name"].upper()

    api = FakeAPI(lists=[page([obj("a", "5"), obj("b", "7")], rv="100", cont="tok-1"),
                         page([obj("c", "9")], rv="100")],
                  watches=[watch(ev("ADDED", obj("d", "101")), ev("DELETED", obj("a", "102")))])
    refl, seen = drive(api, decode=decode)
    assert converted == [("SYNC", "a", 2), ("SYNC", "b", 2), ("SYNC", "c", 2),
                         ("ADDED", "d", 2), ("DELETED", "a", 2)]
    assert [c.get("_continue") for c in api.list_calls] == [None, "tok-1"]
    assert seen == [(SYNC, ["A", "B", "C"]), ("ADDED", ["D"]), ("DELETED", ["A"])]
    assert all(type(e) is Event and type(e.type) is EventType for e in seen)


def _keyed_pages(bodies: dict[str | None, bytes]) -> tuple[Callable[..., bytes], list]:
    calls: list[str | None] = []

    def fetch(limit: int, _continue: str | None = None) -> bytes:
        calls.append(_continue)
        return bodies[_continue]
    return fetch, calls


def test_a_continue_token_read_early_that_the_body_contradicts_is_dropped():
    """The early token comes from the head of the raw body; when the decoded metadata says
    otherwise (here an annotation named "continue" stands first), that request is dropped
    and the page the decoded token names is fetched in order."""
    fetch, calls = _keyed_pages({
        None: b'{"metadata":{"annotations":{"continue":"zzz"},"resourceVersion":"7",'
              b'"continue":"tok-1"},"items":[{"n":1}]}',
        "zzz": b'{"this page": "is never used"}',
        "tok-1": b'{"metadata":{"resourceVersion":"7"},"items":[{"n":2}]}'})
    assert reflector_mod.list_pages(fetch, page_size=1) == ([{"n": 1}, {"n": 2}], "7", 2)
    assert calls == [None, "zzz", "tok-1"]


@pytest.mark.parametrize("first", [
    b'{"items":[{"n":1}],"metadata":{"resourceVersion":"7","continue":"tok-1"}}',  # items first
    b'{"metadata":{"resourceVersion":"7","continue":"tok.1?"},"items":[{"n":1}]}',  # not base64
], ids=["metadata-after-items", "odd-token"])
def test_a_body_without_an_early_token_is_paged_in_order(first):
    nxt = "tok-1" if b"tok-1" in first else "tok.1?"
    fetch, calls = _keyed_pages({None: first,
                                 nxt: b'{"metadata":{"resourceVersion":"7"},"items":[{"n":2}]}'})
    assert reflector_mod.list_pages(fetch, page_size=1) == ([{"n": 1}, {"n": 2}], "7", 2)
    assert calls == [None, nxt]


def test_empty_list_still_syncs():
    api = FakeAPI(lists=[FakeResponse(body=b'{"metadata": {"resourceVersion": "3"}, "items": null}')])
    refl, seen = drive(api)
    assert seen == [(SYNC, [])] and refl.synced.is_set() and api.watch_rvs == ["3"]


def test_watch_fn_defaults_to_list_fn():
    api = FakeAPI(lists=[page([], rv="1"), watch(ev("ADDED", obj("a", "2")))])
    seen: Seen = []
    refl = Reflector("node", api.list_fn, None, seen.append, **FAST)
    api.reflector = refl
    refl.run()
    assert summary(seen) == [(SYNC, []), ("ADDED", "a")]
    assert [c.get("watch", False) for c in api.list_calls] == [False, True, True]


@pytest.mark.parametrize("bad_page,error,reused", [
    (FakeResponse(body=b"<html>502 Bad Gateway</html>"), "not JSON", True),
    (FakeResponse(body=b"[]"), "not a JSON object", True),
    (FakeResponse(body=b'{"metadata": {"resourceVersion": "1"}, "items": {}}'), "not a list", True),
    (FakeResponse(body=b'{"metadata": {}, "items": []}'), "no resourceVersion", True),
    # A body cut short must not send its connection back to the pool.
    (FakeResponse(error=ProtocolError("Connection broken: IncompleteRead")), "IncompleteRead", False),
], ids=["not-json", "not-object", "items-not-list", "no-rv", "body-cut"])
def test_bad_list_response_is_retried_after_backoff(bad_page, error, reused):
    api = FakeAPI(lists=[bad_page, page([obj("a", "1")], rv="10")])
    refl, seen = drive(api)
    assert summary(seen) == [(SYNC, ["a"])]
    assert refl.restarts == 1 and refl.lists == 1 and error in str(refl.last_error)
    assert (bad_page.released, bad_page.closed) == (reused, not reused)
    assert_backoff(waits(refl), [BACKOFF_INITIAL])


def test_list_failures_back_off_exponentially_and_report_nothing_until_a_list_succeeds():
    api = FakeAPI(lists=[
        api_error(500, "Internal Server Error"),
        conn_refused(),
        api_error(503, "Service Unavailable"),
        api_error(429, "Too Many Requests"),
        page([obj("a", "1")], rv="10"),
    ])
    refl, seen = drive(api)
    assert summary(seen) == [(SYNC, ["a"])]
    assert refl.restarts == 4 and refl.lists == 1 and refl.relists == 0
    assert_backoff(waits(refl), [0.001, 0.002, 0.004, 0.004])   # doubling, capped at backoff_max


# -- WATCH events -----------------------------------------------------------------------------------

EVENTS = [
    ev("ADDED", obj("b", "11")),
    ev("MODIFIED", obj("a", "12", spec={"x": 1})),
    ev("DELETED", obj("b", "13")),
    ev("ADDED", obj("c", "14")),
]
STREAM = b"".join(EVENTS)


def rechunk(stream: bytes, sizes: str) -> tuple[bytes, ...]:
    if sizes == "per-event":
        return tuple(EVENTS)
    if sizes == "one-chunk":
        return (stream,)
    if sizes == "bytewise":
        return tuple(stream[i:i + 1] for i in range(len(stream)))
    if sizes == "odd-7":
        return tuple(stream[i:i + 7] for i in range(0, len(stream), 7))
    if sizes == "blank-lines":
        return (b"\n",) + tuple(e + b"\n" for e in EVENTS)
    if sizes == "no-final-newline":
        return (stream[:-1],)
    raise ValueError(sizes)


@pytest.mark.parametrize("sizes", ["per-event", "one-chunk", "bytewise", "odd-7", "blank-lines",
                                   "no-final-newline"])
def test_watch_events_are_delivered_in_order_however_the_stream_is_chunked(sizes):
    first = FakeResponse(chunks=rechunk(STREAM, sizes))
    api = FakeAPI(lists=[page([obj("a", "10")], rv="10")], watches=[first])
    refl, seen = drive(api)

    assert summary(seen) == [(SYNC, ["a"]), ("ADDED", "b"), ("MODIFIED", "a"), ("DELETED", "b"),
                             ("ADDED", "c")]
    assert seen[2].objects[0]["spec"] == {"x": 1}        # the object is passed through as a plain dict
    assert refl.events == 4 and refl.resource_version == "14"
    # The server ended the watch (its timeout): resume at once from the last event, no backoff.
    assert api.watch_rvs == ["10", "14"]
    assert (refl.restarts, refl.relists, refl.lists) == (0, 0, 1) and waits(refl) == []
    assert first.released and not first.closed   # a fully read stream goes back to the pool


def test_bookmark_only_moves_the_resource_version():
    api = FakeAPI(lists=[page([obj("a", "10")], rv="10")], watches=[
        watch(ev("BOOKMARK", {"kind": "Service", "metadata": {"resourceVersion": "20"}})),
        watch(ev("ADDED", obj("b", "21")),
              ev("BOOKMARK", {"kind": "Service", "metadata": {"resourceVersion": "35"}})),
    ])
    refl, seen = drive(api)
    assert summary(seen) == [(SYNC, ["a"]), ("ADDED", "b")]
    assert refl.bookmarks == 2 and refl.events == 1 and refl.resource_version == "35"
    assert api.watch_rvs == ["10", "20", "35"]
    assert refl.restarts == 0 and waits(refl) == []   # a bookmark-only watch is not "empty"


def test_unknown_event_type_is_logged_and_skipped(caplog):
    caplog.set_level(logging.WARNING, logger="kproxy_ebpf.kube.reflector")
    api = FakeAPI(lists=[page([], rv="10")], watches=[
        watch(ev("SOMETHING-NEW", obj("x", "11")), ev("ADDED", obj("a", "12"))),
    ])
    refl, seen = drive(api)
    assert summary(seen) == [(SYNC, []), ("ADDED", "a")]
    assert refl.restarts == 0 and refl.resource_version == "12"
    assert "unknown type 'SOMETHING-NEW'" in caplog.text


# -- expiry: relist ---------------------------------------------------------------------------------

@pytest.mark.parametrize("error_event", [
    status(410, "Expired", "too old resource version: 10 (2000)"),
    status(410, "Gone", "too old resource version"),
    status(504, "Timeout", "Too large resource version",
           details={"causes": [{"reason": "ResourceVersionTooLarge"}]}),
], ids=["410-expired", "410-gone", "504-rv-too-large"])
def test_expired_error_event_relists_and_the_new_sync_replaces_the_set(error_event):
    first = watch(ev("ADDED", obj("c", "11")), ev("ERROR", error_event),
                  ev("ADDED", obj("never", "12")))
    api = FakeAPI(
        lists=[page([obj("a", "5"), obj("b", "6")], rv="10"),
               page([obj("a", "5"), obj("c", "11"), obj("d", "40")], rv="50")],
        watches=[first, watch(ev("MODIFIED", obj("d", "51")))],
    )
    refl, seen = drive(api)

    assert summary(seen) == [(SYNC, ["a", "b"]), ("ADDED", "c"),
                             (SYNC, ["a", "c", "d"]), ("MODIFIED", "d")]
    assert "DELETED" not in [t for t, _ in seen]   # "b" goes by the replacing SYNC, not an event
    assert (refl.relists, refl.lists, refl.restarts) == (1, 2, 0)
    assert isinstance(refl.last_error, ResourceExpired)
    assert api.watch_rvs == ["10", "50", "51"]
    assert first.closed and not first.released   # the rest of that stream was not read
    assert waits(refl) == []                     # the first expiry relists at once


@pytest.mark.parametrize("exc", [
    api_error(410, "Gone"),
    api_error(504, "Gateway Timeout", status(504, "Timeout", "Too large resource version",
                                             details={"causes": [{"reason": "ResourceVersionTooLarge"}]})),
], ids=["410", "504-rv-too-large"])
def test_expired_watch_call_relists(exc):
    api = FakeAPI(lists=[page([obj("a", "5")], rv="10"), page([obj("b", "30")], rv="30")],
                  watches=[watch(ev("ADDED", obj("z", "11"))), exc])
    refl, seen = drive(api)
    assert summary(seen) == [(SYNC, ["a"]), ("ADDED", "z"), (SYNC, ["b"])]
    assert (refl.relists, refl.lists, refl.restarts) == (1, 2, 0)
    assert isinstance(refl.last_error, ResourceExpired) and f"HTTP {exc.status}" in str(refl.last_error)
    assert api.watch_rvs == ["10", "11", "30"]
    assert waits(refl) == []


def test_504_without_rv_too_large_is_an_ordinary_error():
    api = FakeAPI(lists=[page([obj("a", "5")], rv="10")],
                  watches=[api_error(504, "Gateway Timeout", status(504, "Timeout", "upstream"))])
    refl, seen = drive(api)
    assert summary(seen) == [(SYNC, ["a"])]
    assert (refl.relists, refl.restarts, refl.lists) == (0, 1, 1)
    assert api.watch_rvs == ["10", "10"]


def test_repeated_expiry_right_after_a_list_backs_off():
    # A server that expires what it just listed: relist at once the first time, then back off.
    api = FakeAPI(lists=[page([], rv="10"), page([], rv="20"), page([], rv="30"), page([], rv="40")],
                  watches=[api_error(410, "Gone"), api_error(410, "Gone"), api_error(410, "Gone"),
                           watch(ev("ADDED", obj("a", "41")))])
    refl, seen = drive(api)
    assert [t for t, _ in seen] == [SYNC, SYNC, SYNC, SYNC, "ADDED"]
    assert (refl.relists, refl.lists, refl.restarts) == (3, 4, 0)
    assert_backoff(waits(refl), [0.001, 0.002])


def test_expired_continue_token_restarts_the_list_from_scratch():
    api = FakeAPI(lists=[page([obj("a", "1"), obj("b", "2")], rv="10", cont="tok"),
                         api_error(410, "Gone"),   # the continue token expired
                         page([obj("a", "1"), obj("b", "2")], rv="12", cont="tok2"),
                         page([obj("c", "3")], rv="12")])
    refl, seen = drive(api)
    assert summary(seen) == [(SYNC, ["a", "b", "c"])]     # no partial SYNC from the first try
    assert [c.get("_continue") for c in api.list_calls] == [None, "tok", None, "tok2"]
    assert refl.lists == 1 and refl.resource_version == "12"


def test_api_server_away_during_relist_reports_no_deletions():
    api = FakeAPI(
        lists=[page([obj("a", "5"), obj("b", "6")], rv="10"),
               conn_refused(), api_error(500, "Internal Server Error"),
               page([obj("a", "5")], rv="60")],
        watches=[watch(ev("ERROR", status(410, "Expired")))],
    )
    refl, seen = drive(api)
    assert summary(seen) == [(SYNC, ["a", "b"]), (SYNC, ["a"])]
    assert (refl.relists, refl.restarts, refl.lists) == (1, 2, 2)
    assert_backoff(waits(refl), [0.001, 0.002])


# -- errors: resume the watch -----------------------------------------------------------------------

def test_watch_errors_restart_with_backoff_and_resume_from_the_last_resource_version():
    first = watch(ev("ADDED", obj("b", "11")),
                  error=ProtocolError("Connection broken: IncompleteRead(0 bytes read)"))
    api = FakeAPI(
        lists=[page([obj("a", "10")], rv="10")],
        watches=[
            first,                                     # stream breaks after one event
            api_error(500, "Internal Server Error"),   # API server unhappy
            conn_refused(),                            # API server gone
            api_error(503, "Service Unavailable"),
            watch(ev("ERROR", status(500, "InternalError", "etcd is down"))),
            watch(ev("MODIFIED", obj("b", "12"))),     # back
            ConnectionResetError(104, "Connection reset by peer"),
        ],
    )
    refl, seen = drive(api)

    assert summary(seen) == [(SYNC, ["a"]), ("ADDED", "b"), ("MODIFIED", "b")]
    assert refl.lists == 1 and refl.relists == 0 and refl.restarts == 6
    assert api.watch_rvs == ["10", "11", "11", "11", "11", "11", "12", "12"]
    assert isinstance(refl.last_error, ConnectionResetError)
    assert first.closed and not first.released
    # Reset after a watch that delivered something, then doubling up to backoff_max.
    assert_backoff(waits(refl), [0.001, 0.002, 0.004, 0.004, 0.004, 0.001])


def test_watch_that_ends_at_once_with_nothing_is_an_error():
    api = FakeAPI(lists=[page([], rv="10")],
                  watches=[watch(), watch(), watch(ev("ADDED", obj("a", "11")))])
    refl, seen = drive(api)
    assert summary(seen) == [(SYNC, []), ("ADDED", "a")]
    assert refl.restarts == 2 and isinstance(refl.last_error, WatchError)
    assert "without any event" in str(refl.last_error)
    assert_backoff(waits(refl), [0.001, 0.002])


@pytest.mark.parametrize("bad_line,error", [
    (b"this is not json", "not JSON"),
    (b'{"type": "ADDED", "object": {"metadata"', "not JSON"),
    (b"[1, 2, 3]", "not a JSON object"),
    (b'{"type": "ADDED"}', "without an object"),
    (b'{"type": "MODIFIED", "object": "x"}', "without an object"),
], ids=["garbage", "truncated", "array", "no-object", "object-not-dict"])
def test_bad_watch_line_restarts_the_watch_from_the_last_good_event(bad_line, error, caplog):
    # Documented behaviour: a line that cannot be handled is a stream failure (WatchError): the
    # connection is dropped, counted as a restart after backoff, and the watch resumes from the
    # last good resourceVersion, so the events after the bad line come again. No relist.
    caplog.set_level(logging.WARNING, logger="kproxy_ebpf.kube.reflector")
    first = watch(ev("ADDED", obj("a", "11")), bad_line + b"\n", ev("ADDED", obj("b", "12")))
    api = FakeAPI(lists=[page([], rv="10")],
                  watches=[first, watch(ev("ADDED", obj("b", "12")))])
    refl, seen = drive(api)

    assert summary(seen) == [(SYNC, []), ("ADDED", "a"), ("ADDED", "b")]
    assert refl.restarts == 1 and refl.relists == 0 and refl.lists == 1
    assert isinstance(refl.last_error, WatchError) and error in str(refl.last_error)
    assert api.watch_rvs == ["10", "11", "12"]
    assert first.closed and not first.released
    assert_backoff(waits(refl), [0.001])
    assert "watch from resourceVersion 11 failed" in caplog.text


def test_handler_exception_is_counted_and_the_watch_continues(caplog):
    caplog.set_level(logging.ERROR, logger="kproxy_ebpf.kube.reflector")
    seen: Seen = []

    def on_event(event: Event) -> None:
        seen.append(event)
        if event.type is SYNC or event.objects[0]["metadata"]["name"].startswith("boom"):
            raise RuntimeError("handler bug")

    api = FakeAPI(lists=[page([obj("a", "1")], rv="10")], watches=[
        watch(ev("ADDED", obj("b", "11")), ev("ADDED", obj("boom1", "12")),
              ev("MODIFIED", obj("boom2", "13")), ev("DELETED", obj("b", "14"))),
    ])
    refl, _ = drive(api, on_event=on_event)

    assert summary(seen) == [(SYNC, ["a"]), ("ADDED", "b"), ("ADDED", "boom1"),
                             ("MODIFIED", "boom2"), ("DELETED", "b")]
    assert refl.handler_errors == 3 and refl.events == 4
    assert refl.synced.is_set() and refl.lists == 1        # a failing SYNC handler still syncs
    assert (refl.restarts, refl.relists) == (0, 0)
    assert refl.resource_version == "14" and api.watch_rvs == ["10", "14"]
    assert caplog.text.count("the event handler failed") == 3 and "handler bug" in caplog.text


# -- backoff bookkeeping --------------------------------------------------------------------------

def test_first_expiry_after_a_dropped_watch_relists_at_once():
    api = FakeAPI(
        lists=[page([], rv="10"), page([], rv="30")],
        watches=[watch(ev("ADDED", obj("a", "11")), error=ProtocolError("Connection broken")),
                 api_error(410, "Gone"),
                 watch(ev("ADDED", obj("b", "31")))],
    )
    refl, seen = drive(api)
    assert [t for t, _ in seen] == [SYNC, "ADDED", SYNC, "ADDED"]
    assert_backoff(waits(refl), [0.001])     # only the reconnect waited; the relist did not


# Regression: an expiry after a working watch that dropped used to count as a repeated expiry
# and wait out the backoff grown during the outage (up to 30 s on stale state).
def test_expiry_after_a_working_watch_that_dropped_relists_at_once_even_after_an_earlier_expiry():
    api = FakeAPI(
        lists=[page([], rv="10"), page([], rv="20"), page([], rv="40")],
        watches=[
            watch(ev("ADDED", obj("a", "11")), ev("ERROR", status(410, "Expired"))),  # expiry #1
            watch(ev("ADDED", obj("b", "21")), error=ProtocolError("Connection broken")),
            api_error(410, "Gone"),     # resume after the API server came back: expiry #2
            watch(ev("ADDED", obj("c", "41"))),
        ],
    )
    refl, seen = drive(api)
    assert [t for t, _ in seen] == [SYNC, "ADDED", SYNC, "ADDED", SYNC, "ADDED"]
    assert (refl.relists, refl.restarts) == (2, 1)
    # Expected: only the reconnect after the dropped watch waits. Actual: the relist waits too.
    assert_backoff(waits(refl), [0.001])


# -- threads, start and stop ------------------------------------------------------------------------

def test_start_runs_in_a_daemon_thread_and_stop_ends_a_held_watch_promptly(started):
    held = watch(ev("ADDED", obj("a", "11")), hold=True)
    api = FakeAPI(lists=[page([], rv="10")], watches=[held])
    seen: Seen = []
    refl = started(Reflector("services", api.list_fn, api.watch_fn,
                             seen.append, **FAST))
    assert refl.synced.wait(1.0)
    wait_until(lambda: refl.events == 1, 2.0, "the ADDED event")
    assert refl.alive and refl._thread.daemon and refl._thread.name == "kproxy-reflector-services"
    with pytest.raises(RuntimeError, match="already started"):
        refl.start()

    assert held.blocked.wait(2.0)
    # The held watch lasts HOLD_LIMIT unless cut: a thread gone within stop()'s 2 s was cut.
    refl.stop(timeout=2.0)
    assert not refl.alive
    assert held.cut.is_set() and held.closed           # cut, and not returned to the pool
    assert summary(seen) == [(SYNC, []), ("ADDED", "a")]
    assert refl.restarts == 0                           # a stop is not a failure


@pytest.mark.parametrize("where", ["list-body", "watch-no-shutdown", "backoff"])
def test_stop_ends_the_thread_promptly_wherever_it_waits(where, started):
    if where == "list-body":      # blocked reading a LIST body
        api = FakeAPI(lists=[FakeResponse(hold=True)])
        opts = FAST
    elif where == "watch-no-shutdown":   # blocked in a watch read; only close() is available
        api = FakeAPI(lists=[page([], rv="10")], watches=[NoShutdownResponse(hold=True)])
        opts = FAST
    else:                         # sleeping a long backoff after a failure
        api = FakeAPI(lists=[api_error(500, "Internal Server Error")])
        opts = {**FAST, "backoff_initial": 60.0, "backoff_max": 60.0}
    seen: Seen = []
    refl = Reflector("services", api.list_fn, api.watch_fn, seen.append, **opts)
    refl._pause = pause = WatchedPause()
    started(refl)
    if where == "backoff":
        assert pause.entered.wait(2.0)
    else:
        held = wait_until(lambda: api.handed_out and api.handed_out[-1]._hold and api.handed_out[-1],
                          2.0, "the held request")
        assert held.blocked.wait(2.0)
    # Each wait lasts far longer than stop()'s 2 s unless stop() ends it (HOLD_LIMIT, a 60 s
    # backoff): a thread gone after stop() was ended by it.
    refl.stop(timeout=2.0)
    assert not refl.alive
    assert pause.woken == ([True] if where == "backoff" else [])
    assert refl.restarts == (1 if where == "backoff" else 0)
    assert seen == ([] if where != "watch-no-shutdown" else [(SYNC, [])])


def test_nothing_is_delivered_after_stop(started):
    gate = threading.Event()
    release = threading.Event()
    seen: Seen = []

    def on_event(event: Event) -> None:
        seen.append(event)
        if event.type is EventType.ADDED:
            gate.set()
            release.wait(1.0)     # the consumer is busy while stop() is called

    api = FakeAPI(lists=[page([], rv="10")],
                  watches=[FakeResponse(chunks=(ev("ADDED", obj("a", "11")) + ev("ADDED", obj("b", "12")),),
                                        hold=True)])
    refl = started(Reflector("services", api.list_fn, api.watch_fn, on_event, **FAST))
    assert gate.wait(1.0)
    stopper = threading.Thread(target=refl.stop, kwargs={"timeout": 2.0})
    stopper.start()
    wait_until(lambda: refl._stop.is_set(), 2.0, "stop() to begin")
    release.set()
    stopper.join(2.0)
    assert not refl.alive
    assert summary(seen) == [(SYNC, []), ("ADDED", "a")]   # "b" was already read, but not delivered


def test_stop_before_start_and_stop_twice_are_harmless():
    api = FakeAPI(lists=[page([], rv="10")])
    refl = Reflector("services", api.list_fn, api.watch_fn, lambda e: None, **FAST)
    refl.stop()
    refl.run()                   # returns at once: stop was requested
    assert api.list_calls == [] and not refl.alive
    refl.stop()


# -- reflector_for ------------------------------------------------------------------------------

def test_reflector_for_binds_the_node_field_selector(monkeypatch):
    calls: list[dict[str, Any]] = []

    class FakeCore:
        def __init__(self, api_client: Any) -> None:
            pass

        def list_node(self, **kwargs: Any) -> Any:
            calls.append(kwargs)
            raise ConnectionRefusedError(111, "Connection refused")

    import kubernetes.client
    monkeypatch.setattr(kubernetes.client, "CoreV1Api", FakeCore)
    refl = reflector_mod.reflector_for(object(), "node", lambda e: None, node_name="n1", **FAST)
    refl._pause = RecordingStop()
    refl._pause.wait = lambda timeout=None: refl._stop.set() or True  # type: ignore[method-assign]
    refl.run()
    assert calls and calls[0]["field_selector"] == "metadata.name=n1" and calls[0]["limit"] == 2
    with pytest.raises(ValueError, match="node_name"):
        reflector_mod.reflector_for(object(), "node", lambda e: None)
    with pytest.raises(ValueError, match="unknown resource"):
        reflector_mod.reflector_for(object(), "pods", lambda e: None)


def test_wake_cuts_a_backoff_short_and_contact_after_failure_is_reported():
    """ApiSource wakes its other reflectors when one gets through after an outage."""
    contacts: list[int] = []
    api = FakeAPI(lists=[conn_refused(), page([obj("a", "5")], rv="5")], watches=[])
    refl = Reflector("services", api.list_fn, api.watch_fn, lambda e: None,
                     **{**FAST, "backoff_initial": 30.0, "backoff_max": 30.0},
                     on_contact=lambda: contacts.append(1))
    api.reflector = refl
    refl._pause = pause = WatchedPause()
    refl.start()
    try:
        assert pause.entered.wait(2.0)    # in a 30 s backoff after the refused list
        refl.wake()
        assert refl.synced.wait(2.0)
        assert pause.woken == [True], "wake() ended the backoff"
        assert contacts == [1], "the first answer after a failure is reported once"
    finally:
        refl.stop()


def test_a_watch_that_stops_delivering_is_reestablished_from_its_resource_version():
    """A read that times out (no event or bookmark for progress_timeout: a connection dropped
    on the way without a FIN) ends that watch: the next resumes where it was, no relist."""
    stalled = ReadTimeoutError(None, "/api/v1/services", "Read timed out. (read timeout=150)")
    api = FakeAPI([page([obj("a", "5")], rv="10")],
                  [watch(ev("ADDED", obj("b", "11")), error=stalled),
                   watch(ev("ADDED", obj("c", "12")))])
    refl, seen = drive(api)
    assert summary(seen) == [(SYNC, ["a"]), ("ADDED", "b"), ("ADDED", "c")]
    assert api.watch_rvs[:2] == ["10", "11"]
    assert (refl.lists, refl.relists, refl.restarts, refl.stalls) == (1, 0, 1, 1)
    assert isinstance(refl.last_error, WatchStalled)
    assert "no event or bookmark for 150s" in str(refl.last_error)
    assert api.handed_out[1].closed        # the dead connection is not reused
