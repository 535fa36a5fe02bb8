"""`kproxy-ebpf check`: the datapath against what the cluster says, on this node or on all."""
from __future__ import annotations

import sys

import click

from kproxy_ebpf.agent.run import DEFAULT_BPFFS

from .options import output_option
from .output import structured, table
from .pinned import open_maps


@click.command()
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
@output_option
def check(config_file, all_nodes: bool, healthz_port: int | None, output: str, **flags) -> None:
    """Compare the datapath with what the cluster says; exit 1 on any difference."""
    from kproxy_ebpf.config import ConfigError, load
    from kproxy_ebpf.datapath.maps import reader
    from kproxy_ebpf.inspect import check as chk
    from kproxy_ebpf.kube.client import ConfigError as KubeConfigError

    try:
        cfg = load(config_file, overrides=flags)
        if all_nodes:
            _check_all_nodes(cfg, healthz_port, output)
        desired, cidrs = chk.wanted_for(cfg)
    except (ConfigError, KubeConfigError, chk.ApiUnreachable) as exc:
        raise click.ClickException(str(exc)) from exc
    maps = open_maps(cfg.bpffs_dir)
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
    if not structured([r.as_dict() for r in reports], output):
        table(*check_nodes.table(reports))
        for r in reports:
            for line in (r.check or {}).get("drift", []):
                click.echo(f"{r.node}: {line}")
    sys.exit(0 if all(r.clean for r in reports) else 1)
