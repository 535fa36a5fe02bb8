"""What the sources deliver (kube/sources.py's Sink), applied to the agent's ProxyState.

Each Kind has its own way into the state, looked up in one table that covers every Kind: an
object of a kind the table does not know raises, it cannot end up as some other kind's
update. The Node is the odd one: it is set, never deleted (the datapath stays as it is).

The kind arrives as a Kind: the sources name it once, when they bind a reflector (or a
manifest list) to it, and nothing here converts it again.
"""
from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Collection, Iterable
from dataclasses import dataclass
from typing import Any

from kproxy_ebpf.kube.convert import ObjectKey, Rejection
from kproxy_ebpf.model.objects import Kind, Node
from kproxy_ebpf.proxy.state import ProxyState

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class _Store:
    """How one kind of object is held by ProxyState."""
    held: Callable[[ProxyState], Iterable[ObjectKey]]
    upsert: Callable[[ProxyState, Any], bool]
    delete: Callable[[ProxyState, str, str], bool]


_STORES = {
    Kind.SERVICE: _Store(ProxyState.service_keys, ProxyState.upsert_service,
                         ProxyState.delete_service),
    Kind.ENDPOINT_SLICE: _Store(ProxyState.slice_keys, ProxyState.upsert_slice,
                                ProxyState.delete_slice),
    Kind.SERVICE_CIDR: _Store(ProxyState.service_cidr_keys, ProxyState.upsert_service_cidr,
                              lambda state, _ns, name: state.delete_service_cidr(name)),
}
if set(_STORES) | {Kind.NODE} != set(Kind):
    raise ImportError(f"state_sink: no store for {set(Kind) - set(_STORES) - {Kind.NODE}}")


class StateSink:
    """Applies the sources' objects to `state` under `lock` (the sync reads the state under it
    too) and calls on_change() after every delivery that changed something."""

    def __init__(self, state: ProxyState, lock: threading.Lock, *, started_at: float,
                 on_change: Callable[[], None], on_node: Callable[[Node], None],
                 on_rejected: Callable[[list[Rejection]], None]) -> None:
        self.state, self.lock = state, lock
        self.started_at = started_at
        self.on_change, self.on_node, self.on_rejected = on_change, on_node, on_rejected
        # Trigger times of slice changes not yet synced (under `lock`): programming latency.
        # (trigger time, the slice's addressType): network programming latency per family
        self.triggers: list[tuple[float, str]] = []

    def replace(self, kind: Kind, objs: list[Any], keep: Collection[ObjectKey] = frozenset()) -> None:
        with self.lock:
            if kind is Kind.NODE:
                changed = bool(objs) and self._set_node(objs[0])
            else:
                store, new = _STORES[kind], {o.key for o in objs}
                gone = [k for k in store.held(self.state) if k not in new and k not in keep]
                changed = False
                # An object that failed conversion keeps its last good version, as on a watch.
                for ns, name in gone:
                    changed |= store.delete(self.state, ns, name)
                for o in objs:
                    changed |= self._upsert(kind, o)
        if changed:
            self.on_change()

    def upsert(self, kind: Kind, obj: Any) -> None:
        with self.lock:
            changed = self._set_node(obj) if kind is Kind.NODE else self._upsert(kind, obj)
        if changed:
            self.on_change()

    def delete(self, kind: Kind, namespace: str, name: str) -> None:
        if kind is Kind.NODE:
            log.warning("node %s was deleted; keeping the datapath as it is", name)
            return
        with self.lock:
            changed = _STORES[kind].delete(self.state, namespace, name)
        if changed:
            self.on_change()

    def rejected(self, rejections: list[Rejection]) -> None:
        self.on_rejected(rejections)

    def _upsert(self, kind: Kind, obj: Any) -> bool:
        changed = _STORES[kind].upsert(self.state, obj)
        # As kube-proxy: changes older than this agent are not its programming latency.
        if (changed and kind is Kind.ENDPOINT_SLICE and obj.trigger_time
                and obj.trigger_time >= self.started_at):
            self.triggers.append((obj.trigger_time, obj.address_type))
        return changed

    def _set_node(self, node: Node) -> bool:
        self.on_node(node)
        return self.state.set_node(node)
