"""Service behaviour, one scenario body per behaviour, run against kproxy, kube-proxy nftables
and kube-proxy iptables (conftest.py). Each check states kube-proxy's behaviour; kproxy must
give the same cell unless verdicts.DIVERGENCES lists the row."""
from __future__ import annotations

import threading
import time

import pytest

from .scenario import CLIENT, HOST
from .verdicts import sticky_cell

pytestmark = [pytest.mark.root, pytest.mark.controlplane]

HTTP = {"name": "http", "port": 80, "targetPort": 8080, "protocol": "TCP"}
DNS = {"name": "dns", "port": 53, "targetPort": 5353, "protocol": "UDP"}


def test_clusterip_tcp_udp(scenario):
    scenario.pods("web", {"web-1": "node1", "web-2": "node2"})
    t0 = time.monotonic()
    ip = scenario.service("web", "web", [HTTP, DNS])
    scenario.check("tcp pod", CLIENT, ip, 80, "web-1,web-2 from pod")
    print(f"\n{scenario.proxy}: Service created -> both backends answer: "
          f"{time.monotonic() - t0:.2f}s")
    scenario.check("udp pod", CLIENT, ip, 53, "web-1,web-2 from pod", udp=True)
    # Host clients: kube-proxy masquerades them to the node's address; the socket hook
    # connects from the node's address directly.
    scenario.check_tcp_udp("host", HOST, ip, (80, 53), "web-1,web-2 from node")


def test_multiport_named_ports(scenario):
    # "web" is 8080 on one pod and 9090 on the other: a named targetPort resolves per pod.
    scenario.pods("multi", {"multi-1": "node1"}, ports=(("tcp", 8080), ("tcp", 7070)),
                  port_names={("tcp", 8080): "web"})
    scenario.pods("multi", {"multi-2": "node2"}, ports=(("tcp", 9090), ("tcp", 7070)),
                  port_names={("tcp", 9090): "web"})
    ip = scenario.service("multi", "multi", [
        {"name": "web", "port": 80, "targetPort": "web", "protocol": "TCP"},
        {"name": "metrics", "port": 81, "targetPort": 7070, "protocol": "TCP"}])
    scenario.check("80 -> named web", CLIENT, ip, 80, "multi-1,multi-2 from pod")
    scenario.check("81 -> 7070", CLIENT, ip, 81, "multi-1,multi-2 from pod")
    # nftables rejects a ClusterIP's unknown ports; iptables has no rule, so it is routed.
    scenario.check("82 (no such port)", CLIENT, ip, 82, {"nftables": "REFUSED",
                                                          "iptables": "ERROR ENETUNREACH"},
                   count=2)


def test_no_endpoints_refused(scenario):
    ip = scenario.service("empty", "nothing-matches", [HTTP, DNS])
    scenario.wait_endpoints("empty", 0)
    scenario.check_tcp_udp("pod", CLIENT, ip, (80, 53), "REFUSED", count=3)
    scenario.check("tcp host", HOST, ip, 80, "REFUSED", count=3)
    # kube-proxy's REJECT runs in the OUTPUT hook here: the datagram is dropped inside sendto().
    scenario.check("udp host", HOST, ip, 53, "ERROR EPERM", udp=True, count=3)


def test_terminating_fallback(scenario):
    scenario.pods("drain", {"drain-1": "node1", "drain-2": "node2"})
    ip = scenario.service("drain", "drain", [HTTP])
    scenario.check("both ready", CLIENT, ip, 80, "drain-1,drain-2 from pod")
    scenario.terminating("drain-2")
    scenario.check("one terminating", CLIENT, ip, 80, "drain-1 from pod")
    scenario.terminating("drain-1")
    # No ready endpoint left, but serving terminating ones: kube-proxy falls back to them.
    scenario.check("all terminating", CLIENT, ip, 80, "drain-1,drain-2 from pod")
    scenario.check("all terminating, host", HOST, ip, 80, "drain-1,drain-2 from node")


def test_itp_local(scenario):
    scenario.pods("itp", {"itp-1": "node1", "itp-2": "node2"})
    ip = scenario.service("itp", "itp", [HTTP, DNS], internalTrafficPolicy="Local")
    scenario.check_tcp_udp("pod", CLIENT, ip, (80, 53), "itp-1 from pod")
    scenario.check("tcp host", HOST, ip, 80, "itp-1 from node")


def test_itp_local_no_local_endpoint(scenario):
    scenario.pods("itpn", {"itpn-2": "node2"})
    ip = scenario.service("itpn", "itpn", [HTTP, DNS], internalTrafficPolicy="Local")
    scenario.wait_endpoints("itpn", 1)
    scenario.check_tcp_udp("pod", CLIENT, ip, (80, 53), "TIMEOUT", count=2)
    scenario.check("tcp host", HOST, ip, 80, "TIMEOUT", count=2)


def test_topology_prefer_close(scenario):
    """trafficDistribution PreferClose: the EndpointSlice controller hints every endpoint for
    its own zone and the proxies keep traffic in the client's zone (node1 is zone-a)."""
    scenario.pods("topo", {"topo-1": "node1", "topo-2": "node2"})
    ip = scenario.service("topo", "topo", [HTTP], trafficDistribution="PreferClose")
    scenario.check("tcp pod (zone-a)", CLIENT, ip, 80, "topo-1 from pod")
    scenario.check("tcp host (zone-a)", HOST, ip, 80, "topo-1 from node")
    # PreferSameNode (1.35): node-level hints; with one node per zone the outcome is the same.
    ip = scenario.service("topo-node", "topo", [HTTP], trafficDistribution="PreferSameNode")
    scenario.check("PreferSameNode, tcp pod", CLIENT, ip, 80, "topo-1 from pod")


def test_session_affinity_client_ip(scenario):
    scenario.pods("sticky", {"sticky-1": "node1", "sticky-2": "node2", "sticky-3": "node2"})
    ip = scenario.service("sticky", "sticky", [HTTP], sessionAffinity="ClientIP")
    scenario.wait_endpoints("sticky", 3)
    # Every connection of one client lands on the same backend (which one is random).
    scenario.check("tcp pod", CLIENT, ip, 80, "1 backend from pod", reduce=sticky_cell)
    scenario.check("tcp host", HOST, ip, 80, "1 backend from node", reduce=sticky_cell)


def test_scale_without_failed_connections(scenario):
    names = [f"scale-{i}" for i in range(1, 6)]
    node = {n: "node1" if i % 2 == 0 else "node2" for i, n in enumerate(names)}
    scenario.pods("scale", {n: node[n] for n in names[:3]})
    ip = scenario.service("scale", "scale", [HTTP])
    scenario.check("3 backends", CLIENT, ip, 80, "scale-1,scale-2,scale-3 from pod", count=30)
    lines: list[str] = []
    stop = threading.Event()

    def client_loop() -> None:  # connections one after another until the churn is over
        while not stop.is_set():
            lines.extend(scenario.probe(CLIENT, ip, 80, count=50, interval=0.01, timeout=2))

    loop = threading.Thread(target=client_loop)
    loop.start()
    try:
        scenario.pods("scale", {n: node[n] for n in names[3:]})
        scenario.check("3 -> 5", CLIENT, ip, 80, ",".join(names) + " from pod", count=40)
        for n in names[1:]:   # 5 -> 1 as a kubelet would: terminating and not ready first,
            scenario.terminating(n)
            scenario.ready(n, False)
        scenario.check("5 -> 1", CLIENT, ip, 80, "scale-1 from pod")
        for n in names[1:]:   # then the pods go away
            scenario.delete_pod(n)
        scenario.check("after the pods left", CLIENT, ip, 80, "scale-1 from pod")
    finally:
        stop.set()
        loop.join()
    failed = [x for x in lines if not x.startswith("scale-")]
    scenario.note("client loop during 3 -> 5 -> 1", f"{len(failed)} failed")
    assert not failed, f"{len(failed)} of {len(lines)} connections failed, e.g. {failed[:3]}"


def test_deleted_service(scenario):
    scenario.pods("gone", {"gone-1": "node2"})
    ip = scenario.service("gone", "gone", [HTTP])
    scenario.check("before", CLIENT, ip, 80, "gone-1 from pod")
    scenario.delete_service("gone")
    # Nothing answers in any mode; how it fails differs (see DIVERGENCES and iptables).
    scenario.check("tcp pod", CLIENT, ip, 80, {"nftables": "TIMEOUT",
                                               "iptables": "ERROR ENETUNREACH"}, count=2)


def test_labels_for_other_proxies(scenario):
    """kube-proxy 1.36 (cmd/kube-proxy/app/server.go) watches Services without the
    service.kubernetes.io/service-proxy-name label (others belong to another proxy) and
    EndpointSlices without service.kubernetes.io/headless; the headless label on a Service
    itself changes nothing."""
    scenario.pods("other", {"other-1": "node2"})
    want_ignored = {"nftables": "TIMEOUT", "iptables": "ERROR ENETUNREACH"}
    for check, label, want in (("service-proxy-name", "service-proxy-name", want_ignored),
                               ("headless label on the Service", "headless",
                                "other-1 from pod")):
        ip = scenario.service(f"other-{label}", "other", [HTTP],
                              labels={f"service.kubernetes.io/{label}": "someone-else"})
        scenario.wait_endpoints(f"other-{label}", 1)
        scenario.check(check, CLIENT, ip, 80, want, count=2)
    # A selector-less Service whose only slice carries the headless label: no endpoints.
    ip = scenario.service("other-slice", None, [HTTP])
    scenario.endpoint_slice("other-slice", ["other-1"], 8080,
                            labels={"service.kubernetes.io/headless": ""})
    scenario.check("headless label on its EndpointSlice", CLIENT, ip, 80, "REFUSED", count=2)
