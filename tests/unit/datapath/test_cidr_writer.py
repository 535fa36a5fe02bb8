"""CidrWriter against in-memory maps keyed by encoded bytes (as the kernel keys them): the rows
bpf/lib/servicecidr.h reads, written in an order where no address is dropped by mistake."""
from __future__ import annotations

import ipaddress

from kproxy_ebpf.datapath.maps import layout as L
from kproxy_ebpf.datapath.write.apply_result import ApplyResult
from kproxy_ebpf.datapath.write.cidr_writer import CIP_PASS, CIP_REJECT, CidrWriter
from kproxy_ebpf.model.desired import ServiceCIDRSet

from ...fakemaps import FakeMap


def maps(on_op=None, cip_size=1000):
    return {"clusterip": FakeMap(L.MAPS["clusterip"], cip_size, on_op),
            "servicecidr": FakeMap(L.MAPS["servicecidr"], 1000, on_op)}


def verdict(m, ip: str) -> str:
    """What lib/servicecidr.h decides for `ip` (no frontend matched), from the raw rows."""
    row = m["clusterip"].get(L.ip16(ip))
    if row is not None:
        return "pass" if row.action == CIP_PASS else "refused"
    for key in m["servicecidr"].keys():
        net = ipaddress.ip_network(f"{L.ip_text(key.addr)}/{L.prefix_len(key.addr, key.prefixlen)}")
        if ipaddress.ip_address(ip) in net:
            return "unreachable"
    return "pass"


def want(cidrs=(), ours=(), foreign=()):
    return ServiceCIDRSet(frozenset(cidrs), frozenset(ours), frozenset(foreign))


def test_rows_and_verdicts():
    m = maps()
    w = CidrWriter(m)
    res = ApplyResult()
    w.apply(want(["10.96.0.0/16"], ["10.96.0.10"], ["10.96.0.20"]), res)
    assert res.ok and res.writes == 3
    assert verdict(m, "10.96.0.10") == "refused"
    assert verdict(m, "10.96.0.20") == "pass"
    assert verdict(m, "10.96.5.5") == "unreachable"
    assert verdict(m, "10.97.0.1") == "pass"
    key = m["servicecidr"].keys()[0]
    # An IPv4 range is its IPv4-mapped prefix, in network order.
    assert (key.prefixlen, L.raw(key)[4:]) == (96 + 16, L.ip_bytes("10.96.0.0"))


def test_unchanged_set_writes_nothing_and_restore_adopts_the_maps():
    m = maps()
    w = CidrWriter(m)
    w.apply(want(["10.96.0.0/16"], ["10.96.0.10"]), ApplyResult())
    res = ApplyResult()
    w.apply(want(["10.96.0.0/16"], ["10.96.0.10"]), res)
    assert res.writes == 0
    fresh = CidrWriter(m)
    fresh.restore()
    assert fresh.cluster_ips == {"10.96.0.10": CIP_REJECT} and fresh.cidrs == {"10.96.0.0/16"}
    res = ApplyResult()
    fresh.apply(want(["10.96.0.0/16"], ["10.96.0.10"]), res)
    assert res.writes == 0


def test_a_foreign_clusterip_is_never_dropped_in_between():
    """After every single map operation, the foreign ClusterIP still passes."""
    seen = []
    m = maps(on_op=lambda: seen.append(verdict(m, "10.96.0.20")))
    w = CidrWriter(m)
    w.apply(want(["10.96.0.0/16"], [], ["10.96.0.20"]), ApplyResult())
    w.apply(want(["10.96.0.0/16", "10.97.0.0/24"], ["10.96.0.10"], ["10.96.0.20"]), ApplyResult())
    w.apply(want([], [], []), ApplyResult())
    assert seen and set(seen) == {"pass"}


def test_full_clusterip_map_holds_back_new_ranges_and_is_retried():
    m = maps(cip_size=1)
    w = CidrWriter(m)
    res = ApplyResult()
    w.apply(want(["10.96.0.0/16"], ["10.96.0.10"], ["10.96.0.20"]), res)
    assert not res.ok and res.full_maps == {L.MAPS["clusterip"].name}
    assert m["servicecidr"].rows == {}, "a range without its exceptions would drop 10.96.0.20"
    m["clusterip"].max_entries = 10
    res = ApplyResult()
    w.apply(want(["10.96.0.0/16"], ["10.96.0.10"], ["10.96.0.20"]), res)
    assert res.ok and verdict(m, "10.96.0.20") == "pass" and verdict(m, "10.96.0.10") == "refused"


def many(n, third=96):
    return [f"10.{third}.{i >> 8}.{i & 255}" for i in range(1, n + 1)]


def test_many_clusterips_go_in_batches_with_the_same_rows():
    """A cold start's ClusterIP rows (one per Service) are batched; what lands is what single
    puts write, and the ranges still come after every row."""
    m = maps()
    w = CidrWriter(m)
    res = ApplyResult()
    ours, foreign = many(300), many(100, third=97)
    w.apply(want(["10.96.0.0/16"], ours, foreign), res)
    assert res.ok and res.writes == 401 and m["clusterip"].batches == 1
    assert {verdict(m, ip) for ip in ours} == {"refused"}
    assert {verdict(m, ip) for ip in foreign} == {"pass"}
    assert [op for op, _ in m["clusterip"].ops] == ["put"] * 400
    fresh = CidrWriter(m)
    fresh.restore()
    assert fresh.cluster_ips == w.cluster_ips


def test_a_batch_that_fails_is_written_one_by_one_and_each_error_is_named():
    """A map that fills up mid-batch (rows the writer does not know of take room): the rows
    go again one by one, so the result names each address that did not fit, and the ranges
    are held back until a retry writes the rest."""
    m = maps(cip_size=200)
    for ip in many(100, third=200):         # not this writer's rows
        m["clusterip"].rows[L.ip_bytes(ip)] = L.raw(L.CipVal(action=CIP_PASS))
    w = CidrWriter(m)
    res = ApplyResult()
    w.apply(want(["10.96.0.0/16"], many(150)), res)
    assert m["clusterip"].batches == 1, "the batch was tried first"
    assert not res.ok and res.full_maps == {L.MAPS["clusterip"].name}
    assert len(res.errors) == 50 and all(e.startswith("ClusterIP 10.96.") for e in res.errors)
    assert m["servicecidr"].rows == {} and len(w.cluster_ips) == 100
    m["clusterip"].max_entries = 1000
    res = ApplyResult()
    w.apply(want(["10.96.0.0/16"], many(150)), res)
    assert res.ok and {verdict(m, ip) for ip in many(150)} == {"refused"}
