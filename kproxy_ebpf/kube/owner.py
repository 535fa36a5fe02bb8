"""The agent's own DaemonSet and its Node, to tell an uninstall from a restart when the agent
exits (agent/uninstall.py).

The DaemonSet is watched from the start (OwnerWatch), not only read at exit: `helm uninstall`
deletes the DaemonSet and, in the same breath, the agent's ServiceAccount and RBAC, so by the
time the garbage collector has deleted the pod and the kubelet sends SIGTERM, the agent's
token is no longer accepted (401) and a read would only say "no answer". The watch saw the
DaemonSet go (or get its deletionTimestamp) before that. The Node is read at exit, when the
DaemonSet is still there (and with it the agent's credentials).
"""
from __future__ import annotations

import functools
import json
import threading
from typing import Any

from .reflector.event import Event, EventType

TIMEOUT = (3.0, 5.0)       # connect, read: the pod's grace period bounds the whole exit


class OwnerWatch:
    """One DaemonSet by name (list+watch with the field selector metadata.name, which RBAC
    resourceNames can authorize). `known` once listed; `current` is its JSON object, or None
    once it is gone."""

    def __init__(self, api: Any, namespace: str, name: str, **options: Any) -> None:
        from kubernetes import client

        from .reflector import Reflector

        self.namespace, self.name = namespace, name
        self._lock = threading.Lock()
        self.known = False
        self.current: dict | None = None
        fn = functools.partial(client.AppsV1Api(api).list_namespaced_daemon_set, namespace,
                               field_selector=f"metadata.name={name}")
        self.reflector = Reflector("daemonset", fn, fn, self._on_event, **options)

    def _on_event(self, event: Event) -> None:
        with self._lock:
            if event.type is EventType.SYNC:
                self.current = event.objects[0] if event.objects else None
            elif event.type is EventType.DELETED:
                self.current = None
            else:
                self.current = event.objects[0]
            self.known = True

    def state(self) -> tuple[bool, dict | None]:
        """(known, the DaemonSet or None when gone)."""
        with self._lock:
            return self.known, self.current

    def start(self) -> None:
        self.reflector.start()

    def stop(self) -> None:
        self.reflector.stop()


def _read(call, *args) -> dict | None:
    """The object, or None when the API server says it does not exist (404); any other
    failure raises."""
    from kubernetes.client.exceptions import ApiException

    try:
        resp = call(*args, _preload_content=False, _request_timeout=TIMEOUT)
    except ApiException as exc:
        if exc.status == 404:
            return None
        raise
    try:
        return json.loads(resp.data)
    finally:
        resp.release_conn()


def daemonset_and_node(api: Any, namespace: str, name: str,
                       node: str) -> tuple[dict | None, dict | None]:
    """(DaemonSet, Node) as the API server has them now; None for one that does not exist."""
    from kubernetes import client

    ds = _read(client.AppsV1Api(api).read_namespaced_daemon_set, name, namespace)
    return ds, _read(client.CoreV1Api(api).read_node, node)
