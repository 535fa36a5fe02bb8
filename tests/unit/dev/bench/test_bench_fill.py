"""The bench's API objects and metric parsing (pure parts of fill.py and testbed.py)."""
import ipaddress

from kproxy_ebpf.dev.bench import fill
from kproxy_ebpf.dev.bench.testbed import metric, parse_prometheus

LAB_RANGES = [ipaddress.ip_network(c) for c in
              ("10.244.0.0/16", "10.250.0.0/24", "10.96.0.0/16", "169.254.0.0/16")]


def test_filler_addresses_unique_and_outside_every_lab_range():
    n, e = 30000, 10          # the largest N the CLI allows
    seen = set()
    for i in (0, 1, n // 2, n - 1):
        for j in range(e):
            seen.add(fill.filler_address(i, j, e))
    assert len(seen) == 4 * e
    last = ipaddress.ip_address(fill.filler_address(n - 1, e - 1, e))
    for addr in (ipaddress.ip_address(fill.filler_address(0, 0, e)), last,
                 ipaddress.ip_address(fill.churn_address(10 ** 6))):
        assert addr in ipaddress.ip_network("10.128.0.0/10")
        assert not any(addr in net for net in LAB_RANGES)
    assert last < ipaddress.ip_address(fill.churn_address(0))   # the two ranges never meet


def test_ipv6_filler_addresses_are_unique_local_and_outside_every_lab_range():
    from kproxy_ebpf.dev.lab.addressing import PLANS
    from kproxy_ebpf.model.objects import IPFamily

    v6 = PLANS[IPFamily.IPV6]
    lab6 = [ipaddress.ip_network(c) for c in (v6.underlay_cidr, v6.pod_supernet,
                                              v6.service_cidr, "fe80::/10")]
    n, e = 30000, 10
    last = ipaddress.ip_address(fill.filler_address(n - 1, e - 1, e, v6=True))
    for addr in (ipaddress.ip_address(fill.filler_address(0, 0, e, v6=True)), last,
                 ipaddress.ip_address(fill.churn_address(10 ** 6, v6=True))):
        assert addr.version == 6 and addr in ipaddress.ip_network("fd00::/8")
        assert not any(addr in net for net in lab6)
    assert last < ipaddress.ip_address(fill.churn_address(0, v6=True))
    assert fill.slice_obj("fill-00001", [str(last)])["addressType"] == "IPv6"


def test_slice_is_ours_not_the_controllers():
    s = fill.slice_obj("fill-00001", ["10.128.0.2", "10.128.0.3"])
    labels = s["metadata"]["labels"]
    assert labels["kubernetes.io/service-name"] == "fill-00001"
    assert labels["endpointslice.kubernetes.io/managed-by"] != "endpointslice-controller.k8s.io"
    assert [ep["conditions"]["ready"] for ep in s["endpoints"]] == [True, True]
    assert s["ports"] == [{"port": fill.TARGET_PORT, "protocol": "TCP"}]
    svc = fill.service_obj("x", (("req", 80, 8080), ("sink", 81, 8081)))
    assert "selector" not in svc["spec"]                        # no controller-managed slice
    assert [p["name"] for p in svc["spec"]["ports"]] == ["req", "sink"]
    assert fill.replace_endpoint_op(3, "10.160.0.9") == [
        {"op": "replace", "path": "/endpoints/3/addresses/0", "value": "10.160.0.9"}]


def test_prometheus_parsing_and_labelled_gauges():
    text = ("# HELP x\n# TYPE x gauge\nkproxy_backends 1010.0\n"
            'kubeproxy_sync_proxy_rules_last_timestamp_seconds{ip_family="IPv4"} 1.7e+09\n'
            "bad line\n")
    m = parse_prometheus(text)
    assert metric(m, "kproxy_backends") == 1010
    assert metric(m, "kubeproxy_sync_proxy_rules_last_timestamp_seconds") == 1.7e9
    assert metric(m, "kproxy_back") == 0            # no prefix matches
    assert metric(m, "missing", 5) == 5
