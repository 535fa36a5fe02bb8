"""The `kproxy-ebpf` command: the agent (`run`), what the kernel holds (`services`, `maps`,
`stats`), `cleanup`, and the local lab (`lab ...`).

The inspection commands read the pinned maps directly (no compile, no agent needed), so they
answer the operator's first question even when the agent is down: "what does this node's
datapath do with traffic to this service right now?"

Each command lives in a module of its own job; this one is the root group they hang from (and
the entry point, `python -m kproxy_ebpf.cli.main` as well as the console script). Their heavy
imports stay inside the command bodies, so each pays only for what it runs.
"""
from __future__ import annotations

import sys

import click

from kproxy_ebpf import __version__
from kproxy_ebpf.agent.run import run

from .check import check
from .cleanup import cleanup
from .maps import ct, maps
from .mount import LazyGroup
from .node import stats, status
from .services import services
from .trace import trace_cmd
from .watch import watch_command


@click.group(cls=LazyGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="kproxy-ebpf")
def main() -> None:
    """An eBPF replacement for kube-proxy."""


for command in (run, services, watch_command, maps, trace_cmd, stats, status, check, ct, cleanup):
    main.add_command(command)


if __name__ == "__main__":
    sys.exit(main())
