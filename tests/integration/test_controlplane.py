"""The lab control plane behaves like a real cluster's for everything kproxy depends on.

Real etcd, kube-apiserver and the real EndpointSlice controller; Nodes and Pods are written by
kproxy_ebpf.dev.lab.kubeobjects in place of a kubelet. No traffic is sent anywhere: all addresses
below are only data in API objects.
"""

from __future__ import annotations

import shutil
import socket
import time
from collections.abc import Iterator

import pytest
from kubernetes import client, config, watch
from kubernetes.client.exceptions import ApiException

from kproxy_ebpf.dev.lab import kubeobjects as ko
from kproxy_ebpf.dev.lab.binaries import read_versions
from kproxy_ebpf.dev.lab.controlplane import RELAY_ADDRESS, WATCHED_RESOURCES, ControlPlane

from ..builders import api_service
from ..support import wait_until

pytestmark = pytest.mark.controlplane

NODE = "kproxy-cp-test-node"
NODE_IP = "10.250.0.11"
ZONE = "kproxy-zone-a"


@pytest.fixture(scope="module")
def node(apiserver) -> Iterator[str]:
    api, _ = apiserver
    ko.create_node(api, NODE, NODE_IP, zone=ZONE, pod_cidrs=["10.244.11.0/24"])
    yield NODE
    client.CoreV1Api(api).delete_node(NODE)


@pytest.fixture
def namespace(apiserver, request) -> Iterator[str]:
    api, _ = apiserver
    name = "kproxy-" + request.node.name.replace("_", "-")[:50].strip("-")
    ko.ensure_namespace(api, name)
    yield name
    core = client.CoreV1Api(api)
    # No namespace controller runs, so remove the contents ourselves (force: pods may be terminating).
    for pod in core.list_namespaced_pod(name).items:
        ko.delete_pod(api, name, pod.metadata.name, force=True)
    for svc in core.list_namespaced_service(name).items:
        core.delete_namespaced_service(svc.metadata.name, name)


def make_service(api: client.ApiClient, namespace: str, name: str, selector: dict[str, str]) -> client.V1Service:
    return client.CoreV1Api(api).create_namespaced_service(namespace, api_service(
        name, None, selector=selector,
        ports=[{"name": "http", "port": 80, "targetPort": "http", "protocol": "TCP"}]))


def endpoints_by_ip(slices: list[client.V1EndpointSlice]) -> dict[str, client.V1Endpoint]:
    return {ep.addresses[0]: ep for ep in ko.slice_endpoints(slices)}


def test_version_is_pinned_release(apiserver):
    api, _ = apiserver
    assert client.VersionApi(api).get_code().git_version == read_versions()["K8S_VERSION"]


def test_kubernetes_service_advertises_relay_address(apiserver, controlplane):
    api, _ = apiserver
    svc = client.CoreV1Api(api).read_namespaced_service("kubernetes", "default")
    assert svc.spec.cluster_ip == "10.96.0.1"
    # The apiserver's own reconciler (not KCM) writes this slice, with the advertise address.
    slices = ko.wait_for_slice_endpoints(api, "default", "kubernetes", 1, timeout=10)
    (ep,) = ko.slice_endpoints(slices)
    assert ep.addresses == [RELAY_ADDRESS]
    assert [p.port for p in slices[0].ports] == [controlplane.api_port]


def test_endpointslice_controller_lists_ready_pods(apiserver, node, namespace):
    api, _ = apiserver
    make_service(api, namespace, "echo", {"app": "echo"})
    t0 = time.monotonic()
    ko.create_pod(api, namespace, "echo-1", node, "10.244.11.2", {"app": "echo"}, [("http", 8080)])
    ko.create_pod(api, namespace, "echo-2", node, "10.244.11.3", {"app": "echo"}, [("http", 8080)])
    slices = ko.wait_for_slice_endpoints(api, namespace, "echo", 2, timeout=5, ready=True)
    print(f"slice with 2 ready endpoints after {time.monotonic() - t0:.2f}s")
    eps = endpoints_by_ip(slices)
    assert set(eps) == {"10.244.11.2", "10.244.11.3"}
    for ep in eps.values():
        assert ep.node_name == node
        assert ep.zone == ZONE
        assert ep.conditions.ready and ep.conditions.serving and not ep.conditions.terminating
    assert [(p.name, p.port, p.protocol) for p in slices[0].ports] == [("http", 8080, "TCP")]


def test_unready_pod_is_not_ready_in_slice(apiserver, node, namespace):
    api, _ = apiserver
    make_service(api, namespace, "echo", {"app": "echo"})
    ko.create_pod(api, namespace, "echo-1", node, "10.244.11.4", {"app": "echo"}, [("http", 8080)])
    ko.create_pod(api, namespace, "echo-2", node, "10.244.11.5", {"app": "echo"}, [("http", 8080)])
    ko.wait_for_slice_endpoints(api, namespace, "echo", 2, timeout=5, ready=True)

    ko.set_pod_ready(api, namespace, "echo-1", False)
    slices = ko.wait_for_slice_endpoints(api, namespace, "echo", 1, timeout=5, ready=True)
    eps = endpoints_by_ip(slices)
    assert set(eps) == {"10.244.11.4", "10.244.11.5"}
    unready = eps["10.244.11.4"].conditions
    assert unready.ready is False and unready.serving is False and not unready.terminating

    ko.set_pod_ready(api, namespace, "echo-1", True)
    ko.wait_for_slice_endpoints(api, namespace, "echo", 2, timeout=5, ready=True)


def test_terminating_pod_is_terminating_and_serving_per_ready_condition(apiserver, node, namespace):
    api, _ = apiserver
    make_service(api, namespace, "echo", {"app": "echo"})
    ko.create_pod(api, namespace, "ready-term", node, "10.244.11.6", {"app": "echo"}, [("http", 8080)])
    ko.create_pod(api, namespace, "unready-term", node, "10.244.11.7", {"app": "echo"}, [("http", 8080)], ready=False)
    ko.wait_for_slice_endpoints(api, namespace, "echo", 2, timeout=5)

    ko.mark_pod_terminating(api, namespace, "ready-term")
    ko.mark_pod_terminating(api, namespace, "unready-term")
    pod = client.CoreV1Api(api).read_namespaced_pod("ready-term", namespace)
    assert pod.metadata.deletion_timestamp is not None  # stays: no kubelet finishes it

    def both_terminating():
        eps = endpoints_by_ip(ko.wait_for_slice_endpoints(api, namespace, "echo", 2, timeout=5))
        return eps if all(ep.conditions.terminating for ep in eps.values()) else None

    eps = wait_until(both_terminating, 5, "both endpoints terminating in the slice")
    ready_term = eps["10.244.11.6"].conditions
    unready_term = eps["10.244.11.7"].conditions
    assert (ready_term.ready, ready_term.serving, ready_term.terminating) == (False, True, True)
    assert (unready_term.ready, unready_term.serving, unready_term.terminating) == (False, False, True)

    ko.delete_pod(api, namespace, "ready-term", force=True)
    ko.wait_for_slice_endpoints(api, namespace, "echo", 1, timeout=5)


def watch_services_from(api: client.ApiClient, namespace: str, resource_version: str) -> list[str]:
    events = watch.Watch().stream(
        client.CoreV1Api(api).list_namespaced_service, namespace,
        resource_version=resource_version, timeout_seconds=1,  # a timeout also disables the client's 410 retry
    )
    return [f"{e['type']} {e['object'].metadata.name}" for e in events]


def test_compaction_alone_does_not_expire_watch_cache(apiserver, controlplane, namespace):
    """The trap: with the watch cache on (as in production) the cache still serves the old
    resourceVersion after etcd compaction. 410 needs a restart or an uncached resource."""
    api, _ = apiserver
    old_rv = client.CoreV1Api(api).list_namespaced_service(namespace).metadata.resource_version
    make_service(api, namespace, "after-rv", {"app": "x"})
    assert controlplane.compact_etcd() > int(old_rv)
    assert watch_services_from(api, namespace, old_rv) == ["ADDED after-rv"]


@pytest.fixture
def uncached_controlplane(controlplane, tmp_path) -> Iterator[ControlPlane]:
    cp = ControlPlane(tmp_path / "kproxy-uncached", controlplane.bin_dir, uncached_resources=WATCHED_RESOURCES)
    try:
        cp.start()
        yield cp
    finally:
        cp.stop()
        shutil.rmtree(tmp_path / "kproxy-uncached" / "etcd", ignore_errors=True)


def test_compaction_makes_uncached_watch_fail_with_410(uncached_controlplane):
    cp = uncached_controlplane
    api = config.new_client_from_config(config_file=str(cp.admin_kubeconfig))
    try:
        ko.ensure_namespace(api, "kproxy-compaction")
        old_rv = client.CoreV1Api(api).list_namespaced_service("kproxy-compaction").metadata.resource_version
        make_service(api, "kproxy-compaction", "after-rv", {"app": "x"})
        assert watch_services_from(api, "kproxy-compaction", old_rv) == ["ADDED after-rv"]

        assert cp.compact_etcd() > int(old_rv)
        with pytest.raises(ApiException) as err:
            watch_services_from(api, "kproxy-compaction", old_rv)
        assert err.value.status == 410
    finally:
        api.close()


def test_restart_apiserver_keeps_data_and_controllers(apiserver, controlplane, node, namespace):
    api, _ = apiserver
    core = client.CoreV1Api(api)
    make_service(api, namespace, "echo", {"app": "echo"})
    ko.create_pod(api, namespace, "echo-1", node, "10.244.11.8", {"app": "echo"}, [("http", 8080)])
    ko.wait_for_slice_endpoints(api, namespace, "echo", 1, timeout=5, ready=True)
    core.create_namespaced_config_map(namespace, client.V1ConfigMap(
        metadata=client.V1ObjectMeta(name="kept"), data={"k": "v"}))
    old_rv = core.list_namespaced_service(namespace).metadata.resource_version
    make_service(api, namespace, "later", {"app": "later"})
    before = controlplane.pids()

    seconds = controlplane.restart_apiserver()
    print(f"apiserver ready again after {seconds:.2f}s")
    after = controlplane.pids()
    assert after["kube-apiserver"] != before["kube-apiserver"]
    assert after["etcd"] == before["etcd"]
    assert after["kube-controller-manager"] == before["kube-controller-manager"]

    assert core.read_namespaced_config_map("kept", namespace).data == {"k": "v"}
    assert core.read_namespaced_service("echo", namespace).spec.cluster_ip
    # The new watch cache starts at the current revision, so a watch from before the restart
    # is too old: the production-like way to provoke 410.
    with pytest.raises(ApiException) as err:
        watch_services_from(api, namespace, old_rv)
    assert err.value.status == 410
    # KCM reconnected and keeps reconciling.
    ko.create_pod(api, namespace, "echo-2", node, "10.244.11.9", {"app": "echo"}, [("http", 8080)])
    # kube-controller-manager's informers reconnect on their own client-go backoff (30 s with
    # up to 100 % jitter), so allow a minute; the lab's Cluster restarts KCM instead.
    ko.wait_for_slice_endpoints(api, namespace, "echo", 2, timeout=70, ready=True)


def test_api_port_taken_is_retried_on_a_fresh_port(controlplane, tmp_path, monkeypatch):
    """A port another process takes between our pick and the API server's bind (as in CI,
    where a lab's apiserver met `address already in use`) costs a retry, not the run; the lab's
    kubeconfig follows the port finally used."""
    from kproxy_ebpf.dev.lab import controlplane as cp_module
    taken = socket.socket()
    taken.bind(("127.0.0.1", 0))
    taken.listen()
    taken_port = taken.getsockname()[1]
    picks = []
    real_free_ports = cp_module.free_ports

    def free_ports(n: int) -> list[int]:
        ports = real_free_ports(n)
        if not picks:
            ports[2] = taken_port  # the API server's port, in _start_once's order
        picks.append(ports)
        return ports

    monkeypatch.setattr(cp_module, "free_ports", free_ports)
    workdir = tmp_path / "kproxy-retry"
    cp = ControlPlane(workdir, controlplane.bin_dir, lab_host_on_api_port=RELAY_ADDRESS)
    try:
        cp.start()
        assert len(picks) == 2 and cp.api_port != taken_port
        assert cp.lab_server == f"https://{RELAY_ADDRESS}:{cp.api_port}"
        assert f"{RELAY_ADDRESS}:{cp.api_port}" in cp.lab_kubeconfig.read_text()
    finally:
        cp.stop()
        taken.close()
        shutil.rmtree(workdir / "etcd", ignore_errors=True)
