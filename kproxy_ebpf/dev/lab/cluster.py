"""The lab as a Kubernetes cluster: the nodes and pods of namespaces.py, a real control plane
(controlplane.py) on the host's loopback, the relay that gives it a lab address, a Node object
per simulated node, Pod objects for lab pods, and one proxy per node: our agent, or upstream
kube-proxy in iptables or nftables mode as the baseline.

Every process is recorded in the lab's state, so a later `lab down` (another process) stops
exactly what this one started, and `down()` after any failure leaves nothing behind.
"""
from __future__ import annotations

import json
import os
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import yaml

from kproxy_ebpf.model.objects import hostport

from . import agent_image, kubeobjects
from .addressing import PLANS, choice_of, families
from .binaries import cli_module, ensure_binaries
from .controlplane import ControlPlane
from .lballoc import DEFAULT_POOL, DEFAULT_POOL6
from .namespaces import CONTROL_PLANE_IP, Lab, PodInfo, external_cidr
from .nsutil import LabError

PROXIES = ("kproxy", "iptables", "nftables", "none")
AGENTS = ("process", "image")     # how kproxy runs: a host process, or the chart's pod spec
NAMESPACE = "default"
LB_ALLOCATOR = "lb-allocator"


def _zone(index: int) -> str:
    """Nodes alternate between two zones, so topology hints have something to choose."""
    return f"zone-{'ab'[(index - 1) % 2]}"


@dataclass
class ClusterInfo:
    proxy: str
    api_port: int
    admin_kubeconfig: str
    lab_kubeconfig: str
    agent: str = "process"
    lb_pool: str = DEFAULT_POOL     # the LoadBalancer allocator's addresses (lab/lballoc.py)
    ip_family: str = "ipv4"         # `lab up --ip-family` (addressing.py)

    @classmethod
    def load(cls, path: Path) -> ClusterInfo:
        return cls(**json.loads(path.read_text()))


class Cluster:
    def __init__(self, name: str = "lab"):
        self.lab = Lab(name)
        self.dir = Path(self.lab.state_dir)
        self.cp_dir = self.dir / "controlplane"
        self.cp: ControlPlane | None = None     # set when this process started it
        self._api = None

    # -- what a later invocation needs ---------------------------------------------------------
    @property
    def info(self) -> ClusterInfo:
        path = self.dir / "cluster.json"
        if not path.exists():
            raise LabError(f"lab {self.lab.name!r} has no control plane (run `lab up`)")
        return ClusterInfo.load(path)

    @property
    def image_endpoint(self) -> agent_image.LabEndpoint:
        """This lab as `--agent image` needs it (lab/agent_image.py)."""
        return agent_image.LabEndpoint(
            lab=self.lab.name, files_dir=self.dir / "agent-image", api_port=self.info.api_port,
            admin_kubeconfig=self.info.admin_kubeconfig, ca_cert=self.cp_dir / "pki" / "ca.crt")

    def api(self):
        """A kubernetes ApiClient on the admin kubeconfig (host loopback)."""
        if self._api is None:
            from kubernetes import config

            self._api = config.new_client_from_config(self.info.admin_kubeconfig)
        return self._api

    # -- up / down -----------------------------------------------------------------------------
    def up(self, nodes: int = 2, proxy: str = "kproxy", build: bool = False,
           log=lambda msg: None, agent: str = "process", lb_pool: str | None = None,
           ip_family: str = "ipv4", bitmap_ip_allocator: bool = False) -> None:
        """lb_pool: the LoadBalancer allocator's range; by default one of the lab's primary
        family (lballoc.DEFAULT_POOL, DEFAULT_POOL6). bitmap_ip_allocator: see ControlPlane."""
        if proxy not in PROXIES:
            raise LabError(f"--proxy must be one of {', '.join(PROXIES)}")
        if agent not in AGENTS or (agent == "image" and proxy != "kproxy"):
            raise LabError(f"--agent must be one of {', '.join(AGENTS)} (image: --proxy kproxy)")
        if self.lab.exists():
            raise LabError(f"lab {self.lab.name!r} exists: `lab down` first")
        fams = families(ip_family)
        lb_pool = external_cidr(lb_pool or (DEFAULT_POOL6 if fams[0] == "IPv6" else DEFAULT_POOL))
        try:
            bin_dir = ensure_binaries(build=build)
            log(f"network: {nodes} nodes, external client, {'/'.join(fams)}")
            self.lab.up(nodes=nodes, external=True, families=fams)
            log("control plane: etcd, kube-apiserver, kube-controller-manager")
            self._control_plane(bin_dir, proxy, agent, lb_pool, bitmap_ip_allocator)
            log(f"LoadBalancer allocator: pool {lb_pool}, routed from the external client "
                "via node1")
            self.start_lb_allocator()
            self.lab.add_external_route(lb_pool, "node1")
            api = self.api()
            kubeobjects.ensure_namespace(api, NAMESPACE)
            for node in self.lab.nodes():
                kubeobjects.create_node(api, node.name, node.ips, zone=_zone(node.index),
                                        pod_cidrs=node.pod_cidrs)
            if agent == "image":
                log("agent image: the chart's DaemonSet pod spec, applied to the lab")
                agent_image.prepare(self.image_endpoint, api)
            for node in self.lab.nodes():
                self.start_proxy(node.name)
            log(f"proxies: {proxy} on {', '.join(n.name for n in self.lab.nodes())}")
            for node in self.lab.nodes():
                self.wait_proxy_healthy(node.name)
        except BaseException:
            self.down()
            raise

    def _control_plane(self, bin_dir: Path, proxy: str, agent: str = "process",
                       lb_pool: str = DEFAULT_POOL, bitmap_ip_allocator: bool = False) -> None:
        plans = [PLANS[f] for f in self.lab.families]
        # The relay listens on the API server's own port, so the `kubernetes` Service's
        # endpoint (advertise address : secure port) is reachable from lab nodes too. The
        # port is the control plane's choice, so a collision is retried on a fresh one.
        # The `kubernetes` Service is of the primary family, and so is its endpoint.
        cp = ControlPlane(self.cp_dir, bin_dir, lab_host_on_api_port=CONTROL_PLANE_IP,
                          advertise_address=plans[0].control_plane,
                          service_cidr=",".join(p.service_cidr for p in plans),
                          bitmap_ip_allocator=bitmap_ip_allocator)
        self.cp = cp
        try:
            cp.start()
        finally:
            # Recorded even if start() failed half-way, so down() stops what did start.
            for name, pid in cp.pids().items():
                self.lab.adopt(pid, name, str(self.cp_dir / "logs" / f"{name}.log"))
        listen = dict.fromkeys([CONTROL_PLANE_IP] + [p.control_plane for p in plans])
        self.lab.spawn("host", [sys.executable, "-m", "kproxy_ebpf.dev.lab.relay",
                                "--netns", self.lab.net_netns,
                                *[a for ip in listen for a in ("--listen", hostport(ip, cp.api_port))],
                                "--to", f"127.0.0.1:{cp.api_port}"], "relay")
        (self.dir / "cluster.json").write_text(json.dumps({
            "proxy": proxy, "agent": agent, "api_port": cp.api_port, "lb_pool": lb_pool,
            "ip_family": choice_of(self.lab.families),
            "admin_kubeconfig": str(cp.admin_kubeconfig),
            "lab_kubeconfig": str(cp.lab_kubeconfig)}))

    def start_lb_allocator(self) -> int:
        """The cloud's part (lab/lballoc.py): a recorded host process on the admin kubeconfig,
        stopped by `lab down` like the control plane."""
        return self.lab.spawn("host", [sys.executable, "-m", "kproxy_ebpf.dev.lab.lballoc",
                                       "--kubeconfig", self.info.admin_kubeconfig,
                                       "--pool", self.info.lb_pool], LB_ALLOCATOR).pid

    def lb_allocator_pid(self) -> int | None:
        for pid, rec in self.lab.status()["procs"].items():
            if rec["name"] == LB_ALLOCATOR and rec["status"] == "running":
                return int(pid)
        return None

    def stop_lb_allocator(self) -> None:
        pid = self.lb_allocator_pid()
        if pid is not None:
            self.lab.kill(pid)

    def _cp(self) -> ControlPlane:
        if self.cp is None:
            raise LabError("controlling the API server needs the process that ran `lab up`")
        return self.cp

    def stop_apiserver(self) -> None:
        """An API outage: kube-apiserver stops, etcd and the proxies stay."""
        old = self._cp().pids()["kube-apiserver"]
        self._cp().stop_apiserver()
        self.lab.kill(old)                      # already stopped: this forgets the record

    def start_apiserver(self) -> float:
        """Starts kube-apiserver again, and a fresh kube-controller-manager with it (whose own
        backoff would otherwise delay EndpointSlices for up to a minute: not what the tests
        measure)."""
        cp = self._cp()
        took = cp.start_apiserver()
        old_kcm = cp.pids()["kube-controller-manager"]
        cp.restart_controller_manager()
        self.lab.kill(old_kcm)                  # already stopped: this forgets the record
        for name in ("kube-apiserver", "kube-controller-manager"):
            self.lab.adopt(cp.pids()[name], name, str(self.cp_dir / "logs" / f"{name}.log"))
        return took

    def restart_apiserver(self) -> float:
        self.stop_apiserver()
        return self.start_apiserver()

    def compact_etcd(self) -> int:
        return self._cp().compact_etcd()

    def agent_metrics(self, node: str) -> str:
        """The Prometheus text a node's agent serves on its metrics port (node loopback)."""
        script = ("import urllib.request\nprint(urllib.request.urlopen("
                  "'http://127.0.0.1:10249/metrics').read().decode())")
        return self.lab.exec(f"node/{node}", [sys.executable, "-c", script], capture_output=True,
                             text=True, check=True).stdout

    def relay_pid(self) -> int | None:
        """The relay that carries lab nodes' API connections (lab/relay.py)."""
        for pid, rec in self.lab.status()["procs"].items():
            if rec["name"] == "relay" and rec["status"] == "running":
                return int(pid)
        return None

    def proxy_pid(self, node: str) -> int | None:
        for pid, rec in self.lab.status()["procs"].items():
            if rec["name"] == self.proxy_name(node) and rec["status"] == "running":
                return int(pid)
        return None

    def down(self) -> list[str]:
        """Removes everything; returns what could not be removed (empty when clean)."""
        self._api = None
        if self.cp is not None:
            # Our own children: stop and reap them here, or their zombies keep the lab's
            # cgroup busy (lab.down() only reaps the processes it spawned itself).
            self.cp.stop()
            self.cp = None
        problems = agent_image.remove_containers(self.lab.name)
        report = self.lab.down()
        return problems + list(report.problems) + agent_image.remove_v1_cgroups(self.lab.name)

    # -- proxies -------------------------------------------------------------------------------
    def proxy_name(self, node: str) -> str:
        return f"proxy-{node}"

    @property
    def program_cache_dir(self) -> str:
        """The lab's agents' compiled-program cache (datapath/progcache.py): in the lab's
        state directory, so `lab down` removes it with the lab."""
        return os.path.join(self.lab.state_dir, "programs")

    def start_proxy(self, node: str, mode: str | None = None,
                    env: dict[str, str] | None = None,
                    extra_args: list[str] | None = None, cwd: str | None = None,
                    name: str | None = None) -> int:
        """env: the proxy's whole environment (the bench points PATH at iptables-legacy);
        extra_args are appended to its command line (the bench's kproxy map sizes); cwd: its
        working directory (`python -m` puts it first on the path: another checkout's agent
        runs from that checkout); name: its process name when not the node's proxy (a second
        proxy beside it, as in a handover; stop it with lab.kill)."""
        mode = mode or self.info.proxy
        if mode == "none":
            return 0
        info = self.lab.node(node)
        if mode == "kproxy" and self.info.agent == "image":
            argv, env = agent_image.start_command(self.image_endpoint, info)
        elif mode == "kproxy":
            argv = [sys.executable, "-m", cli_module(cwd), "run",
                    "--kubeconfig", self.info.lab_kubeconfig, "--hostname-override", node,
                    "--cgroup", info.cgroup, "--bpffs-dir", info.bpffs,
                    "--program-cache", self.program_cache_dir,
                    "--healthz-bind-address", "0.0.0.0:10256",
                    "--metrics-bind-address", "127.0.0.1:10249"]
        else:
            argv = [str(ensure_binaries(build=False) / "kube-proxy"),
                    f"--config={self._kube_proxy_config(node, mode)}"]
        return self.lab.spawn(f"node/{node}", argv + list(extra_args or ()),
                              name or self.proxy_name(node), env=env, cwd=cwd).pid

    def stop_proxy(self, node: str, hard: bool = False) -> None:
        """Stops the node's proxy (SIGTERM, or SIGKILL with hard=True)."""
        pid = self.proxy_pid(node)
        if pid is not None:
            if hard and self.info.agent == "image":
                agent_image.kill(self.lab.name, node)    # the agent, not the podman client
            elif hard:
                os.kill(pid, 9)
            self.lab.kill(pid)

    def _kube_proxy_config(self, node: str, mode: str) -> Path:
        """kube-proxy's KubeProxyConfiguration for a lab node (flags are ignored with --config).
        conntrack sizes 0: a child namespace cannot write nf_conntrack_max."""
        cfg = {
            "apiVersion": "kubeproxy.config.k8s.io/v1alpha1", "kind": "KubeProxyConfiguration",
            "clientConnection": {"kubeconfig": self.info.lab_kubeconfig, "qps": 100, "burst": 200},
            "hostnameOverride": node, "mode": mode,
            "clusterCIDR": ",".join(PLANS[f].pod_supernet for f in self.lab.families),
            "healthzBindAddress": "0.0.0.0:10256", "metricsBindAddress": "127.0.0.1:10249",
            "conntrack": {"maxPerCore": 0, "min": 0, "tcpEstablishedTimeout": "0s",
                          "tcpCloseWaitTimeout": "0s"},
            "iptables": {"localhostNodePorts": False, "minSyncPeriod": "1s", "syncPeriod": "30s"},
            "nftables": {"minSyncPeriod": "1s", "syncPeriod": "30s"},
        }
        path = self.dir / f"kube-proxy-{node}.yaml"
        path.write_text(yaml.safe_dump(cfg))
        return path

    def wait_proxy_healthy(self, node: str, timeout: float = 60) -> None:
        """Polls the proxy's /healthz from inside the node's namespace."""
        if self.info.proxy == "none":
            return
        script = ("import urllib.request,sys\n"
                  "try:\n urllib.request.urlopen('http://127.0.0.1:10256/healthz', timeout=1)\n"
                  "except Exception as e: sys.exit(1)\n")
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.lab.exec(f"node/{node}", [sys.executable, "-c", script],
                             capture_output=True).returncode == 0:
                return
            time.sleep(0.3)
        raise LabError(f"the proxy on {node} is not healthy after {timeout:.0f}s; see "
                       f"{self.lab.log_path(self.proxy_name(node))}")

    # -- pods ----------------------------------------------------------------------------------
    def create_pod(self, name: str, node: str, labels: dict[str, str] | None = None,
                   ports: tuple[tuple[str, int], ...] = (("tcp", 8080), ("udp", 5353)),
                   ready: bool = True,
                   port_names: dict[tuple[str, int], str] | None = None) -> PodInfo:
        """A lab pod with its echo server and its Pod object; container ports are named
        `<proto>-<port>` unless `port_names` names them (for Services' named targetPorts)."""
        pod = self.lab.create_pod(name, node, ports=ports, labels=labels or {})
        names = port_names or {}
        try:
            kubeobjects.create_pod(
                self.api(), NAMESPACE, name, node, list(pod.ips), labels or {},
                [(names.get((proto, port), f"{proto}-{port}"), port, proto.upper())
                 for proto, port in ports],
                ready=ready, host_ip=self.lab.node(node).ip)
        except BaseException:
            self.lab.delete_pod(name)
            raise
        return pod

    def delete_pod(self, name: str) -> None:
        kubeobjects.delete_pod(self.api(), NAMESPACE, name, force=True)
        self.lab.delete_pod(name)
