"""What the API server sends, read as it is: JSON bodies and the newline-separated events of
a watch stream, and the errors that decide between resuming a watch and relisting."""
from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any


class ResourceExpired(Exception):
    """The server no longer has history from our resourceVersion (410): relist."""


class WatchError(Exception):
    """The watch stream failed in a way that a resumed watch may fix."""


class WatchStalled(WatchError):
    """Neither an event nor a bookmark for progress_timeout: the connection is taken as dead
    (dropped by something on the path without a FIN or RST) and a new watch resumes."""


def json_object(data: bytes, what: str) -> dict:
    try:
        value = json.loads(data)
    except ValueError as exc:
        raise WatchError(f"{what} is not JSON: {exc}") from exc
    if not isinstance(value, dict):
        raise WatchError(f"{what} is not a JSON object")
    return value


def lines(resp: Any) -> Iterator[bytes]:
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


def is_expired(code: Any, body: Any) -> bool:
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


def describe(exc: BaseException) -> str:
    status = getattr(exc, "status", None)
    if status is not None and hasattr(exc, "reason"):
        return f"HTTP {status} {getattr(exc, 'reason', '')}".strip()
    text = " ".join(str(exc).split())
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__
