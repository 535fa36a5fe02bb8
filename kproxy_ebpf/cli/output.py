"""How the inspection commands print: kubectl's tables and quantities, or JSON/YAML."""
from __future__ import annotations

import json

import click


def table(header: tuple, lines: list[tuple]) -> None:
    """kubectl's column style: every column padded to its widest cell but the last."""
    widths = [max(len(str(x[i])) for x in [header, *lines]) for i in range(len(header) - 1)]
    for line in [header, *lines]:
        # strict=False: the last column is not padded, so widths stop before it.
        click.echo("  ".join(str(c).ljust(w) for c, w in zip(line, widths, strict=False))
                   + "  " + str(line[-1]))


def si(n: int) -> str:
    """A count as kubectl prints quantities: 1234 -> 1.2k."""
    for unit, size in (("G", 10 ** 9), ("M", 10 ** 6), ("k", 10 ** 3)):
        if n >= size:
            return f"{n / size:.1f}{unit}"
    return str(n)


def structured(data, output: str) -> bool:
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
