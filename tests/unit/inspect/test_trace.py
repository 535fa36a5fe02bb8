"""`trace` (kproxy_ebpf/inspect/trace.py) over maps the writer filled (fake maps): each verdict and the
step that decides it. tests/integration/test_trace.py compares it with where probes land."""
from __future__ import annotations

import dataclasses

from kproxy_ebpf.datapath.maps import layout as L
from kproxy_ebpf.datapath.write.writer import MapWriter
from kproxy_ebpf.inspect.trace import Verdict, tc_client, trace
from kproxy_ebpf.model.desired import Action, FrontendKind, Scope
from kproxy_ebpf.model.objects import Protocol

from ...builders import fe
from ...fakemaps import FakeMap

TCP = Protocol.TCP


def written(*frontends) -> dict:
    maps = {n: FakeMap(L.MAPS[n]) for n in ("svc", "backend", "meta", "srcrange", "affinity")}
    assert MapWriter(maps).apply({f.key: f for f in frontends}).ok
    return maps


def test_a_cluster_ip_lists_its_backends_in_slot_order():
    maps = written(fe("10.96.0.10", 80, ("10.244.1.5", "10.244.2.6")))
    t = trace(maps, "10.96.0.10", 80, TCP, Scope.SOCK)
    assert t.verdict is Verdict.FORWARD and t.service == "default/web:http"
    assert sorted(t.candidates) == ["10.244.1.5:8080", "10.244.2.6:8080"] and t.chosen is None
    assert [s.step for s in t.steps] == ["frontend", "backends"]
    # The other scope holds no such frontend.
    assert trace(maps, "10.96.0.10", 80, TCP, Scope.EXT).verdict is Verdict.UNTOUCHED


def test_refusals_say_why():
    local = dataclasses.replace(fe("10.96.0.11", 80, (), Action.DROP), kind=FrontendKind.CLUSTER_IP)
    maps = written(local, fe("10.96.0.12", 80, (), Action.REJECT))
    t = trace(maps, "10.96.0.11", 80, TCP, Scope.SOCK)
    assert t.verdict is Verdict.UNREACHABLE
    assert "internalTrafficPolicy Local and no endpoint on this node" in t.steps[-1].why
    assert "EHOSTUNREACH" in t.steps[-1].why
    t = trace(maps, "10.96.0.12", 80, TCP, Scope.SOCK)
    assert t.verdict is Verdict.REFUSED and "ECONNREFUSED" in t.steps[-1].why


def test_source_ranges_judge_the_client():
    lb = fe("198.51.100.1", 80, ("10.244.1.5",), kind=FrontendKind.LOAD_BALANCER,
            scope=Scope.EXT, ranges=("203.0.113.0/24",))
    maps = written(lb)
    assert trace(maps, "198.51.100.1", 80, TCP, Scope.EXT, "203.0.113.9").verdict \
        is Verdict.FORWARD
    t = trace(maps, "198.51.100.1", 80, TCP, Scope.EXT, "192.0.2.1")
    assert t.verdict is Verdict.DENIED and "dropped" in t.steps[-1].why
    assert trace(maps, "198.51.100.1", 80, TCP, Scope.EXT).verdict is Verdict.FORWARD


def test_a_fresh_affinity_row_names_the_backend():
    maps = written(fe("10.96.0.13", 80, ("10.244.1.5", "10.244.2.6"), affinity=10800))
    head = maps["svc"].get(L.svc_key("10.96.0.13", 80, TCP))
    slot2 = maps["svc"].get(L.svc_key("10.96.0.13", 80, TCP, slot=2))
    be = maps["backend"].get(L.U32(slot2.backend_id))
    for client in (77, tc_client("192.0.2.7")):
        maps["affinity"].put(L.AffKey(client=client, svc_id=head.svc_id,
                                      type=L.const("KP_AFF_CLIENT"), family=4),
                             L.AffVal(last_used=1_000, backend_id=slot2.backend_id, slot=2))
    want = f"{L.ip_str(be.addr)}:8080"
    assert trace(maps, "10.96.0.13", 80, TCP, Scope.SOCK, "10.244.3.3", 77,
                 now_ns=2_000).chosen == want
    # Another client, or a row older than the timeout: a new choice.
    assert trace(maps, "10.96.0.13", 80, TCP, Scope.SOCK, "10.244.3.4", 78,
                 now_ns=2_000).chosen is None
    assert trace(maps, "10.96.0.13", 80, TCP, Scope.SOCK, "10.244.3.3", 77,
                 now_ns=10800 * 10 ** 9 + 2_000).chosen is None


def test_tc_client_is_the_programs_identity():
    # tc_lb.c kp_tc_client: an IPv4 address's __be32 word with bit 63 set.
    assert tc_client("192.0.2.7") == (1 << 63) | int.from_bytes(bytes([192, 0, 2, 7]), "little")


def test_a_maglev_frontend_names_the_backend_of_a_flow():
    from kproxy_ebpf.model import maglev

    np_ = dataclasses.replace(fe("192.168.0.1", 30080, ("10.244.1.5", "10.244.2.6", "10.244.2.7"),
                                 kind=FrontendKind.NODE_PORT, scope=Scope.EXT), maglev=251)
    maps = {n: FakeMap(L.MAPS[n]) for n in ("svc", "backend", "meta", "maglev")}
    assert MapWriter(maps).apply({np_.key: np_}).ok
    t = trace(maps, "192.168.0.1", 30080, TCP, Scope.EXT, "203.0.113.9")
    assert t.chosen is None and "give --from and --from-port" in t.steps[-1].why
    ips = sorted(b.ip for b in np_.backends)
    for sport in (40000, 40001, 51234):
        t = trace(maps, "192.168.0.1", 30080, TCP, Scope.EXT, "203.0.113.9", source_port=sport)
        entry = maglev.flow_hash("203.0.113.9", sport, 30080, 6) % 251
        want = ips[maglev.build([(ip, 8080) for ip in ips], 251)[entry]]
        assert t.chosen == f"{want}:8080", t.steps
        assert t.steps[-1].step == "maglev" and f"entry {entry} of 251" in t.steps[-1].found
