"""The agent's own DaemonSet and its Node, read once as JSON when the agent exits, to tell an
uninstall from a restart (agent/uninstall.py)."""
from __future__ import annotations

import json
from typing import Any

TIMEOUT = (3.0, 5.0)       # connect, read: the pod's grace period bounds the whole exit


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
