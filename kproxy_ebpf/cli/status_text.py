"""`kproxy-ebpf status` in sentences: the agent's health as kube-proxy's /healthz body says
it, for the families this node has; the programs' counters as a table. Pure functions of what
the command read, so they are unit tested."""
from __future__ import annotations

import socket
from datetime import UTC, datetime


def node_families() -> list[str]:
    """The families this network namespace has a global address of (what the node proxies;
    the health body names both whatever the node has)."""
    import ipaddress

    from pyroute2 import IPRoute  # the agent's netlink library; loaded on use

    out = set()
    with IPRoute() as ipr:
        for a in ipr.get_addr():
            ip = ipaddress.ip_address(a.get_attr("IFA_ADDRESS"))
            if a["scope"] == 0 and not ip.is_loopback:      # RT_SCOPE_UNIVERSE
                out.add("IPv4" if a["family"] == socket.AF_INET else "IPv6")
    return sorted(out)


def _ago(stamp: str | None, now: datetime) -> str:
    if not stamp or stamp.startswith("0001-"):
        return "never"
    then = datetime.fromisoformat(stamp.replace("Z", "+00:00"))
    return f"{max(0.0, (now - then).total_seconds()):.0f} s ago"


def health_sentences(code: int, body: dict, families: list[str]) -> list[str]:
    """The /healthz answer (its HTTP code and kube-proxy's body) as sentences."""
    now = datetime.fromisoformat(body["currentTime"].replace("Z", "+00:00")) \
        if body.get("currentTime") else datetime.now(UTC)
    per = body.get("status") or {}
    last = _ago(next((v.get("lastUpdated") for v in per.values()), None), now)
    out = [("healthy" if code == 200 else "UNHEALTHY")
           + f": the last sync that programmed every change ended {last}."]
    if not body.get("healthy", True):
        out.append("A change has waited for a sync longer than the health timeout (2 x "
                   "syncPeriod): see the agent's log.")
    if body.get("nodeEligible") is False:
        out.append("The Node is not eligible (not seen yet, being deleted, or tainted "
                   "ToBeDeletedByClusterAutoscaler): load balancers drain it; Services are "
                   "still served.")
    for fam in families:
        if fam in per:
            out.append(f"{fam}: {'healthy' if per[fam].get('healthy') else 'UNHEALTHY'}.")
    return out


def counter_rows(counters: dict[str, int], columns: int = 3) -> list[tuple[str, ...]]:
    """The non-zero counters as rows of `columns` (name, value) pairs, in the order the
    programs number them; zeros are summed up in a last cell."""
    cells = [f"{name} {value}" for name, value in counters.items() if value]
    zero = [name for name, value in counters.items() if not value]
    if zero:
        cells.append(f"({len(zero)} others 0)")
    return [tuple(cells[i:i + columns]) for i in range(0, len(cells), columns)]
