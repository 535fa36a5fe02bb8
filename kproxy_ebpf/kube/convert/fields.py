"""What every converter shares: the Rejection it reports, the collector that fills in the
object's identity, tolerant accessors (a wrong type reads as "absent") and the checks of fields
that more than one kind has (metadata, labels, list-of-object fields, ports, protocols)."""
from __future__ import annotations

import sys
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, TypeGuard

from kproxy_ebpf.model.objects import Protocol


@dataclass(frozen=True)
class Rejection:
    """Something in an API object that the proxy cannot use, and why.

    `reason` is a CamelCase word (as in a Kubernetes Event), `message` a sentence for humans that
    names the offending field and value. `uid` is the object's metadata.uid when known: an Event
    carrying it shows up in `kubectl describe` of the object.
    """
    kind: str
    namespace: str
    name: str
    reason: str
    message: str
    uid: str = ""

    def __str__(self) -> str:
        where = f"{self.namespace}/{self.name}" if self.namespace else self.name
        return f"{self.kind} {where or '<unnamed>'}: {self.reason}: {self.message}"


# Small tolerant accessors: a wrong type reads as "absent", and the caller decides whether that
# deserves a rejection. Booleans are excluded from ints on purpose (True is an int in Python).

def _dict(value: Any) -> dict:
    return value if isinstance(value, dict) else {}


def _list(value: Any) -> list:
    return value if isinstance(value, list) else []


def _str(value: Any) -> str | None:
    return value if isinstance(value, str) else None


def _is_int(value: Any) -> TypeGuard[int]:
    return isinstance(value, int) and not isinstance(value, bool)


def _short(value: Any, limit: int = 60) -> str:
    """repr() of a bad value, cut short so one garbage field cannot flood a log or an Event."""
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


class _Collector:
    """Accumulates rejections for one object, filling in its identity."""

    def __init__(self, kind: str, namespace: str, name: str, uid: str) -> None:
        self.kind, self.namespace, self.name, self.uid = kind, namespace, name, uid
        self.items: list[Rejection] = []

    def add(self, reason: str, message: str) -> None:
        self.items.append(Rejection(self.kind, self.namespace, self.name, reason, message, self.uid))


def _objects(raw: Any, where: str, reason: str, what: str,
             col: _Collector) -> Iterator[tuple[str, dict]]:
    """(path, entry) for each object of a list field; a non-list field or a non-object entry
    is reported once under `reason` and skipped."""
    if raw is not None and not isinstance(raw, list):
        col.add(reason, f"{where} is not a list: {_short(raw)}")
        return
    for i, entry in enumerate(_list(raw)):
        path = f"{where}[{i}]"
        if not isinstance(entry, dict):
            col.add(reason, f"{path} is not an object: {_short(entry)}, {what} ignored")
            continue
        yield path, entry


def _identity(obj: Any, kind: str) -> tuple[dict, _Collector, bool]:
    """Read metadata; returns (metadata, collector, ok). Not ok: no usable name."""
    if not isinstance(obj, dict):
        col = _Collector(kind, "", "", "")
        col.add("InvalidObject", f"expected a JSON object, got {type(obj).__name__}")
        return {}, col, False
    meta = obj.get("metadata")
    # Interned: thousands of objects share a few namespaces.
    ns = sys.intern(_str(_dict(meta).get("namespace")) or "default")  # kubectl's default
    name = _str(_dict(meta).get("name")) or ""
    uid = _str(_dict(meta).get("uid")) or ""
    col = _Collector(kind, ns, name, uid)
    if not isinstance(meta, dict):
        col.add("InvalidMetadata", "metadata is missing or not an object")
        return {}, col, False
    if not name:
        col.add("InvalidMetadata", f"metadata.name is missing or not a string: {_short(meta.get('name'))}")
        return meta, col, False
    return meta, col, True


def _labels(meta: dict) -> dict[str, str]:
    return {k: v for k, v in _dict(meta.get("labels")).items() if isinstance(k, str) and isinstance(v, str)}


def _protocol(value: Any, where: str, col: _Collector) -> Protocol | None:
    if value is None:
        return Protocol.TCP
    try:
        return Protocol(value)
    except ValueError:
        col.add("InvalidProtocol", f"{where}: unknown protocol {_short(value)}, entry ignored")
        return None


def _port_entry(entry: dict, where: str, col: _Collector, *,
                unset_ok: bool) -> tuple[str | None, int | None, Protocol] | None:
    """(name, port, protocol) of one port entry, or None (reported) when it is unusable.
    unset_ok: a slice port may leave name and port unset (proxy/ ignores such ports); a
    Service port must have a port in 1..65535 and its unset name means ""."""
    name = entry.get("name")
    if name is not None and not isinstance(name, str):
        col.add("InvalidPort", f"{where}.name is not a string: {_short(name)}, port ignored")
        return None
    port = entry.get("port")
    lowest = 0 if unset_ok else 1
    if not (unset_ok and port is None) and (not _is_int(port) or not lowest <= port <= 65535):
        col.add("InvalidPort", f"{where}.port must be an integer in 1..65535, got {_short(port)}; "
                "port ignored")
        return None
    protocol = _protocol(entry.get("protocol"), f"{where}.protocol", col)
    if protocol is None:
        return None
    # Interned: a few names ("http", "dns") repeat in every Service and slice, 100,000 copies
    # at 50,000 Services.
    return (sys.intern(name) if name else name), port, protocol
