"""TcDatapath._attach_dev: the egress program goes on before the ingress one, so that no reply
of a flow the ingress program translated leaves untranslated (make migrate saw one such
SYN-ACK at an attach beside kube-proxy); tcx links first, an older agent's clsact filters
deleted after them; the clsact path once the kernel refuses tcx."""
from pathlib import Path

import pytest

from kproxy_ebpf.datapath.load import tc, tcx


class FakeIpr:
    def __init__(self, filters: dict[int, list[str]] | None = None) -> None:
        self.calls: list[tuple] = []
        self.filters = filters or {}

    def tc(self, command: str, *args, **kw) -> None:
        self.calls.append((command, kw.get("parent"), kw.get("name")))

    def get_filters(self, index: int, parent: int) -> list:
        return [FakeFilter(name) for name in self.filters.get(parent, [])]


class FakeFilter:
    def __init__(self, name: str) -> None:
        self.name = name

    def get_attr(self, attr: str):
        return self if attr == "TCA_OPTIONS" else f"{self.name}:[42]"


def datapath() -> tc.TcDatapath:
    d = tc.TcDatapath(Path("/nonexistent"), ["eth0"], ())
    d._fds = {prog: 100 + i for i, prog in enumerate(tc.PROGRAMS)}
    return d


@pytest.fixture
def links(monkeypatch) -> list[tuple[int, str, int]]:
    made: list[tuple[int, str, int]] = []
    monkeypatch.setattr(tcx, "attach", lambda _dir, index, where, fd: made.append(
        (index, where, fd)) or False)
    return made


def test_tcx_egress_before_ingress(links) -> None:
    for programs in (tc.EXT_PROGRAMS, tc.POD_PROGRAMS):
        links.clear()
        d, ipr = datapath(), FakeIpr()
        d._attach_dev(ipr, 2, "eth0", programs)
        assert [where for _, where, _ in links] == ["egress", "ingress"]
        assert {fd for _, _, fd in links} == {d._fds[p] for p in programs}
        assert ipr.calls == []          # no qdisc, no filter


def test_legacy_filters_deleted_after_the_links(links) -> None:
    d = datapath()
    ipr = FakeIpr({tc.INGRESS: ["kp_from_outside"], tc.EGRESS: ["kp_to_outside", "other"]})
    d._attach_dev(ipr, 2, "eth0", tc.EXT_PROGRAMS)
    assert len(links) == 2
    assert ipr.calls == [("del-filter", tc.EGRESS, None), ("del-filter", tc.INGRESS, None)]


def test_clsact_when_the_kernel_refuses_tcx(monkeypatch) -> None:
    tries = []

    def refuse(*args) -> bool:
        tries.append(args)
        raise tcx.Unsupported("link create: Invalid argument")

    monkeypatch.setattr(tcx, "attach", refuse)
    d = datapath()
    for programs in (tc.EXT_PROGRAMS, tc.POD_PROGRAMS):
        ipr = FakeIpr()
        d._attach_dev(ipr, 2, "eth0", programs)
        filters = [(parent, name) for cmd, parent, name in ipr.calls if cmd == "replace-filter"]
        assert [parent for parent, _ in filters] == [tc.EGRESS, tc.INGRESS]
        assert {name for _, name in filters} == set(programs)
    assert len(tries) == 1              # asked once, not per device
