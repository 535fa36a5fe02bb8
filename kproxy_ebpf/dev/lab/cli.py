"""`kproxy-ebpf lab ...`: the local simulated cluster, as used by tests, the demo and benchmarks.
The command names and output formats are an interface (tests parse them): keep them stable."""
from __future__ import annotations

import json
import os
import sys
import time
from collections.abc import Mapping

import click

from .addressing import IP_FAMILY_CHOICES
from .lballoc import DEFAULT_POOL, DEFAULT_POOL6
from .nsutil import LabError

LAB_OPTION = click.option("--lab", "lab_name", default="lab", envvar="KPROXY_LAB",
                          show_default=True, help="Lab name (prefix of everything it makes).")


def _cluster(lab_name: str):
    from .cluster import Cluster

    return Cluster(lab_name)


def _target(pod: str | None, node: str | None, external: bool) -> str:
    chosen = [t for t in (pod and f"pod/{pod}", node and f"node/{node}", external and "ext") if t]
    if len(chosen) != 1:
        raise click.UsageError("give exactly one of --pod, --node, --external")
    return chosen[0]


def target_env(base: Mapping[str, str]) -> dict[str, str]:
    """Any target's: this checkout's commands (kproxy-ebpf, the venv's python) on PATH, as
    they are where the lab was started from."""
    env = dict(base)
    bin_dir = os.path.dirname(sys.executable)
    if bin_dir not in env.get("PATH", "").split(os.pathsep):
        env["PATH"] = os.pathsep.join(p for p in (bin_dir, env.get("PATH")) if p)
    return env


def node_env(c, node: str, base: Mapping[str, str]) -> dict[str, str]:
    """The environment of a command run on lab node `node` (see `exec`)."""
    env = target_env(base)
    info = c.lab.node(node)
    env.setdefault("KPROXY_BPFFS_DIR", info.bpffs)
    env.setdefault("KPROXY_CGROUP", info.cgroup)      # `trace --from POD_IP` finds its netns
    env.setdefault("KPROXY_HOSTNAME_OVERRIDE", node)
    try:
        env.setdefault("KPROXY_KUBECONFIG", c.info.lab_kubeconfig)
    except LabError:
        pass                      # a lab without a control plane: nothing to list from
    return env


def _where(f):
    f = click.option("--external", is_flag=True, help="The external client namespace.")(f)
    f = click.option("--node", help="A node's host network (and its host cgroup).")(f)
    return click.option("--pod", help="A pod (its namespace and cgroup).")(f)


@click.group()
def lab() -> None:
    """The local lab: nodes and pods as network namespaces, a real control plane."""


@lab.command()
@LAB_OPTION
@click.option("--nodes", default=2, show_default=True, type=click.IntRange(1, 20),
              help="Simulated nodes (network namespaces), each with its own proxy.")
@click.option("--proxy", type=click.Choice(["kproxy", "iptables", "nftables", "none"]),
              default="kproxy", show_default=True,
              help="Proxy per node: our agent, or upstream kube-proxy as the baseline.")
@click.option("--build", is_flag=True, help="Build missing control-plane binaries (tools/k8s).")
@click.option("--agent", type=click.Choice(["process", "image"]), default="process",
              show_default=True,
              help="With --proxy kproxy: run the agent as a host process, or from the image "
                   "(`make image`) with the Helm chart's DaemonSet pod spec, via podman.")
@click.option("--lb-pool", metavar="CIDR",
              help="Addresses the lab's LoadBalancer allocator writes into the status of "
                   "Services of type LoadBalancer (routed from the external client via node1); "
                   f"default {DEFAULT_POOL}, {DEFAULT_POOL6} in an IPv6 lab.")
@click.option("--ip-family", type=click.Choice(list(IP_FAMILY_CHOICES)), default="ipv4",
              show_default=True,
              help="The cluster's IP families: Service ranges, Node and pod addresses "
                   "(dual: IPv4 primary, IPv6 second).")
def up(lab_name: str, nodes: int, proxy: str, build: bool, agent: str, lb_pool: str | None,
       ip_family: str) -> None:
    """Bring up the control plane, the nodes, one proxy per node and the LB allocator."""
    c = _cluster(lab_name)
    try:
        t0 = time.monotonic()           # each step with the time since the start
        c.up(nodes=nodes, proxy=proxy, build=build,
             log=lambda m: click.echo(f"lab up: [+{time.monotonic() - t0:.0f}s] {m}"),
             agent=agent, lb_pool=lb_pool, ip_family=ip_family)
    except LabError as exc:
        raise click.ClickException(str(exc)) from exc
    click.echo(f"lab {lab_name} is up; kubeconfig: {c.info.admin_kubeconfig}")


@lab.command()
@LAB_OPTION
def down(lab_name: str) -> None:
    """Remove everything the lab made (processes, namespaces, cgroups, pins, state)."""
    problems = _cluster(lab_name).down()
    for p in problems:
        click.echo(f"lab down: {p}", err=True)
    if problems:
        sys.exit(1)
    click.echo(f"lab {lab_name} is down")


@lab.command()
@LAB_OPTION
def status(lab_name: str) -> None:
    """Nodes, pods and processes of the lab, as JSON."""
    c = _cluster(lab_name)
    if not c.lab.exists():
        raise click.ClickException(f"lab {lab_name} is not up")
    st = c.lab.status()
    try:
        st["cluster"] = c.info.__dict__
    except LabError:
        pass
    click.echo(json.dumps(st, indent=2))


@lab.command()
@LAB_OPTION
@click.argument("cidr")
@click.option("--via", "node", help="The node the external client sends CIDR to.")
@click.option("--delete", is_flag=True, help="Remove the route `lab route` added for CIDR.")
def route(lab_name: str, cidr: str, node: str | None, delete: bool) -> None:
    """Route CIDR (a LoadBalancer pool, ExternalIPs) from the external client to a node."""
    if delete == bool(node):
        raise click.UsageError("give --via NODE, or --delete")
    c = _cluster(lab_name)
    try:
        if delete:
            c.lab.delete_external_route(cidr)
        else:
            c.lab.add_external_route(cidr, node)
    except LabError as exc:
        raise click.ClickException(str(exc)) from exc
    click.echo(f"route {cidr} " + ("deleted" if delete else f"via {node}"))


@lab.command()
@LAB_OPTION
def kubeconfig(lab_name: str) -> None:
    """Print the path of the admin kubeconfig (for kubectl, helm, tests)."""
    try:
        click.echo(_cluster(lab_name).info.admin_kubeconfig)
    except LabError as exc:
        raise click.ClickException(str(exc)) from exc


@lab.group()
def pod() -> None:
    """Pods: a Pod object plus a namespace, a cgroup and an echo server."""


def _ports(text: str) -> tuple[tuple[str, int], ...]:
    out = []
    for item in filter(None, text.split(",")):
        proto, _, port = item.partition(":")
        if proto not in ("tcp", "udp") or not port.isdigit():
            raise click.BadParameter(f"{item!r}: use tcp:PORT or udp:PORT")
        out.append((proto, int(port)))
    return tuple(out)


def _labels(text: str) -> dict[str, str]:
    pairs = [p.split("=", 1) for p in filter(None, text.split(","))]
    if any(len(p) != 2 for p in pairs):
        raise click.BadParameter("use k=v,k2=v2")
    return dict(pairs)  # type: ignore[arg-type]


@pod.command("create")
@LAB_OPTION
@click.argument("name")
@click.option("--node", required=True)
@click.option("--labels", default="", help="k=v,k2=v2")
@click.option("--ports", default="tcp:8080,udp:5353", show_default=True)
@click.option("--not-ready", is_flag=True, help="Create the Pod with Ready=False.")
def pod_create(lab_name, name, node, labels, ports, not_ready) -> None:
    try:
        p = _cluster(lab_name).create_pod(name, node, _labels(labels), _ports(ports),
                                          ready=not not_ready)
    except LabError as exc:
        raise click.ClickException(str(exc)) from exc
    click.echo(f"pod {p.name} on {p.node}: {', '.join(p.ips)}")


@pod.command("delete")
@LAB_OPTION
@click.argument("name")
def pod_delete(lab_name, name) -> None:
    _cluster(lab_name).delete_pod(name)
    click.echo(f"pod {name} deleted")


@lab.command(context_settings={"ignore_unknown_options": True})
@LAB_OPTION
@_where
@click.argument("cmd", nargs=-1, required=True, type=click.UNPROCESSED)
def exec(lab_name, pod, node, external, cmd) -> None:  # noqa: A001 - the command's name
    """Run CMD in a pod, on a node's host network, or in the external client, with this
    checkout's kproxy-ebpf on PATH. On a node its commands need no flags: KPROXY_BPFFS_DIR,
    KPROXY_CGROUP, KPROXY_KUBECONFIG and KPROXY_HOSTNAME_OVERRIDE name that node's pins, its
    hook cgroup, the kubeconfig its agent uses and its name (unless already set)."""
    c = _cluster(lab_name)
    try:
        env = node_env(c, node, os.environ) if node else target_env(os.environ)
        rc = c.lab.exec(_target(pod, node, external), list(cmd), env=env).returncode
    except LabError as exc:
        raise click.ClickException(str(exc)) from exc
    sys.exit(rc)


@lab.command()
@LAB_OPTION
@_where
@click.argument("address", metavar="ADDR:PORT")
@click.option("--udp", is_flag=True)
@click.option("--count", default=1, show_default=True, type=click.IntRange(1))
@click.option("--timeout", default=1.0, show_default=True, type=float)
@click.option("--interval", default=0.0, show_default=True, type=float)
@click.option("--source", help="Send from this address of the target (e.g. a second address "
                               "of the external client).")
def probe(lab_name, pod, node, external, address, udp, count, timeout, interval, source) -> None:
    """One line per attempt: the server's line, REFUSED, TIMEOUT or ERROR <errno>."""
    host, _, port = address.rpartition(":")
    if not port.isdigit():
        raise click.BadParameter("ADDR:PORT")
    c = _cluster(lab_name)
    lines = c.lab.probe(_target(pod, node, external), host.strip("[]"), int(port), udp=udp,
                        count=count, timeout=timeout, interval=interval, source=source)
    for line in lines:
        click.echo(line)
    sys.exit(0 if all(not line.startswith(("REFUSED", "TIMEOUT", "ERROR", "WRONG"))
                      for line in lines) else 1)


@lab.command()
@LAB_OPTION
@click.option("--keep", is_flag=True, help="Leave the lab up (remove it with `lab down`).")
def demo(lab_name: str, keep: bool) -> None:
    """Two nodes with kproxy, two pods behind a Service, reached through its ClusterIP."""
    from .demo import run_demo

    ok = run_demo(_cluster(lab_name), keep=keep, echo=click.echo)
    sys.exit(0 if ok else 1)

