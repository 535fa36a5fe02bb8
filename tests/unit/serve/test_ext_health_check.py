"""healthCheckNodePort (semantics 1.9): which Services get a server, what it counts and says.

The HTTP test binds 127.0.0.1 on a free port: loopback only, no packet leaves the host.
"""
from __future__ import annotations

import functools
import json
import socket
import urllib.error
import urllib.request

import pytest

from kproxy_ebpf.model.objects import EndpointPort, Node, Protocol, ServicePort, ServiceType
from kproxy_ebpf.proxy.healthcheck import HealthCheck, health_check
from kproxy_ebpf.proxy.state import ProxyState
from kproxy_ebpf.serve.service_health import ServiceHealthServers

from ... import builders

TCP, UDP = Protocol.TCP, Protocol.UDP
NODE = Node(name="node-a", addresses=("192.168.0.1",))
LB = ServiceType.LOAD_BALANCER


# An eTP Local LoadBalancer "lb" with healthCheckNodePort 32000, its slice and local endpoints.
svc = functools.partial(builders.svc, name="lb", type=LB, external_traffic_local=True, health_check_node_port=32000,
                        ports=(ServicePort("a", TCP, 80, 30080), ServicePort("b", UDP, 53, 30053)))
sl = functools.partial(builders.sl, name="lb-1", svc="lb",
                       ports=(EndpointPort("a", TCP, 8080), EndpointPort("b", UDP, 5353)))
ep = functools.partial(builders.ep, node="node-a")


@pytest.mark.parametrize("service,expected", [
    pytest.param(svc(), 32000, id="lb-etp-local"),
    pytest.param(svc(external_traffic_local=False), None, id="etp-cluster-none"),
    pytest.param(svc(type=ServiceType.NODE_PORT), None, id="nodeport-none"),
    pytest.param(svc(health_check_node_port=0), None, id="no-port"),
])
def test_which_services_get_a_server(service, expected):
    hc = health_check(service, [], NODE)
    assert (hc.port if hc else None) == expected


@pytest.mark.parametrize("endpoints,count", [
    pytest.param([ep("10.0.1.1"), ep("10.0.1.2")], 2, id="two-local"),
    pytest.param([ep("10.0.1.1"), ep("10.0.2.1", node="node-b")], 1, id="remote-not-counted"),
    pytest.param([ep("10.0.1.1", ready=False, serving=True, terminating=True)], 0,
                 id="terminating-not-counted"),
    pytest.param([ep("10.0.1.1", ready=False)], 0, id="unready-not-counted"),
    pytest.param([], 0, id="none"),
])
def test_local_endpoints_are_unique_local_ready_ips_over_all_ports(endpoints, count):
    # Both ports list every endpoint: an IP counts once.
    assert health_check(svc(), [sl(*endpoints)], NODE).local_endpoints == count


def test_state_first_service_keeps_a_shared_port():
    state = ProxyState(NODE)
    state.load([svc(name="b"), svc(name="a")], [sl(ep("10.0.1.1"), svc="b")])
    state.compute()                     # health_checks() reads what compute() kept
    assert state.health_checks() == {32000: HealthCheck("ns", "a", 32000, 0)}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _get(port):
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/any/path", timeout=5) as r:
            return r.status, r.headers, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, e.headers, json.loads(e.read())


def test_servers_answer_kube_proxy_codes_and_body_and_follow_the_services():
    healthy = [True]
    servers = ServiceHealthServers(lambda: healthy[0], address="127.0.0.1")
    p1, p2 = _free_port(), _free_port()
    try:
        servers.sync({p1: HealthCheck("ns", "one", p1, 2), p2: HealthCheck("ns", "two", p2, 0)})
        code, headers, body = _get(p1)
        assert code == 200 and body == {"service": {"namespace": "ns", "name": "one"},
                                        "localEndpoints": 2, "serviceProxyHealthy": True}
        assert headers["Content-Type"] == "application/json"
        assert headers["X-Content-Type-Options"] == "nosniff"
        assert _get(p2)[0] == 503
        healthy[0] = False
        code, _, body = _get(p1)
        assert code == 503 and body["serviceProxyHealthy"] is False
        servers.sync({p2: HealthCheck("ns", "two", p2, 1)})
        healthy[0] = True
        assert _get(p2)[0] == 200
        with pytest.raises(urllib.error.URLError):
            urllib.request.urlopen(f"http://127.0.0.1:{p1}/", timeout=5)
    finally:
        servers.close()


def test_a_server_on_all_families_answers_ipv4_and_ipv6_clients():
    """healthCheckNodePorts listen on every address of both families by default (kube-proxy's
    ":port"): a load balancer probing a node's IPv6 address is answered too. Probed on
    loopback only."""
    servers = ServiceHealthServers(lambda: True)
    port = _free_port()
    try:
        servers.sync({port: HealthCheck("ns", "one", port, 1)})
        for host in ("127.0.0.1", "[::1]"):
            with urllib.request.urlopen(f"http://{host}:{port}/", timeout=5) as r:
                assert r.status == 200, host
    finally:
        servers.close()
