"""The options every inspection command shares: where the maps are pinned, and -o."""
from __future__ import annotations

import click

from kproxy_ebpf.agent.run import DEFAULT_BPFFS


def bpffs_option(f):
    return click.option("--bpffs-dir", envvar="KPROXY_BPFFS_DIR", default=DEFAULT_BPFFS,
                        show_default=True, help="The agent's bpffs directory (pinned maps).")(f)


def output_option(f=None, *, wide: bool = False, name: bool = False):
    """-o as kubectl's: json and yaml everywhere, wide only where the table has more columns
    to show and name only where rows have names (elsewhere they are refused, not ignored)."""
    choices = ["table", *(["wide"] if wide else []), "json", "yaml", *(["name"] if name else [])]
    text = ("Output format: table" + (", wide (the table with more columns)" if wide else "")
            + ", json, yaml" + (", name (one name a line, for scripts)" if name else "") + ".")
    option = click.option("-o", "--output", type=click.Choice(choices), default="table",
                          show_default=True, help=text)
    return option(f) if f is not None else option
