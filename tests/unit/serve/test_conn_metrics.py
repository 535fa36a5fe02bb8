from prometheus_client import CollectorRegistry, generate_latest

from kproxy_ebpf.serve.conn_metrics import BackendConnsCollector


def test_backend_connections_are_bounded_busiest_first():
    reg = CollectorRegistry()
    rows = [("10.0.0.2:8080", "TCP", 5), ("10.0.0.1:8080", "TCP", 2), ("[fd00::1]:53", "UDP", 1)]
    reg.register(BackendConnsCollector(lambda: rows, 2))
    text = generate_latest(reg).decode()
    assert 'kproxy_backend_connections{backend="10.0.0.2:8080",protocol="TCP"} 5.0' in text
    assert 'kproxy_backend_connections{backend="10.0.0.1:8080",protocol="TCP"} 2.0' in text
    assert "fd00::1" not in text
    assert "kproxy_backend_metrics_omitted 1.0" in text


def test_a_map_that_cannot_be_read_gives_no_series_and_no_error():
    def fail():
        raise OSError("gone")
    reg = CollectorRegistry()
    reg.register(BackendConnsCollector(fail, 10))
    assert "kproxy_backend_metrics_omitted 0.0" in generate_latest(reg).decode()
