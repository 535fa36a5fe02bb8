"""What kproxy does on this node: `status` (hooks, maps, counters, agent health) and `stats`
(the socket hooks' counters)."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import click

from .options import bpffs_option, output_option
from .output import structured
from .pinned import fill, open_maps


@click.command()
@bpffs_option
@output_option
def stats(bpffs_dir: str, output: str) -> None:
    """The socket hooks' counters (forward, reject, drop, affinity hits, ...)."""
    from kproxy_ebpf.datapath.maps import reader

    counters = reader.counters(open_maps(bpffs_dir)["stats"])
    if not structured(counters, output):
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


@click.command()
@bpffs_option
@output_option
@click.option("--healthz", default="http://127.0.0.1:10256/healthz", show_default=True,
              help="The agent's health URL ('' skips it).")
def status(bpffs_dir: str, output: str, healthz: str) -> None:
    """Is kproxy on this node? Its hooks and cgroup, map fill, counters, agent health."""
    import urllib.error
    import urllib.request

    from kproxy_ebpf.datapath.load import tc
    from kproxy_ebpf.datapath.maps import reader

    from . import status_text

    maps_ = open_maps(bpffs_dir)
    hooks = reader.hooks(Path(bpffs_dir), cgroup_roots=STATUS_CGROUP_ROOTS)
    out: dict[str, Any] = {"bpffs_dir": bpffs_dir, "hooks": hooks,
           "tc": [{"device": d, "direction": w, "program": p, "via": v}
                  for d, w, p, v in tc.attachments()],
           "maps": {k: fill(m) for k, m in maps_.items()},
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
    if structured(out, output):
        return
    click.echo(f"pinned under {bpffs_dir}")
    for h in out["hooks"]:
        where = (f"prog {h['prog_id']} on cgroup {h['cgroup'] or '?'} (id {h['cgroup_id']})"
                 if h["pinned"] else "NOT ATTACHED")
        click.echo(f"  {h['hook']:<13} {where}")
    for t in out["tc"] or [{"device": "-", "direction": "", "program": "no TC program in this "
                                                                     "network namespace"}]:
        via = f" ({t['via']})" if t.get("via") else ""
        click.echo(f"  tc {t['device']:<10} {t['direction']:<8} {t['program']}{via}")
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
