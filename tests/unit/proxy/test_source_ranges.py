"""loadBalancerSourceRanges: parsing (kube/convert/), which frontends they restrict and with
what (proxy/external.py), and the writer's order for the trie rows and the slot-0 flag.

kube-proxy v1.36 is the reference: pkg/proxy/util MapCIDRsByIPFamily (trim, ParseCIDRSloppy,
invalid entries logged and ignored) and pkg/proxy/nftables/proxier.go (firewall-ips map: LB
ingress IPs only; allowFromNode admits the LB IPs as sources when a range holds the node IP).
Addresses are documentation ranges; no traffic is sent.
"""
from __future__ import annotations

import dataclasses

import pytest

from kproxy_ebpf.datapath.maps import layout as L
from kproxy_ebpf.datapath.write.writer import MapWriter
from kproxy_ebpf.kube.convert import cidr_sloppy, service_from_api
from kproxy_ebpf.model.desired import FrontendKind, Scope, ServicePortName
from kproxy_ebpf.model.objects import LoadBalancerIngress, Node, Protocol, Service, ServicePort, ServiceType
from kproxy_ebpf.proxy.external import lb_source_ranges, service_ext_frontends
from kproxy_ebpf.proxy.frontends import service_frontends

from ...builders import api_service, fe
from ...fakemaps import FakeMap, consistent

TCP = Protocol.TCP
NODE = Node(name="node-a", addresses=("192.168.0.1",))


# -- parsing ----------------------------------------------------------------------------------

@pytest.mark.parametrize("text,expected", [
    ("203.0.113.0/24", "203.0.113.0/24"),
    ("  203.0.113.0/24\t", "203.0.113.0/24"),     # trimmed (the API allows padding too)
    ("203.0.113.7/24", "203.0.113.0/24"),         # host bits tolerated
    ("010.001.0.0/16", "10.1.0.0/16"),            # ParseCIDRSloppy: leading zeros are decimal
    ("203.0.113.7", None),                        # a bare address is no CIDR
    ("203.0.113.0/33", None),
    ("203.0.113.0/", None),
    ("203.0.113.0/x", None),
    ("not-a-cidr/8", None),
    (7, None),
])
def test_cidr_sloppy(text, expected):
    net = cidr_sloppy(text)
    assert (str(net) if net is not None else None) == expected


def _api_service(ranges):
    return api_service("lb", meta={"uid": "u1"}, type="LoadBalancer", clusterIP="172.30.0.10",
                       ports=[{"port": 80, "protocol": "TCP", "nodePort": 30080}],
                       loadBalancerSourceRanges=ranges)


def test_invalid_entries_are_reported_and_ignored_the_valid_ones_apply():
    svc, rejections = service_from_api(_api_service(
        [" 203.0.113.0/24 ", "", "198.51.100.9", "2001:db8::/32", "bad", "198.51.100.0/25"]))
    assert svc.load_balancer_source_ranges == ("203.0.113.0/24", "2001:db8::/32", "198.51.100.0/25")
    # The empty entry is skipped silently; the IPv6 range is kept for the IPv6 frontends
    # (the IPv4 ones see only IPv4 ranges, proxy/families.py); the bare address and the
    # garbage are reported, one rejection each.
    assert [r.reason for r in rejections] == ["InvalidSourceRange", "InvalidSourceRange"]
    assert "'198.51.100.9'" in rejections[0].message and "'bad'" in rejections[1].message


def test_only_invalid_entries_mean_no_filtering():
    svc, _ = service_from_api(_api_service(["bad", "203.0.113.7"]))
    assert svc.load_balancer_source_ranges == ()
    fronts = service_ext_frontends(_svc(svc.load_balancer_source_ranges), [], NODE)
    assert all(f.source_ranges == () for f in fronts)


# -- which frontends, with what ---------------------------------------------------------------

def _svc(ranges, lb_ips=("198.51.100.1", "198.51.100.2")):
    return Service(namespace="ns", name="lb", type=ServiceType.LOAD_BALANCER,
                   cluster_ips=("172.30.0.10",), external_ips=("203.0.113.50",),
                   ports=(ServicePort("", TCP, 80, node_port=30080),),
                   load_balancer_ingress=tuple(LoadBalancerIngress(ip) for ip in lb_ips),
                   load_balancer_source_ranges=tuple(ranges))


def test_only_load_balancer_ip_frontends_are_restricted_in_both_scopes():
    want = {("198.51.100.1", FrontendKind.LOAD_BALANCER): ("203.0.113.0/24",),
            ("198.51.100.2", FrontendKind.LOAD_BALANCER): ("203.0.113.0/24",),
            ("203.0.113.50", FrontendKind.EXTERNAL_IP): (),
            ("192.168.0.1", FrontendKind.NODE_PORT): ()}
    fronts = service_ext_frontends(_svc(["203.0.113.0/24"]), [], NODE)
    assert {(f.ip, f.kind): f.source_ranges for f in fronts} == want
    # Traffic that starts on this node (pods, the node's processes) is judged too: kube-proxy's
    # firewall chain hooks output as well as prerouting. The ClusterIP stays open.
    sock, _ = service_frontends(_svc(["203.0.113.0/24"]), [], NODE)
    got = {(f.ip, f.kind): f.source_ranges for f in sock}
    assert got == {**want, ("172.30.0.10", FrontendKind.CLUSTER_IP): ()}


def test_a_range_holding_the_node_ip_admits_the_lb_ips_as_sources():
    # kube-proxy's allowFromNode: a VIP routed to the node loops back with the VIP as source.
    assert lb_source_ranges(("192.168.0.0/16", "10.0.0.0/8"), NODE,
                            ["198.51.100.2", "198.51.100.1"]) == (
        "10.0.0.0/8", "192.168.0.0/16", "198.51.100.1/32", "198.51.100.2/32")
    assert lb_source_ranges(("10.0.0.0/8",), NODE, ["198.51.100.1"]) == ("10.0.0.0/8",)
    assert lb_source_ranges((), NODE, ["198.51.100.1"]) == ()


def test_ext_frontends_carry_the_service_info_like_the_socket_ones():
    # Both scopes share one kp_svc_meta row per service port: the same info, or the writer
    # would rewrite it back and forth.
    service = _svc(["203.0.113.0/24"])
    infos = {f.info for f in service_ext_frontends(service, [], NODE)}
    infos |= {f.info for f in service_frontends(service, [], NODE)[0]}
    assert len(infos) == 1 and infos.pop().source_ranges == ("203.0.113.0/24",)


# -- the writer's order -----------------------------------------------------------------------

SPN = ServicePortName("ns", "lb", "", TCP)
LB = ("198.51.100.1", 80)


def lb_fe(ranges=(), backends=("10.244.1.10",)):
    return fe(*LB, backends, kind=FrontendKind.LOAD_BALANCER, service=SPN, scope=Scope.EXT,
              ranges=ranges)


class Watch:
    """Checks after every single map operation that a slot 0 carrying the flag has the rows
    of the old or of the new range set complete (never the flag without its rows)."""

    def __init__(self):
        self.maps = {n: FakeMap(L.MAPS[n], on_op=self.check)
                     for n in ("svc", "backend", "meta", "srcrange")}
        self.old: frozenset[str] = frozenset()
        self.new: frozenset[str] = frozenset()
        self.checks = 0

    def flag(self) -> bool | None:
        head = self.maps["svc"].get(L.frontend_svc_key(lb_fe().key))
        return None if head is None else bool(head.fe_flags & L.FE_F_SRC_RANGES)

    def rows(self) -> set[str]:
        return {L.srcrange_of(k)[1] for k in self.maps["srcrange"].keys()}

    def check(self):
        consistent({n: self.maps[n] for n in ("svc", "backend", "meta")})
        self.checks += 1
        if self.flag():
            # A set that had (or will have) the flag, complete: an empty set never had it.
            rows, sets = self.rows(), [s for s in (self.old, self.new) if s]
            assert any(rows >= s for s in sets), (rows, self.old, self.new)

    def step(self, writer, ranges):
        desired = {} if ranges is None else {lb_fe(ranges).key: lb_fe(ranges)}
        self.new = frozenset(ranges or ())
        res = writer.apply(desired)
        assert res.ok
        self.old = self.new
        return res


STEPS = [
    [], ["203.0.113.0/24"], ["203.0.113.0/24", "192.0.2.0/28"], ["192.0.2.0/28"],
    ["198.18.0.0/15"], [], ["203.0.113.0/24"], None,
]


def test_rows_land_before_the_flag_and_leave_after_it():
    watch = Watch()
    w = MapWriter(watch.maps)
    for ranges in STEPS:
        watch.step(w, ranges)
        assert watch.rows() == set(ranges or ())
        assert watch.flag() == (None if ranges is None else bool(ranges))
    assert watch.checks > 10


def test_each_scope_holds_its_own_rows():
    """The socket scope's LB frontend and the EXT one have the same ranges in one trie: the
    scope in the key keeps them apart, so removing one leaves the other's rows."""
    maps = {n: FakeMap(L.MAPS[n]) for n in ("svc", "backend", "meta", "srcrange")}
    w = MapWriter(maps)
    ext = lb_fe(["203.0.113.0/24"])
    sock = dataclasses.replace(ext, scope=Scope.SOCK)
    assert w.apply({ext.key: ext, sock.key: sock}).ok
    rows = sorted((L.srcrange_of(k)[0].scope, L.srcrange_of(k)[1]) for k in maps["srcrange"].keys())
    assert rows == [(Scope.SOCK, "203.0.113.0/24"), (Scope.EXT, "203.0.113.0/24")]
    assert w.apply({ext.key: ext}).ok
    assert [L.srcrange_of(k) for k in maps["srcrange"].keys()] == [(ext.key, "203.0.113.0/24")]
    # A new writer reads both back with their scope.
    assert w.apply({ext.key: ext, sock.key: sock}).ok
    again = MapWriter(maps)
    again.restore()
    assert not again.apply({ext.key: ext, sock.key: sock}).writes


def test_operation_order_in_the_recorded_log():
    maps = {n: FakeMap(L.MAPS[n]) for n in ("svc", "backend", "meta", "srcrange")}
    w = MapWriter(maps)
    w.apply({lb_fe().key: lb_fe()})
    log = []
    for n in ("svc", "srcrange"):
        maps[n].on_op = lambda n=n: log.append((n, maps[n].ops[-1][0]))
    w.apply({lb_fe().key: lb_fe(["203.0.113.0/24"])})
    assert log == [("srcrange", "put"), ("svc", "put")]
    log.clear()
    w.apply({lb_fe().key: lb_fe()})
    assert log == [("svc", "put"), ("srcrange", "delete")]
    log.clear()
    w.apply({lb_fe().key: lb_fe(["203.0.113.0/24"])})
    log.clear()
    w.apply({})
    assert log[:2] == [("svc", "delete"), ("srcrange", "delete")]


def test_batched_apply_keeps_the_order():
    """A large apply goes through the writer's batch plan; the order must survive it."""
    watch = Watch()
    w = MapWriter(watch.maps)
    many = tuple(f"10.244.1.{i}" for i in range(1, 80))
    for ranges in (["203.0.113.0/24"], ["192.0.2.0/28"], []):
        watch.new = frozenset(ranges)
        f = lb_fe(ranges, backends=many)
        assert w.apply({f.key: f}).ok
        watch.old = watch.new
        assert watch.rows() == set(ranges)
    assert any(m.batches for m in watch.maps.values())


def test_restore_adopts_the_rows_and_rewrites_nothing():
    maps = {n: FakeMap(L.MAPS[n]) for n in ("svc", "backend", "meta", "srcrange")}
    f = lb_fe(["203.0.113.0/24", "192.0.2.0/28"])
    MapWriter(maps).apply({f.key: f})
    # A leftover row of a frontend that no longer exists (a crash between two deletes).
    stray = dataclasses.replace(lb_fe(["198.18.0.0/15"]), ip="198.51.100.99")
    maps["srcrange"].put(L.srcrange_key(stray.key, "198.18.0.0/15"), L.U32(0))
    w = MapWriter(maps)
    assert w.restore() == 1
    assert {L.srcrange_of(k)[1] for k in maps["srcrange"].keys()} == {
        "203.0.113.0/24", "192.0.2.0/28"}
    assert w.apply({f.key: f}).writes == 0
    assert w.row_counts()["srcrange"] == 2


def test_the_trie_key_matches_the_frontend_in_full_then_the_source_prefix():
    key = L.srcrange_key(lb_fe().key, "203.0.113.0/24")
    # The frontend's 160 bits, then the source's IPv4-mapped prefix (96 + 24).
    assert key.prefixlen == 160 + 96 + 24 and L.ip_str(key.saddr) == "203.0.113.0"
    assert L.srcrange_of(key) == (lb_fe().key, "203.0.113.0/24")
