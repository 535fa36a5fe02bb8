"""The chart against the real kube-apiserver (RBAC authorization, as in the lab): server-side
dry-run of the rendered manifests, then a real `helm install`, `helm upgrade` with changed
values and `helm uninstall`; and the agent's ServiceAccount, bound by the chart's RBAC, can
read what it watches and post Events but cannot write Services or EndpointSlices.

There is no kubelet and no DaemonSet controller: the DaemonSet's pods never run here, so the
objects themselves are checked (the pods run in the lab: tests/conformance and test_proxy_modes.py, image column)."""
from __future__ import annotations

import subprocess

import pytest
import yaml
from kubernetes import client
from kubernetes.client.rest import ApiException

from kproxy_ebpf.dev.lab import agent_image
from kproxy_ebpf.dev.lab.binaries import ensure_binaries

pytestmark = [pytest.mark.root, pytest.mark.controlplane]

RELEASE = "kproxy-ebpf"
NS = "kube-system"


@pytest.fixture(scope="module")
def tools(controlplane):
    bins = ensure_binaries(build=False, names=("helm", "kubectl"))
    return str(bins / "helm"), str(bins / "kubectl"), str(controlplane.admin_kubeconfig)


def run(argv, stdin=None):
    r = subprocess.run(argv, input=stdin, capture_output=True, text=True)
    assert r.returncode == 0, f"{argv[:3]}: {r.stdout}{r.stderr}"
    return r.stdout


def helm(tools, *args):
    h, _, kubeconfig = tools
    return run([h, "--kubeconfig", kubeconfig, "--namespace", NS, *args])


def test_server_side_dry_run_accepts_every_rendered_object(tools):
    _, kubectl, kubeconfig = tools
    objects = agent_image.helm_template({"apiServer": {"host": "10.250.0.1", "port": 6443}})
    out = run([kubectl, "--kubeconfig", kubeconfig, "apply", "--dry-run=server",
               "--server-side", "-f", "-"], yaml.safe_dump_all(objects))
    kinds = sorted(line.split("/")[0] for line in out.splitlines())
    assert len(kinds) == len(objects), out
    for kind in ("configmap", "daemonset.apps", "serviceaccount", "service",
                 "clusterrole.rbac.authorization.k8s.io",
                 "clusterrolebinding.rbac.authorization.k8s.io", "pod"):
        assert kind in kinds, out          # pod: the helm test hook


def test_install_upgrade_uninstall(tools, apiserver):
    api, _ = apiserver
    core, apps = client.CoreV1Api(api), client.AppsV1Api(api)
    name = RELEASE
    try:
        helm(tools, "install", RELEASE, str(agent_image.CHART), "--wait=false",
             "--set", "apiServer.host=10.250.0.1")
        ds = apps.read_namespaced_daemon_set(name, NS)
        cm = core.read_namespaced_config_map(name, NS)
        assert 'logLevel: "info"' in cm.data["config.yaml"]
        first_checksum = ds.spec.template.metadata.annotations["checksum/config"]
        assert core.read_namespaced_service(f"{name}-metrics", NS).spec.cluster_ip == "None"

        helm(tools, "upgrade", RELEASE, str(agent_image.CHART), "--reuse-values",
             "--set", "config.logLevel=debug", "--set", "image.tag=0.1.1",
             "--set", "metricsService.enabled=false")
        ds = apps.read_namespaced_daemon_set(name, NS)
        assert 'logLevel: "debug"' in core.read_namespaced_config_map(name, NS).data["config.yaml"]
        assert ds.spec.template.metadata.annotations["checksum/config"] != first_checksum
        assert ds.spec.template.spec.containers[0].image.endswith(":0.1.1")
        with pytest.raises(ApiException) as gone:          # disabled in the upgrade: removed
            core.read_namespaced_service(f"{name}-metrics", NS)
        assert gone.value.status == 404
        assert "REVISION: 2" in helm(tools, "status", RELEASE)
    finally:
        helm(tools, "uninstall", RELEASE, "--wait")
    for read in (lambda: apps.read_namespaced_daemon_set(name, NS),
                 lambda: core.read_namespaced_config_map(name, NS),
                 lambda: core.read_namespaced_service_account(name, NS),
                 lambda: client.RbacAuthorizationV1Api(api).read_cluster_role(name)):
        with pytest.raises(ApiException) as exc:
            read()
        assert exc.value.status == 404


def test_service_account_reads_and_reports_but_cannot_write_services(tools, apiserver,
                                                                       controlplane):
    api, _ = apiserver
    helm(tools, "install", "kp-rbac", str(agent_image.CHART), "--wait=false")
    try:
        token = agent_image.service_account_token(api, NS, "kp-rbac-kproxy-ebpf", 600)
        cfg = client.Configuration()
        cfg.host = controlplane.api_url
        cfg.ssl_ca_cert = str(controlplane.pki.ca_cert)
        cfg.api_key = {"authorization": f"Bearer {token}"}
        agent = client.ApiClient(cfg)
        core, disc = client.CoreV1Api(agent), client.DiscoveryV1Api(agent)
        # What the agent needs works with this token...
        core.list_service_for_all_namespaces(limit=1)
        core.list_node(limit=1)
        disc.list_endpoint_slice_for_all_namespaces(limit=1)
        core.create_namespaced_event("default", {
            "metadata": {"generateName": "kproxy-rbac-"},
            "involvedObject": {"kind": "Service", "namespace": "default", "name": "kubernetes"},
            "reason": "Test", "message": "rbac test", "type": "Normal"})
        # its own DaemonSet, by name only (uninstall or restart, at exit: kube/owner.py)
        apps = client.AppsV1Api(agent)
        apps.read_namespaced_daemon_set("kp-rbac-kproxy-ebpf", NS)
        own = apps.list_namespaced_daemon_set(NS, field_selector="metadata.name=kp-rbac-kproxy-ebpf")
        assert [d.metadata.name for d in own.items] == ["kp-rbac-kproxy-ebpf"]
        for other in (lambda: apps.list_namespaced_daemon_set(NS),
                      lambda: apps.read_namespaced_daemon_set("kube-proxy", NS)):
            with pytest.raises(ApiException) as exc:
                other()
            assert exc.value.status == 403, exc.value
        # ...writing Services or EndpointSlices does not.
        svc = {"metadata": {"name": "kproxy-rbac-denied"},
               "spec": {"ports": [{"port": 80}]}}
        slice_ = {"metadata": {"name": "kproxy-rbac-denied"}, "addressType": "IPv4",
                  "endpoints": [], "ports": []}
        for write in (lambda: core.create_namespaced_service("default", svc),
                      lambda: core.patch_namespaced_service("kubernetes", "default",
                                                            {"metadata": {"labels": {"x": "y"}}}),
                      lambda: core.delete_namespaced_service("kubernetes", "default"),
                      lambda: disc.create_namespaced_endpoint_slice("default", slice_),
                      lambda: disc.delete_collection_namespaced_endpoint_slice("default")):
            with pytest.raises(ApiException) as exc:
                write()
            assert exc.value.status == 403, exc.value
    finally:
        helm(tools, "uninstall", "kp-rbac", "--wait")
    # Uninstalled, the agent's RBAC (and ServiceAccount) went with the DaemonSet: an agent
    # still stopping cannot ask whether its DaemonSet is gone, which is why it watches it
    # while it runs.
    with pytest.raises(ApiException) as exc:
        client.AppsV1Api(agent).read_namespaced_daemon_set("kp-rbac-kproxy-ebpf", NS)
    assert exc.value.status in (401, 403), exc.value
    agent.close()
