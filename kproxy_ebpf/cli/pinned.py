"""What the inspection commands read from the pinned maps: the maps themselves (an error that
says where to look when there are none), their fill, and the Services' frontends."""
from __future__ import annotations

from pathlib import Path

import click


def open_maps(bpffs_dir: str):
    from kproxy_ebpf.datapath.load.bpffs import open_pinned_maps

    maps = open_pinned_maps(Path(bpffs_dir))
    if "svc" not in maps:
        raise click.ClickException(
            f"no kproxy maps pinned under {bpffs_dir}: is the agent running on this node "
            "(or is --bpffs-dir / KPROXY_BPFFS_DIR pointing elsewhere)?")
    return maps


def fill(m) -> dict:
    """A map's entries and max_entries; None where there is no such figure: a per-CPU array
    has a value per key and CPU, never "entries", and socket storage has no capacity, its rows
    hang off their sockets and the map syscalls do not list them."""
    if m.spec.per_socket:
        return {"entries": None, "max_entries": None}
    return {"entries": None if m.spec.percpu else len(m), "max_entries": m.max_entries}


def service_rows(maps, service: str | None) -> list[dict]:
    """reader.services, each row saying whom its frontend serves ("from": the node's own
    sockets, or packets from outside), limited to `service` (NS/NAME: an error when it has no
    frontend)."""
    from kproxy_ebpf.datapath.maps import reader

    from .names import require_service

    rows = reader.services(maps)
    for r in rows:
        r["from"] = "outside" if r["scope"] else "node"
    if service:
        require_service(service, {r["service"].split(":")[0] for r in rows})
        rows = [r for r in rows if r["service"].split(":")[0] == service]
    return rows
