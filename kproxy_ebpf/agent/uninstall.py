"""At exit: an uninstall (or the node taken out) removes the datapath, a restart keeps it.

A stopping agent normally leaves its programs attached and its maps pinned, so a restart or a
rolling update loses no connection (the next agent adopts them). But when the agent stops
because it is leaving the node for good, what it leaves would keep translating Services with
nobody updating the maps: `helm uninstall`, or the node no longer selected by the DaemonSet.
The agent therefore watches its own DaemonSet (name and namespace from the chart, through
the downward API; kube/owner.py), and on SIGTERM reads it and its Node again unless the watch
already saw it go, and removes its datapath (hooks, TC filters, pins, program cache) when

* the DaemonSet is gone (404) or being deleted (deletionTimestamp): an uninstall;
* the Node is gone: the node is leaving the cluster;
* the DaemonSet no longer selects the node: its nodeSelector, required node affinity or a
  NoExecute taint it does not tolerate (what makes the DaemonSet controller delete the pod).

Everything else keeps the datapath: the DaemonSet present and selecting the node (a restart,
a rolling update, a pod deleted by hand, a node drain), no DaemonSet configured (an agent run
by hand or by a lab), and above all an API server that does not answer: removing the datapath
of a node that is still meant to have it would break every Service on it, while keeping one
too many is what `kproxy-ebpf cleanup` is for. Each decision is logged with its reason.
"""
from __future__ import annotations

import logging
import threading
from typing import Any

log = logging.getLogger("kproxy_ebpf.agent")

# The whole question at exit, retries included, must fit in the pod's grace period (30 s in
# the chart) with the removal after it.
DEADLINE = 10.0

# Taints the DaemonSet controller tolerates for every daemon pod (it adds these tolerations).
DAEMON_TOLERATED = {"node.kubernetes.io/not-ready", "node.kubernetes.io/unreachable"}


def _expression(req: dict, values: dict[str, str]) -> bool:
    key, op, want = req.get("key", ""), req.get("operator", ""), req.get("values") or []
    have = values.get(key)
    if op == "In":
        return have is not None and have in want
    if op == "NotIn":
        return have is None or have not in want
    if op == "Exists":
        return have is not None
    if op == "DoesNotExist":
        return have is None
    if op in ("Gt", "Lt") and have is not None and len(want) == 1:
        try:
            return int(have) > int(want[0]) if op == "Gt" else int(have) < int(want[0])
        except ValueError:
            return False
    return False


def _term(term: dict, labels: dict[str, str], fields: dict[str, str]) -> bool:
    """A nodeSelectorTerm: every requirement holds; an empty term matches no node."""
    exprs, field_exprs = term.get("matchExpressions") or [], term.get("matchFields") or []
    if not exprs and not field_exprs:
        return False
    return (all(_expression(r, labels) for r in exprs)
            and all(_expression(r, fields) for r in field_exprs))


def _tolerated(taint: dict, tolerations: list[dict]) -> bool:
    for t in tolerations:
        if t.get("effect") and t["effect"] != taint.get("effect"):
            continue
        if t.get("operator") == "Exists":
            if not t.get("key") or t["key"] == taint.get("key"):
                return True
        elif t.get("key") == taint.get("key") and (t.get("value") or "") == \
                (taint.get("value") or ""):
            return True
    return False


def selects(pod_spec: dict, node: dict) -> bool:
    """Whether a DaemonSet with this pod template keeps its pod on this node."""
    labels = node.get("metadata", {}).get("labels") or {}
    fields = {"metadata.name": node.get("metadata", {}).get("name", "")}
    for key, value in (pod_spec.get("nodeSelector") or {}).items():
        if labels.get(key) != value:
            return False
    required = (((pod_spec.get("affinity") or {}).get("nodeAffinity") or {})
                .get("requiredDuringSchedulingIgnoredDuringExecution"))
    if required and not any(_term(t, labels, fields)
                            for t in required.get("nodeSelectorTerms") or []):
        return False
    tolerations = pod_spec.get("tolerations") or []
    return all(_tolerated(taint, tolerations)
               for taint in (node.get("spec") or {}).get("taints") or []
               if taint.get("effect") == "NoExecute" and taint.get("key") not in DAEMON_TOLERATED)


def leaving(ds: dict | None, node: dict | None, namespace: str, name: str,
            node_name: str) -> tuple[bool, str]:
    """(remove the datapath?, why) from the DaemonSet and Node as the API server has them."""
    where = f"DaemonSet {namespace}/{name}"
    if ds is None:
        return True, f"{where} is gone (uninstalled)"
    if ds.get("metadata", {}).get("deletionTimestamp"):
        return True, f"{where} is being deleted (uninstalled)"
    if node is None:
        return True, f"node {node_name} is gone from the cluster"
    pod_spec = ds.get("spec", {}).get("template", {}).get("spec", {})
    if not selects(pod_spec, node):
        return True, f"{where} no longer selects node {node_name}"
    return False, f"{where} still runs on node {node_name}: a restart or an update"


def decide(api: Any, namespace: str | None, name: str | None, node_name: str,
           watched: tuple[bool, dict | None] = (False, None),
           deadline: float = DEADLINE) -> tuple[bool, str]:
    """The decision at exit; every doubt keeps the datapath, an answer that does not come
    within `deadline` seconds too. `watched`: what the DaemonSet's watch saw last (known, the
    object or None): an uninstall it saw needs no question (kube/owner.py says why)."""
    if api is None or not name or not namespace:
        return False, "no DaemonSet to ask about (daemonsetName/daemonsetNamespace unset)"
    known, ds = watched
    if known and (ds is None or ds.get("metadata", {}).get("deletionTimestamp")):
        return leaving(ds, None, namespace, name, node_name)
    from kproxy_ebpf.kube.owner import daemonset_and_node

    answer: list = []

    def ask() -> None:
        try:
            answer.append(daemonset_and_node(api, namespace, name, node_name))
        except Exception as exc:   # noqa: BLE001 - any failure to ask keeps the datapath
            answer.append(exc)

    asking = threading.Thread(target=ask, name="ask-daemonset", daemon=True)
    asking.start()
    asking.join(deadline)
    got = answer[0] if answer else TimeoutError(f"no answer within {deadline:g}s")
    if isinstance(got, BaseException):
        reason = getattr(got, "reason", None) or got
        return False, (f"the API server did not answer whether DaemonSet {namespace}/{name} "
                       f"still runs here ({reason}): keeping the datapath to be safe; if this "
                       f"was an uninstall, run `kproxy-ebpf cleanup` on the node")
    ds, node = got
    return leaving(ds, node, namespace, name, node_name)
