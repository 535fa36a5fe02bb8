"""The lab below Kubernetes (`Lab`): nodes, pods, a router and an external client as network
namespaces on one machine, each with its cgroup and its recorded processes; the pods' echo
servers; `down()` that removes all of it. cluster.py puts the control plane and the proxies on
top.

Topology (every name carries the prefix kproxy-<lab>; nothing is ever added to the host's own
namespace, and no lab link leads out of the lab):

    netns kproxy-<lab>-net      bridge br0 10.250.0.1/24: the underlay and the control-plane
                                endpoint; routes 10.244.<i>.0/24 via node i so the control
                                plane can answer pods; no default route, forwarding off
    netns kproxy-<lab>-rtr      the lab router, eth0 10.250.0.254/24 (veth kpn-rtr on br0) and
                                nothing else: no other link, no default route; routes only to
                                the pod CIDRs via their nodes (to send ICMP errors back to
                                pods). Forwarding is on, so a packet for any address outside
                                the lab gets "network unreachable" from here at once.
    netns kproxy-<lab>-node<i>  eth0 10.250.0.(10+i)/24 (veth kpn-node<i> on br0); forwarding
                                on; default via the router (a real node has a gateway: routed
                                first, then kube-proxy's DNAT/REJECT applies); routes
                                10.244.<j>.0/24 via 10.250.0.(10+j) for every other node j;
                                <podip>/32 dev kpv<id> for each local pod.
    netns kproxy-<lab>-p-<pod>  eth0 10.244.<i>.X/32 (X from 10), the peer of kpv<id> in the
                                node; default via 169.254.1.1 onlink
    netns kproxy-<lab>-ext      the external client, eth0 10.250.0.250/24 (veth kpn-ext on br0);
                                10.96.0.0/16 via node1, default via the router, and
                                `unreachable 10.244.0.0/16`: pod IPs are not routed from outside

IPv6 (`lab up --ip-family ipv6|dual`, addressing.py): every address above has its IPv6 twin
in fd00::/8 (underlay fd00:250::/64, pods fd00:244:<i>::/64, Services fd00:96::/112) with the
same routes; a pod's IPv6 next hop is fe80::1, on the host end of its veth. Addresses are
added without duplicate address detection (nodad): they are unique by construction, and a
tentative address could not be bound for the ~1 s DAD takes.

Safety: the only links are veths whose both ends are lab namespaces, plus br0; the only way
"out" of any namespace is the router, which leads nowhere (tests/datapath/test_lab_network.py
proves a packet to a public address never shows up in the host namespace).

Pod gateway: the host end of every pod veth carries 169.254.1.1/32 (scope link), so the pod's
ARP for its gateway is answered as for any local address (proxy_arp would make the answer
depend on the node's routes to 169.254.1.1, which only the default route covers, towards the
router). Many veths holding the same /32 is fine for the kernel; being scope link, that address
is never picked as a source (not by MASQUERADE either). Node routes to pods carry
`src <node ip>` so that node processes talk to local pods from the node address, not from
169.254.1.1.

cgroups (v2, under /sys/fs/cgroup/unified/kproxy-<lab>): node<i> is where node i's agent
attaches its socket hooks; node<i>/host holds the node's own processes and node<i>/pod-<pod>
each pod's, so the hooks of node i see exactly what runs on node i. ext and net hold the
external client's and the control plane's processes outside any node.

Everything is recorded in the state file (state.py), but down() removes by name, so it also
cleans up after a crash that lost the state.
"""
from __future__ import annotations

import hashlib
import ipaddress
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from kproxy_ebpf.model.objects import IPFamily, family_of

from . import cgroups, nsutil, procs, state
from .addressing import PLANS, FamilyPlan
from .nsutil import LabError
from .state import LabState, NodeRec, PodRec, ProcRec, check_name

_V4 = PLANS[IPFamily.IPV4]
# The IPv4 plan's addresses (the underlay's, used by every lab: see addressing.py).
CONTROL_PLANE_IP = _V4.control_plane
UNDERLAY_PREFIXLEN = _V4.underlay_prefixlen
UNDERLAY_CIDR = _V4.underlay_cidr
EXTERNAL_IP = _V4.external
ROUTER_IP = _V4.router
POD_SUPERNET = _V4.pod_supernet
SERVICE_CIDR = _V4.service_cidr
POD_GATEWAY = _V4.pod_gateway
MAX_NODES = 239  # node IPs 10.250.0.11 .. 10.250.0.249; .250 is the external client
POD_HOSTS = range(10, 255)
DEFAULT_PORTS: tuple[tuple[str, int], ...] = (("tcp", 8080), ("udp", 5353))
BPFFS_ROOT = "/sys/fs/bpf"

_HERE = os.path.dirname(os.path.abspath(__file__))
ECHO_SCRIPT = os.path.join(_HERE, "echo.py")
PROBE_SCRIPT = os.path.join(_HERE, "probe.py")


def external_cidr(cidr: str) -> str:
    """A route the external client may get, in canonical form: an IPv4 or IPv6 network that
    overlaps none of the client's own routes (underlay, pods, Service range, default)."""
    try:
        net = ipaddress.ip_network(cidr, strict=False)
    except ValueError as exc:
        raise LabError(f"{cidr!r} is not an IPv4 or IPv6 CIDR") from exc
    if net.prefixlen == 0:
        raise LabError("the external client's default route is the lab router's")
    plan = PLANS[family_of(str(net.network_address))]
    for own in (plan.underlay_cidr, plan.pod_supernet, plan.service_cidr):
        if net.overlaps(ipaddress.ip_network(own)):
            raise LabError(f"{net} overlaps the lab's own route {own}")
    return str(net)


def node_ip(index: int) -> str:
    """Node `index`'s IPv4 underlay address."""
    return _V4.node_ip(index)


def pod_cidr(index: int) -> str:
    return _V4.pod_cidr(index)


class _Addresses:
    """What a node, pod or client with an address per family (`ips`) answers."""
    ips: tuple[str, ...]

    def ip_of(self, family: str) -> str:
        """Its address of `family` (StopIteration when the lab has not that family)."""
        return next(ip for ip in self.ips if family_of(ip) == family)


@dataclass(frozen=True)
class NodeInfo(_Addresses):
    name: str
    ip: str      # the node's address of the lab's primary family (its first InternalIP)
    netns: str
    cgroup: str  # the agent attaches socket hooks here
    host_cgroup: str  # the node's own processes (agent, probes run "on the node")
    pod_cidr: str     # of the primary family
    bpffs: str  # this node's agent pins its maps here
    index: int
    ips: tuple[str, ...] = ()         # one per family of the lab, primary first
    pod_cidrs: tuple[str, ...] = ()
    underlay_ip: str = ""             # IPv4, in every lab: how it reaches the control plane


@dataclass(frozen=True)
class PodInfo(_Addresses):
    name: str
    node: str
    ip: str
    netns: str
    cgroup: str
    ports: tuple[tuple[str, int], ...]
    labels: Mapping[str, str] = field(default_factory=dict, compare=False, hash=False)
    veth: str = ""  # host end, in the node's netns (where TC programs attach)
    echo_pid: int | None = None
    ips: tuple[str, ...] = ()  # one per family of the lab, primary first (ip is the first)


@dataclass(frozen=True)
class ExternalInfo(_Addresses):
    name: str
    ip: str      # of the lab's primary family
    netns: str
    cgroup: str
    ips: tuple[str, ...] = ()


@dataclass(frozen=True)
class Target:
    """Where a command runs: a netns plus the cgroup its processes join."""

    label: str  # "pod/<name>", "node/<name>", "ext", "net" or "host"
    netns: str | None  # None: the host namespace
    cgroup: str


@dataclass
class DownReport:
    removed: list[str] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.problems


class Lab:
    """One simulated cluster. Methods are idempotent where that is meaningful; each public
    mutation holds the lab's state lock for its whole duration."""

    def __init__(self, name: str = "lab", *, run_root: str = state.RUN_ROOT,
                 cgroup_root: str = cgroups.ROOT, bpffs_root: str = BPFFS_ROOT,
                 python: str | None = None) -> None:
        self.name = check_name("lab", name)
        self.prefix = f"kproxy-{name}"
        self.run_root = run_root
        self.cgroup_root = cgroup_root
        self.bpffs_root = bpffs_root
        self.python = python or sys.executable
        self._st: LabState | None = None

    # ---- names ---------------------------------------------------------------------------

    @property
    def net_netns(self) -> str:
        return f"{self.prefix}-net"

    @property
    def ext_netns(self) -> str:
        return f"{self.prefix}-ext"

    @property
    def rtr_netns(self) -> str:
        return f"{self.prefix}-rtr"

    def node_netns(self, node: str) -> str:
        return f"{self.prefix}-{node}"

    def pod_netns(self, pod: str) -> str:
        return f"{self.prefix}-p-{pod}"

    @property
    def cgroup(self) -> str:
        return os.path.join(self.cgroup_root, self.prefix)

    def node_cgroup(self, node: str) -> str:
        return os.path.join(self.cgroup, node)

    def pod_cgroup(self, node: str, pod: str) -> str:
        return os.path.join(self.cgroup, node, f"pod-{pod}")

    def bpffs(self, node: str) -> str:
        return os.path.join(self.bpffs_root, f"{self.prefix}-{node}")

    @property
    def state_dir(self) -> str:
        return state.state_dir(self.name, self.run_root)

    def log_path(self, name: str) -> str:
        return os.path.join(self.state_dir, "logs", f"{name}.log")

    # ---- state -----------------------------------------------------------------------------

    @contextmanager
    def _txn(self) -> Iterator[LabState]:
        """Hold the lock; nested calls (up -> add_node) share the outer transaction."""
        if self._st is not None:
            yield self._st
            return
        with state.locked(self.name, self.run_root) as st:
            assert st is not None
            self._st = st
            try:
                yield st
            finally:
                self._st = None

    def _snapshot(self) -> LabState:
        st = self._st or state.load(self.name, self.run_root)
        if st is None:
            raise LabError(f"lab {self.name!r} does not exist (no {self.state_dir})")
        return st

    def exists(self) -> bool:
        return os.path.isdir(self.state_dir) or any(self._owns(n) for n in nsutil.list_netns())

    # ---- lookups ---------------------------------------------------------------------------

    @property
    def families(self) -> tuple[IPFamily, ...]:
        """The cluster's IP families, primary first (`lab up --ip-family`)."""
        return tuple(IPFamily(f) for f in self._snapshot().families)

    @staticmethod
    def _plans(st: LabState) -> list[FamilyPlan]:
        return [PLANS[IPFamily(f)] for f in st.families]

    def _node_info(self, name: str, rec: NodeRec, st: LabState) -> NodeInfo:
        plans = self._plans(st)
        return NodeInfo(name=name, ip=plans[0].node_ip(rec.index), netns=self.node_netns(name),
                        cgroup=self.node_cgroup(name),
                        host_cgroup=os.path.join(self.node_cgroup(name), "host"),
                        pod_cidr=plans[0].pod_cidr(rec.index), bpffs=self.bpffs(name),
                        index=rec.index, ips=tuple(p.node_ip(rec.index) for p in plans),
                        pod_cidrs=tuple(p.pod_cidr(rec.index) for p in plans),
                        underlay_ip=rec.ip)

    def _pod_info(self, name: str, rec: PodRec) -> PodInfo:
        return PodInfo(name=name, node=rec.node, ip=rec.ip, netns=self.pod_netns(name),
                       cgroup=self.pod_cgroup(rec.node, name),
                       ports=tuple((p, n) for p, n in rec.ports), labels=dict(rec.labels),
                       veth=rec.veth, echo_pid=rec.echo_pid, ips=tuple(rec.ips or [rec.ip]))

    def node(self, name: str) -> NodeInfo:
        st = self._snapshot()
        if name not in st.nodes:
            raise LabError(f"no node {name!r} in lab {self.name!r}")
        return self._node_info(name, st.nodes[name], st)

    def nodes(self) -> list[NodeInfo]:
        st = self._snapshot()
        return [self._node_info(n, r, st) for n, r in sorted(st.nodes.items(),
                                                         key=lambda kv: kv[1].index)]

    def pod(self, name: str) -> PodInfo:
        st = self._snapshot()
        if name not in st.pods:
            raise LabError(f"no pod {name!r} in lab {self.name!r}")
        return self._pod_info(name, st.pods[name])

    def pods(self) -> list[PodInfo]:
        st = self._snapshot()
        return [self._pod_info(n, r) for n, r in sorted(st.pods.items())]

    def external(self) -> ExternalInfo:
        st = self._snapshot()
        if st.external is None:
            raise LabError(f"lab {self.name!r} has no external client")
        return ExternalInfo(name="ext", ip=st.external, netns=self.ext_netns,
                            cgroup=os.path.join(self.cgroup, "ext"),
                            ips=tuple(p.external for p in self._plans(st)))

    def target(self, target: str) -> Target:
        """Resolve "net", "ext", "host", "node/<n>", "pod/<p>", or a bare node or pod name.

        "host" is the machine's own network namespace (loopback only: the control plane and
        the relay run there) in the lab cgroup kproxy-<lab>/host, so down() still finds them."""
        st = self._snapshot()
        kind, _, name = target.partition("/")
        if not name:
            kind, name = "", target
        if target == "net":
            return Target("net", self.net_netns, os.path.join(self.cgroup, "net"))
        if target == "host":
            return Target("host", None, os.path.join(self.cgroup, "host"))
        if target in ("rtr", "router"):
            return Target("rtr", self.rtr_netns, os.path.join(self.cgroup, "rtr"))
        if target in ("ext", "external"):
            ext = self.external()
            return Target("ext", ext.netns, ext.cgroup)
        if kind in ("", "node") and name in st.nodes:
            n = self._node_info(name, st.nodes[name], st)
            return Target(f"node/{name}", n.netns, n.host_cgroup)
        if kind in ("", "pod") and name in st.pods:
            p = self._pod_info(name, st.pods[name])
            return Target(f"pod/{name}", p.netns, p.cgroup)
        raise LabError(f"unknown target {target!r} in lab {self.name!r}")

    def status(self) -> dict[str, Any]:
        """The recorded state plus whether each recorded process still runs (for the CLI)."""
        st = self._snapshot()
        d = st.to_json()
        for pid, rec in st.procs.items():
            d["procs"][str(pid)]["status"] = procs.identify(rec)
        return d

    # ---- building --------------------------------------------------------------------------

    def up(self, nodes: int = 2, external: bool = True,
           families: Sequence[str] | None = None) -> None:
        """Create the underlay, `nodes` nodes (adding to an existing lab as needed) and the
        external client, with addresses of `families` (primary first; default IPv4 for a new
        lab, and an existing lab's own, which cannot change). If
        this call created the lab and fails or is interrupted, the whole lab is removed
        before the error propagates."""
        if not 1 <= nodes <= MAX_NODES:
            raise ValueError(f"nodes must be in 1..{MAX_NODES}")
        try:
            prior = state.load(self.name, self.run_root)
        except (ValueError, KeyError, TypeError):
            prior = None
        fresh = prior is None or not prior.up
        try:
            with self._txn() as st:
                wanted = [str(IPFamily(f)) for f in families or (IPFamily.IPV4,)]
                if fresh:
                    st.families = wanted
                elif families is not None and wanted != st.families:
                    raise LabError(f"lab {self.name!r} has families {st.families}: "
                                   "`lab down` first to change them")
                self._underlay(st)
                while len(st.nodes) < nodes:
                    self.add_node()
                if external:
                    self._external(st)
                st.up = True
        except BaseException as e:
            if fresh:
                report = self.down()
                for problem in report.problems:
                    e.add_note(f"lab cleanup: {problem}")
            raise

    def _cg(self, st: LabState, path: str) -> str:
        cgroups.ensure(self.cgroup, self.cgroup_root)
        st.note(f"cgroup:{path}")
        return cgroups.ensure(path, self.cgroup_root)

    def _netns(self, st: LabState, name: str, sysctls: dict[str, str] | None = None) -> None:
        st.note(f"netns:{name}")  # noted first: a half-made netns is still cleaned up
        nsutil.add(name, sysctls)

    def _underlay(self, st: LabState) -> None:
        net = self.net_netns
        # The underlay is a switch plus the control-plane endpoint, never a router.
        self._netns(st, net, {"net.ipv4.ip_forward": "0", "net.ipv6.conf.all.forwarding": "0"})
        nsutil.add_bridge(net, "br0")
        for plan in self._underlay_plans(st):
            nsutil.set_addr(net, "br0", f"{plan.control_plane}/{plan.underlay_prefixlen}")
        nsutil.link_up(net, "br0")
        self._cg(st, os.path.join(self.cgroup, "net"))
        self._cg(st, os.path.join(self.cgroup, "host"))
        self._router(st)

    def _router(self, st: LabState) -> None:
        """The lab's gateway: one port on br0 and nothing else. No link leaves the lab and it
        has no default route, so a packet for an outside address ends here; forwarding is on
        only so that it answers "network unreachable" at once (a real router without a route
        does the same), instead of leaving the client to time out. Its ICMP errors are not
        rate-limited (icmp_ratelimit, 1 s per peer by default), so every probe gets its answer."""
        ns = self.rtr_netns
        self._netns(st, ns, {"net.ipv4.ip_forward": "1", "net.ipv4.icmp_ratelimit": "0",
                             "net.ipv6.conf.all.forwarding": "1"})
        self._attach_to_bridge(st, "kpn-rtr", ns, lambda plan: plan.router)
        self._cg(st, os.path.join(self.cgroup, "rtr"))

    def _underlay_plans(self, st: LabState) -> list[FamilyPlan]:
        """The families on the underlay: the IPv4 one always (addressing.py), then IPv6."""
        return [_V4] + [p for p in self._plans(st) if p.family is IPFamily.IPV6]

    def _attach_to_bridge(self, st: LabState, port: str, netns: str, addr) -> None:
        """veth `port` on br0 in the underlay, peer `eth0` in `netns` with `addr(plan)` of
        each underlay family."""
        net = self.net_netns
        if not nsutil.link_exists(net, port):
            nsutil.add_veth(net, port, netns)
        nsutil.link_up(net, port, master="br0")
        for plan in self._underlay_plans(st):
            nsutil.set_addr(netns, "eth0", f"{addr(plan)}/{plan.underlay_prefixlen}")
        nsutil.link_up(netns, "eth0")

    def add_node(self) -> NodeInfo:
        """Add node<i> (i = highest index + 1) and the pod-CIDR routes between it and the
        existing nodes."""
        with self._txn() as st:
            self._underlay(st)
            index = max((r.index for r in st.nodes.values()), default=0) + 1
            if index > MAX_NODES:
                raise LabError(f"lab {self.name!r} is full ({MAX_NODES} nodes)")
            name = f"node{index}"
            ns = self.node_netns(name)
            # A node routes for its pods. rp_filter is pinned to 0 because a new netns
            # inherits the host's conf/all and conf/default, and the lab must not depend on
            # the host; set before eth0 exists so the interface inherits it.
            self._netns(st, ns, {"net.ipv4.ip_forward": "1",
                                 "net.ipv4.conf.all.rp_filter": "0",
                                 "net.ipv4.conf.default.rp_filter": "0",
                                 "net.ipv6.conf.all.forwarding": "1"})
            self._attach_to_bridge(st, f"kpn-{name}", ns, lambda plan: plan.node_ip(index))
            st.nodes[name] = NodeRec(index=index, ip=node_ip(index))
            for plan in self._underlay_plans(st):
                nsutil.set_route(ns, "default", "eth0", via=plan.router)
            for plan in self._plans(st):
                for other, rec in st.nodes.items():
                    if other == name:
                        continue
                    nsutil.set_route(ns, plan.pod_cidr(rec.index), "eth0",
                                     via=plan.node_ip(rec.index))
                    nsutil.set_route(self.node_netns(other), plan.pod_cidr(index), "eth0",
                                     via=plan.node_ip(index))
                # The underlay answers pods (control plane), the router sends them its ICMP
                # errors.
                nsutil.set_route(self.net_netns, plan.pod_cidr(index), "br0",
                                 via=plan.node_ip(index))
                nsutil.set_route(self.rtr_netns, plan.pod_cidr(index), "eth0",
                                 via=plan.node_ip(index))
            self._cg(st, self.node_cgroup(name))
            self._cg(st, os.path.join(self.node_cgroup(name), "host"))
            return self._node_info(name, st.nodes[name], st)

    def _external(self, st: LabState) -> None:
        if "node1" not in st.nodes:
            raise LabError("the external client routes Service IPs via node1, which is missing")
        ns = self.ext_netns
        self._netns(st, ns)
        self._attach_to_bridge(st, "kpn-ext", ns, lambda plan: plan.external)
        node1 = st.nodes["node1"].index
        for plan in self._underlay_plans(st):
            nsutil.set_route(ns, "default", "eth0", via=plan.router)
            nsutil.set_route(ns, plan.service_cidr, "eth0", via=plan.node_ip(node1))
            # Pod IPs are not routed from outside the cluster (the router knows them, to
            # send ICMP errors to pods, but must not carry the external client's traffic).
            nsutil.set_unreachable(ns, plan.pod_supernet)
        self._cg(st, os.path.join(self.cgroup, "ext"))
        st.external = self._plans(st)[0].external

    def add_external_route(self, cidr: str, node: str = "node1") -> None:
        """Route `cidr` (e.g. a LoadBalancer or ExternalIP range) from the external client via
        `node` (replacing a route of the same CIDR); routes only inside the lab, recorded
        for `lab status`."""
        net = external_cidr(cidr)
        with self._txn() as st:
            if st.external is None:
                raise LabError(f"lab {self.name!r} has no external client")
            if node not in st.nodes:
                raise LabError(f"no node {node!r}")
            plan = PLANS[family_of(net)]
            if plan not in self._underlay_plans(st):
                raise LabError(f"{net}: lab {self.name!r} has no {plan.family} underlay")
            nsutil.set_route(self.ext_netns, net, "eth0",
                             via=plan.node_ip(st.nodes[node].index))
            st.external_routes[net] = node

    def delete_external_route(self, cidr: str) -> None:
        """Remove a route `add_external_route` made (the lab's own routes stay)."""
        net = external_cidr(cidr)
        with self._txn() as st:
            if net not in st.external_routes:
                raise LabError(f"no route {net} was added with `lab route` "
                               f"(added: {', '.join(sorted(st.external_routes)) or 'none'})")
            nsutil.del_route(self.ext_netns, net)
            del st.external_routes[net]

    def add_external_address(self, ip: str) -> None:
        """Give the external client another source address (one of EXTERNAL_EXTRA, on the
        underlay so nodes reach it without a route), e.g. to test loadBalancerSourceRanges
        with two clients. Removed with the client's namespace."""
        with self._txn() as st:
            extras = [(x, p) for p in self._underlay_plans(st) for x in p.external_extra]
            plan = next((p for x, p in extras if x == ip), None)
            if plan is None:
                raise LabError(f"{ip}: the external client's extra addresses are "
                               f"{', '.join(x for x, _ in extras)}")
            if st.external is None:
                raise LabError(f"lab {self.name!r} has no external client")
            nsutil.set_addr(self.ext_netns, "eth0", f"{ip}/{plan.underlay_prefixlen}")
            if ip not in st.external_addresses:
                st.external_addresses.append(ip)

    # ---- pods ------------------------------------------------------------------------------

    def _alloc_ips(self, st: LabState, node: str) -> list[str]:
        """A free host number on `node`, as an address of each family (primary first)."""
        rec = st.nodes[node]
        plans = self._plans(st)
        used = {p.ip for p in st.pods.values()}
        start = rec.next_host if rec.next_host in POD_HOSTS else POD_HOSTS.start
        order = list(range(start, POD_HOSTS.stop)) + list(range(POD_HOSTS.start, start))
        for host in order:
            ips = [plan.pod_ip(rec.index, host) for plan in plans]
            if ips[0] not in used:
                # Round-robin: a deleted pod's address comes back only after a full cycle,
                # so a stale client of the old pod does not reach a new one at once.
                rec.next_host = host + 1 if host + 1 in POD_HOSTS else POD_HOSTS.start
                return ips
        raise LabError(f"node {node} has no free pod address")

    def _veth_name(self, st: LabState, node: str, pod: str) -> str:
        taken = {p.veth for p in st.pods.values() if p.node == node}
        for salt in range(100):
            digest = hashlib.sha1(f"{pod}/{salt}".encode()).hexdigest()[:8]
            name = f"kpv{digest}"  # 11 chars, under IFNAMSIZ (15)
            if name not in taken and not nsutil.link_exists(self.node_netns(node), name):
                return name
        raise LabError(f"no free veth name for pod {pod}")

    def create_pod(self, name: str, node: str,
                   ports: Sequence[tuple[str, int]] = DEFAULT_PORTS,
                   labels: Mapping[str, str] | None = None, echo: bool = True) -> PodInfo:
        """Create pod `name` on `node` and start its echo server on `ports` (unless
        echo=False). Returns the existing pod if it is already on that node."""
        check_name("pod", name)
        ports = [(str(p).lower(), int(n)) for p, n in ports]
        for proto, port in ports:
            if proto not in ("tcp", "udp") or not 0 < port < 65536:
                raise ValueError(f"bad port {proto}/{port}")
        with self._txn() as st:
            if name in st.pods:
                if st.pods[name].node != node:
                    raise LabError(f"pod {name!r} already exists on {st.pods[name].node}")
                return self._pod_info(name, st.pods[name])
            if node not in st.nodes:
                raise LabError(f"no node {node!r} in lab {self.name!r}")
            ips = self._alloc_ips(st, node)
            rec = PodRec(node=node, ip=ips[0], ips=ips,
                         veth=self._veth_name(st, node, name), ports=ports,
                         labels=dict(labels or {}))
            st.pods[name] = rec  # recorded first so a failure below is cleaned up by name
            try:
                self._pod_network(st, name, rec)
                self._cg(st, self.pod_cgroup(node, name))
                if echo and ports:
                    self._start_echo(st, name, rec)
            except BaseException:
                self._remove_pod(st, name)
                raise
            return self._pod_info(name, rec)

    def _pod_network(self, st: LabState, name: str, rec: PodRec) -> None:
        ns, node_ns = self.pod_netns(name), self.node_netns(rec.node)
        self._netns(st, ns)
        if not nsutil.link_exists(node_ns, rec.veth):
            nsutil.add_veth(node_ns, rec.veth, ns)
        index = st.nodes[rec.node].index
        for plan, ip in zip(self._plans(st), rec.ips or [rec.ip], strict=True):
            nsutil.set_addr(ns, "eth0", f"{ip}/{plan.host_prefixlen}")
            nsutil.set_addr(node_ns, rec.veth,
                            f"{plan.pod_gateway}/{plan.pod_gateway_prefixlen}",
                            scope=nsutil.RT_SCOPE_LINK)
        nsutil.link_up(ns, "eth0")
        nsutil.link_up(node_ns, rec.veth)
        for plan, ip in zip(self._plans(st), rec.ips or [rec.ip], strict=True):
            # Everything goes to the node, as with Calico-style CNIs; the node routes it on.
            nsutil.set_route(ns, "default", "eth0", via=plan.pod_gateway,
                             onlink=plan.family is IPFamily.IPV4)
            nsutil.set_route(node_ns, f"{ip}/{plan.host_prefixlen}", rec.veth,
                             src=plan.node_ip(index))

    def _start_echo(self, st: LabState, name: str, rec: PodRec) -> None:
        argv = [self.python, "-I", "-S", ECHO_SCRIPT, "--name", name]
        for proto, port in rec.ports:
            argv += [f"--{proto}", str(port)]
        plans = self._plans(st)
        for plan in plans:
            argv += ["--bind", "0.0.0.0" if plan.family is IPFamily.IPV4 else "::"]
        v6 = any(plan.family is IPFamily.IPV6 for plan in plans)
        p = self._spawn(st, f"pod/{name}", argv, f"echo-{name}")
        rec.echo_pid = p.pid
        _wait_listening(p, rec.ports, timeout=5.0, v6=v6)

    def delete_pod(self, name: str) -> None:
        """Stop the pod's processes and remove its veth, netns and cgroup; a pod that does
        not exist is not an error."""
        with self._txn() as st:
            problems = self._remove_pod(st, name)
        if problems:
            raise LabError(f"delete_pod {name}: " + "; ".join(problems))

    def _remove_pod(self, st: LabState, name: str) -> list[str]:
        problems: list[str] = []
        rec = st.pods.get(name)
        nodes = [rec.node] if rec else list(st.nodes)
        problems += self._stop_target(st, f"pod/{name}",
                                      [self.pod_cgroup(n, name) for n in nodes])
        if rec and nsutil.exists(self.node_netns(rec.node)):
            # Deleting one end removes the pair, the 169.254.1.1 address and the /32 route.
            err = nsutil.del_link(self.node_netns(rec.node), rec.veth)
            if err:
                problems.append(err)
        ns = self.pod_netns(name)
        problems += _netns_holders(ns)
        err = nsutil.delete(ns)
        if err:
            problems.append(err)
        st.forget(f"netns:{ns}")
        for n in nodes:
            cg = self.pod_cgroup(n, name)
            problems += cgroups.remove_tree(cg, self.cgroup_root)
            st.forget(f"cgroup:{cg}")
        st.pods.pop(name, None)
        return problems

    # ---- processes -------------------------------------------------------------------------

    def _spawn(self, st: LabState, target: str, argv: Sequence[str], log_name: str,
               env: Mapping[str, str] | None = None, cwd: str | None = None) -> ProcRec:
        t = self.target(target)
        rec = procs.spawn(argv, netns=t.netns, cgroup=t.cgroup, log_path=self.log_path(log_name),
                          target=t.label, name=log_name, env=dict(env) if env else None,
                          cwd=cwd)
        st.procs[rec.pid] = rec
        return rec

    def spawn(self, target: str, argv: Sequence[str], name: str,
              env: Mapping[str, str] | None = None, cwd: str | None = None) -> ProcRec:
        """Start a long-running process (agent, control plane, load generator) in a target's
        netns and cgroup; it is recorded and stopped by kill() or down(). Output goes to
        <state dir>/logs/<name>.log."""
        with self._txn() as st:
            return self._spawn(st, target, argv, name, env, cwd)

    def adopt(self, pid: int, name: str, log: str, target: str = "host") -> ProcRec:
        """Record a process started elsewhere (the control plane starts its own) so kill()
        and down() stop it; it moves into the target's cgroup so a leftover is found too."""
        t = self.target(target)
        cgroups.move(pid, t.cgroup, self.cgroup_root)
        argv, start = procs.cmdline(pid), procs.read_starttime(pid)
        if argv is None or start is None:
            raise LabError(f"pid {pid} ({name}) is not running")
        rec = ProcRec(pid=pid, argv=argv, starttime=start, target=t.label, log=log, name=name)
        with self._txn() as st:
            st.procs[pid] = rec
        return rec

    def kill(self, pid: int, grace: float = 3.0) -> str:
        """Stop a process this lab recorded (never an unrecorded pid); see
        procs.kill_recorded for the result values."""
        with self._txn() as st:
            rec = st.procs.get(pid)
            if rec is None:
                raise LabError(f"pid {pid} was not started by lab {self.name!r}")
            result = procs.kill_recorded(rec, grace)
            if result != "stuck":
                del st.procs[pid]
            return result

    def exec(self, target: str, argv: Sequence[str], **kwargs: Any) -> subprocess.CompletedProcess:
        """Run a one-off command in the target's netns and cgroup (kwargs: subprocess.run);
        stdio and the exit code pass through unless captured."""
        t = self.target(target)
        return procs.run_in(t.netns, t.cgroup, argv, **kwargs)

    def probe(self, target: str, addr: str, port: int, udp: bool = False, count: int = 1,
              timeout: float = 1.0, interval: float = 0.0, keep: bool = False,
              sport: int = 0, source: str | None = None, abort: bool = False) -> list[str]:
        """Run probe.py inside the target; one result line per attempt (see probe.py).
        `source`: send from this address of the target (see add_external_address);
        `abort`: TCP connections end with a RST."""
        host = f"[{addr}]" if ":" in addr else addr
        argv = [self.python, "-I", "-S", PROBE_SCRIPT, f"{host}:{port}", "--count", str(count),
                "--timeout", str(timeout), "--interval", str(interval)]
        if udp:
            argv.append("--udp")
        if keep:
            argv.append("--keep")
        if sport:
            argv += ["--sport", str(sport)]
        if source:
            argv += ["--source", source]
        if abort:
            argv.append("--abort")
        r = self.exec(target, argv, capture_output=True, text=True,
                      timeout=count * (timeout + interval) * 2 + 10)
        lines = r.stdout.splitlines()
        if r.returncode not in (0, 1) or len(lines) != count:
            raise LabError(f"probe in {target} failed (rc {r.returncode}): {r.stderr.strip()}")
        return lines

    def _stop_target(self, st: LabState, label: str, cgroup_paths: Sequence[str]) -> list[str]:
        """Stop recorded processes of `label`, then anything left in its cgroups (children
        of what we started, or leftovers of `exec`)."""
        problems = []
        for pid, rec in list(st.procs.items()):
            if rec.target == label:
                if procs.kill_recorded(rec) == "stuck":
                    problems.append(f"pid {pid} ({rec.name}) survived SIGKILL")
                else:
                    del st.procs[pid]
        for cg in cgroup_paths:
            problems += [f"pid {pid} in {cg} survived SIGKILL" for pid in self._sweep(cg)[1]]
        return problems

    def _sweep(self, cg: str) -> tuple[list[int], list[int]]:
        """Kills what is left in cgroup `cg` and below (children of what we started, leftovers
        of `exec`): (killed, survived) pids."""
        killed: list[int] = []
        survived: list[int] = []
        if not os.path.isdir(cg):
            return killed, survived
        for pid in cgroups.pids_recursive(cg, self.cgroup_root):
            (killed if procs.kill_pid(pid) else survived).append(pid)
        # A process killed above may have forked meanwhile (kube-proxy starting an
        # iptables-restore as it stops): the sweep never saw that child, which holds the
        # cgroup and the netns. The kernel kills the whole tree at once.
        if cgroups.pids_recursive(cg, self.cgroup_root):
            cgroups.kill_all(cg, self.cgroup_root)
        return killed, survived

    # ---- teardown --------------------------------------------------------------------------

    def _longer_labs(self) -> list[str]:
        """Other labs whose names extend ours with '-' (lab "t" vs lab "t-p"): their objects
        also start with kproxy-t-, so down() of "t" must skip them."""
        names: set[str] = set()
        try:
            names.update(os.listdir(self.run_root))
        except FileNotFoundError:
            pass
        try:
            names.update(e[len("kproxy-"):] for e in os.listdir(self.cgroup_root)
                         if e.startswith("kproxy-"))
        except FileNotFoundError:
            pass
        return [n for n in names if n.startswith(f"{self.name}-")]

    def _owns(self, obj: str, longer: Sequence[str] | None = None) -> bool:
        if not obj.startswith(f"{self.prefix}-"):
            return False
        longer = self._longer_labs() if longer is None else longer
        return not any(obj.startswith(f"kproxy-{other}-") for other in longer)

    def down(self) -> DownReport:
        """Remove everything of this lab, recorded or not: processes (recorded ones, then any
        left in the lab's cgroups), netns kproxy-<lab>-*, the cgroup tree, bpffs directories
        /sys/fs/bpf/kproxy-<lab>-*, and the state directory. Never raises for leftovers: they
        are listed in the report's problems."""
        if self._st is not None:
            raise RuntimeError("down() inside a lab transaction would deadlock on the lock")
        report = DownReport()
        longer = self._longer_labs()
        with state.locked(self.name, self.run_root, create=False) as st:
            if st is not None:
                for pid, rec in list(st.procs.items()):
                    result = procs.kill_recorded(rec)
                    report.removed.append(f"pid {pid} ({rec.name}): {result}")
                    if result == "stuck":
                        report.problems.append(f"pid {pid} ({rec.name}) survived SIGKILL")
            killed, survived = self._sweep(self.cgroup)
            report.removed += [f"pid {pid} (found in lab cgroup)" for pid in killed + survived]
            report.problems += [f"pid {pid} in lab cgroup survived SIGKILL" for pid in survived]
            owned = [n for n in nsutil.list_netns() if self._owns(n, longer)]
            # Pods first, then nodes, the external client and the underlay.
            owned.sort(key=lambda n: (not n.startswith(f"{self.prefix}-p-"),
                                      n == self.net_netns, n))
            for ns in owned:
                report.problems += _netns_holders(ns)
                err = nsutil.delete(ns)
                (report.problems if err else report.removed).append(err or f"netns {ns}")
            if os.path.isdir(self.cgroup):
                problems = cgroups.remove_tree(self.cgroup, self.cgroup_root)
                report.problems += problems
                if not problems:
                    report.removed.append(f"cgroup {self.cgroup}")
            try:
                entries = os.listdir(self.bpffs_root)
            except FileNotFoundError:
                entries = []
            for e in sorted(entries):
                if self._owns(e, longer):
                    path = os.path.join(self.bpffs_root, e)
                    try:
                        shutil.rmtree(path)
                        report.removed.append(f"bpffs {path}")
                    except OSError as err:
                        report.problems.append(f"bpffs {path}: {err}")
            if os.path.isdir(self.state_dir):
                shutil.rmtree(self.state_dir, ignore_errors=True)
                report.removed.append(f"state {self.state_dir}")
        try:
            os.rmdir(self.run_root)  # only if no other lab is left
        except OSError:
            pass
        return report


def _netns_holders(ns: str) -> list[str]:
    """Processes still inside a lab netns that is about to be deleted: they keep it (and its
    interfaces) alive without a name, so they are reported; they are not ours to kill
    (ours were stopped through their cgroups before)."""
    deadline = time.monotonic() + 3.0
    while (pids := nsutil.pids_in(ns)) and time.monotonic() < deadline:
        time.sleep(0.05)          # processes killed a moment ago may still be exiting
    if not pids:
        return []
    who = [f"{pid} ({' '.join(procs.cmdline(pid) or ['?'])[:80]})" for pid in pids]
    return [f"netns {ns} is still used by pids {who}: it lives on until they exit"]


def _listening(pid: int, ports: Sequence[tuple[str, int]], v6: bool = False) -> bool:
    """Whether the process's netns has all the ports bound (/proc/<pid>/net is per netns;
    v6: the IPv6 sockets too, the last ones echo.py binds)."""
    for proto, port in ports:
        want = f":{port:04X}"
        try:
            with open(f"/proc/{pid}/net/{proto}{'6' if v6 else ''}") as f:
                rows = [line.split() for line in f.readlines()[1:]]
        except OSError:
            return False
        if not any(r[1].endswith(want) and (proto == "udp" or r[3] == "0A") for r in rows):
            return False
    return True


def _wait_listening(rec: ProcRec, ports: Sequence[tuple[str, int]], timeout: float,
                    v6: bool = False) -> None:
    deadline = time.monotonic() + timeout
    while not _listening(rec.pid, ports, v6):
        if procs.identify(rec) != "running" or time.monotonic() > deadline:
            try:
                with open(rec.log, errors="replace") as f:
                    tail = f.read()[-2000:]
            except OSError:
                tail = ""
            raise LabError(f"{rec.name} (pid {rec.pid}) did not start listening: {tail}")
        time.sleep(0.01)
