"""nat_hold.script: the hold table's nat chains at the four hooks and one rule with a ct
expression (the conntrack reference), translating nothing."""
from __future__ import annotations

from kproxy_ebpf.datapath.load import nat_hold


def test_the_hold_table_has_nat_hooks_and_a_conntrack_user_and_translates_nothing():
    lines = nat_hold.script("ip6").splitlines()
    assert lines[0] == "add table ip6 kproxy-nat-hold"
    chains = [line for line in lines if line.startswith("add chain")]
    assert sorted(c.split()[4] for c in chains) == ["input", "output", "postrouting",
                                                    "prerouting"]
    assert all("type nat hook" in c for c in chains)
    rules = [line for line in lines if line.startswith("add rule")]
    assert rules == ["add rule ip6 kproxy-nat-hold prerouting ct state untracked counter"]
    assert not any(word in nat_hold.script("ip") for word in ("dnat", "snat", "masquerade", "drop"))
