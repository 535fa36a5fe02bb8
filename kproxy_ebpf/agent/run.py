"""`kproxy-ebpf run`: the agent's command line, flags over KPROXY_* variables over the config
file (config.py), then the agent until a signal.

A module of its own, below cli.py: the lab checks the Helm chart's args against this very
command (lab/agent_image.py) without importing the command group that mounts the lab.
"""
from __future__ import annotations

import logging

import click

from kproxy_ebpf.model.objects import LBAlgorithm

DEFAULT_BPFFS = "/sys/fs/bpf/kproxy"


@click.command()
@click.option("--config", "config_file", type=click.Path(exists=True, dir_okay=False),
              help="YAML configuration file (camelCase keys, as kube-proxy's).")
@click.option("--kubeconfig", help="Kubeconfig.  [default: in-cluster, then ~/.kube/config]")
@click.option("--master", help="API server address, overriding the kubeconfig's.")
@click.option("--hostname-override", help="This node's name.  [default: the host name]")
@click.option("--bpffs-dir", help=f"Pin directory for maps and links.  [default: {DEFAULT_BPFFS}]")
@click.option("--program-cache",
              help="Directory of compiled programs reused across restarts ('' disables).  "
                   "[default: /var/cache/kproxy-ebpf/programs]")
@click.option("--cgroup", help="cgroup v2 directory the socket hooks attach to (required).")
@click.option("--min-sync-period", help="Shortest time between two syncs, e.g. 200ms.  [default: 200ms]")
@click.option("--sync-period", help="Longest time between two syncs, e.g. 30s; every 10th "
                                    "brings a drift check.  [default: 30s]")
@click.option("--healthz-bind-address", help="host:port of /healthz and /livez ('' disables).")
@click.option("--metrics-bind-address", help="host:port of /metrics ('' disables).")
@click.option("--manifests", multiple=True,
              help="Read Services/EndpointSlices from these YAML files or directories instead "
                   "of the API server (re-read when they change).")
@click.option("--north-south", type=click.BOOL, default=None,
              help="Serve NodePort/ExternalIP/LoadBalancer traffic from outside the node at TC "
                   "[true]; false leaves it to no one (--north-south=false).")
@click.option("--devices", multiple=True,
              help="External devices for the TC programs.  [default: from the routes]")
@click.option("--node-port-addresses", multiple=True,
              help="CIDRs (or 'primary') whose node addresses serve NodePorts.  [default: primary]")
@click.option("--external-ip-allowlist", multiple=True,
              help="Program only ExternalIPs inside these CIDRs (CVE-2020-8554).  [default: all]")
@click.option("--socket-lb", type=click.BOOL, default=None,
              help="Socket-level load balancing (cgroup hooks) [default: true]; false serves ClusterIPs "
                   "per packet at TC on the pod devices (--socket-lb=false).")
@click.option("--pod-devices", multiple=True,
              help="Globs of the pod-facing devices for --socket-lb=false.  [default: veth*,cali*,lxc*,kpv*]")
@click.option("--snat-port-range", help="SNAT source ports for remote backends.  [default: 61000-65535]")
@click.option("--lb-algorithm", type=click.Choice([a.value for a in LBAlgorithm]),
              help="How frontends pick a backend for a new connection [random]; round-robin "
                   "and least-conn as IPVS's rr and lc; maglev: every node picks the same one "
                   "for a flow from outside (a Service's annotation kproxy-ebpf.io/lb-algorithm "
                   "overrides it).")
@click.option("--maglev-table-size", type=int,
              help="Entries of a Maglev table, a prime; grown to 1000 per backend.  [default: 16381]")
@click.option("--kube-proxy-cleanup", type=click.Choice(["off", "dry-run", "on"]),
              help="Remove kube-proxy's leftovers from this node once kube-proxy no longer runs "
                   "here (on), only list them in the log (dry-run), or leave them.  [default: off]")
@click.option("--log-level", type=click.Choice(["debug", "info", "warning", "error"]),
              help="The agent's log level.  [default: info]")
def run(config_file, **flags) -> None:
    """Run the agent: watch the cluster and program this node's datapath."""
    from kproxy_ebpf.config import ConfigError, load

    try:
        cfg = load(config_file, overrides=flags)
        cfg.validate()
    except ConfigError as exc:
        raise click.ClickException(str(exc)) from exc
    logging.basicConfig(level=cfg.log_level.upper(),
                        format="%(asctime)s %(levelname).1s %(name)s: %(message)s")
    from kproxy_ebpf.datapath.load.kernel import KernelUnsupported
    from kproxy_ebpf.datapath.maps.pinned import LayoutMismatch

    from .agent import Agent

    try:
        Agent(cfg).run_until_signalled()
    except (LayoutMismatch, KernelUnsupported) as exc:
        raise click.ClickException(f"refusing to run: {exc}") from exc
