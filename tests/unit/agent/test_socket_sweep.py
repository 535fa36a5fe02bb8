"""When the agent searches for stale sockets and what it does with the result
(socket_sweep.py), with the search itself replaced by a recorder: which sockets it ends is
tested in test_stale_sockets.py and in the lab."""
from __future__ import annotations

import pytest

from kproxy_ebpf.agent.established import Established
from kproxy_ebpf.agent.socket_sweep import SocketSweep
from kproxy_ebpf.datapath.sockets.stale_sockets import Outcome, Reaped, peer_of
from kproxy_ebpf.datapath.write.writer import MapWriter
from kproxy_ebpf.model.objects import Node, Protocol
from kproxy_ebpf.proxy.state import ProxyState
from kproxy_ebpf.serve.metrics import Metrics

from ...builders import ep, sl, svc
from ...fakemaps import checked_maps

TCP = Protocol.TCP


class Recorder:
    supported = True

    def __init__(self) -> None:
        self.calls: list[set | None] = []
        self.everywhere: list[bool] = []
        self.fail = False

    def reap(self, serves, held, peers=None, everywhere=False) -> Reaped:
        self.calls.append(peers)
        self.everywhere.append(everywhere)
        self.held = held
        if self.fail:
            raise OSError("netlink went away")
        return Reaped(counts={("TCP", Outcome.DESTROYED): 1} if peers else {})


@pytest.fixture(params=[False, True], ids=["where-adopted", "where-new"])
def world(request):
    state = ProxyState(Node(name="node-a", addresses=("192.168.0.1",)))
    state.upsert_service(svc())
    writer, stale = MapWriter(checked_maps()), Recorder()
    sweep = SocketSweep(stale, Metrics(), new_where=request.param)
    stale.new_where = request.param

    def sync(*ips: str, full: bool = False) -> None:
        state.upsert_slice(sl(*(ep(ip, "node-b") for ip in ips)))
        changes = state.compute()
        before = sweep.before(writer.held, None if full else changes.recomputed_keys)
        assert writer.apply(changes.frontends).ok
        sweep.after(before, Established(writer.held, changes.frontends, state.serving_endpoints), full,
                    writer.held.holds)
    return sync, stale


def test_every_socket_first_then_only_the_backends_a_sync_removed(world):
    sync, stale = world
    sync("10.0.2.1", "10.0.2.2")
    assert stale.calls == [None]                      # the first sync: every socket
    sync("10.0.2.1", "10.0.2.2", "10.0.2.3")          # nothing removed: no search
    assert stale.calls == [None]
    sync("10.0.2.1", "10.0.2.3")
    assert stale.calls[1] == {peer_of(("10.0.2.2", 8080, TCP))}
    sync("10.0.2.1", "10.0.2.3", full=True)           # a full sync: every socket again
    assert stale.calls[2] is None
    # Every namespace once, and only when kp_skwhere is new beside adopted maps.
    assert stale.everywhere == [stale.new_where, False, False]
    assert stale.held(peer_of(("10.0.2.3", 8080, TCP)))
    assert not stale.held(peer_of(("10.0.2.2", 8080, TCP)))


def test_a_failed_search_is_logged_and_the_next_sync_searches_everything(world, caplog):
    sync, stale = world
    stale.fail = True
    sync("10.0.2.1")
    assert "the search for stale sockets failed" in caplog.text
    stale.fail = False
    sync("10.0.2.1", "10.0.2.4")
    assert stale.calls == [None, None]
