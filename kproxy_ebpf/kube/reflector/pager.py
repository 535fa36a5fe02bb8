"""A complete LIST in pages (limit/continue), the next page fetched while this one is decoded."""
from __future__ import annotations

import re
import threading
from collections.abc import Callable
from typing import Any

from .wire import WatchError, json_object

# One LIST request: keyword arguments (limit, _continue) -> the raw JSON body.
PageFunc = Callable[..., bytes]


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
            body = json_object(raw, "list response")
            del raw
            meta: dict = body["metadata"] if isinstance(body.get("metadata"), dict) else {}
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
