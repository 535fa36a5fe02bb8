"""datapath/pod_devices.py: which links get the per-packet ClusterIP programs, once each, with
a fake netlink listing (the real one is exercised by tests/datapath/test_agent_socket_lb.py)."""
from __future__ import annotations

import pytest

from kproxy_ebpf.datapath.load.pod_devices import DEFAULT_GLOBS, PodDeviceWatcher, matches


class Link(dict):
    def __init__(self, index: int, name: str):
        super().__init__(index=index)
        self.name = name

    def get_attr(self, attr: str) -> str:
        assert attr == "IFLA_IFNAME"
        return self.name


class FakeIPRoute:
    def __init__(self, *links: tuple[int, str]):
        self.links = dict(links)

    def get_links(self):
        return [Link(i, n) for i, n in self.links.items()]


@pytest.mark.parametrize("name,expected", [("veth1a2b", True), ("cali12345", True),
                                           ("lxc_health", True), ("kpv0011aabb", True),
                                           ("eth0", False), ("lo", False), ("cni0", False)])
def test_default_globs(name, expected):
    assert matches(name, DEFAULT_GLOBS) is expected


def test_each_matching_device_once_excluded_and_vanished_ones_forgotten():
    done, forgotten = [], []
    w = PodDeviceWatcher(("kpv*", "veth*"), lambda ipr, i, n: done.append((i, n)),
                         exclude=("veth-ext",), forget=forgotten.append)
    ipr = FakeIPRoute((1, "lo"), (2, "eth0"), (3, "kpv1"), (4, "veth-ext"), (5, "veth9"))
    w.scan(ipr)
    w.scan(ipr)
    assert done == [(3, "kpv1"), (5, "veth9")], "attached once each; eth0 and the excluded not"
    del ipr.links[3]
    ipr.links[6] = "kpv2"
    ipr.links[5] = "veth5-renamed-new"      # same index, another device: attached again
    w.scan(ipr)
    assert done[2:] == [(5, "veth5-renamed-new"), (6, "kpv2")]
    assert w.attached == {5: "veth5-renamed-new", 6: "kpv2"}
    assert forgotten == [3, 5], "the vanished devices' leftovers (tcx pins) go, before a re-attach"


def test_a_failed_attach_is_retried_at_the_next_listing(caplog):
    calls = []

    def attach(ipr, index, name):
        calls.append(name)
        if len(calls) == 1:
            raise OSError("EBUSY")

    w = PodDeviceWatcher(("kpv*",), attach)
    ipr = FakeIPRoute((3, "kpv1"))
    w.scan(ipr)
    assert w.attached == {} and "could not attach" in caplog.text
    w.scan(ipr)
    assert calls == ["kpv1", "kpv1"] and w.attached == {3: "kpv1"}
