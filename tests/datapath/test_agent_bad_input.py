"""Bad input and a full map, through the agent process (fed from manifests): each gets a log
line and a metric, the agent keeps running, and what was already programmed keeps working; a
frontend that did not fit is reported (metric, Event, `status`) and programmed by itself once
room returns."""
from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from kproxy_ebpf.datapath.load.bpffs import open_pinned_maps, remove_pins
from kproxy_ebpf.datapath.maps import layout as L
from kproxy_ebpf.datapath.maps import reader

from ..support import wait_until
from .agent_proc import log_of, metrics, sample, service_manifest
from .dplab import pod_of

pytestmark = pytest.mark.root

def good(lab) -> str:
    """Service ok (10.96.0.90) with endpoint a1."""
    return service_manifest("ok", "10.96.0.90", [(lab.pod("a1").ip, "node1")])


BAD = """
---
apiVersion: v1
kind: Service
metadata: {name: bad-port, namespace: default}
spec:
  clusterIP: 10.96.0.91
  ports: [{name: zero, port: 0}, {name: http, port: 80, targetPort: 8080}, {name: x, port: abc}]
---
apiVersion: v1
kind: Service
metadata: {name: v6-only, namespace: default}
spec: {clusterIP: "fd00::10", clusterIPs: ["fd00::10"], ports: [{port: 80}]}
---
apiVersion: v1
kind: Service
metadata: {name: v6-mismatch, namespace: default}
spec: {clusterIP: "fd00::11", clusterIPs: ["fd00::11"], ipFamilies: [IPv4], ports: [{port: 80}]}
---
apiVersion: v1
kind: Service
metadata: {name: mapped, namespace: default}
spec: {clusterIP: "::ffff:10.96.0.94", ports: [{port: 80}]}
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: ok-v6, namespace: default, labels: {kubernetes.io/service-name: ok}}
addressType: IPv6
ports: [{name: http, port: 8080, protocol: TCP}]
endpoints: [{addresses: ["fd00::1"], conditions: {ready: true}}]
---
apiVersion: v1
kind: Service
metadata: {name: garbage, namespace: default}
spec: "not a mapping"
---
apiVersion: v1
kind: Service
metadata: {name: bad-proto, namespace: default}
spec: {clusterIP: 10.96.0.92, ports: [{port: 80, protocol: FOO}]}
"""

# 1 + 12 service rows: more than the map holds.
BIG = service_manifest("big", "10.96.0.93", [(f"10.244.9.{i}", None) for i in range(1, 13)])


def service_rows(node) -> list[dict]:
    maps = open_pinned_maps(Path(node.bpffs))
    try:
        return reader.services(maps)
    finally:
        for mp in maps.values():
            mp.close()


def services_in(node) -> set[str]:
    return {s["service"] for s in service_rows(node)}


def status_text(lab, node) -> str:
    return lab.exec("node1", [sys.executable, "-m", "kproxy_ebpf.cli.main", "status", "--bpffs-dir",
                              node.bpffs], capture_output=True, text=True, check=True).stdout


def test_bad_input_and_a_full_map_are_reported_and_harm_nothing(lab, tmp_path):
    node = lab.node("node1")
    manifest = tmp_path / "svc.yaml"
    manifest.write_text(good(lab) + BAD)
    config = tmp_path / "agent.yaml"
    # 16 service rows: "ok" (2 rows), "bad-port" (2), "v6-only" (1) and "v6-mismatch" (1)
    # fit, "big" (1 + 12 slots) only once the bad ones are gone.
    config.write_text("mapSizes: {svc: 16}\nmetricsBindAddress: 127.0.0.1:10249\n"
                      "healthzBindAddress: 127.0.0.1:10256\nminSyncPeriod: 50ms\n")
    argv = [sys.executable, "-m", "kproxy_ebpf.cli.main", "run", "--config", str(config),
            "--manifests", str(manifest), "--cgroup", node.cgroup, "--bpffs-dir", node.bpffs,
            "--hostname-override", "node1",
            "--program-cache", os.path.join(lab.state_dir, "programs")]
    agent = lab.spawn("node1", argv, "agent-bad")
    try:
        wait_until(lambda: "first sync:" in log_of(lab, "agent-bad"), 30, "the first sync")
        log = log_of(lab, "agent-bad")
        for needle in ("bad-port", "InvalidPort", "v6-mismatch", "IPFamilyMismatch", "garbage",
                       "InvalidProtocol", "mapped", "SliceFamilyNotServed"):
            assert needle in log, f"no log line about {needle}"
        m = metrics(lab)
        assert sample(m, 'kproxy_rejected_objects_total{kind="Service",reason="InvalidPort"}') >= 2
        # An IPv6 slice for the IPv4-only "ok" is unused, and said so; "ok" itself is served.
        assert sample(m, 'kproxy_service_problems{reason="SliceFamilyNotServed"}') >= 1
        assert {pod_of(x) for x in lab.probe("client", "10.96.0.90", 80, count=10)} == {"a1"}
        # The good port of a service with a bad one still works (here: no endpoints, so refused).
        assert lab.probe("client", "10.96.0.91", 80) == ["REFUSED"]

        manifest.write_text(good(lab) + BAD + BIG)   # the map overflows
        svc_map = L.MAPS["svc"].name
        wait_until(lambda: f"BPF map {svc_map} is full" in log_of(lab, "agent-bad"), 15,
                   "a map-full log line")
        assert sample(metrics(lab), f'kproxy_bpf_map_full_total{{map="{svc_map}"}}') >= 1
        assert agent.pid in [int(p) for p, r in lab.status()["procs"].items()
                             if r["status"] == "running"], "the agent survived"
        assert {pod_of(x) for x in lab.probe("client", "10.96.0.90", 80, count=10)} == {"a1"}, \
            "what was programmed still works"
        rows = service_rows(node)
        shown, addresses = {s["service"] for s in rows}, {s["address"] for s in rows}
        assert "default/big:http" not in shown, "a half-written frontend is never visible"
        assert "fd00::10" in addresses, "an IPv6-only Service is served (no endpoints: refused)"
        # ipFamilies that disagree with clusterIPs are reported (above), and the clusterIPs
        # are what counts, as for kube-proxy, which reads only those.
        assert "fd00::11" in addresses

        assert sample(metrics(lab), "kproxy_frontends_unprogrammed") == 1
        shown = status_text(lab, node)
        assert f"1 frontends are not programmed: map(s) {svc_map} full" in shown, shown

        manifest.write_text(good(lab) + BIG)  # room returns: "big" is programmed by itself
        wait_until(lambda: "default/big:http" in services_in(node), 20,
                   "the frontend that did not fit to be programmed once room returned")
        assert sample(metrics(lab), "kproxy_frontends_unprogrammed") == 0
        assert "not programmed" not in status_text(lab, node)

        manifest.write_text(good(lab))        # the operator fixes it
        def cleaned():
            mp = open_pinned_maps(Path(node.bpffs))
            try:
                return len(mp["svc"]) == 2
            finally:
                for x in mp.values():
                    x.close()
        wait_until(cleaned, 15, "the leftovers of the failed write to be collected")
    finally:
        lab.kill(agent.pid)
        remove_pins(Path(node.bpffs))
