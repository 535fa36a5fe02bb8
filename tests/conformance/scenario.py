"""One differential scenario against one proxy's lab cluster (fixture `scenario` in conftest.py):
the objects it makes, its probes and the cells it records (verdicts.py). Conventions in
conftest.py."""
from __future__ import annotations

import json
import os
import re
from collections import Counter
from collections.abc import Callable, Sequence
from typing import Any

import yaml
from click.testing import CliRunner
from kubernetes import client

from kproxy_ebpf.cli.main import main as kproxy_cli
from kproxy_ebpf.dev.lab import agent_image, kubeobjects
from kproxy_ebpf.dev.lab.cluster import NAMESPACE, Cluster
from kproxy_ebpf.model.objects import IPFamily, hostport

from ..builders import api_ep, api_service, api_slice
from ..support import wait_until
from . import verdicts

# Probe sources: the client pod on node1, node1's own namespace, the external client.
CLIENT = "pod/client"
HOST = "node/node1"
EXT = "ext"
# Proxy log lines worth showing first when a check fails: klog errors and warnings (E1207,
# W1207), tracebacks, and kube-proxy's words on topology hints.
LOG_NOTABLE = re.compile(r"^[EW]\d{4} |Traceback|Error|hint|topolog", re.IGNORECASE)


class Scenario:
    """One scenario against one proxy: makes pods and Services, probes, records and asserts
    cells; removes what it made afterwards."""

    def __init__(self, cluster: Cluster, name: str):
        self.c = cluster
        self.name = name
        self.proxy = "image" if cluster.info.agent == "image" else cluster.info.proxy
        self.family = cluster.info.ip_family          # ipv4, ipv6 or dual (verdicts.py)
        self.core = client.CoreV1Api(cluster.api())
        self._pods: list[str] = []
        self._services: list[str] = []
        self._slices: list[str] = []
        lab = cluster.lab
        # Source addresses a backend may see, by role: "node" is node1 (the client's node).
        self.roles = {ip: role for role, ips in (
            ("pod", lab.pod("client").ips), ("node", lab.node("node1").ips),
            ("node2", lab.node("node2").ips), ("ext", lab.external().ips)) for ip in ips}
        # Dual-stack lab: a Service's or node's primary (IPv4) address -> its IPv6 one, which
        # every check of the primary one also probes (verdicts.TWIN).
        self.twins: dict[str, str] = {}
        if self.family == "dual":
            for node in lab.nodes():
                self.twins[node.ip] = node.ip_of(IPFamily.IPV6)

    def pick(self, v4: str, v6: str) -> str:
        """The address (or range) of the lab's primary family."""
        return v6 if self.family == "ipv6" else v4

    # -- objects ---------------------------------------------------------------------------------
    def pods(self, app: str, placement: dict[str, str], ports=(("tcp", 8080), ("udp", 5353)),
             port_names: dict[tuple[str, int], str] | None = None) -> None:
        for pod, node in placement.items():
            self.c.create_pod(pod, node, labels={"app": app}, ports=tuple(ports),
                              port_names=port_names)
            self._pods.append(pod)

    def delete_pod(self, pod: str) -> None:
        self.c.delete_pod(pod)
        self._pods.remove(pod)

    def service(self, name: str, app: str | None, ports: Sequence[dict[str, Any]],
                labels: dict[str, str] | None = None, **spec: Any) -> str:
        if self.family == "dual":
            spec.setdefault("ipFamilyPolicy", "RequireDualStack")
        spec = {"selector": {"app": app} if app else None, **spec}
        body = api_service(name, None, typed=True, meta={"labels": labels or {}},
                           ports=list(ports), **spec)
        self._services.append(name)
        created = self.core.create_namespaced_service(NAMESPACE, body).spec
        if self.family == "dual":
            self.twins[created.cluster_ips[0]] = created.cluster_ips[1]
        return created.cluster_ip

    def endpoint_slice(self, service: str, pods: Sequence[str], port: int,
                       labels: dict[str, str] | None = None) -> None:
        """A hand-made EndpointSlice (as a custom controller writes them) for a selector-less
        Service, one per family of the lab; removed with the Service (no garbage collector
        runs in the lab)."""
        for family in self.c.lab.families:
            lab = self.c.lab
            body = api_slice(f"{service}-manual-{family.lower()}", service, None, typed=True,
                             labels={"endpointslice.kubernetes.io/managed-by": "kproxy-conformance",
                                     **(labels or {})},
                             address_type=str(family),
                             ports=[{"name": "http", "port": port, "protocol": "TCP"}],
                             endpoints=[api_ep(lab.pod(p).ip_of(family), lab.pod(p).node,
                                               {"ready": True}) for p in pods])
            client.DiscoveryV1Api(self.c.api()).create_namespaced_endpoint_slice(NAMESPACE,
                                                                                 body)
            self._slices.append(body["metadata"]["name"])

    def delete_service(self, name: str) -> None:
        self.core.delete_namespaced_service(name, NAMESPACE)
        self._services.remove(name)

    def terminating(self, pod: str) -> None:
        """As a kubelet starts a graceful deletion: deletionTimestamp set, still Ready (so the
        endpoint is serving and terminating, not ready)."""
        kubeobjects.mark_pod_terminating(self.c.api(), NAMESPACE, pod)

    def ready(self, pod: str, ready: bool) -> None:
        kubeobjects.set_pod_ready(self.c.api(), NAMESPACE, pod, ready)

    def wait_endpoints(self, service: str, count: int, **kw: Any) -> None:
        """Until the Service's slices hold `count` endpoints per family of the lab."""
        kubeobjects.wait_for_slice_endpoints(self.c.api(), NAMESPACE, service,
                                             count * len(self.c.lab.families), timeout=30, **kw)

    def cleanup(self) -> None:
        for name in list(self._services):
            self.delete_service(name)
        for name in self._slices:
            client.DiscoveryV1Api(self.c.api()).delete_namespaced_endpoint_slice(name, NAMESPACE)
        for pod in self._pods:
            self.c.delete_pod(pod)

    # -- probes ----------------------------------------------------------------------------------
    def probe(self, src: str, ip: str, port: int, udp: bool = False, count: int = 20,
              timeout: float = 1.0, **kw: Any) -> list[str]:
        return self.c.lab.probe(src, ip, port, udp=udp, count=count, timeout=timeout, **kw)

    def check(self, check: str, src: str, ip: str, port: int, want: str | dict[str, str],
              udp: bool = False, count: int = 20, converge: float = 30,
              reduce: Callable[[list[str], dict[str, str]], str] = verdicts.cell,
              sport: int = 0) -> str:
        """Probes until the cell equals what this proxy must give (the proxies program
        asynchronously: kube-proxy's minSyncPeriod is 1 s), records the cell, asserts it.
        `sport`: UDP from that fixed source port (one conntrack flow for every attempt). In
        the dual-stack lab the check runs again against `ip`'s IPv6 twin, if it has one."""
        cell = self._check(check, src, ip, port, want, udp, count, converge, reduce, sport)
        if ip in self.twins:
            self._check(check + verdicts.TWIN, src, self.twins[ip], port, want, udp, count,
                        converge, reduce, sport)
        return cell

    def _check(self, check: str, src: str, ip: str, port: int, want: str | dict[str, str],
               udp: bool, count: int, converge: float,
               reduce: Callable[[list[str], dict[str, str]], str], sport: int) -> str:
        target = verdicts.expected(self.name, check, self.proxy, want)
        # Where only failures are expected, wait past TCP's first SYN retransmission (1 s): on
        # these sub-millisecond paths an ICMP error can come back while connect() still holds
        # the socket lock, and the kernel then keeps it as a soft error until the next try.
        timeout = 1.0 if any(" from " in t for t in target) else 1.5
        return self._converge(check, target, converge, lambda: reduce(
            self.probe(src, ip, port, udp=udp, count=count, timeout=timeout, sport=sport),
            self.roles), dest=ip)

    def check_tcp_udp(self, check: str, src: str, ip: str, ports: tuple[int, int],
                      want: str | dict[str, str], **kw: Any) -> None:
        """check() over TCP to ports[0], then over UDP to ports[1]: cells "tcp <check>" and
        "udp <check>"."""
        self.check(f"tcp {check}", src, ip, ports[0], want, **kw)
        self.check(f"udp {check}", src, ip, ports[1], want, udp=True, **kw)

    def health(self, check: str, node: str, port: int, want: str | dict[str, str],
               converge: float = 30) -> str:
        """GET http://<node>:<healthCheckNodePort>/ from the external client (as a cloud load
        balancer probes it) until the cell (status code and every field of the JSON body)
        equals what this proxy must give; records and asserts it."""
        target = verdicts.expected(self.name, check, self.proxy, want)
        url = f"http://{hostport(self.c.lab.node(node).ip, port)}/"
        return self._converge(check, target, converge, lambda: verdicts.http_cell(
            self.c.lab.exec(EXT, [self.c.lab.python, "-I", "-S", "-c", HTTP_GET, url],
                            capture_output=True, text=True, timeout=30).stdout))

    def _converge(self, check: str, target: set[str], converge: float,
                  measure: Callable[[], str], dest: str | None = None) -> str:
        seen: list[str] = []

        def matches() -> bool:
            seen.append(measure())
            return seen[-1] in target

        try:
            wait_until(matches, converge, f"{check}: {sorted(target)}", step=0.1)
        except AssertionError:
            tally = ", ".join(f"{v!r} x{n}" for v, n in Counter(seen).most_common())
            raise AssertionError(f"{self.proxy}: {self.name} / {check}: wanted {sorted(target)}, "
                                 f"still {seen[-1]!r} after {converge}s (seen: {tally})\n"
                                 f"{self.diagnostics(dest=dest)}") from None
        finally:
            if seen:
                verdicts.record(self.name, check, self.proxy, seen[-1], self.family)
        return seen[-1]

    def diagnostics(self, node: str = "node1", limit: int = 3000,
                    dest: str | None = None) -> str:
        """What a failed check leaves for whoever reads the CI log (the run's lab is gone by
        then): node1's routes and conntrack table, the proxy's rules (kube-proxy) or
        `kproxy-ebpf status` (ours), and the tail of the proxy's log. With `dest` (the checked
        address) also node1's conntrack entries for it and, under kube-proxy nftables, its
        address maps on their own (the same limit each): the tails above cut them off when
        the tables are long."""
        lab = self.c.lab

        def run(argv: list[str], target: str = f"node/{node}") -> str:
            try:
                r = lab.exec(target, argv, capture_output=True, text=True, timeout=30)
                return (r.stdout + r.stderr)[-limit:]
            except Exception as exc:  # noqa: BLE001 - a diagnostic must not hide the failure itself
                return f"({' '.join(argv)}: {exc})"

        table = "ip6" if self.family == "ipv6" else "ip"
        rules = {"nftables": ["nft", "list", "table", table, "kube-proxy"],
                 "iptables": ["iptables-save", "-t", "nat"]}.get(
            self.proxy, [lab.python, "-m", "kproxy_ebpf.cli.main", "status",
                         "--bpffs-dir", lab.node(node).bpffs])
        try:
            log = open(lab.log_path(self.c.proxy_name(node))).read()[-limit:]
        except OSError as exc:
            log = f"({exc})"
        # What explains most failures first: CI keeps only the start of a long failure.
        parts = {"endpoint slices": self._slices_summary(),
                 f"{node} proxy log, errors and topology": "\n".join(
                     line for line in log.splitlines() if LOG_NOTABLE.search(line))[-limit:],
                 "ext routes": run(["ip", "route"], "ext"), f"{node} routes": run(["ip", "route"]),
                 f"{node} conntrack": run(["conntrack", "-L"]), f"{node} rules": run(rules),
                 f"{node} proxy log": log}
        if dest:
            parts[f"{node} conntrack to {dest}"] = run(["conntrack", "-L", "-d", dest])
            if self.proxy == "nftables":
                for m in ("service-ips", "no-endpoint-services", "firewall-ips"):
                    parts[f"{node} map {m}"] = run(["nft", "list", "map", table, "kube-proxy", m])
        return "\n".join(f"--- {k}\n{v.rstrip()}" for k, v in parts.items())

    def _slices_summary(self) -> str:
        """Each EndpointSlice of the namespace on one line per endpoint: the addresses, the
        conditions, node, zone and hints a proxy chose from."""
        try:
            slices = client.DiscoveryV1Api(self.c.api()).list_namespaced_endpoint_slice(
                NAMESPACE).items
            nodes = {n.metadata.name: (n.metadata.labels or {}).get(kubeobjects.ZONE_LABEL)
                     for n in self.core.list_node().items}
        except Exception as exc:  # noqa: BLE001 - a diagnostic must not hide the failure itself
            return f"({exc})"
        lines = [f"node zones: {nodes}"]
        for s in slices:
            svc = (s.metadata.labels or {}).get("kubernetes.io/service-name")
            for ep in s.endpoints or []:
                c = ep.conditions
                hints = ep.hints and ([z.name for z in ep.hints.for_zones or []],
                                      [n.name for n in ep.hints.for_nodes or []])
                lines.append(f"{svc} {s.metadata.name}: {ep.addresses} ready={c.ready} "
                             f"serving={c.serving} terminating={c.terminating} "
                             f"node={ep.node_name} zone={ep.zone} hints={hints}")
        return "\n".join(lines)

    def note(self, check: str, value: str) -> None:
        """Record a cell that the scenario asserts itself."""
        verdicts.record(self.name, check, self.proxy, value, self.family)

    # -- north-south -----------------------------------------------------------------------------
    def node_ip(self, node: str) -> str:
        return self.c.lab.node(node).ip

    def route_from_outside(self, cidr: str, node: str = "node1") -> None:
        """The external client reaches `cidr` (ExternalIPs, LoadBalancer IPs) through `node`,
        as a cloud router would; the route stays for the cluster's life (idempotent)."""
        self.c.lab.add_external_route(cidr, node)

    def set_load_balancer_ip(self, service: str, ip: str) -> None:
        """Plays the cloud's LoadBalancer controller: writes status.loadBalancer.ingress."""
        self.core.patch_namespaced_service_status(
            service, NAMESPACE, {"status": {"loadBalancer": {"ingress": [{"ip": ip}]}}})

    @property
    def ours(self) -> bool:
        return self.proxy in verdicts.OURS

    def kproxy_flows(self, node: str, service: str) -> list[dict]:
        """kproxy only: the TC conntrack rows of `service` on `node`, through the operator's
        `kproxy-ebpf ct list`."""
        bpffs = self.c.lab.node(node).bpffs
        if self.proxy == "image":   # the node's bpffs is the pod's /sys/fs/bpf: the chart's subdir
            values = yaml.safe_load((agent_image.CHART / "values.yaml").read_text())
            bpffs = os.path.join(bpffs, values["bpffsSubdir"])
        out = CliRunner().invoke(kproxy_cli, ["ct", "list", "--bpffs-dir", bpffs,
                                        "-o", "json", "--service", f"{NAMESPACE}/{service}"])
        assert out.exit_code == 0, out.output
        return json.loads(out.output)


# An HTTP GET printing "<status> <JSON body>" (an error status is an answer too, as for a load
# balancer's probe); any failure prints the probe-style verdict instead.
HTTP_GET = """\
import json, socket, sys, urllib.error, urllib.request
try:
    r = urllib.request.urlopen(sys.argv[1], timeout=2)
except urllib.error.HTTPError as e:
    r = e
except (OSError, urllib.error.URLError) as e:
    e = getattr(e, "reason", e)
    print("TIMEOUT" if isinstance(e, socket.timeout) else
          "REFUSED" if isinstance(e, ConnectionRefusedError) else f"ERROR {e}")
    sys.exit(0)
print(r.status, json.dumps(json.loads(r.read() or b"{}")))
"""
