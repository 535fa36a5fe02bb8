"""nat_hold.replace_script: kube-proxy's table is deleted in the same nft transaction that adds
the empty nat chains, so no packet meets a namespace without NAT hooks in between."""
from __future__ import annotations

from kproxy_ebpf.datapath.load import nat_hold


def test_one_transaction_adds_the_four_nat_hooks_then_deletes_the_table():
    lines = nat_hold.replace_script("ip6", "kube-proxy").splitlines()
    assert lines[0] == "add table ip6 kproxy-nat-hold"
    assert lines[-1] == "delete table ip6 kube-proxy"
    chains = lines[1:-1]
    assert sorted(c.split()[4] for c in chains) == ["input", "output", "postrouting",
                                                    "prerouting"]
    assert all("type nat hook" in c and c.count("{") == 1 for c in chains)
    assert not any("policy drop" in c or "dnat" in c.split("priority")[0] for c in chains)
