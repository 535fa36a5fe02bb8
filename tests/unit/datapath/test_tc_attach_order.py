"""TcDatapath._attach_dev: the egress filter goes on before the ingress one, so that no reply
of a flow the ingress program translated leaves untranslated (make migrate saw one such
SYN-ACK at an attach beside kube-proxy)."""
from pathlib import Path

from kproxy_ebpf.datapath.load import tc


class FakeIpr:
    def __init__(self) -> None:
        self.calls: list[tuple] = []

    def tc(self, command: str, *args, **kw) -> None:
        self.calls.append((command, kw.get("parent"), kw.get("name")))


def test_egress_before_ingress() -> None:
    for programs in (tc.EXT_PROGRAMS, tc.POD_PROGRAMS):
        d = tc.TcDatapath(Path("/nonexistent"), ["eth0"], ())
        d._fds = {prog: 100 + i for i, prog in enumerate(tc.PROGRAMS)}
        ipr = FakeIpr()
        d._attach_dev(ipr, 2, "eth0", programs)
        filters = [(parent, name) for cmd, parent, name in ipr.calls if cmd == "replace-filter"]
        assert [parent for parent, _ in filters] == [tc.EGRESS, tc.INGRESS]
        assert {name for _, name in filters} == set(programs)
