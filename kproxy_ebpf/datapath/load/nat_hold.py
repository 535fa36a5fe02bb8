"""The nftables table that keeps a node's netfilter NAT running for connections kube-proxy
translated, once kube-proxy's own rules are gone.

The kernel's conntrack keeps an established flow's NAT binding, but applies it only while the
network namespace has both conntrack's hooks (registered while some rule uses conntrack: a
DNAT, a masquerade, a ct match) and nf_nat's (while some nat base chain exists). On a node
where kube-proxy's rules were the only users, removing them unregisters both: every connection
kube-proxy had DNATed or masqueraded loses its translation at once (measured in the lab, both
modes: tests/integration/test_migration_traffic.py). So before kube-proxy's rules go, a table
of ours takes both: empty nat chains at the four hooks and one rule with a ct expression that
matches nothing; nothing new is translated. It is removed with the rest of kproxy's datapath
(teardown.py), by when kube-proxy, if it returns, holds the hooks again.
"""
from __future__ import annotations

import shutil
import subprocess

TABLE = "kproxy-nat-hold"
_CHAINS = (("prerouting", "prerouting", "dstnat"), ("output", "output", "-100"),
           ("input", "input", "100"), ("postrouting", "postrouting", "srcnat"))


def script(family: str) -> str:
    """An `nft -f` script that makes the hold table of `family`."""
    chains = "".join(f"add chain {family} {TABLE} {name} "
                     f"{{ type nat hook {hook} priority {prio}; }}\n"
                     for name, hook, prio in _CHAINS)
    # A ct expression takes the namespace's conntrack reference: the nat chains do not (the
    # rules that use conntrack are its users). It matches nothing.
    rule = f"add rule {family} {TABLE} prerouting ct state untracked counter\n"
    return f"add table {family} {TABLE}\n{chains}{rule}"


def hold() -> list[str]:
    """Makes the hold tables that do not exist yet; returns the errors."""
    nft = shutil.which("nft")
    if not nft:
        return ["nft not found: kube-proxy's established connections may lose their NAT"]
    errors = []
    for family in ("ip", "ip6"):
        if subprocess.run([nft, "list", "table", family, TABLE],
                          capture_output=True).returncode == 0:
            continue
        r = subprocess.run([nft, "-f", "-"], input=script(family), capture_output=True,
                           text=True)
        if r.returncode != 0:
            errors.append(f"nft table {family} {TABLE}: {r.stderr.strip()}")
    return errors


def remove() -> list[str]:
    """Deletes the hold tables of this network namespace; what was removed."""
    nft = shutil.which("nft")
    removed = []
    for family in ("ip", "ip6"):
        if nft and subprocess.run([nft, "delete", "table", family, TABLE],
                                  capture_output=True).returncode == 0:
            removed.append(f"nftables table {family} {TABLE}")
    return removed
