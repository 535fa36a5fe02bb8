"""kube-proxy leftover removal: which chains and rules go (kube-proxy's own), which stay (the
kubelet's and everyone else's). The real thing runs in test_kubeproxy_cleanup.py (lab)."""
from kproxy_ebpf.agent import kubeproxy_cleanup as kc

NAT = """\
*nat
:PREROUTING ACCEPT [0:0]
:OUTPUT ACCEPT [0:0]
:POSTROUTING ACCEPT [0:0]
:KUBE-KUBELET-CANARY - [0:0]
:KUBE-MARK-MASQ - [0:0]
:KUBE-NODEPORTS - [0:0]
:KUBE-POSTROUTING - [0:0]
:KUBE-PROXY-CANARY - [0:0]
:KUBE-SEP-ABC - [0:0]
:KUBE-SERVICES - [0:0]
:KUBE-SVC-XYZ - [0:0]
:OTHER - [0:0]
-A PREROUTING -m comment --comment "kubernetes service portals" -j KUBE-SERVICES
-A OUTPUT -m comment --comment "kubernetes service portals" -j KUBE-SERVICES
-A POSTROUTING -m comment --comment "kubernetes postrouting rules" -j KUBE-POSTROUTING
-A POSTROUTING -s 10.0.0.0/8 -j MASQUERADE
-A OTHER -j KUBE-MARK-MASQ
-A KUBE-SERVICES -d 10.96.0.1/32 -p tcp -j KUBE-SVC-XYZ
-A KUBE-SVC-XYZ -j KUBE-SEP-ABC
COMMIT
"""


def test_nat_script_removes_kube_proxys_chains_and_the_jumps_into_them():
    script, chains = kc.restore_script("nat", NAT)
    assert sorted(chains) == ["KUBE-MARK-MASQ", "KUBE-NODEPORTS", "KUBE-POSTROUTING",
                              "KUBE-PROXY-CANARY", "KUBE-SEP-ABC", "KUBE-SERVICES",
                              "KUBE-SVC-XYZ"]
    lines = script.splitlines()
    assert lines[0] == "*nat" and lines[-1] == "COMMIT"
    assert ('-D PREROUTING -m comment --comment "kubernetes service portals" -j KUBE-SERVICES'
            in lines)
    assert "-D OTHER -j KUBE-MARK-MASQ" in lines        # a foreign jump into ours goes too
    assert not any("MASQUERADE" in x or "KUBELET" in x for x in lines)
    # flush (chain lines) before the deletes, deletes before -X
    first_x = min(i for i, x in enumerate(lines) if x.startswith("-X"))
    assert all(i < first_x for i, x in enumerate(lines) if x.startswith(("-D", ":")))


def test_kubelet_chains_stay_in_filter():
    saved = ("*filter\n:INPUT ACCEPT [0:0]\n:KUBE-FIREWALL - [0:0]\n:KUBE-FORWARD - [0:0]\n"
             "-A INPUT -j KUBE-FIREWALL\n-A FORWARD -m comment --comment \"kubernetes "
             "forwarding rules\" -j KUBE-FORWARD\nCOMMIT\n")
    script, chains = kc.restore_script("filter", saved)
    assert chains == ["KUBE-FORWARD"]
    assert "KUBE-FIREWALL" not in script


def test_nothing_of_kube_proxys_means_no_script():
    assert kc.restore_script("mangle", "*mangle\n:PREROUTING ACCEPT [0:0]\nCOMMIT\n") == ("", [])
    # per-service chain names count in nat only
    assert not kc.is_kube_proxy_chain("filter", "KUBE-SVC-XYZ")



def test_ipvs_modes_chains_are_kube_proxys_too():
    saved = ("*filter\n:INPUT ACCEPT [0:0]\n:OUTPUT ACCEPT [0:0]\n:KUBE-FIREWALL - [0:0]\n"
             ":KUBE-IPVS-FILTER - [0:0]\n:KUBE-IPVS-OUT-FILTER - [0:0]\n:KUBE-NODE-PORT - [0:0]\n"
             ":KUBE-SOURCE-RANGES-FIREWALL - [0:0]\n"
             "-A INPUT -m comment --comment \"kubernetes ipvs access filter\" -j KUBE-IPVS-FILTER\n"
             "-A OUTPUT -m comment --comment \"kubernetes ipvs access filter\" "
             "-j KUBE-IPVS-OUT-FILTER\n-A INPUT -j KUBE-FIREWALL\nCOMMIT\n")
    script, chains = kc.restore_script("filter", saved)
    assert sorted(chains) == ["KUBE-IPVS-FILTER", "KUBE-IPVS-OUT-FILTER", "KUBE-NODE-PORT",
                              "KUBE-SOURCE-RANGES-FIREWALL"]
    assert "KUBE-FIREWALL" not in script
    assert kc.is_kube_proxy_chain("nat", "KUBE-LOAD-BALANCER")
    for kubelets in ("KUBE-KUBELET-CANARY", "KUBE-IPTABLES-HINT", "KUBE-MARK-DROP",
                     "KUBE-FIREWALL"):
        assert not any(kc.is_kube_proxy_chain(t, kubelets) for t in kc.TABLES)


def test_ipvs_ipset_names_of_both_families_fit_ipsets_limit():
    from kproxy_ebpf.agent import ipvs_leftovers as ipvs

    names = ipvs.ipset_names()
    assert "KUBE-CLUSTER-IP" in names and "KUBE-6-CLUSTER-IP" in names
    # kube-proxy cuts the IPv6 names to 31 characters, as ipset requires
    assert "KUBE-6-LOAD-BALANCER-SOURCE-CIDR"[:31] in names
    assert all(len(n) <= 31 for n in names) and len(set(names)) == 2 * len(ipvs.IPSETS)
