"""`kubectl kproxy ...` (the `kubectl-kproxy` script this package installs): the inspection
commands run in the kproxy-ebpf agent pod of the node asked for, from anywhere kubectl
reaches the cluster, as Cilium's CLI finds its agents.

    kubectl kproxy services --node NODE [ARGS...]     # in NODE's agent pod: kproxy-ebpf services ARGS
    kubectl kproxy status --all-nodes                 # on every node, one after the other
    kubectl kproxy check --all-nodes                  # every agent's own check (one pod asks all)

Its own options come before the command: --node, --all-nodes, --namespace (where the agents
run, kube-system), --context and --kubeconfig (passed to kubectl). `kubectl_complete-kproxy`
(also installed) completes them, the commands and node names for `kubectl kproxy <TAB>`. The agents are found by
the chart's label (app.kubernetes.io/name=kproxy-ebpf), the container by its name, agent.
Only kubectl and this module: nothing of the agent is imported.
"""
from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Sequence

LABEL = "app.kubernetes.io/name=kproxy-ebpf"
CONTAINER = "agent"
# Commands that read one node's maps; `check --all-nodes` asks every agent from one pod.
PER_NODE = ("services", "trace", "watch", "status", "stats", "maps", "ct", "check")
ALL_NODES = ("status", "stats", "services", "maps", "ct")

USAGE = """usage: kubectl kproxy [--node NODE | --all-nodes] [--namespace NS] [--context CTX]
                      [--kubeconfig FILE] COMMAND [ARGS...]
Runs `kproxy-ebpf COMMAND ARGS` in the kproxy-ebpf agent pod of NODE (or of every node with
--all-nodes, for status, stats, services, maps and ct). COMMAND is one of: """ + ", ".join(PER_NODE)


class PluginError(Exception):
    """A sentence for the user (exit 1)."""


def _parse(argv: Sequence[str]) -> tuple[dict, list[str]]:
    opts: dict = {"node": None, "all_nodes": False, "namespace": "kube-system", "kubectl": []}
    args = list(argv)
    while args and args[0].startswith("-"):
        flag = args.pop(0)
        name, eq, value = flag.partition("=")
        if name in ("-h", "--help"):
            raise SystemExit(print(USAGE) or 0)
        if name == "--all-nodes":
            opts["all_nodes"] = True
            continue
        if not eq:
            if not args:
                raise PluginError(f"{name} needs a value")
            value = args.pop(0)
        if name == "--node":
            opts["node"] = value
        elif name in ("-n", "--namespace"):
            opts["namespace"] = value
        elif name in ("--context", "--kubeconfig"):
            opts["kubectl"] += [f"{name}={value}"]
        else:
            raise PluginError(f"unknown option {name} (kproxy-ebpf's own options go after "
                              "the command)")
    if not args:
        raise PluginError("give a command: " + ", ".join(PER_NODE))
    if args[0] not in PER_NODE:
        raise PluginError(f"{args[0]} is not a command kubectl kproxy runs on a node; one of: "
                          + ", ".join(PER_NODE))
    return opts, args


def agents(opts: dict) -> dict[str, str]:
    """node name -> the name of its running agent pod."""
    r = subprocess.run(["kubectl", *opts["kubectl"], "-n", opts["namespace"], "get", "pods",
                        "-l", LABEL, "-o", "json"], capture_output=True, text=True)
    if r.returncode != 0:
        raise PluginError(f"kubectl could not list the agent pods: {r.stderr.strip()}")
    out = {}
    for pod in json.loads(r.stdout).get("items", []):
        if (pod.get("status") or {}).get("phase") == "Running":
            out[pod["spec"]["nodeName"]] = pod["metadata"]["name"]
    if not out:
        raise PluginError(f"no running kproxy-ebpf agent in namespace {opts['namespace']} "
                          f"(label {LABEL}): is the chart installed there (--namespace)?")
    return out


def _exec(opts: dict, pod: str, args: list[str]) -> int:
    return subprocess.run(["kubectl", *opts["kubectl"], "-n", opts["namespace"], "exec", pod,
                           "-c", CONTAINER, "--", "kproxy-ebpf", *args]).returncode


def main(argv: Sequence[str] | None = None) -> int:
    try:
        opts, args = _parse(sys.argv[1:] if argv is None else argv)
        pods = agents(opts)
        if args[0] == "check" and "--all-nodes" in args:
            return _exec(opts, next(iter(sorted(pods.values()))), args)
        if opts["all_nodes"]:
            if args[0] not in ALL_NODES:
                raise PluginError(f"--all-nodes runs {', '.join(ALL_NODES)}; for check use "
                                  "`kubectl kproxy check --all-nodes`")
            rc = 0
            for name in sorted(pods):
                print(f"== node {name} ({pods[name]})", flush=True)
                rc = max(rc, _exec(opts, pods[name], args))
            return rc
        node = opts["node"] or (next(iter(pods)) if len(pods) == 1 else None)
        if node is None:
            raise PluginError("give --node NODE (agents run on " + ", ".join(sorted(pods))
                              + ") or --all-nodes")
        if node not in pods:
            raise PluginError(f"no running kproxy-ebpf agent on node {node}; agents run on "
                              + ", ".join(sorted(pods)))
        return _exec(opts, pods[node], args)
    except PluginError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1


OWN_OPTIONS = ("--node", "--all-nodes", "--namespace", "--context", "--kubeconfig")


def complete(argv: Sequence[str] | None = None) -> int:
    """kubectl's plugin completion (kubectl_complete-<plugin>, kubectl 1.26+): the words
    typed so far, the last one partial; candidates one a line, then cobra's directive (4: no
    file names)."""
    args = list(sys.argv[1:] if argv is None else argv) or [""]
    word, before = args[-1], args[:-1]
    if before and before[-1] == "--node":
        r = subprocess.run(["kubectl", "get", "nodes", "-o", "jsonpath={.items[*].metadata.name}"],
                           capture_output=True, text=True)
        choices = r.stdout.split()
    elif any(a in PER_NODE for a in before):
        choices = []                      # kproxy-ebpf's own arguments: its completion's
    else:
        choices = [*PER_NODE, *OWN_OPTIONS]
    for c in choices:
        if c.startswith(word):
            print(c)
    print(":4")
    return 0


if __name__ == "__main__":
    sys.exit(main())
