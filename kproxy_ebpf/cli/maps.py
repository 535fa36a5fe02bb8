"""`kproxy-ebpf maps ...` and `ct ...`: the pinned maps and the TC paths' conntrack, row by
row."""
from __future__ import annotations

import json

import click

from .names import namespace_option, service_ref
from .options import bpffs_option, output_option
from .output import structured, table
from .pinned import fill, open_maps, service_rows


@click.group()
def maps() -> None:
    """Inspect the pinned BPF maps."""


@maps.command("list")
@bpffs_option
@output_option(name=True)
def maps_list(bpffs_dir: str, output: str) -> None:
    """Each map: name, entries, capacity."""
    rows = [{"map": name, "pin": m.spec.name, **fill(m)}
            for name, m in open_maps(bpffs_dir).items()]
    if output == "name":
        click.echo("\n".join(r["map"] for r in rows))
        return
    if structured(rows, output):
        return
    def cell(v) -> str:
        return "-" if v is None else str(v)

    table(("MAP", "PIN", "ENTRIES", "MAX"),
          [(r["map"], r["pin"], cell(r["entries"]),
            cell(r["max_entries"]) if r["max_entries"] is not None
            else "- (one row per TCP socket, freed with it)") for r in rows])


@maps.command("dump")
@click.argument("name")
@bpffs_option
@output_option
def maps_dump(name: str, bpffs_dir: str, output: str) -> None:
    """Every row of map NAME (svc, backend, sknat, affinity, meta, stats), decoded.
    sksvc (a TCP socket's service address, in socket storage) cannot be listed."""
    from kproxy_ebpf.datapath.maps import reader

    maps_ = open_maps(bpffs_dir)
    by_pin = {m.spec.name: k for k, m in maps_.items()}
    key = name if name in maps_ else by_pin.get(name)
    if key is None:
        raise click.ClickException(f"unknown map {name!r}; known: {', '.join(maps_)}")
    if maps_[key].spec.per_socket:
        raise click.ClickException(
            f"{maps_[key].spec.name} is socket storage: the map syscalls list no rows of it (each "
            "belongs to a TCP socket, for getpeername); `sknat` holds the UDP ones")
    rows = reader.dump(maps_[key])
    if structured(rows, output):
        return
    for r in rows:
        click.echo(f"{json.dumps(r['key'])} => {json.dumps(r['value'])}"
                   + (f"  [{r['counter']}]" if "counter" in r else ""))


@click.group()
def ct() -> None:
    """The TC paths' connection tracking (north-south flows, and pods' ClusterIP flows with
    --socket-lb=false)."""


@ct.command("list")
@bpffs_option
@output_option
@click.option("--service", "service_filter", metavar="[NS/]NAME",
              help="Only flows of this service (any of its ports).")
@namespace_option
def ct_list(bpffs_dir: str, output: str, service_filter: str | None,
            namespace: str | None) -> None:
    """Every tracked flow: path, client, frontend, backend, SNAT, state and time left."""
    from kproxy_ebpf.datapath.flows import conntrack

    service = service_ref(service_filter, namespace)
    maps = open_maps(bpffs_dir)
    if service:
        service_rows(maps, service)          # a Service with no frontend is an error
    rows = conntrack.entries(maps)
    if service:
        rows = [r for r in rows if (r["service"] or "").split(":")[0] == service]
    if structured(rows, output):
        return
    if not rows:
        click.echo("no flows tracked")
        return
    header = ("SERVICE", "PATH", "PROTO", "CLIENT", "FRONTEND", "BACKEND", "SNAT", "STATE",
              "EXPIRES")
    lines = [(r["service"] or "?", r["path"], r["protocol"], r["client"], r["frontend"], r["backend"],
              r["snat"] or "-", r["state"], f"{r['expires_in_seconds']}s") for r in rows]
    table(header, lines)
