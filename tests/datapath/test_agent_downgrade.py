"""A rollback to the previous release under traffic from outside the node: a LoadBalancer
Service with loadBalancerSourceRanges, served per packet at TC on node1 (backends a1 on node1,
b1 on node2, so both the plain DNAT and the SNAT flows), this checkout's agent stopped by
SIGTERM and the agent of the previous release (conftest.UPGRADE_FROM) started while the
external client opens new connections and keeps one open. That release reads kp_srcrange_v2
and attaches its programs before its first sync: it must find the ranges written at the stop
(datapath/downgrade.py), or it drops every new flow until that sync. Tracked flows (kp_ct and
kp_rnat, the same layout in both) keep their translation."""
from __future__ import annotations

import contextlib
import threading
from pathlib import Path

import pytest

from kproxy_ebpf.datapath.load.bpffs import remove_pins
from kproxy_ebpf.dev.lab import LabError
from kproxy_ebpf.dev.lab.addressing import PLANS
from kproxy_ebpf.model.objects import IPFamily

from ..support import fresh_lab, wait_until
from .agent_proc import log_of, start_agent
from .dplab import pod_of

pytestmark = pytest.mark.root

LAB = "dgns"
PODS = {"a1": "node1", "b1": "node2"}
LB_NET, LB_IP = "10.250.100.0/24", "10.250.100.5"
CLIENT = PLANS[IPFamily.IPV4].external
FILLERS = 3000


@pytest.fixture(scope="module")
def lab():
    with fresh_lab(LAB, nodes=2, external=True) as lab:
        for pod, node in PODS.items():
            lab.create_pod(pod, node, ports=(("tcp", 8080),))
        lab.add_external_route(LB_NET, "node1")
        yield lab


def lb_manifest(lab) -> str:
    eps = "".join(f"- {{addresses: [{lab.pod(p).ip}], conditions: {{ready: true}}, "
                  f"nodeName: {node}}}\n" for p, node in PODS.items())
    return f"""---
apiVersion: v1
kind: Service
metadata: {{name: lb, namespace: default}}
spec:
  type: LoadBalancer
  clusterIP: 10.96.0.90
  ports: [{{name: http, port: 80, targetPort: 8080, nodePort: 30090}}]
  loadBalancerSourceRanges: [{CLIENT}/32]
status:
  loadBalancer: {{ingress: [{{ip: {LB_IP}}}]}}
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {{name: lb-1, namespace: default, labels: {{kubernetes.io/service-name: lb}}}}
addressType: IPv4
ports: [{{name: http, port: 8080, protocol: TCP}}]
endpoints:
{eps}"""


def fillers(count: int) -> str:
    """ClusterIP Services without endpoints: a node's other Services, whose first sync keeps
    the previous release between its attach and the source ranges' rows for a while (as a
    LIST of a real cluster's objects would)."""
    return "".join(f"""---
apiVersion: v1
kind: Service
metadata: {{name: filler-{i}, namespace: default}}
spec:
  clusterIP: 10.96.{100 + i // 250}.{i % 250 + 1}
  ports: [{{name: http, port: 80, targetPort: 8080}}]
""" for i in range(count))


def answered(lines: list[str]) -> bool:
    return bool(lines) and all(pod_of(x) in PODS for x in lines)


def test_a_rollback_keeps_the_source_ranges_and_the_tracked_flows(lab, tmp_path, old_tree):
    manifest = tmp_path / "lb.yaml"
    manifest.write_text(lb_manifest(lab) + fillers(FILLERS))
    bpffs = Path(lab.node("node1").bpffs)
    agents, loops, results = [], [], {}
    try:
        agents.append(start_agent(lab, manifest, "agent-new"))
        wait_until(lambda: answered(lab.probe("ext", LB_IP, 80, timeout=0.5)), 30,
                   "the LB address to answer the external client")
        # ~20 s of clients: past the old agent's compile, attach and first sync. A SYN dropped
        # is sent again after 1 s: the 0.5 s timeout counts it as the failure it is. Without
        # the copy the window from that attach to the rows is ~120 ms here (3,000 fillers),
        # ten of the new loop's attempts: its first one there fails.
        loops = [
            threading.Thread(target=lambda: results.__setitem__("new", lab.probe(
                "ext", LB_IP, 80, count=1500, interval=0.01, timeout=0.5))),
            threading.Thread(target=lambda: results.__setitem__("held", lab.probe(
                "ext", LB_IP, 80, count=800, interval=0.02, keep=True,
                timeout=0.5))),
        ]
        for t in loops:
            t.start()
        assert lab.kill(agents[0].pid, grace=10) == "killed"
        assert "wrote kp_srcrange_v2 (" in log_of(lab, "agent-new"), log_of(lab, "agent-new")
        agents.append(start_agent(lab, manifest, "agent-old", tree=old_tree))
        wait_until(lambda: "first sync:" in log_of(lab, "agent-old"), 60,
                   "the previous release's first sync")
        assert all(t.is_alive() for t in loops), "the clients ended before the rollback did"
        # It attached before that sync (it adopted the Service rows).
        log = log_of(lab, "agent-old")
        assert log.index("attached kp_from_outside") < log.index("first sync:"), log
        for t in loops:
            t.join()
        for name, lines in results.items():
            failed = [(i, x) for i, x in enumerate(lines) if pod_of(x) not in PODS]
            assert not failed, f"{name}: {len(failed)} failed, e.g. {failed[:3]}"
        assert {pod_of(x) for x in results["new"]} == set(PODS)
    finally:
        for t in loops:
            if t.is_alive():
                t.join(120)
        for rec in agents:
            with contextlib.suppress(LabError):      # the test stopped it already
                lab.kill(rec.pid)
        remove_pins(bpffs)
