"""ct_handoff: which of kp_ct's flows are written into the kernel's conntrack, and how (the
`conntrack` arguments measured by tools/probes/ct_inject.sh)."""
from __future__ import annotations

import socket

from kproxy_ebpf.datapath.load import ct_handoff
from kproxy_ebpf.datapath.maps import layout as L


def row(state: str = "established", flags: int = 0, proto: int = socket.IPPROTO_TCP,
        client: str = "10.9.0.2", be: str = "10.1.0.5", nat: str = "0.0.0.0"):
    key = L.ct_key(client, 40000, "10.0.1.1", 30080, proto)
    val = L.CtVal(be_addr=L.ip16(be), nat_addr=L.ip16(nat), be_port=L.port_be(8080),
                  nat_port=L.port_be(50001))
    val.state = {v: k for k, v in L.CT_STATE_NAMES.items()}[state]
    val.flags = flags
    return key, val


class FakeMap:
    """What ct_handoff reads of a PinnedMap: items() (ctypes rows are not hashable)."""

    def __init__(self, rows) -> None:
        self.rows = list(rows)

    def items(self):
        return iter(self.rows)

    def close(self) -> None:
        pass


def ct(*rows):
    return {"ct": FakeMap(rows)}


def test_established_tcp_flows_with_their_nat_only():
    maps = ct(row(), row(flags=L.CT_F_SNAT, client="10.9.0.3", nat="10.0.1.1"),
              row(state="new", client="10.9.0.4"), row(state="closing", client="10.9.0.5"),
              row(proto=socket.IPPROTO_UDP, client="10.9.0.6"))
    found, skipped = ct_handoff.flows(maps)
    assert skipped == 0
    assert sorted(found) == [
        (("10.9.0.2", 40000), ("10.0.1.1", 30080), ("10.1.0.5", 8080), None),
        (("10.9.0.3", 40000), ("10.0.1.1", 30080), ("10.1.0.5", 8080), ("10.0.1.1", 50001))]


def test_ipv6_flows_are_counted_not_written():
    found, skipped = ct_handoff.flows(ct(row(client="fd00::2", be="fd00:1::5")))
    assert (found, skipped) == ([], 1)


def test_the_entry_is_the_flows_own_tuple_with_the_nat_as_attributes():
    deletes, create = ct_handoff.argv_for(("10.9.0.2", 40000), ("10.0.1.1", 30080),
                                          ("10.1.0.5", 8080), ("10.0.1.1", 50001))
    # the translated halves netfilter may hold: client -> backend, frontend -> client, SNAT
    assert [d[4:] for d in deletes] == [
        ["10.9.0.2", "-d", "10.1.0.5", "--sport", "40000", "--dport", "8080"],
        ["10.0.1.1", "-d", "10.9.0.2", "--sport", "30080", "--dport", "40000"],
        ["10.0.1.1", "-d", "10.1.0.5", "--sport", "50001", "--dport", "8080"]]
    args = " ".join(create)
    # the reply tuple is the plain inverse: the kernel's NAT setup translates it
    assert "-s 10.9.0.2 -d 10.0.1.1 --sport 40000 --dport 30080" in args
    assert "-r 10.0.1.1 -q 10.9.0.2 --reply-port-src 30080 --reply-port-dst 40000" in args
    assert "--dst-nat 10.1.0.5:8080 --src-nat 10.0.1.1:50001" in args
    assert "--state ESTABLISHED" in args
    _, local = ct_handoff.argv_for(("10.9.0.2", 40000), ("10.0.1.1", 30080), ("10.1.0.5", 8080),
                                   None)
    # no SNAT: the client's own source, so that the kernel cannot pick another port
    assert "--dst-nat 10.1.0.5:8080 --src-nat 10.9.0.2:40000" in " ".join(local)


def test_nothing_to_write_without_the_tool_is_said(monkeypatch):
    monkeypatch.setattr(ct_handoff.shutil, "which", lambda _: None)
    written, problems = ct_handoff.handoff(ct(row()))
    assert written == 0 and "conntrack not found" in problems[0]
    assert ct_handoff.handoff(ct()) == (0, [])
