"""A server whose port is taken waits for it instead of failing (kube-proxy still on the
node during a migration). Real sockets on the loopback, an ephemeral port."""
import socket
import threading
import time
import urllib.request

import pytest
from prometheus_client import CollectorRegistry

from kproxy_ebpf.serve import health
from kproxy_ebpf.serve.port_wait import PortWaits


@pytest.fixture
def taken():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    s.listen()
    yield s
    s.close()


def test_a_taken_port_is_waited_for_then_served(taken, caplog):
    caplog.set_level("INFO")
    port = taken.getsockname()[1]
    registry = CollectorRegistry()
    told = []
    waits = PortWaits(registry, retry=0.05, told=lambda *a: told.append(a))
    stop = threading.Event()
    h = health.ProxyHealth(60)
    listener = waits.serve(("127.0.0.1", port), health.handler(h), "healthz", stop)
    try:
        assert not listener.serving.is_set()
        assert registry.get_sample_value("kproxy_listen_port_in_use",
                                         {"server": "healthz"}) == 1
        assert "in use by another process" in caplog.text
        assert told[0][0] == "PortInUse"
        taken.close()
        assert listener.serving.wait(5)
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/livez", timeout=5) as r:
            assert r.status == 200
        assert registry.get_sample_value("kproxy_listen_port_in_use",
                                         {"server": "healthz"}) == 0
        assert "is free now; serving healthz" in caplog.text
        deadline = time.monotonic() + 5
        while told[-1][0] != "PortFree" and time.monotonic() < deadline:
            time.sleep(0.01)
        assert told[-1][0] == "PortFree"
    finally:
        stop.set()
        if listener.server:
            listener.server.shutdown()
            listener.server.server_close()


def test_a_free_port_is_served_at_once():
    stop = threading.Event()
    listener = PortWaits(CollectorRegistry()).serve(("127.0.0.1", 0),
                                                    health.handler(health.ProxyHealth(60)),
                                                    "healthz", stop)
    assert listener.serving.is_set() and listener.server is not None
    listener.server.shutdown()
    listener.server.server_close()


def test_other_bind_errors_still_stop_the_caller():
    with pytest.raises(OSError):
        PortWaits(CollectorRegistry()).serve(("192.0.2.1", 0),
                                             health.handler(health.ProxyHealth(60)), "healthz",
                                             threading.Event())
