"""The one way an API object becomes a model object: from_api(kind, raw). The reflector's LIST
(page by page, as each page arrives) and its watch events both come through here, so a listed
object and a watched one can never be converted differently."""
from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

from kproxy_ebpf.model.objects import Kind

from .cluster import node_from_api, service_cidr_from_api
from .endpointslice import slice_from_api
from .fields import Rejection
from .service import service_from_api

ObjectKey = tuple[str, str]     # (namespace, name); "" for cluster-scoped objects


class Converted(NamedTuple):
    """One API object as the model sees it. obj is None when nothing of it can be used: then
    `key` (read from its raw metadata) names the object whose last good version stays."""
    key: ObjectKey
    obj: Any
    rejections: list[Rejection]


_CONVERT: dict[Kind, Callable[[Any], tuple[Any, list[Rejection]]]] = {
    Kind.SERVICE: service_from_api,
    Kind.ENDPOINT_SLICE: slice_from_api,
    Kind.NODE: lambda raw: (node_from_api(raw), []),
    Kind.SERVICE_CIDR: service_cidr_from_api,
}


def from_api(kind: Kind, raw: Any) -> Converted:
    """`raw` (a JSON object as the API server sent it) converted as a `kind`; never raises."""
    obj, rejections = _CONVERT[kind](raw)
    if obj is not None:
        return Converted((getattr(obj, "namespace", ""), obj.name), obj, rejections)
    meta = raw.get("metadata") if isinstance(raw, dict) else None
    meta = meta if isinstance(meta, dict) else {}
    return Converted((meta.get("namespace") or "", meta.get("name") or ""), None, rejections)


def deleted(raw: dict) -> Converted:
    """A deleted object needs only its key: nothing of it is converted, nothing rejected. (A
    metadata that is no object fails here, in the event handler, as it always did.)"""
    meta = raw.get("metadata") or {}
    return Converted((meta.get("namespace") or "", meta.get("name") or ""), None, [])
