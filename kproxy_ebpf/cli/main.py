"""The `kproxy-ebpf` command: the agent (`run`), what the kernel holds (`services`, `maps`,
`stats`), `cleanup`, and the local lab (`lab ...`).

The inspection commands read the pinned maps directly (no compile, no agent needed), so they
answer the operator's first question even when the agent is down: "what does this node's
datapath do with traffic to this service right now?"
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

import click

from kproxy_ebpf import __version__
from .cli_names import namespace_option, service_ref
from kproxy_ebpf.datapath.maps import svc_counters
from kproxy_ebpf.model.desired import Scope
from kproxy_ebpf.model.objects import Protocol, hostport
from kproxy_ebpf.agent.run import DEFAULT_BPFFS, run


def _bpffs_option(f):
    return click.option("--bpffs-dir", envvar="KPROXY_BPFFS_DIR", default=DEFAULT_BPFFS,
                        show_default=True, help="The agent's bpffs directory (pinned maps).")(f)


def _output_option(f=None, *, wide: bool = False, name: bool = False):
    """-o as kubectl's: json and yaml everywhere, wide only where the table has more columns
    to show and name only where rows have names (elsewhere they are refused, not ignored)."""
    choices = ["table", *(["wide"] if wide else []), "json", "yaml", *(["name"] if name else [])]
    text = ("Output format: table" + (", wide (the table with more columns)" if wide else "")
            + ", json, yaml" + (", name (one name a line, for scripts)" if name else "") + ".")
    option = click.option("-o", "--output", type=click.Choice(choices), default="table",
                          show_default=True, help=text)
    return option(f) if f is not None else option


def _table(header: tuple, lines: list[tuple]) -> None:
    """kubectl's column style: every column padded to its widest cell but the last."""
    widths = [max(len(str(x[i])) for x in [header, *lines]) for i in range(len(header) - 1)]
    for line in [header, *lines]:
        # strict=False: the last column is not padded, so widths stop before it.
        click.echo("  ".join(str(c).ljust(w) for c, w in zip(line, widths, strict=False))
                   + "  " + str(line[-1]))


def _si(n: int) -> str:
    """A count as kubectl prints quantities: 1234 -> 1.2k."""
    for unit, size in (("G", 10 ** 9), ("M", 10 ** 6), ("k", 10 ** 3)):
        if n >= size:
            return f"{n / size:.1f}{unit}"
    return str(n)


def _structured(data, output: str) -> bool:
    """Prints `data` as JSON or YAML when that is the output asked for (True), else leaves the
    table to the caller (False)."""
    if output == "json":
        click.echo(json.dumps(data, indent=2))
    elif output == "yaml":
        import yaml

        click.echo(yaml.safe_dump(data, sort_keys=False, default_flow_style=False), nl=False)
    else:
        return False
    return True


def _open_maps(bpffs_dir: str):
    from kproxy_ebpf.datapath.load.bpffs import open_pinned_maps

    maps = open_pinned_maps(Path(bpffs_dir))
    if "svc" not in maps:
        raise click.ClickException(
            f"no kproxy maps pinned under {bpffs_dir}: is the agent running on this node "
            "(or is --bpffs-dir / KPROXY_BPFFS_DIR pointing elsewhere)?")
    return maps


class _LazyGroup(click.Group):
    """`lab` and `bench` are imported only when asked for: they pull in the Kubernetes client
    models and pyroute2 (~0.35 s), which `run` (the agent's cold start) must not pay. The
    agent's image ships neither (Dockerfile): there they are not listed, and asking for one
    says so."""
    LAZY = {"lab": "kproxy_ebpf.dev.lab.cli", "bench": "kproxy_ebpf.dev.bench.cli"}

    @staticmethod
    def _installed(module: str) -> bool:
        import importlib.util

        try:
            return importlib.util.find_spec(module) is not None
        except ModuleNotFoundError:         # its package (lab/, bench/) is not there
            return False

    def list_commands(self, ctx):
        lazy = [n for n, mod in self.LAZY.items() if self._installed(mod)]
        return sorted(set(super().list_commands(ctx)) | set(lazy))

    def resolve_command(self, ctx, args):
        """click's, with a suggestion for a mistyped command (`service` -> `services`)."""
        if (args and not args[0].startswith("-") and args[0] not in self.LAZY
                and args[0] not in self.list_commands(ctx)):
            from .cli_names import suggestion

            ctx.fail(f'No such command "{args[0]}".'
                     + suggestion(args[0], self.list_commands(ctx)))
        return super().resolve_command(ctx, args)

    def get_command(self, ctx, name):
        if name in self.LAZY and name not in self.commands:
            import importlib

            if not self._installed(self.LAZY[name]):
                ctx.fail(f"`{name}` is not installed here: the agent's image holds the agent "
                         f"only; run `kproxy-ebpf {name}` from a source checkout")
            self.add_command(getattr(importlib.import_module(self.LAZY[name]), name))
        return super().get_command(ctx, name)


@click.group(cls=_LazyGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="kproxy-ebpf")
def main() -> None:
    """An eBPF replacement for kube-proxy."""


main.add_command(run)


def _backend_text(b: dict) -> str:
    if b.get("missing"):
        return f"{b['slot']}) <missing backend {b['id']}>"
    return f"{b['slot']}) {hostport(b['address'], b['port'])} ({b['state']})"


def _policy_text(p: dict, allowed: list[str] | None = None) -> str:
    """The Service's settings that differ from the defaults, e.g. 'eTP=Local,hc=32000', and
    the sources an LB frontend from outside admits ('allow=10.0.0.0/8|192.0.2.7/32')."""
    parts = [f"eTP={p['externalTrafficPolicy']}" if p.get("externalTrafficPolicy") == "Local" else "",
             f"iTP={p['internalTrafficPolicy']}" if p.get("internalTrafficPolicy") == "Local" else "",
             f"hc={p['healthCheckNodePort']}" if p.get("healthCheckNodePort") else "",
             f"srcRanges={p['loadBalancerSourceRanges']}" if p.get("loadBalancerSourceRanges") else "",
             f"dist={p['trafficDistribution']}" if p.get("trafficDistribution") else "",
             f"allow={'|'.join(allowed)}" if allowed is not None else ""]
    return ",".join(x for x in parts if x) or "-"


def _service_rows(maps, service: str | None) -> list[dict]:
    """reader.services, each row saying whom its frontend serves ("from": the node's own
    sockets, or packets from outside), limited to `service` (NS/NAME: an error when it has no
    frontend)."""
    from .cli_names import require_service
    from kproxy_ebpf.datapath.maps import reader

    rows = reader.services(maps)
    for r in rows:
        r["from"] = "outside" if r["scope"] else "node"
    if service:
        require_service(service, {r["service"].split(":")[0] for r in rows})
        rows = [r for r in rows if r["service"].split(":")[0] == service]
    return rows


@main.command()
@_bpffs_option
@_output_option(wide=True, name=True)
@click.option("--service", "service_filter", metavar="[NS/]NAME",
              help="Only this Service (any of its ports).")
@namespace_option
def services(bpffs_dir: str, output: str, service_filter: str | None,
             namespace: str | None) -> None:
    """Every frontend in the maps: address, port, protocol, type, whom it serves (the node's
    own sockets or packets from outside), backends and their state. -o wide adds each
    Service port's counters, one total over its frontends."""
    service = service_ref(service_filter, namespace)
    maps = _open_maps(bpffs_dir)
    rows = _service_rows(maps, service)
    counts = svc_counters.read(maps["svcstat"]) if "svcstat" in maps else {}
    for r in rows:      # the service port's for this frontend's scope, shared with its like
        key = svc_counters.CounterKey(r["service_id"], Scope.EXT if r["scope"] else Scope.SOCK)
        r["counters"] = counts.get(key, svc_counters.ServiceCounters()).as_dict()
    if output == "name":             # each service port once, as kubectl's -o name
        for name in dict.fromkeys(r["service"] for r in rows):
            click.echo(name)
        return
    if _structured(rows, output):
        return
    if not rows:
        click.echo("no services programmed")
        return
    _table(*_services_table(rows, wide=output == "wide"))


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
                      r["action"], aff, _policy_text(r.get("policy", {}), r.get("source_ranges")),
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


@main.command("watch")
@_bpffs_option
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

    from kproxy_ebpf.inspect import watch
    from kproxy_ebpf.datapath.maps import reader

    service_filter = service_ref(service_filter, namespace)
    if service_filter:
        # Not programmed: NotFound, as `kubectl get -w NAME`; a Service about to be created
        # is watched without --service (its "+" line comes when it is programmed).
        maps = _open_maps(bpffs_dir)
        _service_rows(maps, service_filter)
        for m in maps.values():
            m.close()

    def read() -> watch.Snapshot:
        maps = _open_maps(bpffs_dir)        # afresh: an agent that swaps its maps is followed
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
            _table(*_watch_table(snap))
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


# services -o wide: the service port's datapath counters (kp_svcstat).
_COUNTER_COLUMNS = ("CONNS", "PKTS IN/OUT", "BYTES IN/OUT", "REFUSED", "DROPPED", "DENIED")


def _counter_cells(c: dict) -> tuple:
    return (_si(c["conns"]), f"{_si(c['packets'])}/{_si(c['reply_packets'])}",
            f"{_si(c['bytes'])}/{_si(c['reply_bytes'])}", _si(c["refused"]),
            _si(c["dropped"]), _si(c["denied"]))


@main.group()
def maps() -> None:
    """Inspect the pinned BPF maps."""


def _fill(m) -> dict:
    """A map's entries and max_entries; None where there is no such figure: a per-CPU array
    has a value per key and CPU, never "entries", and socket storage has no capacity, its rows
    hang off their sockets and the map syscalls do not list them."""
    if m.spec.per_socket:
        return {"entries": None, "max_entries": None}
    return {"entries": None if m.spec.percpu else len(m), "max_entries": m.max_entries}


@maps.command("list")
@_bpffs_option
@_output_option(name=True)
def maps_list(bpffs_dir: str, output: str) -> None:
    """Each map: name, entries, capacity."""
    rows = [{"map": name, "pin": m.spec.name, **_fill(m)}
            for name, m in _open_maps(bpffs_dir).items()]
    if output == "name":
        click.echo("\n".join(r["map"] for r in rows))
        return
    if _structured(rows, output):
        return
    def cell(v) -> str:
        return "-" if v is None else str(v)

    _table(("MAP", "PIN", "ENTRIES", "MAX"),
           [(r["map"], r["pin"], cell(r["entries"]),
             cell(r["max_entries"]) if r["max_entries"] is not None
             else "- (one row per TCP socket, freed with it)") for r in rows])


@maps.command("dump")
@click.argument("name")
@_bpffs_option
@_output_option
def maps_dump(name: str, bpffs_dir: str, output: str) -> None:
    """Every row of map NAME (svc, backend, sknat, affinity, meta, stats), decoded.
    sksvc (a TCP socket's service address, in socket storage) cannot be listed."""
    from kproxy_ebpf.datapath.maps import reader

    maps_ = _open_maps(bpffs_dir)
    by_pin = {m.spec.name: k for k, m in maps_.items()}
    key = name if name in maps_ else by_pin.get(name)
    if key is None:
        raise click.ClickException(f"unknown map {name!r}; known: {', '.join(maps_)}")
    if maps_[key].spec.per_socket:
        raise click.ClickException(
            f"{maps_[key].spec.name} is socket storage: the map syscalls list no rows of it (each "
            "belongs to a TCP socket, for getpeername); `sknat` holds the UDP ones")
    rows = reader.dump(maps_[key])
    if _structured(rows, output):
        return
    for r in rows:
        click.echo(f"{json.dumps(r['key'])} => {json.dumps(r['value'])}"
                   + (f"  [{r['counter']}]" if "counter" in r else ""))


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


@main.command("trace")
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
@_bpffs_option
@_output_option
def trace_cmd(target: str, source: str | None, from_outside: bool, source_port: int | None,
              cgroup: str | None, explain: bool, bpffs_dir: str, output: str) -> None:
    """Every lookup the datapath would make for a connect or packet to ADDR:PORT, in order,
    from what the kernel holds: frontend, ServiceCIDR, source ranges, action, backends,
    affinity, conntrack; the verdict and the backend."""
    from kproxy_ebpf.model.desired import Scope
    from kproxy_ebpf.inspect.trace import trace

    ip, port, proto = _parse_target(target)
    maps = _open_maps(bpffs_dir)
    scope = Scope.EXT if from_outside else Scope.SOCK
    cookie = _netns_cookie(maps, source, cgroup) if source and not from_outside else None
    t = trace(maps, ip, port, proto, scope, source, cookie, source_port=source_port)
    if _structured(t.to_json(), output):
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


@main.command()
@_bpffs_option
@_output_option
def stats(bpffs_dir: str, output: str) -> None:
    """The socket hooks' counters (forward, reject, drop, affinity hits, ...)."""
    from kproxy_ebpf.datapath.maps import reader

    counters = reader.counters(_open_maps(bpffs_dir)["stats"])
    if not _structured(counters, output):
        for k, v in counters.items():
            click.echo(f"{k:<14} {v}")


# Where status looks for the hooks' cgroup: the host's cgroup v2 mounts (hybrid and unified
# layouts) and the chart's mount of the node's cgroup root inside the agent container.
STATUS_CGROUP_ROOTS = ("/sys/fs/cgroup/unified", "/sys/fs/cgroup", "/run/kproxy-ebpf/cgroup")
# The kernel's root cgroup (of the whole machine, not of a cgroup namespace) always has id 1.
ROOT_CGROUP_ID = 1


def _attach_warnings(hooks: list[dict]) -> list[str]:
    """The known trap of socket-level load balancers on kind (nodes are containers sharing one
    kernel): hooks on the machine's root cgroup translate the sockets of every node and of the
    host itself with this one node's view of the cluster."""
    at_root = [h["hook"] for h in hooks if h.get("pinned") and h.get("cgroup_id") == ROOT_CGROUP_ID]
    if not at_root:
        return []
    return [f"{', '.join(at_root)} attached to the machine's ROOT cgroup: every process on this "
            "host (other kind nodes sharing the kernel too) gets this node's Service "
            "translation. Attach to the node's own cgroup (on kind: the node container's "
            "cgroup namespace root), then `kproxy-ebpf cleanup` and restart the agent."]


@main.command()
@_bpffs_option
@_output_option
@click.option("--healthz", default="http://127.0.0.1:10256/healthz", show_default=True,
              help="The agent's health URL ('' skips it).")
def status(bpffs_dir: str, output: str, healthz: str) -> None:
    """Is kproxy on this node? Its hooks and cgroup, map fill, counters, agent health."""
    import urllib.error
    import urllib.request

    from kproxy_ebpf.datapath.maps import reader

    from . import status_text
    from kproxy_ebpf.datapath.load import tc

    maps_ = _open_maps(bpffs_dir)
    hooks = reader.hooks(Path(bpffs_dir), cgroup_roots=STATUS_CGROUP_ROOTS)
    out = {"bpffs_dir": bpffs_dir, "hooks": hooks,
           "tc": [{"device": d, "direction": w, "program": p} for d, w, p in tc.attached()],
           "maps": {k: _fill(m) for k, m in maps_.items()},
           "counters": reader.counters(maps_["stats"]),
           "families": status_text.node_families(),
           "warnings": _attach_warnings(hooks)}
    if healthz:
        try:
            # The body has a "status" of its own (kube-proxy's per-family health): kept apart.
            with urllib.request.urlopen(healthz, timeout=2) as r:
                out["agent"] = {"status": r.status, "healthz": json.loads(r.read())}
        except urllib.error.HTTPError as exc:
            out["agent"] = {"status": exc.code, "healthz": json.loads(exc.read() or b"{}")}
        except (OSError, ValueError) as exc:
            out["agent"] = {"status": None, "url": healthz, "error": str(exc)}
    if _structured(out, output):
        return
    click.echo(f"pinned under {bpffs_dir}")
    for h in out["hooks"]:
        where = (f"prog {h['prog_id']} on cgroup {h['cgroup'] or '?'} (id {h['cgroup_id']})"
                 if h["pinned"] else "NOT ATTACHED")
        click.echo(f"  {h['hook']:<13} {where}")
    for t in out["tc"] or [{"device": "-", "direction": "", "program": "no TC program in this "
                                                                     "network namespace"}]:
        click.echo(f"  tc {t['device']:<10} {t['direction']:<8} {t['program']}")
    for name, m in out["maps"].items():
        click.echo(f"  map {name:<9} {m['entries'] if m['entries'] is not None else '-':>7}"
                   f" / {m['max_entries'] if m['max_entries'] is not None else 'per socket'}")
    click.echo("  counters:")
    for row in status_text.counter_rows(out["counters"]):
        click.echo("    " + "".join(f"{c:<28}" for c in row).rstrip())
    for warning in out["warnings"]:
        click.echo(f"WARNING: {warning}")
    if "agent" in out:
        agent = out["agent"]
        if agent["status"] is None:
            click.echo(f"  agent: unreachable at {agent['url']} ({agent['error']}): the agent "
                       "serves it in its own network namespace, the node's; run status there "
                       "(in the lab: `kproxy-ebpf lab exec --node NODE -- kproxy-ebpf status "
                       "--bpffs-dir DIR`), or pass --healthz with its address ('' skips it)")
            return
        if agent["status"] in (200, 503):
            for line in status_text.health_sentences(agent["status"], agent.get("healthz") or {},
                                                     out["families"]):
                click.echo(f"  agent: {line}")
        else:
            click.echo(f"  agent: HTTP {agent['status']} from {healthz}")
        waiting = (agent.get("healthz") or {}).get("unprogrammed")
        if waiting:
            full = waiting.get("fullMaps") or []
            click.echo(f"WARNING: {waiting['frontends']} frontends are not programmed"
                       + (f": map(s) {', '.join(full)} full; raise mapSizes and restart "
                          "the agent (the maps are made anew at the new size while traffic "
                          "flows) or remove Services. "
                          if full else "; their writes failed (see the agent's log). ")
                       + "They are retried automatically.")


@main.command()
@click.option("--config", "config_file", type=click.Path(exists=True, dir_okay=False),
              help="The agent's configuration file, read as `run` reads it (then KPROXY_* "
                   "variables, then these flags): its kubeconfig, master, hostnameOverride, "
                   "bpffsDir, manifests and preferSameNode are used.")
@click.option("--bpffs-dir", help=f"The agent's bpffs directory.  [default: {DEFAULT_BPFFS}]")
@click.option("--kubeconfig", help="Compare with this cluster.  [default: in-cluster, then "
                                   "~/.kube/config]")
@click.option("--master", help="API server address, overriding the kubeconfig's.")
@click.option("--hostname-override", help="This node's name.  [default: the host name]")
@click.option("--manifests", multiple=True, help="Compare with these YAML files instead.")
@click.option("--all-nodes", is_flag=True,
              help="Ask every node's agent for its own check (its health port, /checkz): one "
                   "row per node.")
@click.option("--healthz-port", type=click.IntRange(1, 65535),
              help="The agents' health port for --all-nodes [the configured healthzBindAddress's, "
                   "10256].")
@_output_option
def check(config_file, all_nodes: bool, healthz_port: int | None, output: str, **flags) -> None:
    """Compare the datapath with what the cluster says; exit 1 on any difference."""
    from kproxy_ebpf.inspect import check as chk
    from kproxy_ebpf.config import ConfigError, load
    from kproxy_ebpf.datapath.maps import reader
    from kproxy_ebpf.kube.client import ConfigError as KubeConfigError

    try:
        cfg = load(config_file, overrides=flags)
        if all_nodes:
            _check_all_nodes(cfg, healthz_port, output)
        desired, cidrs = chk.wanted_for(cfg)
    except (ConfigError, KubeConfigError, chk.ApiUnreachable) as exc:
        raise click.ClickException(str(exc)) from exc
    maps = _open_maps(cfg.bpffs_dir)
    drifts = chk.compare(desired, reader.services(maps))
    if cidrs is not None and "clusterip" in maps:
        from kproxy_ebpf.datapath.write.cidr_writer import CidrWriter

        drifts += chk.compare_cidrs(cidrs, *CidrWriter(maps).held())
    for d in drifts:
        click.echo(str(d))
    rows = f", {len(cidrs.cluster_ips) + len(cidrs.foreign_ips)} ClusterIPs" if cidrs else ""
    click.echo(f"{len(desired)} frontends{rows} expected, {len(drifts)} differences")
    sys.exit(1 if drifts else 0)


def _check_all_nodes(cfg, port: int | None, output: str) -> None:
    """check --all-nodes: exits 0 when every node is clean, else 1."""
    from kproxy_ebpf.inspect import check_nodes
    from kproxy_ebpf.inspect.check import list_nodes

    port = port or int(cfg.healthz_bind_address.rpartition(":")[2] or 10256)
    reports = check_nodes.ask_all(
        [(n.metadata.name, check_nodes.node_address(n)) for n in list_nodes(cfg)], port)
    if not _structured([r.as_dict() for r in reports], output):
        _table(*check_nodes.table(reports))
        for r in reports:
            for line in (r.check or {}).get("drift", []):
                click.echo(f"{r.node}: {line}")
    sys.exit(0 if all(r.clean for r in reports) else 1)


@main.group()
def ct() -> None:
    """The TC paths' connection tracking (north-south flows, and pods' ClusterIP flows with
    --socket-lb=false)."""


@ct.command("list")
@_bpffs_option
@_output_option
@click.option("--service", "service_filter", metavar="[NS/]NAME",
              help="Only flows of this service (any of its ports).")
@namespace_option
def ct_list(bpffs_dir: str, output: str, service_filter: str | None,
            namespace: str | None) -> None:
    """Every tracked flow: path, client, frontend, backend, SNAT, state and time left."""
    from kproxy_ebpf.datapath.flows import conntrack

    service = service_ref(service_filter, namespace)
    maps = _open_maps(bpffs_dir)
    if service:
        _service_rows(maps, service)          # a Service with no frontend is an error
    rows = conntrack.entries(maps)
    if service:
        rows = [r for r in rows if (r["service"] or "").split(":")[0] == service]
    if _structured(rows, output):
        return
    if not rows:
        click.echo("no flows tracked")
        return
    header = ("SERVICE", "PATH", "PROTO", "CLIENT", "FRONTEND", "BACKEND", "SNAT", "STATE",
              "EXPIRES")
    lines = [(r["service"] or "?", r["path"], r["protocol"], r["client"], r["frontend"], r["backend"],
              r["snat"] or "-", r["state"], f"{r['expires_in_seconds']}s") for r in rows]
    _table(header, lines)


@main.command()
@_bpffs_option
@click.option("--yes", is_flag=True, help="Do not ask.")
@click.option("--kube-proxy-leftovers", is_flag=True,
              help="Instead: remove what kube-proxy left in this node's network namespace "
                   "(its KUBE-* iptables chains, legacy and nft, and its nftables tables), "
                   "as `kube-proxy --cleanup` does. kproxy's own pins stay.")
@click.option("--dry-run", is_flag=True, help="With --kube-proxy-leftovers: only list.")
@click.option("--program-cache", envvar="KPROXY_PROGRAM_CACHE",
              default="/var/cache/kproxy-ebpf/programs", show_default=True,
              help="The agent's compiled-program cache, emptied too ('' keeps it).")
def cleanup(bpffs_dir: str, yes: bool, kube_proxy_leftovers: bool, dry_run: bool,
            program_cache: str) -> None:
    """Detach the socket hooks and this netns's TC programs, remove the pinned maps
    (services stop being translated) and the compiled-program cache."""
    if kube_proxy_leftovers:
        _cleanup_kube_proxy(yes, dry_run)
        return
    from kproxy_ebpf.datapath.load.bpffs import remove_pins
    from kproxy_ebpf.datapath.load.progcache import remove as remove_program_cache

    if not Path(bpffs_dir).exists():
        click.echo(f"nothing pinned under {bpffs_dir}")
    elif not yes:
        click.confirm(f"Detach kproxy from this node and remove {bpffs_dir}?", abort=True)
    if program_cache and Path(program_cache).is_dir():
        # Keyed by its inputs, it can never serve wrong programs; it goes because an operator
        # cleaning up expects nothing of kproxy left on the node.
        for path in remove_program_cache(Path(program_cache)):
            click.echo(f"removed {path}")
    if not Path(bpffs_dir).exists():
        return
    from kproxy_ebpf.datapath.load.tc import detach_all

    for what in detach_all():
        click.echo(f"removed {what}")
    for path in remove_pins(Path(bpffs_dir)):
        click.echo(f"removed {path}")


def _cleanup_kube_proxy(yes: bool, dry_run: bool) -> None:
    from kproxy_ebpf.agent import kubeproxy_cleanup

    if not (yes or dry_run):
        click.confirm("Remove kube-proxy's iptables chains and nftables tables from this "
                      "node? (kube-proxy must not be running)", abort=True)
    report = kubeproxy_cleanup.cleanup(dry_run=dry_run)
    for item in report.removed:
        click.echo(f"{'would remove' if dry_run else 'removed'} {item}")
    if not report.removed:
        click.echo("no kube-proxy leftovers")
    for err in report.errors:
        click.echo(f"error: {err}", err=True)
    if report.errors:
        sys.exit(1)


if __name__ == "__main__":
    sys.exit(main())
