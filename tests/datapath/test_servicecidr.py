"""ServiceCIDRs and allocated ClusterIPs on both ClusterIP paths (socket hooks, per-packet TC;
dplab.LB_PATHS), with real packets from a pod of node1 (lab "dp", see dplab.py). kube-proxy
nftables (v1.36, chain cluster-ips-check) rejects a port an allocated ClusterIP does not have
and drops any other address of a ServiceCIDR; we refuse the first the same way and fail the
second at once with EHOSTUNREACH (a documented divergence, as for internalTrafficPolicy Local).
Addresses of Services another proxy owns and addresses outside every ServiceCIDR are left
untouched."""
from __future__ import annotations

import pytest

from kproxy_ebpf.datapath.maps import reader
from kproxy_ebpf.datapath.write.cidr_writer import CidrWriter
from kproxy_ebpf.model.objects import Service, ServiceCIDR

from .dplab import LB_PATHS, assert_untouched, cluster_view, endpoints, pod_of, service

pytestmark = [pytest.mark.root, pytest.mark.parametrize("lb_path", LB_PATHS, indirect=True)]

HTTP, HTTP_EP = ("http", "TCP", 80), ("http", "TCP", 8080)
DNS, DNS_EP = ("dns", "UDP", 53), ("dns", "UDP", 5353)
CIDR = ServiceCIDR("kubernetes", ("10.96.0.0/16",))


def program(node1, cidrs, *objs) -> None:
    """Frontends through the MapWriter, then the ServiceCIDR rows, as the agent's sync does."""
    state = cluster_view(node1.node, objs, cidrs)
    result = node1.writer.apply(state.compute(full=True).frontends)
    cidrs = CidrWriter(node1.datapath.maps)
    cidrs.restore()               # as a restarted agent: diff against what the maps hold
    cidrs.apply(state.service_cidr_set(), result)
    assert result.ok, result.errors


def test_wrong_port_refused_unallocated_unreachable_others_untouched(lab, node1):
    foreign = Service("default", "theirs", cluster_ips=("10.96.0.77",), proxy_name="other-proxy",
                      ports=service("x", "10.96.0.77", HTTP).ports)
    objs = (service("web", "10.96.0.10", HTTP, DNS),
            endpoints(lab, "web", ["a1"], HTTP_EP, DNS_EP), foreign)
    program(node1, [], *objs)     # no ServiceCIDR listed yet: only the ClusterIP rule applies
    assert_untouched(lab, node1, "10.96.9.9", 81)
    assert lab.probe("client", "10.96.0.10", 81) == ["REFUSED"]

    program(node1, [CIDR], *objs)
    before = reader.counters(node1.datapath.maps["stats"])
    # The Service's own ports still work.
    assert pod_of(lab.probe("client", "10.96.0.10", 80)[0]) == "a1"
    assert pod_of(lab.probe("client", "10.96.0.10", 53, udp=True)[0]) == "a1"
    # A port (or protocol) the allocated ClusterIP does not have: refused at once (each attempt
    # by its first packet or syscall: the counters below grow by one per attempt).
    assert lab.probe("client", "10.96.0.10", 81, count=3) == ["REFUSED"] * 3
    assert lab.probe("client", "10.96.0.10", 80, udp=True) == ["REFUSED"]
    # An unallocated address inside the ServiceCIDR: fails at once, TCP and UDP.
    assert lab.probe("client", "10.96.9.9", 81, count=3) == ["ERROR EHOSTUNREACH"] * 3
    assert lab.probe("client", "10.96.9.9", 53, udp=True) == ["ERROR EHOSTUNREACH"]
    # A Service of another proxy, and addresses outside every ServiceCIDR: as without us.
    after = reader.counters(node1.datapath.maps["stats"])
    assert after["cip_reject"] - before["cip_reject"] == 4
    assert after["cidr_drop"] - before["cidr_drop"] == 4
    for ip in ("10.96.0.77", "10.97.0.1"):
        for udp in (False, True):
            assert_untouched(lab, node1, ip, 81, udp)

    # The ServiceCIDR goes away: the unallocated address is left alone again; the ClusterIP
    # rule stays (kube-proxy's cluster-ips set does not depend on the ServiceCIDRs).
    program(node1, [], *objs)
    assert_untouched(lab, node1, "10.96.9.9", 81)
    assert lab.probe("client", "10.96.0.10", 81) == ["REFUSED"]


def test_ipv4_mapped_sockets_get_the_same_verdicts(lab, node1):
    program(node1, [CIDR], service("web", "10.96.0.10", HTTP),
            endpoints(lab, "web", ["b1"], HTTP_EP))
    script = (
        "import errno, socket\n"
        "for addr, port in (('::ffff:10.96.0.10', 81), ('::ffff:10.96.9.9', 80)):\n"
        "    s = socket.socket(socket.AF_INET6, socket.SOCK_STREAM); s.settimeout(2)\n"
        "    try:\n"
        "        s.connect((addr, port)); print('connected')\n"
        "    except OSError as e:\n"
        "        print(errno.errorcode.get(e.errno, e))\n")
    out = lab.exec("client", ["python3", "-c", script], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["ECONNREFUSED", "EHOSTUNREACH"]
