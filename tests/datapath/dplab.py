"""The datapath suite's lab "dp" and its helpers (fixtures: conftest.py): a 2-node lab, pods with
echo servers, and node1's datapath programmed in-process through the real policy code
(ProxyState) and the real MapWriter.

Conventions (lab "dp", dual-stack): node1 10.250.0.11 and fd00:250::11 (pods 10.244.1.x,
fd00:244:1::x), node2 10.250.0.12 and fd00:250::12 (10.244.2.x, fd00:244:2::x). Pods: client
(node1), a1, a2 (node1), b1, b2 (node2); each echo server answers tcp:8080 and udp:5353 with
"<pod> <client-ip>:<client-port>" ([ip]:port in IPv6). Service IPs are 10.96.0.x and
fd00:96::x; a test taking the `fam` fixture runs once per family (Fam below).

ClusterIP paths: node1 serves Services through the socket hooks, or, where a module says
`pytestmark = pytest.mark.parametrize("lb_path", LB_PATHS, indirect=True)`, once through each
path: "socket" (cgroup hooks) and "tc" (`socketLB: false`: tc_lb.c's kp_from_pod/kp_to_pod on
node1's pod veths, attached by the agent's own PodDeviceWatcher). The tests are the same; only
a counter's name differs (NodeProxy.counter).
"""
from __future__ import annotations

from pathlib import Path

from kproxy_ebpf.datapath.load import tc
from kproxy_ebpf.datapath.load.bpffs import remove_pins
from kproxy_ebpf.datapath.load.sock_hooks import SockDatapath
from kproxy_ebpf.datapath.maps import reader
from kproxy_ebpf.datapath.write.writer import MapWriter
from kproxy_ebpf.dev.lab import Lab, nsutil
from kproxy_ebpf.model.objects import (
    EndpointPort,
    EndpointSlice,
    Node,
    Protocol,
    Service,
    ServicePort,
)
from kproxy_ebpf.proxy.state import ProxyState

from .. import builders

LAB = "dp"
PODS = {"client": "node1", "a1": "node1", "a2": "node1", "b1": "node2", "b2": "node2"}
PORTS = (("tcp", 8080), ("udp", 5353))
LB_PATHS = ("socket", "tc")
LAB_FAMILIES = ("IPv4", "IPv6")


class Fam:
    """One IP family of the dp lab: its Service addresses, the pods' addresses, the address
    text the echo servers print."""

    def __init__(self, family: str):
        self.family = family
        self.v6 = family == "IPv6"
        self.af = "socket.AF_INET6" if self.v6 else "socket.AF_INET"     # for client scripts

    def vip(self, n: int) -> str:
        return f"fd00:96::{n}" if self.v6 else f"10.96.0.{n}"

    def ip(self, lab: Lab, pod: str) -> str:
        return lab.pod(pod).ip_of(self.family)

    def peer(self, ip: str) -> str:
        """How the echo servers print `ip` before ':<port>'."""
        return f"[{ip}]" if self.v6 else ip

    def endpoints(self, lab: Lab, svc: str, pods: list[str], *ports, **kw) -> EndpointSlice:
        """endpoints() of this family."""
        return endpoints(lab, svc, pods, *ports, fam=self, **kw)

    def __repr__(self) -> str:
        return self.family


V4 = Fam("IPv4")


class NodeProxy:
    """node1's datapath, driven like the agent drives it, minus the API. path "socket": the
    cgroup hooks; "tc": the maps only, and the per-packet programs on the pod devices."""

    def __init__(self, lab: Lab, node: str, path: str = "socket"):
        info = lab.node(node)
        self.path = path
        self.netns = info.netns
        self.node = Node(node, addresses=info.ips)
        self.bpffs = Path(info.bpffs)
        self.datapath = SockDatapath(self.bpffs, Path(info.cgroup))
        self.tc: tc.TcDatapath | None = None
        try:
            self.datapath.load()
            if path == "socket":
                self.datapath.attach()
            else:
                self.tc = tc.TcDatapath(self.bpffs, [], info.ips, pod_globs=("kpv*",),
                                        runner=lambda body: nsutil.run_in_thread(info.netns, body))
                self.tc.load()
                self.tc.attach()
        except BaseException:
            self.close()
            raise
        self.writer = MapWriter(self.datapath.maps)
        self.writer.restore()
        self.state = ProxyState(self.node)

    def program(self, *objs) -> None:
        """Replaces the whole cluster view with `objs` (Services and EndpointSlices)."""
        result = self.writer.apply(cluster_view(self.node, objs).compute(full=True).frontends)
        assert result.ok, result.errors

    def counter(self, name: str) -> int:
        """A verdict counter of the path in use: the TC programs count as tc_<name>."""
        prefix = "tc_" if self.path == "tc" else ""
        return reader.counters(self.datapath.maps["stats"]).get(prefix + name, 0)

    def close(self) -> None:
        if self.tc is not None:
            self.tc.close()
            nsutil.run_in_thread(self.netns, lambda: tc.detach_all(tc.POD_PROGRAMS))
        self.datapath.close()
        remove_pins(self.bpffs)


def cluster_view(node: Node, objs, cidrs=(), **options) -> ProxyState:
    """The policy state of a node that sees exactly `objs` (Services and EndpointSlices) and
    the ServiceCIDRs `cidrs`; `options` are ProxyState's."""
    state = ProxyState(node, **options)
    state.load([o for o in objs if isinstance(o, Service)],
               [o for o in objs if isinstance(o, EndpointSlice)])
    for sc in cidrs:
        state.upsert_service_cidr(sc)
    return state


def service(name: str, ip: str, *ports: tuple[str, str, int], affinity: int = 0,
            itp_local: bool = False) -> Service:
    return builders.svc(name, ip, ns="default",
                        ports=(ServicePort(n, Protocol(p), port) for n, p, port in ports),
                        session_affinity_timeout=affinity, internal_traffic_local=itp_local)


def endpoints(lab: Lab, svc: str, pods: list[str], *ports: tuple[str, str, int],
              ready: bool = True, serving: bool = True, terminating: bool = False,
              slice_name: str | None = None, fam: Fam = V4) -> EndpointSlice:
    eps = (builders.ep(fam.ip(lab, p), lab.pod(p).node, ready=ready, serving=serving,
                       terminating=terminating) for p in pods)
    return builders.sl(*eps,
                       name=slice_name or f"{svc}-{6 if fam.v6 else 1}", svc=svc, ns="default",
                       ports=(EndpointPort(n, Protocol(p), port) for n, p, port in ports),
                       family=fam.family)


def pod_of(line: str) -> str:
    """The echo line is '<pod> <client-ip>:<client-port>'."""
    return line.split()[0]


VERDICTS = ("cip_reject", "cidr_drop")


def assert_untouched(lab, node1, ip: str, port: int, udp: bool = False) -> None:
    """The hooks neither refused nor failed the attempt: their counters stay, and the result is
    whatever the lab's routing gives (no route, or an ICMP error the kernel may rate-limit)."""
    stats = node1.datapath.maps["stats"]
    before = {k: reader.counters(stats).get(k, 0) for k in VERDICTS}
    result = lab.probe("client", ip, port, udp=udp, timeout=0.5)[0]
    assert {k: reader.counters(stats).get(k, 0) for k in VERDICTS} == before, (ip, udp, result)
    assert result in ("ERROR ENETUNREACH", "TIMEOUT"), (ip, udp, result)
