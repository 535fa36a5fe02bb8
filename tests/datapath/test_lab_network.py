"""The lab network itself: real namespaces, veths, routes, cgroups and the echo/probe pair.

Conventions: lab "labnet-t", nodes 10.250.0.11/.12 (pod CIDRs 10.244.1.0/24, 10.244.2.0/24),
pods a (node1, 10.244.1.10), c (node1, 10.244.1.11), b (node2, 10.244.2.10), external client
10.250.0.250, lab router 10.250.0.254. All traffic is sent from inside the lab's namespaces.
"""
from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from kproxy_ebpf.datapath.load.bpffs import ensure_bpffs
from kproxy_ebpf.dev.lab import Lab, LabError, nsutil, procs
from kproxy_ebpf.dev.lab.state import ProcRec

from ..support import fresh_lab, require_root
from .sniff import Sniffer

pytestmark = pytest.mark.root

LAB = "labnet-t"
PREFIX = f"kproxy-{LAB}"
CGROOT = "/sys/fs/cgroup/unified"


def _sh(*argv: str) -> str:
    return subprocess.run(argv, capture_output=True, text=True, check=True).stdout


def _host_view() -> dict[str, set[str]]:
    """What the host namespace shows; the lab must never change it."""
    return {
        "routes": set(_sh("ip", "-4", "route", "show", "table", "all").splitlines()),
        "links": {line.split(":")[1].strip() for line in _sh("ip", "-o", "link").splitlines()},
    }


def _ours(names: list[str], prefix: str = PREFIX) -> list[str]:
    return [n for n in names if n.startswith(prefix + "-") or n == prefix]


def _leftovers(prefix: str = PREFIX) -> list[str]:
    left = _ours(sorted(os.listdir("/run/netns")) if os.path.isdir("/run/netns") else [],
                 prefix)
    left += _ours(os.listdir(CGROOT), prefix)
    left += _ours(os.listdir("/sys/fs/bpf"), prefix)
    if os.path.exists(f"/run/kproxy/{prefix[len('kproxy-'):]}"):
        left.append("state dir")
    return left


@pytest.fixture(scope="module")
def host_before() -> dict[str, set[str]]:
    require_root()
    return _host_view()


@pytest.fixture(scope="module")
def lab(host_before):
    with fresh_lab(LAB, nodes=2) as lab:
        lab.create_pod("a", "node1", labels={"app": "echo"})
        lab.create_pod("b", "node2")
        lab.create_pod("c", "node1")
        yield lab


def _ip(lab: Lab, target: str, *args: str) -> str:
    return lab.exec(target, ["ip", *args], capture_output=True, text=True, check=True).stdout


def test_topology_names_and_addresses(lab):
    n1, n2 = lab.node("node1"), lab.node("node2")
    assert (n1.ip, n1.netns, n1.pod_cidr) == ("10.250.0.11", f"{PREFIX}-node1", "10.244.1.0/24")
    assert (n2.ip, n2.pod_cidr) == ("10.250.0.12", "10.244.2.0/24")
    assert n1.cgroup == f"{CGROOT}/{PREFIX}/node1" and n1.host_cgroup == n1.cgroup + "/host"
    assert n1.bpffs == f"/sys/fs/bpf/{PREFIX}-node1"
    a, b, c = lab.pod("a"), lab.pod("b"), lab.pod("c")
    assert (a.ip, c.ip, b.ip) == ("10.244.1.10", "10.244.1.11", "10.244.2.10")
    assert a.netns == f"{PREFIX}-p-a" and a.cgroup == f"{n1.cgroup}/pod-a"
    assert a.ports == (("tcp", 8080), ("udp", 5353)) and a.labels == {"app": "echo"}
    assert len(a.veth) <= 15 and a.veth.startswith("kpv")
    for ns in (f"{PREFIX}-net", f"{PREFIX}-ext", n1.netns, n2.netns, a.netns, b.netns):
        assert os.path.exists(f"/run/netns/{ns}")
    for cg in (n1.host_cgroup, a.cgroup, b.cgroup, f"{CGROOT}/{PREFIX}/ext"):
        assert os.path.isdir(cg)
    assert lab.external().ip == "10.250.0.250"

    node_routes = _ip(lab, "node1", "-4", "route")
    assert "10.244.2.0/24 via 10.250.0.12 dev eth0" in node_routes
    assert f"10.244.1.10 dev {a.veth}" in node_routes
    assert "default via 10.250.0.254 dev eth0" in node_routes and "10.96." not in node_routes
    pod_routes = _ip(lab, "a", "-4", "route").splitlines()
    assert [r.split()[:5] for r in pod_routes] == [["default", "via", "169.254.1.1", "dev", "eth0"]]
    assert "onlink" in pod_routes[0]
    ext_routes = _ip(lab, "ext", "-4", "route")
    assert "default via 10.250.0.254 dev eth0" in ext_routes
    assert "10.96.0.0/16 via 10.250.0.11 dev eth0" in ext_routes
    assert "unreachable 10.244.0.0/16" in ext_routes
    assert "default" not in _ip(lab, "net", "-4", "route")
    rtr_routes = _ip(lab, "rtr", "-4", "route")
    assert "default" not in rtr_routes and "10.244.1.0/24 via 10.250.0.11 dev eth0" in rtr_routes
    fwd = lab.exec("node1", ["cat", "/proc/sys/net/ipv4/ip_forward"], capture_output=True,
                   text=True).stdout.strip()
    assert fwd == "1"


def test_pod_to_pod_tcp_across_nodes(lab):
    res = lab.probe("a", lab.pod("b").ip, 8080, count=3)
    assert len(res) == 3
    for line in res:
        name, peer = line.split()
        assert name == "b" and peer.startswith("10.244.1.10:")
    assert len({r.split(":")[1] for r in res}) == 3  # a new connection per attempt


def test_pod_to_pod_udp_across_nodes(lab):
    res = lab.probe("b", lab.pod("a").ip, 5353, udp=True, count=3)
    assert [r.split(":")[0] for r in res] == ["a 10.244.2.10"] * 3


def test_same_node_and_node_to_pod(lab):
    assert lab.probe("a", lab.pod("c").ip, 8080)[0].startswith("c 10.244.1.10:")
    # Node processes reach local and remote pods from the node address.
    assert lab.probe("node1", lab.pod("c").ip, 8080)[0].startswith("c 10.250.0.11:")
    assert lab.probe("node1", lab.pod("b").ip, 5353, udp=True)[0].startswith("b 10.250.0.11:")


def test_long_lived_connection_answers_repeatedly(lab):
    res = lab.probe("a", lab.pod("b").ip, 8080, count=4, keep=True)
    assert len(set(res)) == 1 and res[0].startswith("b 10.244.1.10:")


def test_refused_and_unreachable(lab):
    b = lab.pod("b").ip
    assert lab.probe("a", b, 9999) == ["REFUSED"]
    # ICMP port unreachable, every time (the lab lifts ICMP rate limits).
    assert lab.probe("a", b, 9999, udp=True, count=30) == ["REFUSED"] * 30
    # The underlay (control-plane endpoint) is reachable from pods and answers with a RST.
    assert lab.probe("a", "10.250.0.1", 6443) == ["REFUSED"]
    # Nothing routes Service IPs yet (that is the proxy's job): the lab router says so.
    assert lab.probe("a", "10.96.0.10", 80) == ["ERROR ENETUNREACH"]


def test_external_client_is_isolated_from_pod_ips(lab):
    assert lab.probe("ext", lab.pod("a").ip, 8080) == ["ERROR EHOSTUNREACH"]
    assert lab.probe("ext", "10.250.0.11", 8080) == ["REFUSED"]  # nodes are reachable


OUTSIDE = "198.51.100.7"  # TEST-NET-2 (RFC 5737): never routed on the internet either


def _counter(lab: Lab, target: str, table: str, key: str) -> int:
    """A counter of /proc/net/snmp or /proc/net/netstat as the target's namespace sees it."""
    rows = lab.exec(target, ["cat", f"/proc/net/{table}"], capture_output=True, text=True,
                    check=True).stdout.splitlines()
    group, _, name = key.partition(".")
    for head, values in zip(rows[::2], rows[1::2], strict=True):
        if head.startswith(group + ":"):
            return int(dict(zip(head.split()[1:], values.split()[1:], strict=True))[name])
    raise KeyError(key)


def test_outside_addresses_end_at_the_lab_router(lab, host_before):
    """Nodes, pods and the external client have a default route (as real machines have a
    gateway), and it leads to the lab router, which leads nowhere: a packet to a public address
    reaches the router, which answers "network unreachable", and never appears in the host's
    namespace."""
    rtr = lab.rtr_netns
    with nsutil.iproute(rtr) as ipr:
        links = {link.get("ifname"): link for link in ipr.get_links()}
        routes = list(ipr.get_routes(family=socket.AF_INET, table=254))
    assert set(links) == {"lo", "eth0"}, "the router has no link but its port on the bridge"
    assert all(r.get("dst_len") > 0 for r in routes), "the router has no default route"
    peer_ns = links["eth0"].get("IFLA_LINK_NETNSID")
    assert peer_ns is not None, "eth0's peer lives in another namespace (the underlay)"
    assert "kpn-rtr" in _ip(lab, "net", "-o", "link", "show", "master", "br0")

    unreach = _counter(lab, "rtr", "snmp", "Icmp.OutDestUnreachs")
    host = Sniffer(OUTSIDE)
    in_router = Sniffer(OUTSIDE, lambda f: nsutil.run_in_thread(rtr, f))
    try:
        results = [lab.probe(src, OUTSIDE, 80, count=3) for src in ("a", "node1", "ext")]
        results += [lab.probe(src, OUTSIDE, 53, udp=True, count=3) for src in ("b", "node2")]
    finally:
        on_host, on_router = host.close(), in_router.close()
    assert results == [["ERROR ENETUNREACH"] * 3] * 5
    assert len(on_router) >= 15 and set(on_router) == {"eth0"}, on_router
    assert on_host == [], f"lab packets to {OUTSIDE} showed up on host links {set(on_host)}"
    assert _counter(lab, "rtr", "snmp", "Icmp.OutDestUnreachs") >= unreach + 15
    view = _host_view()
    assert view["links"] == host_before["links"] and view["routes"] == host_before["routes"]


def test_exec_runs_in_target_netns_and_cgroup(lab):
    r = lab.exec("pod/a", ["cat", "/proc/self/cgroup"], capture_output=True, text=True)
    assert f"0::/{PREFIX}/node1/pod-a" in r.stdout.splitlines()
    r = lab.exec("node/node2", ["cat", "/proc/self/cgroup"], capture_output=True, text=True)
    assert f"0::/{PREFIX}/node2/host" in r.stdout.splitlines()
    assert "10.244.1.10/32" in _ip(lab, "a", "-4", "addr", "show", "dev", "eth0")
    assert lab.exec("c", ["sh", "-c", "exit 7"]).returncode == 7
    assert lab.exec("b", ["cat"], input="hi\n", capture_output=True, text=True).stdout == "hi\n"
    with pytest.raises(LabError):
        lab.target("nope")


def test_exec_from_many_threads_at_once(lab):
    """Processes are started through an exec trampoline (no Python between fork and exec), so
    threads may start them concurrently, each landing in its own namespace and cgroup."""
    from concurrent.futures import ThreadPoolExecutor
    targets = ["a", "b", "c", "node1", "node2", "ext"] * 4
    script = "cat /proc/self/cgroup | grep '^0::'; readlink /proc/self/ns/net"

    def where(t: str) -> tuple[str, str]:
        out = lab.exec(t, ["sh", "-c", script], capture_output=True, text=True, check=True)
        cg, ns = out.stdout.split()
        return cg, ns

    with ThreadPoolExecutor(8) as pool:
        seen = list(pool.map(where, targets))
    for t, (cg, ns) in zip(targets, seen, strict=True):
        want = lab.target(t)
        assert cg == "0::/" + os.path.relpath(want.cgroup, CGROOT)
        assert ns == f"net:[{os.stat(f'/run/netns/{want.netns}').st_ino}]"


def test_echo_serves_many_concurrent_connections(lab):
    script = (
        "import socket,sys\n"
        "ss=[socket.create_connection((sys.argv[1],8080),timeout=3) for _ in range(200)]\n"
        "lines=[s.makefile().readline() for s in ss]\n"
        "[s.sendall(b'again\\n') for s in ss]\n"
        "again=[s.makefile().readline() for s in ss]\n"
        "print(sum(l==m and l.startswith('b ') for l,m in zip(lines,again)))\n"
    )
    r = lab.exec("a", [sys.executable, "-c", script, lab.pod("b").ip], capture_output=True,
                 text=True, timeout=20)
    assert r.stdout.strip() == "200", r.stderr


def test_add_node_routes_to_and_from_existing_nodes(lab):
    n3 = lab.add_node()
    assert (n3.name, n3.ip, n3.pod_cidr) == ("node3", "10.250.0.13", "10.244.3.0/24")
    d = lab.create_pod("d", "node3", ports=[("tcp", 8080)])
    try:
        assert d.ip == "10.244.3.10"
        assert lab.probe("a", d.ip, 8080)[0].startswith("d 10.244.1.10:")
        assert lab.probe("d", lab.pod("b").ip, 8080)[0].startswith("b 10.244.3.10:")
    finally:
        lab.delete_pod("d")


def test_delete_pod_removes_everything_of_the_pod(lab):
    e = lab.create_pod("e", "node2")
    assert lab.probe("a", e.ip, 8080)[0].startswith("e ")
    recorded = dict(lab.status()["procs"][str(e.echo_pid)])
    recorded.pop("status")
    echo = ProcRec(**recorded)
    assert procs.identify(echo) == "running"
    lab.delete_pod("e")
    lab.delete_pod("e")  # idempotent
    assert procs.identify(echo) == "gone"
    assert str(e.echo_pid) not in lab.status()["procs"]
    assert not os.path.exists(f"/run/netns/{e.netns}")
    assert not os.path.exists(e.cgroup)
    links = _ip(lab, "node2", "-o", "link")
    assert e.veth not in links
    assert e.ip not in _ip(lab, "node2", "-4", "route")
    with pytest.raises(LabError):
        lab.pod("e")
    assert not lab.probe("a", e.ip, 8080, timeout=0.3)[0].startswith("e ")
    f = lab.create_pod("f", "node2")
    assert f.ip != e.ip  # a freed address is not handed out again at once
    lab.delete_pod("f")


def test_kill_recorded_leaves_a_reused_pid_alone(lab):
    rec = lab.spawn("node1", ["sleep", "60"], "sleeper")
    impostor = ProcRec(rec.pid, ["sleep", "61"], rec.starttime, rec.target, rec.log)
    assert procs.kill_recorded(impostor) == "reused"
    old = ProcRec(rec.pid, rec.argv, rec.starttime - 1, rec.target, rec.log)
    assert procs.kill_recorded(old) == "reused"
    assert procs.identify(rec) == "running"
    assert lab.kill(rec.pid) == "killed"
    assert procs.identify(rec) == "gone"
    with pytest.raises(LabError):
        lab.kill(rec.pid)


def test_down_of_a_prefix_named_lab_spares_this_lab(lab):
    report = Lab("labnet").down()  # "kproxy-labnet-t-..." also starts with "kproxy-labnet-"
    assert not any("labnet-t" in r for r in report.removed), report.removed
    assert lab.probe("a", lab.pod("b").ip, 8080)[0].startswith("b ")


def test_up_failure_removes_the_partial_lab(monkeypatch):
    require_root()
    failing = Lab("labnet-fail")
    failing.down()
    real_add_node = Lab.add_node

    def add_node_then_fail(self):
        info = real_add_node(self)
        if info.index == 2:
            raise KeyboardInterrupt  # as if Ctrl-C arrived mid-way
        return info

    monkeypatch.setattr(Lab, "add_node", add_node_then_fail)
    with pytest.raises(KeyboardInterrupt):
        failing.up(3)
    assert _leftovers("kproxy-labnet-fail") == []


def test_down_removes_everything(lab, host_before):
    pins = f"/sys/fs/bpf/{PREFIX}-node1"
    ensure_bpffs(Path(pins))  # stands in for an agent's pinned maps
    lab.spawn("net", ["sleep", "60"], "cp-standin")
    # An unrecorded child left in a pod cgroup (as `lab exec ... &` could leave) goes too.
    lab.exec("a", ["sh", "-c", "sleep 60 >/dev/null 2>&1 &"])
    # One that forks when it is stopped (kube-proxy starting iptables-restore as it dies):
    # the child is born after the sweep listed the cgroup's processes.
    lab.exec("node1", ["sh", "-c", "(trap 'sleep 60 & exit' TERM; while :; do sleep 0.05; done)"
                                   " >/dev/null 2>&1 &"])
    report = lab.down()
    assert report.ok, report.problems
    assert _leftovers() == []
    assert not lab.exists()
    assert lab.down().ok  # idempotent on nothing
    after = _host_view()
    assert after["links"] == host_before["links"]
    assert after["routes"] == host_before["routes"]
