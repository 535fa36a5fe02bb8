"""`kproxy-ebpf check --all-nodes`: every node's agent asked for its own drift check.

The Nodes come from the API server; each node's agent answers on its health port (kube-proxy's
10256, on the node's InternalIP): /checkz (self_check.py: the frontends it last computed against
its maps, its socket hooks) and /healthz (kube-proxy's: a change waiting too long for a sync).
A node is clean when both are; an agent that does not answer is a problem too. One row per
node, exit 1 on any problem.
"""
from __future__ import annotations

import json
import urllib.error
import urllib.request
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

from kproxy_ebpf.model.objects import hostport

TIMEOUT_S = 5.0       # a check walks every map: ~1 s at 10,000 Services


@dataclass
class NodeReport:
    node: str
    address: str | None
    healthz: int | None = None            # HTTP code of /healthz
    check: dict | None = None             # /checkz's body
    problems: list[str] = field(default_factory=list)

    @property
    def clean(self) -> bool:
        return not self.problems

    def as_dict(self) -> dict:
        return {"node": self.node, "address": self.address, "healthz": self.healthz,
                "clean": self.clean, "problems": self.problems, "check": self.check}


def node_address(node) -> str | None:
    """A V1Node's InternalIP (the first one), else its first address."""
    addrs = (node.status.addresses or []) if node.status else []
    internal = [a.address for a in addrs if a.type == "InternalIP"]
    return (internal or [a.address for a in addrs] or [None])[0]


def _get(url: str) -> tuple[int, dict]:
    try:
        with urllib.request.urlopen(url, timeout=TIMEOUT_S) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read() or b"{}")


def ask(name: str, address: str | None, port: int,
        get: Callable[[str], tuple[int, dict]] = _get) -> NodeReport:
    rep = NodeReport(name, address)
    if address is None:
        rep.problems.append("the Node has no address")
        return rep
    base = f"http://{hostport(address, port)}"
    try:
        rep.healthz, _ = get(base + "/healthz")
        code, rep.check = get(base + "/checkz")
    except (OSError, ValueError) as exc:
        reason = getattr(exc, "reason", exc)
        rep.problems.append(f"no agent answers at {base} ({reason})")
        return rep
    if code != 200:
        rep.problems.append(f"/checkz answered HTTP {code} (an agent older than this command?)")
        rep.check = None
    if rep.healthz != 200:
        rep.problems.append(f"/healthz {rep.healthz}: a change has waited too long for a sync")
    if rep.check is not None:
        rep.problems += rep.check.get("problems", [])
    return rep


def ask_all(nodes: list[tuple[str, str | None]], port: int,
            get: Callable[[str], tuple[int, dict]] = _get) -> list[NodeReport]:
    """Every node at once (a few seconds in all, not per node)."""
    with ThreadPoolExecutor(max(1, min(16, len(nodes)))) as pool:
        return list(pool.map(lambda n: ask(n[0], n[1], port, get), nodes))


def table(reports: list[NodeReport]) -> tuple[tuple, list[tuple]]:
    header = ("NODE", "ADDRESS", "HEALTHZ", "FRONTENDS", "DRIFT", "HOOKS", "STATUS")
    lines = []
    for r in reports:
        c = r.check or {}
        hooks = (f"{c['hooksAttached']} attached" + (f", {len(c['hooksDetached'])} detached"
                                                     if c.get("hooksDetached") else "")
                 if c else "-")
        lines.append((r.node, r.address or "-", r.healthz or "-",
                      c.get("frontends", "-") if c else "-",
                      c.get("driftCount", "-") if c else "-", hooks,
                      "ok" if r.clean else "; ".join(r.problems)))
    return header, lines
