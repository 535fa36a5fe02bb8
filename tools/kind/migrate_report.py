"""e2e/results/migrate-latest.md from the report of tools/kind/migrate.py: per proxy mode, one
table step x traffic kind (failed / all outcomes), the reasons, the leftover checks, and the
failures the kernel cannot avoid marked with why (docs/design/deployment.md)."""
from __future__ import annotations

import migrate_traffic as traffic  # type: ignore[import-not-found]

# Flows the TC path translated (NodePort from outside) live only in its own connection table:
# when the agent leaves a node its programs detach and such a TCP connection's next segment
# meets kube-proxy as a new connection (docs/design/deployment.md, "The agent's connections
# once it leaves"). UDP has no connection to break, but a flow may change backend.
KERNEL_BOUND = ("the agent leaves",)
KERNEL_REASON = ("TC-path flows from outside die when the agent's programs detach: their NAT "
                 "lived only in kp_ct, which the kernel's conntrack never saw "
                 "(docs/design/deployment.md)")
OUTSIDE_KINDS = {traffic.KINDS[("outside", "long")], traffic.KINDS[("outside", "udpflow")]}


def traffic_info() -> dict:
    return {"per_client": {"long_lived": traffic.LONG, "message_interval_ms": 100,
                           "new_per_s": traffic.RATE},
            "clients": "a pod per node (ClusterIP, DNS); one container on the kind network "
                       "with one client per node (NodePort TCP and UDP)",
            "backends": "a pod per node (DaemonSet), externalTrafficPolicy Cluster",
            "kinds": list(traffic.KINDS.values())}


def _short(label: str) -> str:
    return (label.replace("pod -> ", "pod→").replace("outside -> ", "out→")
            .replace("long-lived TCP (messages)", "long TCP").replace("connected UDP socket",
                                                                        "DNS conn")
            .replace("new sockets", "DNS new").replace("CoreDNS, ", "")
            .replace("UDP from new sockets", "UDP new").replace("one UDP flow", "UDP flow"))


def _cell(c: dict) -> str:
    total = c["ok"] + c["failed"]
    if not total:
        return "–"
    s = f"{c['failed']}/{total}"
    if c["broken"]:
        s += f" ({c['broken']} broken)"
    return f"**{s}**" if c["failed"] else s


def _expected(step: str, label: str) -> bool:
    return any(k in step for k in KERNEL_BOUND) and label in OUTSIDE_KINDS


def markdown(rep: dict) -> str:
    env = rep["environment"]
    out = ["# make migrate: kube-proxy -> kproxy-ebpf -> kube-proxy on a live kind cluster", "",
           f"{env['date']}, commit {env['commit']}, kernel {env['kernel']}, {env['cpus']} CPUs, "
           f"Kubernetes {env['kubernetes']}, kind {env['kind']}, {env['podman']}; "
           f"{env['nodes']}.", "",
           "Traffic the whole run (per client: "
           f"{rep['traffic']['per_client']['long_lived']} long-lived TCP connections, a message "
           f"each every 100 ms; {rep['traffic']['per_client']['new_per_s']} new TCP connections/s;"
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
        out += ["| step | s | " + " | ".join(_short(label) for label in labels) + " |",
                "|---|---|" + "---|" * len(labels)]
        notes = []
        for st in p.get("steps", []):
            cells = []
            for label in labels:
                c = st.get("counts", {}).get(label, {"ok": 0, "failed": 0, "broken": 0})
                cell = _cell(c)
                if c["failed"] and _expected(st["name"], label):
                    cell += " †"
                cells.append(cell)
                if c["failed"]:
                    notes.append(f"- {st['name']}, {label}: " + ", ".join(
                        f"{r or 'failed'} x{n}" for r, n in sorted(c["reasons"].items())))
            out.append(f"| {st['name']} | {st['seconds']} | " + " | ".join(cells) + " |")
        out += ["", "† " + KERNEL_REASON + ".", ""]
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
        pins = p.get("kproxy_pins_while_running")
        if pins:
            out.append(f"kproxy-ebpf's pins while it ran: {pins}.")
        kx = p.get("kproxy_leftovers", {})
        if kx:
            out.append(f"kproxy-ebpf's leftovers after helm uninstall (pins, TC filters, nft "
                       f"table, cgroup hooks): "
                       f"{'none on any node' if kx['clean'] else kx['nodes']} "
                       f"(checked until clean: {kx['after_s']} s).")
        if p.get("guard_after"):
            out.append(f"Egress guard drops before/after: {p.get('guard_before')} / "
                       f"{p['guard_after']}.")
        out.append("")
    return "\n".join(out)
