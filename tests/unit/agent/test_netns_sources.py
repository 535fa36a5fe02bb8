"""The bookkeeping of kp_nssrc (datapath/netns_sources.py): rows for every namespace while a
frontend has ranges, none after; a namespace gone loses its rows; a miss the hook noted makes
every namespace be looked at again (a reused inode has a new cookie); a full map is reported, not
raised. The namespaces and their routes are stand-ins here; tests/integration/test_lb_cluster.py
runs the real walk against pods and the node under kube-proxy's oracle."""
from __future__ import annotations

import ctypes

import pytest

from kproxy_ebpf.agent.client_sources import ClientSources
from kproxy_ebpf.datapath.maps import layout as L
from kproxy_ebpf.datapath.sockets import netns_scope, netns_sources
from kproxy_ebpf.datapath.sockets.netns_sources import NetnsSources
from kproxy_ebpf.model.desired import FrontendKind, Scope
from kproxy_ebpf.model.objects import IPFamily
from kproxy_ebpf.serve.metrics import Metrics

from ...builders import fe
from ...fakemaps import FakeMap

V4 = IPFamily.IPV4


class Node:
    """Namespaces by path -> (inode, cookie, address), what the walk and the routes give."""

    def __init__(self, monkeypatch, tmp_path):
        self.tmp, self.ns = tmp_path, {}
        monkeypatch.setattr(netns_scope, "scope", lambda root, dirs: netns_scope.Scope(
            frozenset(), tuple(str(self.tmp / n) for n in sorted(self.ns))))
        monkeypatch.setattr(netns_sources, "_resolve", self.resolve)
        self.resolved = 0

    def add(self, name: str, cookie: int, addr: str) -> None:
        (self.tmp / name).write_text(name)
        self.ns[name] = (cookie, addr)

    def remove(self, name: str) -> None:
        (self.tmp / name).unlink()
        del self.ns[name]

    def resolve(self, path, targets):
        self.resolved += 1
        cookie, addr = self.ns[path.rsplit("/", 1)[1]]
        return cookie, dict.fromkeys(targets, addr)


@pytest.fixture
def node(monkeypatch, tmp_path):
    return Node(monkeypatch, tmp_path)


def sources(max_entries=100) -> NetnsSources:
    return NetnsSources(FakeMap(L.MAPS["nssrc"], max_entries), FakeMap(L.MAPS["nsmiss"]), "/x")


def rows(src: NetnsSources) -> dict[int, str]:
    return {k.netns: L.ip_text(bytes(src.rows.get(k))) for k in src.rows.keys()}


def test_rows_while_wanted_and_none_after(node):
    node.add("host", 1, "10.250.0.11")
    node.add("pod-a", 7, "10.244.1.5")
    src = sources()
    assert src.poll() is None, "nothing to do while no frontend has ranges"
    src.want({V4: "198.51.100.1"})
    assert rows(src) == {1: "10.250.0.11", 7: "10.244.1.5"}
    assert src.want({V4: "198.51.100.1"}) is None, "the same targets: no pass"
    node.add("pod-b", 9, "10.244.1.6")     # before the removal: no inode reuse (next test)
    node.remove("pod-a")
    src.last_scan = 0                               # the rescan is due
    res = src.poll()
    assert (res.learnt, res.removed) == (1, 1)
    assert rows(src) == {1: "10.250.0.11", 9: "10.244.1.6"}
    src.want({})
    assert rows(src) == {} and not src.known


def test_a_miss_looks_at_every_namespace_again(node):
    node.add("pod-a", 7, "10.244.1.5")
    src = sources()
    src.want({V4: "198.51.100.1"})
    # The namespace went and a new one got its inode: same path and inode, a new cookie.
    node.ns["pod-a"] = (8, "10.244.1.7")
    assert src.poll() is None, "not due, nothing missed: the known inode is not re-read"
    src.misses.put(ctypes.c_uint64(8), ctypes.c_uint64(123))
    src.poll()
    assert rows(src) == {8: "10.244.1.7"}
    assert src.misses.keys() == [], "the misses are consumed"


def test_a_full_map_is_reported_not_raised(node, caplog):
    for i in range(3):
        node.add(f"pod-{i}", 10 + i, f"10.244.1.{i + 1}")
    src = sources(max_entries=2)
    res = src.want({V4: "198.51.100.1"})
    assert (res.learnt, res.failed) == (2, 1)
    assert "kp_nssrc" in caplog.text and "full" in caplog.text


def test_client_sources_follow_the_range_limited_socket_frontends(node):
    node.add("pod-a", 7, "10.244.1.5")
    cs = ClientSources(sources(), Metrics())
    lb = fe("198.51.100.1", 80, ("10.244.1.10",), kind=FrontendKind.LOAD_BALANCER,
            scope=Scope.SOCK, ranges=("203.0.113.0/24",))
    ext = fe("198.51.100.1", 80, ("10.244.1.10",), kind=FrontendKind.LOAD_BALANCER,
             scope=Scope.EXT, ranges=("203.0.113.0/24",))
    cs.before_apply({ext.key: ext}, None)
    assert not cs.sources.active, "the TC path judges packets by their own source"
    cs.before_apply({ext.key: ext, lb.key: lb}, [lb.key])
    assert cs.sources.targets == {V4: "198.51.100.1"} and rows(cs.sources) == {7: "10.244.1.5"}
    cs.before_apply({ext.key: ext}, [lb.key])
    assert not cs.sources.active and rows(cs.sources) == {}
