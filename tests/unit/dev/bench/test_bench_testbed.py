"""The testbed's reading of kube-proxy's KUBE-SERVICES (no lab)."""
from kproxy_ebpf.dev.bench.testbed import rule_positions

SAVE = """*nat
:KUBE-SERVICES - [0:0]
-A KUBE-SERVICES -d 10.96.0.5/32 -p tcp -m comment --comment "kpbench/a:sink cluster IP" -m tcp --dport 81 -j KUBE-SVC-AAAA
-A KUBE-SERVICES -d 10.96.0.10/32 -p tcp -m comment --comment "default/kubernetes:https cluster IP" -m tcp --dport 443 -j KUBE-SVC-BBBB
-A KUBE-SERVICES -d 10.96.0.50/32 -p tcp -m comment --comment "kpbench/b:req cluster IP" -m tcp --dport 80 -j KUBE-SVC-CCCC
-A KUBE-SERVICES -d 10.96.0.5/32 -p tcp -m comment --comment "kpbench/a:req cluster IP" -m tcp --dport 80 -j KUBE-SVC-DDDD
-A KUBE-SERVICES -m comment --comment "kubernetes service nodeports" -m addrtype --dst-type LOCAL -j KUBE-NODEPORTS
-A KUBE-SVC-DDDD -j KUBE-SEP-1
COMMIT
"""  # noqa: E501 - verbatim iptables-save output


def test_each_port_is_placed_on_its_own_and_a_prefix_address_does_not_match():
    # a's sink rule comes first, its request rule fourth: the request port's is the one
    # the measured connections walk to; 10.96.0.5 must not match 10.96.0.50.
    got, rules = rule_positions(SAVE, {"a": "10.96.0.5", "b": "10.96.0.50", "gone": "10.96.9.9"},
                                80)
    assert got == {"a": 4, "b": 3, "gone": None}
    assert rules == 5
