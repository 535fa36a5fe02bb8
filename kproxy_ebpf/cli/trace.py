"""`kproxy-ebpf trace`: every lookup the datapath would make for one connect or packet."""
from __future__ import annotations

import click

from kproxy_ebpf.model.objects import Protocol

from .options import bpffs_option, output_option
from .output import structured
from .pinned import open_maps


def _parse_target(text: str) -> tuple[str, int, Protocol]:
    addr, _, proto = text.partition("/")
    host, _, port = addr.rpartition(":")
    host = host.strip("[]")
    try:
        import ipaddress

        ipaddress.ip_address(host)
        return str(ipaddress.ip_address(host)), int(port), Protocol(proto.upper() or "TCP")
    except ValueError as exc:
        raise click.BadParameter(f"{text!r}: expected ADDR:PORT[/TCP|UDP|SCTP], e.g. "
                                 "10.96.0.10:53/UDP or [fd00::10]:80") from exc


def _netns_cookie(maps, ip: str, cgroup: str | None) -> int | None:
    """The netns cookie of the namespace sending from `ip`: kp_nssrc first (filled while a
    Service has source ranges), else a walk of the namespaces under `cgroup`."""
    from kproxy_ebpf.datapath.maps import layout as L

    for key, value in maps["nssrc"].items() if "nssrc" in maps else ():
        if L.ip_text(bytes(value)) == ip:
            return key.netns
    if cgroup:
        from kproxy_ebpf.datapath.sockets.netns_sources import cookie_of

        return cookie_of(ip, cgroup)
    return None


@click.command("trace")
@click.argument("target", metavar="ADDR:PORT[/PROTO]")
@click.option("--from", "source", metavar="IP",
              help="The client's address (a pod's, the node's, or an outside client's).")
@click.option("--from-outside", is_flag=True,
              help="A packet from outside the node (the TC path) instead of a connect from a "
                   "pod or the node (the socket hooks).")
@click.option("--from-port", "source_port", type=click.IntRange(1, 65535), metavar="PORT",
              help="The outside client's source port: names the backend a Maglev table gives "
                   "that flow.")
@click.option("--cgroup", envvar="KPROXY_CGROUP",
              help="The agent's hook cgroup, to find the pod with the --from address (its "
                   "ClientIP affinity row is keyed by its network namespace).")
@click.option("--explain", is_flag=True, help="Say why at each step.")
@bpffs_option
@output_option
def trace_cmd(target: str, source: str | None, from_outside: bool, source_port: int | None,
              cgroup: str | None, explain: bool, bpffs_dir: str, output: str) -> None:
    """Every lookup the datapath would make for a connect or packet to ADDR:PORT, in order,
    from what the kernel holds: frontend, ServiceCIDR, source ranges, action, backends,
    affinity, conntrack; the verdict and the backend."""
    from kproxy_ebpf.inspect.trace import trace
    from kproxy_ebpf.model.desired import Scope

    ip, port, proto = _parse_target(target)
    maps = open_maps(bpffs_dir)
    scope = Scope.EXT if from_outside else Scope.SOCK
    cookie = _netns_cookie(maps, source, cgroup) if source and not from_outside else None
    t = trace(maps, ip, port, proto, scope, source, cookie, source_port=source_port)
    if structured(t.to_json(), output):
        return
    click.echo(f"TRACE {t.frontend} ({'from outside: TC' if from_outside else 'socket hooks'}"
               f"{', from ' + source if source else ''})")
    width = max(len(s.step) for s in t.steps)
    for s in t.steps:
        click.echo(f"{s.step.upper():<{width}}  {s.found}")
        if explain and s.why:
            click.echo(f"{'':<{width}}    {s.why}")
    if t.verdict == "forward":
        to = (f"-> {t.chosen}" if t.chosen
              else f"-> one of {len(t.candidates)} backends at random")
    else:
        to = ""
    click.echo(f"{'VERDICT':<{width}}  {t.verdict.value} {to}".rstrip())
