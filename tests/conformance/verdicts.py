"""Outcomes of a Service scenario, reduced to text that can be compared across proxies.

A *cell* is what one client saw over a batch of attempts: the set of backends reached and the
source address they saw ("a1,b1 from pod"), or the failure verdict ("REFUSED", "TIMEOUT",
"ERROR ENETUNREACH"), or both joined by " + " when a batch mixed them. Source addresses are
named by role (pod: the client pod's own IP; node: the client node's IP), so cells of two labs
compare equal when the behaviour is the same.

Every cell is recorded (RESULTS) and printed as a table test x proxy at the end of the run
(conftest.py). kube-proxy nftables is the reference: a kproxy cell that differs from it must be
listed in DIVERGENCES, with the reason, and the scenario asserts that listed difference.

Families: each proxy runs in an IPv4 lab, and ours and nftables also in an IPv6 and a
dual-stack lab (`lab up --ip-family`); their cells are columns of their own ("kproxy ipv6"),
compared with nftables of the same family. In the dual-stack lab every Service is
RequireDualStack and each check also runs against its IPv6 twin (the Service's IPv6 ClusterIP,
the node's IPv6 address): that cell's check name ends in TWIN. Cells name sources by role in
every family, so one family's cells read like the other's.
"""
from __future__ import annotations

import json
from collections import defaultdict
from dataclasses import dataclass

from kproxy_ebpf.dev.lab.probe import is_reply

PROXIES = ("kproxy", "image", "nftables", "iptables")
FAMILIES = ("ipv4", "ipv6", "dual")
# The labs of the families other than IPv4: only our agent and the reference (image and
# iptables repeat, per family, what kproxy and nftables prove).
FAMILY_PROXIES = ("kproxy", "nftables")
TWIN = " [IPv6]"
# Our agent as a host process, and from the container image with the Helm chart's pod spec
# (capabilities, mounts, token: `lab up --agent image`); both must give the same cells.
OURS = ("kproxy", "image")
REFERENCE = "nftables"


@dataclass(frozen=True)
class Divergence:
    kproxy: str  # the cell kproxy gives
    reason: str
    # Set when other work in progress will make kproxy match nftables: until then either cell
    # is accepted (the table says which one it was), and the row goes once that work lands.
    until: str = ""


# (scenario, check) -> what kproxy deliberately does instead of kube-proxy's cell. Keep in step
# with docs/design/testing.md ("Where kproxy differs from kube-proxy").
DIVERGENCES: dict[tuple[str, str], Divergence] = {
    ("itp_local_no_local_endpoint", "tcp pod"): Divergence(
        "ERROR EHOSTUNREACH",
        "internalTrafficPolicy Local with no local endpoint: kube-proxy drops the packets and "
        "the client waits for its own timeout; the socket hook fails connect() at once"),
    ("itp_local_no_local_endpoint", "tcp host"): Divergence(
        "ERROR EHOSTUNREACH", "as for pod clients"),
    ("itp_local_no_local_endpoint", "udp pod"): Divergence(
        "ERROR EHOSTUNREACH", "as for TCP: sendto() fails at once instead of a silent drop"),
    ("no_endpoints_refused", "udp host"): Divergence(
        "REFUSED",
        "UDP from a host process to a Service without endpoints: kube-proxy's REJECT runs in "
        "the OUTPUT hook, so the datagram is dropped inside sendto(), which fails with EPERM; "
        "the socket hook fails sendto() with ECONNREFUSED, as for pods and for TCP"),
    ("deleted_service", "tcp pod"): Divergence(
        "ERROR EHOSTUNREACH",
        "an address inside a ServiceCIDR that no Service holds: kube-proxy nftables drops it and "
        "the client waits for its own timeout; the socket hook fails connect() at once, as for "
        "internalTrafficPolicy Local"),
    ("labels_for_other_proxies", "service-proxy-name"): Divergence(
        "ERROR ENETUNREACH",
        "both ignore a Service owned by another proxy, but nftables then drops its ClusterIP as "
        "unallocated while kproxy leaves it untouched for that proxy to translate (a connect "
        "failed in the socket hook would never reach it); with no other proxy in the lab the "
        "connect goes out untranslated and the lab router answers network unreachable"),
    # North-south (test_north_south.py).
    ("nodeport_etp_cluster", "tcp ext -> node1, backend on node1"): Divergence(
        "npl-1 from ext",
        "externalTrafficPolicy Cluster: kube-proxy masquerades every external connection; the TC "
        "path SNATs only when the backend is on another node (the reply has to come back through "
        "this node then). A local backend's reply passes this node anyway, so it keeps the "
        "client's address, as Cilium's does"),
    ("nodeport_etp_cluster", "udp ext -> node1, backend on node1"): Divergence(
        "npl-1 from ext", "as for TCP"),
    ("nodeport_etp_cluster", "tcp pod -> node1"): Divergence(
        "npr-2 from pod",
        "a pod's connection to a NodePort (eTP Cluster): kube-proxy DNATs it on the node and "
        "masquerades it; the socket hook picks the backend at connect() and the pod connects to "
        "it directly, so no NAT is on the path and the backend sees the pod (as for ClusterIPs)"),
    ("nodeport_etp_cluster", "udp pod -> node1"): Divergence(
        "npr-2 from pod", "as for TCP"),
    ("external_ip_and_load_balancer_ip", "tcp pod -> LB IP"): Divergence(
        "eip-2 from pod", "as for a pod's connection to a NodePort: served by the socket hook"),
}

# RESULTS[(scenario, check)][column(proxy, family)] = cell
RESULTS: dict[tuple[str, str], dict[str, str]] = defaultdict(dict)


def column(proxy: str, family: str) -> str:
    return proxy if family == "ipv4" else f"{proxy} {family}"


def divergence(scenario: str, check: str) -> Divergence | None:
    """The listed difference of a cell, if any: the same in every family (a TWIN cell is
    listed under its check's name)."""
    return DIVERGENCES.get((scenario, check.removesuffix(TWIN)))


def cell(lines: list[str], roles: dict[str, str]) -> str:
    """Summarise probe lines (`<pod> <ip>:<port>`, `<pod> [<ip>]:<port>` or a failure) into
    one cell; `roles` names client source IPs ({"10.244.1.10": "pod", "10.250.0.11":
    "node"})."""
    backends, sources, failures = set(), set(), set()
    for line in lines:
        if is_reply(line):
            pod, peer = line.split()[:2]
            backends.add(pod)
            ip = peer.rpartition(":")[0].strip("[]")
            sources.add(roles.get(ip, ip))
        else:
            failures.add(line)
    parts = []
    if backends:
        parts.append(f"{','.join(sorted(backends))} from {','.join(sorted(sources))}")
    parts += sorted(failures)
    return " + ".join(parts) or "-"


def sticky_cell(lines: list[str], roles: dict[str, str]) -> str:
    """Like cell(), but counts the backends instead of naming them (for affinity, where which
    backend a client sticks to is random): "1 backend from pod"."""
    text = cell(lines, roles)
    head, sep, rest = text.partition(" from ")
    if not sep or "+" in text:
        return text
    n = len(head.split(","))
    return f"{n} backend{'s' if n > 1 else ''} from {rest}"


def http_cell(output: str) -> str:
    """A health check answer ("<status> <JSON body>", or a probe verdict) as a cell: the status
    and every field of the body, nested keys dotted, in key order, so a field one proxy adds,
    drops or spells differently shows in the table."""
    code, _, body = output.strip().partition(" ")
    if not code.isdigit():
        return output.strip() or "-"

    def flat(obj: object, prefix: str = "") -> list[str]:
        if isinstance(obj, dict):
            return [x for k in sorted(obj) for x in flat(obj[k], f"{prefix}{k}.")]
        return [f"{prefix[:-1]}={obj if isinstance(obj, str) else json.dumps(obj)}"]
    return " ".join([code, *flat(json.loads(body))])


def expected(scenario: str, check: str, proxy: str, want: str | dict[str, str]) -> set[str]:
    """The cells `proxy` may give. `want` is kube-proxy's behaviour (one cell, or one per mode
    where iptables and nftables differ); kproxy must give the nftables cell unless the row is a
    listed divergence (or a pending one: then either)."""
    reference = want if isinstance(want, str) else want[REFERENCE]
    if proxy in OURS:
        div = divergence(scenario, check)
        if div:
            return {div.kproxy, reference} if div.until else {div.kproxy}
        return {reference}
    return {want if isinstance(want, str) else want[proxy]}


def record(scenario: str, check: str, proxy: str, value: str, family: str = "ipv4") -> None:
    RESULTS[(scenario, check)][column(proxy, family)] = value


def compare_row(row: dict[str, str], key: tuple[str, str], family: str = "ipv4") -> str:
    """For one family's columns: '=' (kproxy matches nftables), 'listed' (a listed
    divergence, as listed), 'pending' (a divergence other work will remove), 'MISMATCH', or ''
    when the row lacks one of the two."""
    ours, image, ref = (column(p, family) for p in ("kproxy", "image", REFERENCE))
    if image in row and ours in row and row[image] != row[ours]:
        return "MISMATCH"               # the chart's pod spec changed what the agent does
    if ours not in row or ref not in row:
        return ""
    if row[ours] == row[ref]:
        return "="
    div = divergence(*key)
    if div and div.kproxy == row[ours]:
        return "pending" if div.until else "listed"
    return "MISMATCH"


def table() -> tuple[list[str], int]:
    """The matrix as text lines, and the number of unlisted kproxy/nftables mismatches."""
    columns = [column(p, f) for f in FAMILIES for p in PROXIES]
    columns = [c for c in columns if any(c in row for row in RESULTS.values())]
    families = [f for f in FAMILIES if column(REFERENCE, f) in columns]
    head = ["scenario", "check", *columns, *(column("kproxy vs nftables", f) for f in families)]
    rows = []
    mismatches = 0
    for key in sorted(RESULTS):
        row = RESULTS[key]
        verdicts = [compare_row(row, key, f) for f in families]
        mismatches += verdicts.count("MISMATCH")
        rows.append([key[0], key[1], *(row.get(c, "") for c in columns), *verdicts])
    widths = [max(len(r[i]) for r in [head, *rows]) for i in range(len(head))]
    fmt = "  ".join(f"{{:<{w}}}" for w in widths)
    out = [fmt.format(*head), fmt.format(*("-" * w for w in widths))]
    out += [fmt.format(*r) for r in rows]
    return out, mismatches
