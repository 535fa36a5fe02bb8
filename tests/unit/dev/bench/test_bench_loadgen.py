"""The watch client's wait gives up when the proxy under measurement dies (kproxy-tc with an
agent that exits at start must not cost the whole cold-start timeout)."""
import subprocess
import sys

import pytest

from kproxy_ebpf.dev.bench.loadgen import ProxyDied, Watcher


def _watcher(code: str) -> Watcher:
    w = Watcher.__new__(Watcher)        # no lab: a stand-in process speaks the protocol
    w.p = subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE,
                           stdout=subprocess.PIPE, text=True, bufsize=1)
    return w


def test_result_stops_waiting_when_the_proxy_is_gone():
    w = _watcher("import sys; sys.stdin.read()")      # never answers until stdin closes
    try:
        with pytest.raises(ProxyDied):
            w.result(alive=lambda: False)
    finally:
        w.p.stdin.close()
        w.p.wait(timeout=10)


def test_result_returns_the_answer_while_the_proxy_lives():
    w = _watcher("print('{\"ok\": true, \"seen_realtime_ns\": 5}')")
    try:
        assert w.result(alive=lambda: True) == {"ok": True, "seen_realtime_ns": 5}
    finally:
        w.p.wait(timeout=10)
