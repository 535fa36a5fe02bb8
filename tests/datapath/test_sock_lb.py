"""ClusterIP load balancing with real packets, clients in pod namespaces, once through each path
(dplab.LB_PATHS): the socket hooks on node1's cgroup, and the per-packet TC programs on
node1's pod veths (`socketLB: false`). See dplab.py for the lab's conventions."""
from __future__ import annotations

import math
import os
import threading
from collections import Counter

import pytest

from kproxy_ebpf.datapath.maps import reader

from ..support import wait_until
from .dplab import LB_PATHS, endpoints, pod_of, service

pytestmark = [pytest.mark.root, pytest.mark.parametrize("lb_path", LB_PATHS, indirect=True)]

HTTP = ("http", "TCP", 80)
HTTP_EP = ("http", "TCP", 8080)
DNS = ("dns", "UDP", 53)
DNS_EP = ("dns", "UDP", 5353)
BACKENDS = ["a1", "a2", "b1", "b2"]


def assert_uniform(counts: Counter, names: list[str], n: int) -> None:
    """Each backend within 5 standard deviations of n/k (a false alarm is ~1e-6 likely)."""
    k = len(names)
    mean, sd = n / k, math.sqrt(n * (1 / k) * (1 - 1 / k))
    assert set(counts) == set(names), counts
    for name in names:
        assert abs(counts[name] - mean) < 5 * sd, (name, counts)


def test_tcp_clusterip_reaches_every_backend_uniformly(lab, node1, fam):
    node1.program(service("web", fam.vip(10), HTTP),
                  fam.endpoints(lab, "web", BACKENDS, HTTP_EP))
    lines = lab.probe("client", fam.vip(10), 80, count=400)
    counts = Counter(pod_of(line) for line in lines)
    assert_uniform(counts, BACKENDS, 400)
    client_ip = fam.peer(fam.ip(lab, "client"))
    assert all(line.split()[1].startswith(client_ip + ":") for line in lines), \
        "the backend sees the client pod's own address (no SNAT on either path)"


def test_udp_unconnected_replies_come_from_the_vip(lab, node1, fam):
    node1.program(service("dns", fam.vip(53), DNS),
                  fam.endpoints(lab, "dns", BACKENDS, DNS_EP))
    # probe.py sends each attempt from a new unconnected socket (sendto/recvfrom) and reports
    # WRONG-SOURCE unless the reply's source is exactly the Service's address and port.
    lines = lab.probe("client", fam.vip(53), 53, udp=True, count=400)
    assert not [line for line in lines if not line.startswith(tuple(BACKENDS))], lines[:5]
    assert_uniform(Counter(pod_of(line) for line in lines), BACKENDS, 400)


def test_getpeername_and_connected_udp(lab, node1, fam):
    node1.program(service("web", fam.vip(10), HTTP, DNS),
                  fam.endpoints(lab, "web", ["b1"], HTTP_EP, DNS_EP))
    vip = fam.vip(10)
    script = (
        "import socket\n"
        f"t = socket.create_connection(('{vip}', 80), timeout=2)\n"
        "print('tcp', t.getpeername()[0], t.getpeername()[1], t.recv(100).decode().split()[0])\n"
        f"u = socket.socket({fam.af}, socket.SOCK_DGRAM); u.settimeout(2)\n"
        f"u.connect(('{vip}', 53)); u.send(b'x')\n"
        "data, src = u.recvfrom(100)\n"
        "print('udp', u.getpeername()[0], u.getpeername()[1], data.decode().split()[0], src[0])\n")
    out = lab.exec("client", ["python3", "-c", script], capture_output=True, text=True, check=True)
    assert out.stdout.split("\n")[:2] == [f"tcp {vip} 80 b1", f"udp {vip} 53 b1 {vip}"]


def test_tcp_getpeername_outlives_every_lru_row(lab, node1, fam, tmp_path):
    """Socket path: a TCP socket keeps its service address in its own storage (kp_sksvc),
    not in the kp_sknat LRU map, where other sockets' rows evict it once the map is full
    (simulated: every row deleted while the socket is open). TC path: no row is needed, the
    reply's source is rewritten per packet."""
    node1.program(service("web", fam.vip(10), HTTP), fam.endpoints(lab, "web", ["b1"], HTTP_EP))
    connected = tmp_path / "connected"
    # The client holds its socket until its stdin (a pipe of ours) ends.
    script = (
        "import socket, sys\n"
        f"t = socket.create_connection(('{fam.vip(10)}', 80), timeout=2)\n"
        f"open({str(connected)!r}, 'w').close()\n"
        "sys.stdin.read()\n"
        "print('tcp', t.getpeername()[0], t.getpeername()[1])\n")
    out = {}
    hold, release = os.pipe()
    th = threading.Thread(target=lambda: out.update(r=lab.exec(
        "client", ["python3", "-c", script], stdin=hold, capture_output=True, text=True,
        timeout=30)))
    th.start()
    try:
        wait_until(lambda: connected.exists() or not th.is_alive(), 20, "the client's connection")
        sknat = node1.datapath.maps["sknat"]
        for key in sknat.keys():
            sknat.delete(key)
    finally:
        os.close(release)
        th.join()
        os.close(hold)
    assert out["r"].returncode == 0, out["r"].stderr
    assert out["r"].stdout.split("\n")[0] == f"tcp {fam.vip(10)} 80"


def test_same_port_tcp_and_udp_are_two_services(lab, node1, fam):
    node1.program(service("tcp-only", fam.vip(20), ("p", "TCP", 53)),
                  fam.endpoints(lab, "tcp-only", ["a1"], ("p", "TCP", 8080)),
                  service("udp-only", fam.vip(20), ("p", "UDP", 53)),
                  fam.endpoints(lab, "udp-only", ["b2"], ("p", "UDP", 5353)))
    assert {pod_of(x) for x in lab.probe("client", fam.vip(20), 53, count=20)} == {"a1"}
    assert {pod_of(x) for x in lab.probe("client", fam.vip(20), 53, udp=True, count=20)} == {"b2"}


def test_session_affinity_holds_for_a_client(lab, node1, fam):
    """Every connection of a client within the timeout lands on one backend. (Expiry from the
    last use is tested with a controlled clock in test_lb_run.py: no waiting here.)"""
    node1.program(service("sticky", fam.vip(30), HTTP, affinity=60),
                  fam.endpoints(lab, "sticky", BACKENDS, HTTP_EP))
    chosen = {pod_of(x) for x in lab.probe("client", fam.vip(30), 80, count=40)}
    assert len(chosen) == 1, chosen
    rows = reader.dump(node1.datapath.maps["affinity"])
    assert any(r["key"]["type"] == 0 for r in rows), "ClientIP affinity rows live in kp_aff"


def test_no_endpoints_is_refused_at_once(lab, node1, fam):
    node1.program(service("empty", fam.vip(40), HTTP, DNS))
    for udp, port in ((False, 80), (True, 53)):
        # REFUSED, not TIMEOUT: the refusal comes at once, not after the client's own timeout.
        assert lab.probe("client", fam.vip(40), port, udp=udp, count=5, timeout=3) == ["REFUSED"] * 5
    assert node1.counter("reject") >= 10


def test_serving_terminating_endpoints_still_serve(lab, node1, fam):
    """kube-proxy's fallback: no ready endpoint, but serving+terminating ones -> use them."""
    node1.program(service("draining", fam.vip(50), HTTP),
                  fam.endpoints(lab, "draining", ["a2", "b1"], HTTP_EP,
                            ready=False, serving=True, terminating=True))
    lines = lab.probe("client", fam.vip(50), 80, count=40)
    assert {pod_of(x) for x in lines} == {"a2", "b1"}
    svc = [s for s in reader.services(node1.datapath.maps) if s["address"] == fam.vip(50)][0]
    assert {b["state"].split(",")[0] for b in svc["backends"]} == {"terminating"}


def test_internal_traffic_policy_local_without_local_endpoint_drops(lab, node1, fam):
    node1.program(service("local", fam.vip(60), HTTP, itp_local=True),
                  fam.endpoints(lab, "local", ["b1", "b2"], HTTP_EP))      # all on node2
    # timeout 3: on the per-packet path an IPv6 client's connect() still holds its socket
    # when the ICMPv6 error comes back, so the kernel applies only the error about the SYN
    # retransmitted 1 s later (test_tc_lab.py measured kube-proxy nftables doing the same).
    assert lab.probe("client", fam.vip(60), 80, count=3, timeout=3) == ["ERROR EHOSTUNREACH"] * 3
    node1.program(service("local", fam.vip(60), HTTP, itp_local=True),
                  fam.endpoints(lab, "local", ["a1", "b1", "b2"], HTTP_EP))
    assert {pod_of(x) for x in lab.probe("client", fam.vip(60), 80, count=20)} == {"a1"}


def test_scaling_changes_the_spread_with_no_failed_connection(lab, node1, fam):
    svc = service("scale", fam.vip(70), HTTP)
    node1.program(svc, fam.endpoints(lab, "scale", ["a1"], HTTP_EP))
    lines: list[str] = []
    loop = threading.Thread(target=lambda: lines.extend(
        lab.probe("client", fam.vip(70), 80, count=600, interval=0.01)))
    loop.start()
    steps = (["a1", "a2", "b1"], BACKENDS, ["b2"], ["a1", "b2"], ["a2"], BACKENDS)
    changes = 0
    while loop.is_alive():                 # as many changes as the client's run allows
        node1.program(svc, fam.endpoints(lab, "scale", steps[changes % len(steps)], HTTP_EP))
        changes += 1
    loop.join()
    assert changes > len(steps)
    node1.program(svc, fam.endpoints(lab, "scale", BACKENDS, HTTP_EP))
    failed = [x for x in lines if pod_of(x) not in BACKENDS]
    assert not failed, f"{len(failed)} failed connections, e.g. {failed[:3]}"
    assert {pod_of(x) for x in lines} == set(BACKENDS)
    after = Counter(pod_of(x) for x in lab.probe("client", fam.vip(70), 80, count=400))
    assert_uniform(after, BACKENDS, 400)


def test_ipv4_services_through_ipv6_sockets(lab, node1):
    """Dual-stack clients (Java's default) reach IPv4 Services as ::ffff:a.b.c.d; the kernel runs
    only the IPv6 hooks for them."""
    node1.program(service("web", "10.96.0.10", HTTP, DNS),
                  endpoints(lab, "web", ["b2"], HTTP_EP, DNS_EP))
    script = (
        "import socket\n"
        "vip = '::ffff:10.96.0.10'\n"
        "t = socket.socket(socket.AF_INET6, socket.SOCK_STREAM); t.settimeout(2)\n"
        "t.connect((vip, 80))\n"
        "print('tcp', t.getpeername()[0], t.recv(100).decode().split()[0])\n"
        "u = socket.socket(socket.AF_INET6, socket.SOCK_DGRAM); u.settimeout(2)\n"
        "u.sendto(b'x', (vip, 53))\n"
        "data, src = u.recvfrom(100)\n"
        "print('udp', src[0], src[1], data.decode().split()[0])\n")
    out = lab.exec("client", ["python3", "-c", script], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split("\n")[:2] == ["tcp ::ffff:10.96.0.10 b2",
                                          "udp ::ffff:10.96.0.10 53 b2"]


def test_host_namespace_client(lab, node1, fam, lb_path):
    """The node's own processes (node1's netns and cgroup): the socket hooks serve them; the
    per-packet path does not (a documented gap, as in Cilium without socket LB: nothing sits
    on the node's own output path), so the connect goes unanswered (TIMEOUT, or the lab
    router's net unreachable)."""
    node1.program(service("web", fam.vip(10), HTTP), fam.endpoints(lab, "web", ["b1"], HTTP_EP))
    got = lab.probe("node1", fam.vip(10), 80, timeout=0.5)
    if lb_path == "socket":
        assert [pod_of(x) for x in got] == ["b1"], got
    else:
        assert got[0] in ("TIMEOUT", "ERROR ENETUNREACH", "ERROR EHOSTUNREACH"), got
