"""`kproxy-ebpf watch`: frontends and backends changing live, as the agent writes them."""
from __future__ import annotations

import sys

import click

from .names import namespace_option, service_ref
from .options import bpffs_option
from .output import table
from .pinned import open_maps, service_rows


@click.command("watch")
@bpffs_option
@namespace_option
@click.option("--service", "service_filter", metavar="[NS/]NAME",
              help="Only this service (any of its ports).")
@click.option("--interval", type=click.FloatRange(0.05), default=1.0, show_default=True,
              help="Seconds between polls of the maps.")
@click.option("--duration", type=click.FloatRange(0), default=None,
              help="Stop after this many seconds.  [default: until Ctrl-C]")
@click.option("--plain", is_flag=True, help="One line per change even on a terminal.")
def watch_command(bpffs_dir: str, namespace: str | None, service_filter: str | None,
                  interval: float, duration: float | None, plain: bool) -> None:
    """Frontends and backends changing live, as the agent writes them: the table redrawn in
    place on a terminal, one timestamped line per change otherwise (`kubectl scale` and
    watch the backends follow)."""
    import time

    from kproxy_ebpf.datapath.maps import reader
    from kproxy_ebpf.inspect import watch

    service_filter = service_ref(service_filter, namespace)
    if service_filter:
        # Not programmed: NotFound, as `kubectl get -w NAME`; a Service about to be created
        # is watched without --service (its "+" line comes when it is programmed).
        maps = open_maps(bpffs_dir)
        service_rows(maps, service_filter)
        for m in maps.values():
            m.close()

    def read() -> watch.Snapshot:
        maps = open_maps(bpffs_dir)        # afresh: an agent that swaps its maps is followed
        try:
            return watch.snapshot(reader.services(maps), service_filter)
        finally:
            for m in maps.values():
                m.close()

    tty = sys.stdout.isatty() and not plain
    recent: list[str] = []
    deadline = None if duration is None else time.monotonic() + duration
    try:
        for snap, changes in watch.follow(read, interval, deadline):
            stamp = time.strftime("%H:%M:%S")
            lines = [f"{stamp} {c.line()}" for c in changes]
            if not tty:
                if not changes:
                    click.echo(f"{stamp} watching {len(snap)} frontends"
                               f"{' of ' + service_filter if service_filter else ''}", err=True)
                for line in lines:
                    click.echo(line)
                sys.stdout.flush()
                continue
            recent = (recent + lines)[-10:]
            click.clear()
            click.echo(f"kproxy-ebpf watch: {len(snap)} frontends, every {interval:g}s "
                       f"(Ctrl-C to stop), {stamp}\n")
            table(*_watch_table(snap))
            click.echo("\nrecent changes:\n" + ("\n".join(recent) or "  none yet"))
    except KeyboardInterrupt:
        pass


def _watch_table(snap) -> tuple[tuple, list[tuple]]:
    header = ("SERVICE", "TYPE", "FRONTEND", "ACTION", "BACKENDS")
    lines = []
    for v in (snap[k] for k in sorted(snap, key=lambda k: (snap[k].service, k))):
        backends = [f"{a} ({s})" for a, s in v.backends.items()] or ["-"]
        lines.append((v.service, v.type, v.frontend, v.action, backends[0]))
        lines.extend(("",) * 4 + (b,) for b in backends[1:])
    return header, lines
