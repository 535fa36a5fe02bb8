"""The benchmark's lab: a Cluster (real API server) with no proxy at first, live backend pods
on node2 running kpbench-server, a client pod on node1, the measured Services, and the
switching of node proxies between modes (each one started cold and cleaned away after).

The measured Service `kpbench-target` has E live endpoints out of `live` pods (the spare pods
let M8's rolling update replace endpoints while every address keeps answering, so a failed
connection is the proxy's doing). `kpbench-m5` has one endpoint that M5 moves between two
pods: a connection that sees the change is then unambiguous.
"""
from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Callable, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from kproxy_ebpf.datapath.maps.layout import MAPS
from kproxy_ebpf.dev.lab import cgroups, nsutil, procs
from kproxy_ebpf.dev.lab.binaries import ensure_binaries
from kproxy_ebpf.dev.lab.cluster import Cluster
from kproxy_ebpf.dev.lab.nsutil import LabError

from . import fill
from .loadgen import CLIENT, SERVER, Client, find_tools, start_server, wait_answers
from .procstat import ProxyMeter
from .rawapi import RawApi

TARGET = "kpbench-target"
M5_SERVICE = "kpbench-m5"
NODEPORT = "kpbench-np"        # M9: a NodePort Service (TCP and UDP) reached from outside
CLIENT_POD = "kpbench-client"
# Copies of the target (same pods, same ports) for kube-proxy iptables: its KUBE-SERVICES
# order follows Go map iteration, so one Service's rule lands anywhere (seen: mostly in the
# first half); the latest of 25 sat past 90 % of the chain in 6 of 6 syncs tried at N=1000,
# and M1/M2 measure through that one (Testbed.place_target_late).
LATE_COPIES = 24
PROXY_MODES = ("iptables", "iptables-legacy", "nftables", "kproxy", "kproxy-tc", "kproxy-maglev",
               "kproxy-rr", "kproxy-lc", "kproxy-before")
KPROXY_MODES = ("kproxy", "kproxy-tc", "kproxy-maglev", "kproxy-rr", "kproxy-lc", "kproxy-before")
# kproxy-before: the agent of another checkout (KPROXY_BENCH_AGENT_TREE, e.g. the commit
# before a change), measured in the same lab and run as this one: an A/B of two commits.
AGENT_TREE_ENV = "KPROXY_BENCH_AGENT_TREE"
# kproxy-tc: the agent with socket LB off, ClusterIP served per packet at TC (issue 8's
# interface: `run --socket-lb BOOLEAN`, config key socketLB). kproxy-maglev: NodePort flows
# from outside picked by Maglev tables instead of at random (lbAlgorithm). kproxy-rr and
# kproxy-lc: every frontend on IPVS's round robin or least connection (issue 46; the
# scheduler bench, schedulers.py, sets them beside kproxy, whose default is random).
KPROXY_ARGS = {"kproxy": [], "kproxy-tc": ["--socket-lb=false"],
               "kproxy-maglev": ["--lb-algorithm=maglev"],
               "kproxy-rr": ["--lb-algorithm=round-robin"],
               "kproxy-lc": ["--lb-algorithm=least-conn"], "kproxy-before": []}
# The bench mode -> kube-proxy's own mode name (iptables-legacy is kube-proxy iptables mode
# running the legacy xtables binaries instead of the host's default nft-based ones).
KUBE_PROXY_MODE = {"iptables": "iptables", "iptables-legacy": "iptables", "nftables": "nftables"}
LEGACY_TOOLS = ("iptables", "iptables-save", "iptables-restore",
                "ip6tables", "ip6tables-save", "ip6tables-restore")
METRICS_PORT = 10249
# What programmed() reads (kproxy's, then kube-proxy's).
PROGRAMMED_METRICS = ("kproxy_backends", "kproxy_service_changes_pending",
                      "kubeproxy_sync_proxy_rules_last_timestamp_seconds",
                      "kubeproxy_sync_proxy_rules_endpoint_changes_pending",
                      "kubeproxy_sync_proxy_rules_service_changes_pending")
# Each proxy's minimum time between two syncs in the lab: kube-proxy's from the lab's
# KubeProxyConfiguration (lab/cluster.py: iptables/nftables minSyncPeriod 1s, kube-proxy's own
# default), kproxy's default (config.py). M5 spaces its changes by more than this, so each
# change is measured alone rather than waiting out the rate limit of the one before.
MIN_SYNC_S = {"iptables": 1.0, "iptables-legacy": 1.0, "nftables": 1.0, "kproxy": 0.2,
              "kproxy-tc": 0.2, "kproxy-maglev": 0.2, "kproxy-rr": 0.2, "kproxy-lc": 0.2,
              "kproxy-before": 0.2}


def backend_name(i: int) -> str:
    return f"kpbench-be-{i:02d}"


def late_copy_name(i: int) -> str:
    return f"kpbench-late-{i:02d}"


# The Services with the target's pods and ports: the target itself and its copies.
TARGET_AND_COPIES = (TARGET, *(late_copy_name(i) for i in range(LATE_COPIES)))


def rule_positions(save: str, vips: dict[str, str], port: int
                   ) -> tuple[dict[str, int | None], int]:
    """From `iptables-save -t nat`: the 1-based position in KUBE-SERVICES of each Service's
    ClusterIP rule for `port` (each port of a Service is a rule of its own, placed on its
    own), and the chain's length."""
    rules = [line.split() for line in save.splitlines() if line.startswith("-A KUBE-SERVICES ")]

    def at(vip: str) -> int | None:
        for i, words in enumerate(rules, 1):
            if (f"{vip}/32" in words and "--dport" in words
                    and words[words.index("--dport") + 1] == str(port)):
                return i
        return None
    return {name: at(vip) for name, vip in vips.items()}, len(rules)


def metric(samples: dict[str, float], name: str, default: float = 0.0) -> float:
    """The largest value of metric `name` over its label sets (kube-proxy labels some of its
    gauges by ip_family)."""
    vals = [v for k, v in samples.items() if k == name or k.startswith(name + "{")]
    return max(vals) if vals else default


def parse_prometheus(text: str) -> dict[str, float]:
    """name{labels} -> value for the sample lines of a /metrics page."""
    out = {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        key, _, value = line.rpartition(" ")
        try:
            out[key] = float(value)
        except ValueError:
            continue
    return out


@dataclass
class Testbed:
    lab_name: str
    tools_dir: str
    endpoints: int = 10
    live: int = 12
    nodes: int = 2
    proxy_nodes: tuple[str, ...] = ("node1",)
    pin: bool = True
    log: Callable[[str], None] = print
    ip_family: str = "ipv4"            # the lab's (`lab up --ip-family`): ipv4 or ipv6
    bitmap_ip_allocator: bool = False  # lab/controlplane.py ControlPlane
    cluster: Cluster | None = None
    api: RawApi | None = None
    tools: dict = field(default_factory=dict)
    pods: dict[str, str] = field(default_factory=dict)      # backend name -> pod IP
    vips: dict[str, str] = field(default_factory=dict)      # service -> ClusterIP
    filled: int = 0
    max_services: int = 0                                  # the largest fill of the run
    target_set: list[str] = field(default_factory=list)     # backends in the target's slice
    one_endpoint: str = ""
    client: Client | None = None
    ext_client: Client | None = None                        # in the lab's external namespace
    np_ports: dict[str, int] = field(default_factory=dict)  # protocol -> nodePort
    np_set: list[str] = field(default_factory=list)         # the NodePort Service's backends
    mode: str = "none"
    pids: dict[str, int] = field(default_factory=dict)      # node -> proxy pid
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _churn_seq: int = 0

    # -- lab ---------------------------------------------------------------------------------
    def up(self) -> None:
        self.tools = find_tools(self.tools_dir)
        self.cluster = Cluster(self.lab_name)
        if self.cluster.lab.exists():
            self.log(f"removing a leftover lab {self.lab_name}")
            self.cluster.down()
        self.cluster.up(nodes=self.nodes, proxy="none", log=lambda m: self.log(f"lab: {m}"),
                        ip_family=self.ip_family, bitmap_ip_allocator=self.bitmap_ip_allocator)
        try:
            self._populate()
        except BaseException:
            self.down()
            raise

    def _populate(self) -> None:
        lab = self.cluster.lab
        self.api = RawApi(self.cluster.info.admin_kubeconfig)
        fill.ensure_namespace(self.api)
        if self.bitmap_ip_allocator:
            # What 1.36's allocator would have made: the proxies see the same ServiceCIDR.
            cidrs = self.cluster.cp.service_cidr.split(",")
            self.api.create("/apis/networking.k8s.io/v1/servicecidrs",
                            fill.service_cidr_obj("kubernetes", cidrs))
        client_cpu, server_cpu = (0, 1) if self.pin and (os.cpu_count() or 1) > 1 else (None, None)
        lab.create_pod(CLIENT_POD, "node1", ports=(), echo=False)
        # Short-lived connections by the thousand: the widest port range, so a run never
        # waits for a free port.
        nsutil.sysctl(lab.pod_netns(CLIENT_POD), "net.ipv4.ip_local_port_range", "1024 65000")
        self.client = Client(lab, self.tools[CLIENT], f"pod/{CLIENT_POD}", client_cpu)
        nsutil.sysctl(lab.ext_netns, "net.ipv4.ip_local_port_range", "1024 65000")
        self.ext_client = Client(lab, self.tools[CLIENT], "ext", client_cpu)
        backend_node = f"node{min(2, self.nodes)}"
        for i in range(self.live):
            name = backend_name(i)
            pod = lab.create_pod(name, backend_node, ports=(), echo=False)
            start_server(lab, self.tools[SERVER], name, fill.TARGET_PORT, fill.SINK_PORT,
                         server_cpu)
            self.pods[name] = pod.ip
        for name, ip in self.pods.items():
            wait_answers(self.client, ip, fill.TARGET_PORT, name)
        self.target_set = [backend_name(i) for i in range(min(self.endpoints, self.live))]
        # The target has a request port and a sink port (M3's bulk stream).
        for name in TARGET_AND_COPIES:
            self.vips[name] = fill.create_service(
                self.api, name, [self.pods[n] for n in self.target_set],
                ports=(("req", fill.SERVICE_PORT, fill.TARGET_PORT),
                       ("sink", fill.SINK_SERVICE_PORT, fill.SINK_PORT)))
        self.one_endpoint = backend_name(0)
        self.vips[M5_SERVICE] = fill.create_service(self.api, M5_SERVICE,
                                                    [self.pods[self.one_endpoint]])
        # M9's NodePort Service: the target's first E pods (all on node2, so node1 forwards
        # and SNATs), a TCP and a UDP port; fixed, M8's rolling update does not touch it.
        self.np_set = list(self.target_set)
        svc = fill.create_service_obj(
            self.api, NODEPORT, [self.pods[n] for n in self.np_set],
            ports=(("req", fill.SERVICE_PORT, fill.TARGET_PORT, "TCP"),
                   ("udp", fill.SERVICE_PORT, fill.TARGET_PORT, "UDP")),
            service_type="NodePort")
        self.np_ports = {p["protocol"]: p["nodePort"] for p in svc["spec"]["ports"]}
        self.log(f"testbed: {self.live} live backends on {backend_node}, target "
                 f"{self.vips[TARGET]}, m5 {self.vips[M5_SERVICE]}, NodePort "
                 f"{self.node_ip()}:{self.np_ports}")

    def down(self) -> None:
        if self.cluster is None:
            return
        for _node in list(self.pids):
            try:
                self.stop_proxy()
            except Exception as e:  # noqa: BLE001 - down() must go on whatever happened
                self.log(f"stopping the proxy: {e}")
                break
        problems = self.cluster.down()
        for p in problems:
            self.log(f"lab down: {p}")
        self.cluster = None

    def fill_to(self, n: int, workers: int = 12) -> dict | None:
        if n <= self.filled:
            return None
        self.log(f"fill: services {self.filled}..{n - 1} ({self.endpoints} endpoints each)")
        r = fill.fill(self.api, self.filled, n, self.endpoints, workers=workers,
                      progress=lambda k: self.log(f"fill: +{k}"), v6=self.v6)
        self.filled = n
        self.log(f"fill: {r.created} services in {r.seconds:.1f}s ({r.rate:.0f}/s)")
        return {"created": r.created, "seconds": r.seconds, "per_s": r.rate}

    @property
    def v6(self) -> bool:
        return self.ip_family == "ipv6"

    def node_ip(self, node: str = "node1") -> str:
        return self.cluster.lab.node(node).ip

    @contextmanager
    def pods_routed_from_outside(self, pods: list[str]):
        """M9's direct floor: the external client reaches these pod IPs through node1 (ext
        -> node1 -> node2 -> pod and back the same way), the NodePort path's hops without
        any NAT. The lab does not route pod IPs from outside, so the routes exist only
        while the floor is measured; node1 stops sending ICMP redirects meanwhile (it
        forwards out the interface the packet came in on, and a redirected client would
        skip node1)."""
        lab = self.cluster.lab
        ext_ip, via = lab.external().ip, self.node_ip("node1")
        host = "/128" if self.v6 else "/32"
        routes = [("ext", f"{self.pods[p]}{host}") for p in pods] + [("node/node2",
                                                                      f"{ext_ip}{host}")]
        # IPv6 has no switch for sending redirects (ip6_forward sends them whenever a packet
        # leaves by the link it came in on): the client ignores them instead.
        ns, keys = ((lab.ext_netns, ("net.ipv6.conf.all.accept_redirects",
                                     "net.ipv6.conf.eth0.accept_redirects")) if self.v6 else
                    (lab.node_netns("node1"), ("net.ipv4.conf.all.send_redirects",
                                               "net.ipv4.conf.eth0.send_redirects")))
        redirects = {k: nsutil.read_sysctl(ns, k) for k in keys}

        def ip_route(op: str, target: str, dst: str) -> None:
            lab.exec(target, ["ip", "route", op, dst, "via", via, "dev", "eth0"], check=True,
                     capture_output=True, timeout=30)

        try:
            nsutil.sysctls(ns, dict.fromkeys(redirects, "0"))
            for target, dst in routes:
                ip_route("replace", target, dst)
            yield
        finally:
            for target, dst in routes:
                lab.exec(target, ["ip", "route", "del", dst], capture_output=True, timeout=30)
            nsutil.sysctls(ns, redirects)

    def expected_backends(self) -> int:
        """Distinct backends a proxy must hold: every filler endpoint plus the live pods the
        measured Services use."""
        live = set(self.target_set) | set(self.np_set) | {self.one_endpoint}
        return self.filled * self.endpoints + len(live)

    # -- proxies -----------------------------------------------------------------------------
    def start_proxy(self, mode: str) -> dict[str, int]:
        if self.pids:
            raise LabError(f"a proxy ({self.mode}) is still running")
        self.mode = mode
        extra = (["--config", str(self.kproxy_config()), *KPROXY_ARGS[mode]]
                 if mode in KPROXY_MODES else None)
        tree = os.environ.get(AGENT_TREE_ENV) if mode == "kproxy-before" else None
        if mode == "kproxy-before" and not tree:
            raise LabError(f"kproxy-before runs the agent of {AGENT_TREE_ENV}, which is unset")
        for node in self.proxy_nodes:
            self.pids[node] = self.cluster.start_proxy(
                node, "kproxy" if mode in KPROXY_MODES else KUBE_PROXY_MODE[mode],
                env=self.proxy_env(mode), extra_args=extra, cwd=tree)
        return dict(self.pids)

    def kproxy_rejects(self, mode: str) -> str | None:
        """The agent's own error if it does not accept the mode's flags (an agent built
        before `--socket-lb` answers "No such option"), else None. click parses every
        option before it acts on --help, so this checks the flags without starting."""
        if not KPROXY_ARGS.get(mode):
            return None
        r = subprocess.run([sys.executable, "-m", "kproxy_ebpf.cli.main", "run", *KPROXY_ARGS[mode],
                            "--help"], capture_output=True, text=True, timeout=120)
        if r.returncode == 0:
            return None
        return (r.stderr.strip() or r.stdout.strip() or f"rc {r.returncode}").splitlines()[-1]

    def proxy_alive(self, node: str = "node1") -> bool:
        """Whether the node's proxy still runs (a dead child stays a zombie until reaped)."""
        pid = self.pids.get(node)
        try:
            with open(f"/proc/{pid}/stat") as f:
                state = f.read().rsplit(")", 1)[1].split()[0]
        except (OSError, TypeError):
            return False
        return state not in ("Z", "X")

    def clear_program_cache(self) -> None:
        """Empties the lab's compiled-program cache: the next kproxy start compiles."""
        from kproxy_ebpf.datapath.load.progcache import remove

        remove(Path(self.cluster.program_cache_dir))

    def program_cache_result(self, node: str = "node1") -> str:
        """How the running agent loaded its programs, from its log: cache hit or compile."""
        try:
            text = Path(self.cluster.lab.log_path(self.cluster.proxy_name(node))).read_text()
        except OSError:
            return "unknown"
        return "hit" if "programs from the program cache in" in text else "compiled"

    def proxy_log_tail(self, node: str = "node1", lines: int = 5) -> str:
        try:
            text = Path(self.cluster.lab.log_path(self.cluster.proxy_name(node))).read_text()
        except OSError:
            return ""
        return " | ".join(line.strip() for line in text.splitlines()[-lines:] if line.strip())

    def kproxy_map_sizes(self) -> dict[str, int]:
        """Map sizes for the largest fill of the run, never below kproxy's defaults (the
        header's: they hold 10,000 Services of 10 endpoints; a Service costs 1 + E rows in the
        service map). Everything else (sync periods) stays at its default."""
        n = max(self.max_services, self.filled) + 16 + 2 * LATE_COPIES   # + two-port copies
        def fit(rows: int, default: int) -> int:
            return max(default, 1 << (int(rows * 1.25) - 1).bit_length())
        default = {name: MAPS[name].default_size for name in ("svc", "backend", "meta")}
        return {"svc": fit(n * (self.endpoints + 1) + 64, default["svc"]),
                "backend": fit(n * self.endpoints + 64, default["backend"]),
                "meta": fit(n * 2, default["meta"])}

    def kproxy_config(self) -> Path:
        path = Path(self.cluster.lab.state_dir) / "kproxy-bench.yaml"
        path.write_text(yaml.safe_dump({"mapSizes": self.kproxy_map_sizes()}))
        return path

    def proxy_env(self, mode: str) -> dict[str, str] | None:
        """For iptables-legacy: PATH starts with a directory whose iptables* are the legacy
        binaries (kube-proxy runs whatever `iptables` PATH gives; the host's alternative
        stays untouched). For kproxy-before, the other tree's package first on the path."""
        tree = os.environ.get(AGENT_TREE_ENV)
        if mode == "kproxy-before" and tree:
            return {**os.environ, "PYTHONPATH": tree}
        if mode != "iptables-legacy":
            return None
        d = Path(self.cluster.lab.state_dir) / "iptables-legacy-bin"
        d.mkdir(exist_ok=True)
        for tool in LEGACY_TOOLS:
            link = d / tool
            if not link.exists():
                link.symlink_to(f"/usr/sbin/{tool.replace('tables', 'tables-legacy', 1)}")
        return {**os.environ, "PATH": f"{d}:{os.environ.get('PATH', '/usr/sbin:/usr/bin')}"}

    def _cgroup(self, node: str) -> str | None:
        """The node's host cgroup (the proxy and its children run there, nothing else while
        the bench measures), if the kernel gives it a cpu.stat."""
        cg = self.cluster.lab.node(node).host_cgroup
        return cg if os.path.exists(os.path.join(cg, "cpu.stat")) else None

    def meter(self, node: str = "node1") -> ProxyMeter:
        return ProxyMeter(self.pids[node], self._cgroup(node))

    def meter_cgroup_usage(self, node: str = "node1") -> float | None:
        """CPU seconds the node's host cgroup has used so far (None without cpu.stat)."""
        return ProxyMeter(0, self._cgroup(node)).sample().cgroup

    def stop_proxy(self) -> None:
        """Stops the proxies and removes what they programmed, so the next mode starts cold
        and is not served by leftovers (kproxy's hooks stay attached through pinned links;
        kube-proxy's rules stay in the node's tables)."""
        mode = self.mode
        for node in list(self.pids):
            self.cluster.stop_proxy(node)
            del self.pids[node]
            info = self.cluster.lab.node(node)
            # Children the proxy left running (an iptables-restore still busy when a cold
            # start was given up) would hold the xtables lock against the cleanup below.
            for pid in cgroups.pids_recursive(info.host_cgroup):
                procs.kill_pid(pid)
            if mode in KPROXY_MODES:
                # In the node's namespace: the TC filters (external device, pod veths) live
                # there and would otherwise keep translating for the next mode.
                r = self.cluster.lab.exec(f"node/{node}", [
                    sys.executable, "-m", "kproxy_ebpf.cli.main", "cleanup", "--bpffs-dir",
                    info.bpffs, "--yes", "--program-cache", ""],    # the cache stays warm
                    capture_output=True, text=True, timeout=120)
                if r.returncode != 0:
                    raise LabError(f"kproxy-ebpf cleanup on {node}: {r.stderr[-500:]}")
            elif mode in KUBE_PROXY_MODE:
                kp = str(ensure_binaries(build=False) / "kube-proxy")
                r = self.cluster.lab.exec(f"node/{node}", [kp, "--cleanup"],
                                          capture_output=True, text=True, timeout=300,
                                          env=self.proxy_env(mode))
                if r.returncode != 0:
                    raise LabError(f"kube-proxy --cleanup on {node}: {r.stderr[-500:]}")
        self.flush_conntrack()
        self.mode = "none"

    def flush_conntrack(self) -> None:
        """Forget the flows of the last mode in every node: an iptables DNAT entry for
        client:port -> VIP has the reply tuple pod -> client:port, and a later direct-to-pod
        connection from the same port would clash with it (the SYN is dropped) for the two
        minutes a TIME_WAIT entry lives."""
        for node in self.cluster.lab.nodes():
            self.cluster.lab.exec(f"node/{node.name}", ["conntrack", "-F"],
                                  capture_output=True, timeout=60)

    def metrics(self, node: str = "node1", names: Sequence[str] = ()) -> dict[str, float]:
        """The proxy's /metrics, fetched from inside the node's namespace; `names` asks for
        those families only (kproxy's `name[]` filter: its whole page grows with the Services,
        8 series per service port, and the waits below poll every 50-100 ms; kube-proxy
        ignores the query)."""
        query = "?" + "&".join(f"name[]={n}" for n in names) if names else ""

        def get() -> str:
            with urllib.request.urlopen(f"http://127.0.0.1:{METRICS_PORT}/metrics{query}",
                                        timeout=2) as r:
                return r.read().decode()

        return parse_prometheus(nsutil.run_in_thread(self.cluster.lab.node_netns(node), get))

    def kube_proxy_syncs(self, node: str = "node1") -> float:
        """How many syncs kube-proxy has finished: its sync duration histogram's count,
        observed as a sync returns (after its conntrack cleanup)."""
        return metric(self.metrics(node), "kubeproxy_sync_proxy_rules_duration_seconds_count")

    def wait_kube_proxy_sync_end(self, before: float, timeout: float,
                                 node: str = "node1") -> bool:
        """Waits until kube-proxy finished a sync after `before` syncs (polled every 20 ms)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.kube_proxy_syncs(node) > before:
                return True
            time.sleep(0.02)
        return False

    def programmed(self, node: str = "node1") -> bool:
        """Whether the proxy reports everything listed as programmed: kproxy's backend gauge
        covers all N x E (+ live) endpoints with nothing pending; kube-proxy has finished a
        sync (its first sync runs only once its informers have listed everything)."""
        try:
            m = self.metrics(node, PROGRAMMED_METRICS)
        except OSError:
            return False
        if self.mode in KPROXY_MODES:
            return (metric(m, "kproxy_backends") >= self.expected_backends()
                    and metric(m, "kproxy_service_changes_pending", 1) == 0)
        return (metric(m, "kubeproxy_sync_proxy_rules_last_timestamp_seconds") > 0
                and metric(m, "kubeproxy_sync_proxy_rules_endpoint_changes_pending") == 0
                and metric(m, "kubeproxy_sync_proxy_rules_service_changes_pending") == 0)

    def wait_programmed(self, timeout: float, node: str = "node1") -> float:
        """Monotonic time at which programmed() first held."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.programmed(node):
                return time.monotonic()
            time.sleep(0.05)
        raise LabError(f"{self.mode} on {node} did not program {self.expected_backends()} "
                       f"backends within {timeout:.0f}s; see "
                       f"{self.cluster.lab.log_path(self.cluster.proxy_name(node))}")

    def kube_services_position(self, service: str = TARGET, node: str = "node1") -> dict | None:
        """Where a Service's ClusterIP rule sits in iptables KUBE-SERVICES (kube-proxy
        iptables mode writes that chain in Go map order, so the position is random per sync:
        pkg/proxy/iptables/proxier.go, `for svcName, svc := range proxier.svcPortMap`)."""
        got = self._kube_services_positions([service], node)
        return got and {"position": got[0][service], "rules": got[1]}

    def _kube_services_positions(self, services: list[str], node: str = "node1"
                                 ) -> tuple[dict[str, int | None], int] | None:
        save = "iptables-legacy-save" if self.mode == "iptables-legacy" else "iptables-save"
        r = self.cluster.lab.exec(f"node/{node}", [save, "-t", "nat"],
                                  capture_output=True, text=True, timeout=120)
        if r.returncode != 0:
            return None
        return rule_positions(r.stdout, {s: self.vips[s] for s in services}, fill.SERVICE_PORT)

    def place_target_late(self, tail: float, budget_s: float) -> dict | None:
        """For kube-proxy iptables: of the target and its copies, the one whose rule sits
        latest in KUBE-SERVICES, where the rule walk is longest (the case the issue measures),
        as {"service", "position", "rules", "rolls", "seconds"}. Should none be in the last
        `tail` share, kube-proxy re-syncs (a filler endpoint change: nothing measured moves),
        each sync writing the chain in a fresh order, for at most budget_s."""
        t0, rolls = time.monotonic(), 0
        while True:
            got = self._kube_services_positions(list(TARGET_AND_COPIES))
            if got is None:
                return None
            positions, rules = got
            service = max(TARGET_AND_COPIES, key=lambda s: positions[s] or 0)
            if ((positions[service] or 0) >= (1 - tail) * rules
                    or time.monotonic() - t0 >= budget_s):
                break
            before = self.kube_proxy_syncs()
            self.api.json_patch(*self.filler_change(0))
            if not self.wait_kube_proxy_sync_end(before, 60.0):
                break
            rolls += 1
        return {"service": service, "position": positions[service], "rules": rules,
                "rolls": rolls, "seconds": round(time.monotonic() - t0, 1)}

    # -- changes -------------------------------------------------------------------------------
    def move_one_endpoint(self) -> tuple[str, str, list]:
        """The next M5 change: the single endpoint of kpbench-m5 moves to the other pod."""
        new = backend_name(1) if self.one_endpoint == backend_name(0) else backend_name(0)
        return new, fill.slices_path(f"{M5_SERVICE}-kpbench"), fill.replace_endpoint_op(
            0, self.pods[new])

    def timed_move(self, w) -> float | None:
        """The next M5 change, made and awaited through watcher `w`: milliseconds from its API
        write to the first connection the new backend answered (None: not seen)."""
        new, path, ops = self.move_one_endpoint()
        w.send(new, 60)
        t_write = time.time_ns()
        self.api.json_patch(path, ops)
        res = w.result()
        self.one_endpoint = new
        return (res["seen_realtime_ns"] - t_write) / 1e6 if res.get("ok") else None

    def rolling_change(self, k: int) -> tuple[str, list]:
        """Rolling update of the target: endpoint k mod E is replaced by a spare live pod, so
        the target always has E answering endpoints."""
        with self._lock:        # the churner calls this from several threads
            spares = [n for n in self.pods if n not in self.target_set]
            if not spares:
                raise LabError("a rolling update needs more live pods than endpoints")
            idx = k % len(self.target_set)
            new = spares[0]
            self.target_set[idx] = new
        return fill.slices_path(f"{TARGET}-kpbench"), fill.replace_endpoint_op(
            idx, self.pods[new])

    def filler_change(self, k: int) -> tuple[str, list]:
        """Endpoint churn over the fillers: one endpoint of one filler moves to an address
        never used before in this lab (so every filler endpoint stays distinct and the
        count a proxy must hold stays N x E)."""
        with self._lock:
            seq = self._churn_seq
            self._churn_seq += 1
        i = (seq * 7919) % max(1, self.filled)
        return (fill.slices_path(f"{fill.filler_name(i)}-kpbench"),
                fill.replace_endpoint_op(seq % self.endpoints, fill.churn_address(seq, self.v6)))
