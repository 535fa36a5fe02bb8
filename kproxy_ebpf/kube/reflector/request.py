"""The one request a reflector has open, tracked so that stop() can cut a read blocked on it."""
from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

from .wire import ResourceExpired, is_expired


class InFlight:
    """`response`: the in-flight urllib3 response, None between requests. `stopped`: the
    reflector's stop event, set before it cuts."""

    def __init__(self, stopped: threading.Event) -> None:
        self._stopped = stopped
        self._lock = threading.Lock()
        self.response: Any = None

    def call(self, fn: Callable[..., Any], **kwargs: Any) -> Any:
        """Call the client, mapping HTTP 410 to ResourceExpired, and track the response."""
        try:
            resp = fn(_preload_content=False, **kwargs)
        except Exception as exc:
            if is_expired(getattr(exc, "status", None), getattr(exc, "body", None)):
                reason = getattr(exc, "reason", "") or ""
                raise ResourceExpired(f"HTTP {exc.status} {reason}".strip()) from exc  # type: ignore[attr-defined]
            raise
        with self._lock:
            self.response = resp
        if self._stopped.is_set():     # stop() ran between the call and the line above
            self.cut()
        return resp

    def release(self, resp: Any, reuse: bool = True) -> None:
        with self._lock:
            if self.response is resp:
                self.response = None
        try:
            if reuse:
                resp.release_conn()
            else:
                resp.close()
        except Exception:  # noqa: BLE001 - as in cut(): a connection already gone needs nothing
            pass

    def cut(self) -> None:
        """Shut down the in-flight connection so that a blocked read returns now.

        shutdown() rather than close(): closing a socket does not wake a thread blocked in
        recv() on it, shutting it down does.
        """
        with self._lock:
            resp = self.response
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
