"""`check`: desired frontends against what the maps hold (as reader.services() decodes it)."""
from kproxy_ebpf.check import compare
from kproxy_ebpf.desired import Action, Backend, Frontend, FrontendKind, ServicePortName
from kproxy_ebpf.model import Protocol

TCP = Protocol.TCP
SPN = ServicePortName("default", "web", "http", TCP)


def fe(ip, backends=(), action=Action.FORWARD):
    return Frontend(ip, 80, TCP, FrontendKind.CLUSTER_IP, SPN, action,
                    tuple(Backend(b, 8080, TCP) for b in backends))


def held(ip, backends=(), action="forward", service="default/web:http"):
    return {"address": ip, "port": 80, "protocol": "TCP", "type": "ClusterIP", "scope": 0,
            "service": service, "action": action, "affinity_timeout": 0,
            "backends": [{"slot": i + 1, "address": b, "port": 8080, "state": "ready"}
                         for i, b in enumerate(backends)]}


def test_in_sync():
    f = fe("10.96.0.10", ["10.244.1.10", "10.244.2.10"])
    assert compare({f.key: f}, [held("10.96.0.10", ["10.244.2.10", "10.244.1.10"])]) == []


def test_missing_stale_and_different():
    a, b = fe("10.96.0.10", ["10.244.1.10"]), fe("10.96.0.11", action=Action.REJECT)
    kernel = [held("10.96.0.10", ["10.244.9.9"]), held("10.96.0.12", service="default/old")]
    drifts = {(d.what, d.frontend) for d in compare({a.key: a, b.key: b}, kernel)}
    assert drifts == {("different", "10.96.0.10:80/TCP"), ("missing", "10.96.0.11:80/TCP"),
                      ("stale", "10.96.0.12:80/TCP")}
