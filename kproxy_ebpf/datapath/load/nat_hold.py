"""The nftables table that keeps a node's netfilter NAT running for connections kube-proxy
translated, once kube-proxy's own rules are gone.

The kernel's conntrack keeps an established flow's NAT binding, but it is applied only while
some NAT base chain is registered in the network namespace (nf_nat registers its hooks per
netns for as long as a nat chain uses them). On a node where kube-proxy's nftables table was
the only one, deleting it unregisters them: every connection kube-proxy had DNATed or
masqueraded loses its translation at once (measured in the lab: all long-lived ones broke,
tests/integration/test_migration_traffic.py). iptables mode keeps the built-in nat chains,
and a real node usually has its CNI's or the kubelet's, but nothing guarantees it. So the
table is replaced, in the same nft transaction, by one of ours with empty nat chains at the
four hooks: they translate nothing new and keep the bindings (and conntrack) alive. It is
removed with the rest of kproxy's datapath (teardown.py), by when kube-proxy, if it returns,
holds the hooks again."""
from __future__ import annotations

import shutil
import subprocess

TABLE = "kproxy-nat-hold"
_CHAINS = (("prerouting", "prerouting", "dstnat"), ("output", "output", "-100"),
           ("input", "input", "100"), ("postrouting", "postrouting", "srcnat"))


def replace_script(family: str, table: str) -> str:
    """An `nft -f` script: our empty nat chains added, `family table` deleted, atomically."""
    chains = "".join(f"add chain {family} {TABLE} {name} "
                     f"{{ type nat hook {hook} priority {prio}; }}\n"
                     for name, hook, prio in _CHAINS)
    return f"add table {family} {TABLE}\n{chains}delete table {family} {table}\n"


def remove() -> list[str]:
    """Deletes the hold tables of this network namespace; what was removed."""
    nft = shutil.which("nft")
    removed = []
    for family in ("ip", "ip6"):
        if nft and subprocess.run([nft, "delete", "table", family, TABLE],
                                  capture_output=True).returncode == 0:
            removed.append(f"nftables table {family} {TABLE}")
    return removed
