"""`kproxy-ebpf services`: every frontend in the maps, with -o wide its Service port's
counters."""
from __future__ import annotations

import click

from kproxy_ebpf.datapath.flows import conn_counts
from kproxy_ebpf.datapath.maps import svc_counters
from kproxy_ebpf.model.desired import Scope
from kproxy_ebpf.model.objects import hostport

from .names import namespace_option, service_ref
from .options import bpffs_option, output_option
from .output import si, structured, table
from .pinned import open_maps, service_rows


def _backend_text(b: dict) -> str:
    if b.get("missing"):
        return f"{b['slot']}) <missing backend {b['id']}>"
    conns = f" {b['active']}/{b['inactive']}" if "active" in b else ""
    return f"{b['slot']}) {hostport(b['address'], b['port'])} ({b['state']}){conns}"


def _policy_text(p: dict, allowed: list[str] | None = None) -> str:
    """The Service's settings that differ from the defaults, e.g. 'eTP=Local,hc=32000', and
    the sources an LB frontend from outside admits ('allow=10.0.0.0/8|192.0.2.7/32')."""
    parts = [f"eTP={p['externalTrafficPolicy']}" if p.get("externalTrafficPolicy") == "Local" else "",
             f"iTP={p['internalTrafficPolicy']}" if p.get("internalTrafficPolicy") == "Local" else "",
             f"hc={p['healthCheckNodePort']}" if p.get("healthCheckNodePort") else "",
             f"srcRanges={p['loadBalancerSourceRanges']}" if p.get("loadBalancerSourceRanges") else "",
             f"dist={p['trafficDistribution']}" if p.get("trafficDistribution") else "",
             f"lb={p['algorithm']}" if p.get("algorithm", "random") != "random" else "",
             f"allow={'|'.join(allowed)}" if allowed is not None else ""]
    return ",".join(x for x in parts if x) or "-"


@click.command()
@bpffs_option
@output_option(wide=True, name=True)
@click.option("--service", "service_filter", metavar="[NS/]NAME",
              help="Only this Service (any of its ports).")
@namespace_option
def services(bpffs_dir: str, output: str, service_filter: str | None,
             namespace: str | None) -> None:
    """Every frontend in the maps: address, port, protocol, type, whom it serves (the node's
    own sockets or packets from outside), backends and their state. -o wide adds each
    Service port's counters, one total over its frontends, and each backend's active/inactive
    connections on this node (ipvsadm's ActiveConn/InActConn: sockets of least-conn Services
    and TC flows open, TC flows closing)."""
    service = service_ref(service_filter, namespace)
    maps = open_maps(bpffs_dir)
    rows = service_rows(maps, service)
    if output not in ("table", "name"):      # what ipvsadm -Ln showed, per backend
        conns = conn_counts.per_backend(maps)
        for b in (b for r in rows for b in r["backends"] if not b.get("missing")):
            b.update(conns.get(b["id"], conn_counts.Conns()).as_dict())
    counts = svc_counters.read(maps["svcstat"]) if "svcstat" in maps else {}
    for r in rows:      # the service port's for this frontend's scope, shared with its like
        key = svc_counters.CounterKey(r["service_id"], Scope.EXT if r["scope"] else Scope.SOCK)
        r["counters"] = counts.get(key, svc_counters.ServiceCounters()).as_dict()
    if output == "name":             # each service port once, as kubectl's -o name
        for name in dict.fromkeys(r["service"] for r in rows):
            click.echo(name)
        return
    if structured(rows, output):
        return
    if not rows:
        click.echo("no services programmed")
        return
    table(*_services_table(rows, wide=output == "wide"))


def _services_table(rows: list[dict], wide: bool) -> tuple[tuple, list[tuple]]:
    """`services`' header and lines (a frontend's further backends on lines of their own)."""
    header = ("SERVICE", "TYPE", "FRONTEND", "FROM", "ACTION", "AFFINITY", "POLICY",
              *(_COUNTER_COLUMNS if wide else ()), "BACKENDS")
    lines = []
    scopes: dict[str, dict] = {}      # the counters of the service port's rows so far, by FROM
    for i, r in enumerate(rows):
        backends = [_backend_text(b) for b in r["backends"]] or ["-"]
        aff = f"{r['affinity_timeout']}s" if r["affinity_timeout"] else "-"
        counters: tuple = ("",) * len(_COUNTER_COLUMNS) if wide else ()
        lines.append((r["service"], r["type"],
                      f"{hostport(r['address'], r['port'])}/{r['protocol']}", r["from"],
                      r["action"], aff, _policy_text({**r.get("policy", {}), "algorithm": r.get(
                          "algorithm")}, r.get("source_ranges")),
                      *counters, backends[0]))
        lines.extend(("",) * (len(header) - 1) + (b,) for b in backends[1:])
        scopes.setdefault(r["from"], r["counters"])
        last = i + 1 == len(rows) or rows[i + 1]["service_id"] != r["service_id"]
        if wide and last:
            # The counters are the service port's per scope (kp_svcstat keys by both): a line
            # each after its (consecutive) frontends, saying whose they are.
            for where, label in _SCOPE_LINES:
                if where in scopes:
                    lines.append((r["service"], label, "", where, "", "", "",
                                  *_counter_cells(scopes[where]), ""))
        if last:
            scopes = {}
    return header, lines


_SCOPE_LINES = (("node", "(all from the node)"), ("outside", "(all from outside)"))

# services -o wide: the service port's datapath counters (kp_svcstat).
_COUNTER_COLUMNS = ("CONNS", "PKTS IN/OUT", "BYTES IN/OUT", "REFUSED", "DROPPED", "DENIED")


def _counter_cells(c: dict) -> tuple:
    return (si(c["conns"]), f"{si(c['packets'])}/{si(c['reply_packets'])}",
            f"{si(c['bytes'])}/{si(c['reply_bytes'])}", si(c["refused"]),
            si(c["dropped"]), si(c["denied"]))
