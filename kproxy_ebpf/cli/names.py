"""kubectl's manners for the inspection commands: a bare NAME is in the default namespace
(or -n's), something asked for that is not there is an error that says what is, and a
mistyped word gets a suggestion."""
from __future__ import annotations

import difflib
from collections.abc import Iterable

import click

DEFAULT_NAMESPACE = "default"


def namespace_option(f):
    return click.option("-n", "--namespace", default=None, metavar="NS",
                        help=f"The namespace of a bare --service NAME.  [default: {DEFAULT_NAMESPACE}]")(f)


def service_ref(text: str | None, namespace: str | None) -> str | None:
    """"NS/NAME" as given, "NAME" in `namespace` (default: "default"); None stays None."""
    if text is None:
        return None
    if "/" in text:
        ns, _, name = text.partition("/")
        if namespace and ns != namespace:
            raise click.BadParameter(f"{text} names namespace {ns}, -n says {namespace}",
                                     param_hint="--service")
        return f"{ns}/{name}"
    return f"{namespace or DEFAULT_NAMESPACE}/{text}"


def suggestion(word: str, choices: Iterable[str]) -> str:
    """' Did you mean "x"?' for the closest choice, or ''."""
    close = difflib.get_close_matches(word, list(choices), n=1, cutoff=0.6)
    return f' Did you mean "{close[0]}"?' if close else ""


def require_service(ref: str, programmed: Iterable[str]) -> None:
    """A Service (NS/NAME) that has no frontend in the maps is an error, as kubectl's
    NotFound; `programmed` holds the NS/NAME of every Service that has one."""
    names = set(programmed)
    if ref not in names:
        raise click.ClickException(
            f"Service {ref} is not programmed on this node (no frontend in the maps)."
            + suggestion(ref, names) + " `kproxy-ebpf services` lists what is.")
