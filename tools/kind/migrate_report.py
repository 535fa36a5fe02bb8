"""e2e/results/migrate-latest.md from the report of tools/kind/migrate.py: per proxy mode, one
table step x traffic kind (failed / all outcomes), the reasons, the leftover checks, and the
failures the kernel cannot avoid marked with why (docs/design/deployment.md)."""
from __future__ import annotations

import re

import migrate_traffic as traffic  # type: ignore[import-not-found]

LOG_LEVEL_WE = re.compile(r" [WE] \S+: ")     # a warning or error line of the agent's log

# Failures the kernel cannot avoid, by step and traffic kind, with why (the classes
# docs/design/deployment.md describes under "Existing connections across the switch").
LEAVES = ("the agent leaves", "†",
          "flows the TC path translated (NodePort from outside) lived only in its own connection "
          "table (kp_ct), which the kernel's conntrack never saw: when the agent's programs "
          "detach, such a TCP connection's next segment meets kube-proxy as a new connection "
          "and is reset, and a UDP flow is balanced anew. When the detach falls between a "
          "request and its answer (or a new connection's greeting) from a remote backend, the "
          "answer meets the node's own stack, which has no socket at the SNAT port and resets "
          "the backend: the waiting client gets nothing and times out (TimeoutError, not a "
          "reset). Marked for a new TCP connection or UDP query only when every failure of the "
          "cell ended by 2.5 s after the agent was gone")
STARTS = ("agent starts beside kube-proxy", "‡",
          "UDP has no mid-stream mark: a datagram of a flow kube-proxy's conntrack carried has "
          "no row in kp_ct and is balanced as new, so a long UDP flow may change backend "
          "(telling it apart needs bpf_skb_ct_lookup, which bcc 0.26 cannot call)")
QDISC = ("agent starts beside kube-proxy", "§",
         "the node's first attach creates the clsact qdisc on its external device, and the "
         "kernel deactivates the device while it grafts one (qdisc_graft -> dev_deactivate): "
         "what the node sends out of it in that instant is dropped (tools/probes/"
         "attach_loss.sh qdisc: 1-3 of 4,000 UDP answers lost in 8 of 20 qdiscs created, none in 20 "
         "runs without). A lost "
         "UDP query or answer times out; a lost SYN-ACK of kube-proxy's makes the client send "
         "its SYN again 1 s later, now to the TC path, which may pick another backend while "
         "kube-proxy's retransmits its SYN-ACK too: one of the two resets the connection. "
         "Marked only when every failure of the cell ended within 2.7 s of the attach "
         "(tc attached at, from the agent's log)")
OUTSIDE_TCP = {traffic.KINDS[(w, k)] for w in traffic.OUTSIDE_SOURCES
               for k in ("long", "cycled")}
UDP_FLOW = traffic.KINDS[("outside", "udpflow")]
# The cells of new connections and queries from outside: label -> (source, client kind).
AT_ATTACH = {traffic.KINDS[(w, k)]: (w, k) for w in traffic.OUTSIDE_SOURCES
             for k in ("new", "udp")}


# What the report shows of the TC path's counters: flows opened, SNATed, whose client port
# moved (a reply tuple another flow held), and mid-stream packets of flows it did not open.
TC_COUNTERS = ("tc_forward", "tc_snat", "tc_port_moved", "tc_midstream")


def _failure_times(st: dict, label: str) -> list[float]:
    """When (s since the step began) the failures of a new-connection cell from outside were."""
    if label not in AT_ATTACH:
        return []
    where, kind = AT_ATTACH[label]
    return [a for key, v in st.get("by_node", {}).items() if key.startswith(where + ":")
            and key.rsplit(" ", 1)[-1] == kind for a in v["at_s"]]


def _at_attach(st: dict, label: str) -> bool:
    """Every failure of the cell ended within [T - 0.2, T + 2.7] s of the TC attach T."""
    t = (st.get("info") or {}).get("tc_attached_at_s")
    times = _failure_times(st, label)
    return t is not None and bool(times) and all(t - 0.2 <= a <= t + 2.7 for a in times)


def _at_detach(st: dict, label: str) -> bool:
    """Every failure of the cell ended by 2.5 s after the agent was gone."""
    gone = (st.get("info") or {}).get("agent_gone_s")
    times = _failure_times(st, label)
    return gone is not None and bool(times) and all(a <= gone + 2.5 for a in times)


def _expected(st: dict, label: str) -> str:
    step = st["name"]
    if LEAVES[0] in step and (label in OUTSIDE_TCP or label == UDP_FLOW
                              or _at_detach(st, label)):
        return LEAVES[1]
    if STARTS[0] in step and label == UDP_FLOW:
        return STARTS[1]
    if QDISC[0] in step and _at_attach(st, label):
        return QDISC[1]
    return ""


def traffic_info() -> dict:
    return {"per_client": {"long_lived": traffic.LONG, "message_interval_ms": 100,
                           "new_per_s": traffic.RATE},
            "clients": "a pod per node (ClusterIP, DNS); a host-network pod per node (ClusterIP "
                       "TCP); one container on the kind network "
                       "with two clients per node (NodePort TCP and UDP, eTP Cluster and "
                       "Local)",
            "backends": "a pod per node (DaemonSet), behind a NodePort Service with "
                        "externalTrafficPolicy Cluster and one with Local",
            "cycled_per_client": traffic.CYCLED, "cycled_lifetime_s": traffic.LIFETIME,
            "kinds": list(traffic.KINDS.values())}


def _short(label: str) -> str:
    for a, b in (("pod -> ", "pod→"), ("node -> ", "node→"), ("outside -> ", "out→"), ("CoreDNS, ", "DNS "),
                 (" eTP Local,", " Local,"),
                 ("long-lived TCP (messages)", "long TCP"), ("connected UDP socket", "conn"),
                 ("TCP reopened every 20 s (messages)", "TCP 20 s"),
                 ("UDP from new sockets", "UDP new"), ("new sockets", "new"),
                 ("one UDP flow", "UDP flow")):
        label = label.replace(a, b)
    return label


def _cell(c: dict) -> str:
    total = c["ok"] + c["failed"]
    if not total:
        return "–"
    s = f"{c['failed']}/{total}"
    if c["broken"]:
        s += f" ({c['broken']} broken)"
    return f"**{s}**" if c["failed"] else s


def _drops(g: dict) -> dict:
    """A guard reading (hack/kind-guard.sh) as {where: packets}: each node and the host."""
    return {**g.get("nodes", {}), "host": g.get("host", 0)}


def guard_by_step(p: dict) -> list[dict]:
    """Per step, the guards' drops in it: {where: packets} (only where some were dropped)."""
    prev, out = _drops(p.get("guard_before", {})), []
    for st in p.get("steps", []):
        if "guard_after" not in st:
            out.append({})
            continue
        now = _drops(st["guard_after"])
        out.append({k: v - prev.get(k, 0) for k, v in now.items() if v - prev.get(k, 0)})
        prev = now
    return out


def guard_log_lines(p: dict) -> list[str]:
    """The host guard's logged drops grouped by step and flow (source, destination, port)."""
    groups: dict = {}
    for e in p.get("guard_log", []):
        key = (e.get("step"), e.get("PROTO"), e.get("SRC"), e.get("DST"), e.get("DPT"),
               " ".join(e.get("flags", [])))
        groups.setdefault(key, []).append(e["t"])
    starts = {st["name"]: st["start"] for st in p.get("steps", [])}
    return [f"- {step or 'outside the steps'}: {n} x {proto} {src} -> {dst}:{dpt}"
            f"{' ' + fl if fl else ''} (at {', '.join(f'{t - starts.get(step, t):.1f}' for t in ts[:5])} s)"
            for (step, proto, src, dst, dpt, fl), ts in groups.items() for n in [len(ts)]]


def markdown(rep: dict) -> str:
    env = rep["environment"]
    out = ["# make migrate: kube-proxy -> kproxy-ebpf -> kube-proxy on a live kind cluster", "",
           f"{env['date']}, commit {env['commit']}, kernel {env['kernel']}, {env['cpus']} CPUs, "
           f"Kubernetes {env['kubernetes']}, kind {env['kind']}, {env['podman']}; "
           f"{env['nodes']}.", "",
           "Traffic the whole run (per client: "
           f"{rep['traffic']['per_client']['long_lived']} long-lived TCP connections, a message "
           f"each every 100 ms, kept the whole run (*long*), and {rep['traffic']['cycled_per_client']} "
           f"reopened every {rep['traffic']['cycled_lifetime_s']} s, staggered (*20 s*); "
           f"{rep['traffic']['per_client']['new_per_s']} new TCP connections/s;"
           " as many DNS queries/s per socket kind and UDP queries/s): "
           f"{rep['traffic']['clients']}; backends: {rep['traffic']['backends']}.",
           "A cell is failed/all outcomes in that step (a long-lived TCP outcome is one 100 ms "
           "message; *broken* counts connections lost); bold = failures. `make migrate` writes "
           "this file.", ""]
    for p in rep["passes"]:
        out += [f"## kube-proxy {p['mode']} -> kproxy-ebpf -> kube-proxy {p['mode']}", "",
                f"Nodes: {', '.join(p.get('nodes', []))}. Pass took {p.get('seconds')} s "
                f"(cluster up {p.get('cluster_up_s')} s).", ""]
        if p.get("error"):
            out += [f"**The pass stopped: {p['error']}** (the steps before are counted).", ""]
        labels = list(traffic.KINDS.values())
        out += ["| step | s | " + " | ".join(_short(label) for label in labels) + " | guard drops |",
                "|---|---|" + "---|" * (len(labels) + 1)]
        notes = []
        guards = guard_by_step(p)
        for st, guard in zip(p.get("steps", []), guards, strict=True):
            cells = []
            for label in labels:
                c = st.get("counts", {}).get(label, {"ok": 0, "failed": 0, "broken": 0})
                cell = _cell(c)
                if c["failed"] and _expected(st, label):
                    cell += " " + _expected(st, label)
                cells.append(cell)
                if c["failed"]:
                    notes.append(f"- {st['name']}, {label}: " + ", ".join(
                        f"{r or 'failed'} x{n}" for r, n in sorted(c["reasons"].items())))
            waits = ", ".join(f"{k.removesuffix('_s').replace('_', ' ')} {v} s"
                              for k, v in info.items()) if isinstance(info := st.get("info"), dict) else ""
            name = f"{st['name']} ({waits})" if waits else st["name"]
            drops = ", ".join(f"**{v} {k.removeprefix(p.get('cluster', '') + '-')}**"
                              for k, v in guard.items()) or "0"
            out.append(f"| {name} | {st['seconds']} | " + " | ".join(cells) + f" | {drops} |")
        out += ["", f"{LEAVES[1]} Expected, kernel-bound: {LEAVES[2]}.",
                f"{STARTS[1]} Expected, kernel-bound: {STARTS[2]}.",
                f"{QDISC[1]} Expected with a clsact attach (only on a kernel without tcx: the "
                f"agent attaches tcx links, no qdisc, since issue 45; tools/probes/"
                f"attach_loss.sh tcx lost 0 in 20 attaches, twice): {QDISC[2]}.",
                "A bold cell without a mark is not explained by these (the reasons and the "
                "times are below and in the JSON's by_node).", ""]
        if notes:
            out += ["Failure reasons:", "", *notes, ""]
        kp = p.get("kube_proxy_leftovers", {})
        before = p.get("kube_proxy_rules_before", {})
        if before:
            out.append("kube-proxy's chains/tables before the migration: " + ", ".join(
                f"{n} {len(v['chains'])} chains, {len(v['nft_tables'])} nft tables"
                for n, v in before.items()))
        if kp:
            out.append(f"kube-proxy's leftovers after its DaemonSet went: "
                       f"{'none on any node' if kp['clean'] else kp['nodes']} "
                       f"(checked until clean: {kp['after_s']} s).")
        running = p.get("kproxy_while_running")
        if running:
            out.append("What the same check finds while the agents run: " + "; ".join(
                f"{n} " + ", ".join(f"{v} {k}" for k, v in found.items())
                for n, found in running.items()) + ".")
        kx = p.get("kproxy_leftovers", {})
        if kx:
            out.append(f"kproxy-ebpf's leftovers after helm uninstall (pins, TC filters, nft "
                       f"table, cgroup hooks): "
                       f"{'none on any node' if kx['clean'] else kx['nodes']} "
                       f"(checked until clean: {kx['after_s']} s).")
        if p.get("guard_after") and p.get("guard_before"):
            b, a = p["guard_before"], p["guard_after"]
            during = a["host"] - b["host"] + sum(v - b["nodes"].get(n, 0)
                                                 for n, v in a["nodes"].items())
            out.append(f"Egress guards (packets leaving the kind network, dropped): {during} "
                       f"during the pass (before it: {b}; after it: {a}); per step in the "
                       f"table's last column (host = the host's side).")
        if p.get("probe_failures"):
            out.append("Probe failures of the traffic's pods (events Unhealthy): " + "; ".join(
                f"{e['pod']} x{e['count']} {e['first']}..{e['last']}: {e['message']}"
                for e in p["probe_failures"]) + ".")
        if p.get("agent_log"):
            out.append("The agents' log at their leave (purges, warnings, errors; the lines in "
                       "the JSON's agent_log): " + ", ".join(
                           f"{n.removeprefix(p.get('cluster', '') + '-')} "
                           f"{sum('purged' in ln for ln in lines)} purges, "
                           f"{sum(bool(LOG_LEVEL_WE.search(ln)) for ln in lines)} warnings "
                           "or errors" for n, lines in p["agent_log"].items()) + ".")
            for n, lines in p["agent_log"].items():
                for i, ln in enumerate(lines):
                    if "Traceback (most recent call last)" in ln:
                        # its last line, the exception: the first not indented after it
                        end = next((j for j in range(i + 1, len(lines))
                                    if not lines[j].partition(" ")[2].startswith(" ")), i)
                        out.append(f"**A traceback in {n}'s agent log** (a defect): "
                                   f"{lines[end].partition(' ')[2]}")
        if p.get("agent_counters"):
            out.append("The TC path's counters at each agent's leave (`kproxy-ebpf stats`): "
                       + "; ".join(f"{n.removeprefix(p.get('cluster', '') + '-')} "
                                   + ", ".join(f"{k} {c.get(k, 0)}" for k in TC_COUNTERS)
                                   for n, c in p["agent_counters"].items()) + ".")
        if p.get("guard_log"):
            out += ["", "The host guard's dropped packets (its kernel log):", "",
                    *guard_log_lines(p)]
        out.append("")
    return "\n".join(out)
