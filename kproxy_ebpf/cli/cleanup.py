"""`kproxy-ebpf cleanup`: kproxy off this node, or kube-proxy's leftovers."""
from __future__ import annotations

import sys
from pathlib import Path

import click

from .options import bpffs_option


@click.command()
@bpffs_option
@click.option("--yes", is_flag=True, help="Do not ask.")
@click.option("--kube-proxy-leftovers", is_flag=True,
              help="Instead: remove what kube-proxy left in this node's network namespace "
                   "(its KUBE-* iptables chains, legacy and nft, its nftables tables, and IPVS "
                   "mode's kube-ipvs0, ipsets and virtual servers), as `kube-proxy --cleanup` "
                   "does. kproxy's own pins stay.")
@click.option("--dry-run", is_flag=True,
              help="With --kube-proxy-leftovers: print what would be removed, change nothing.")
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
    from kproxy_ebpf.datapath.load.teardown import remove_all

    if not Path(bpffs_dir).exists():
        click.echo(f"nothing pinned under {bpffs_dir}")
    elif not yes:
        click.confirm(f"Detach kproxy from this node and remove {bpffs_dir}?", abort=True)
    for what in remove_all(Path(bpffs_dir), Path(program_cache) if program_cache else None):
        click.echo(f"removed {what}")


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
    for note in report.notes:
        click.echo(f"note: {note}")
    for err in report.errors:
        click.echo(f"error: {err}", err=True)
    if report.errors:
        sys.exit(1)
