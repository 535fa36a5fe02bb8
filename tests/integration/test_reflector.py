"""The reflector (list+watch) and the Event recorder against a real kube-apiserver.

No mocks: the `apiserver` fixture (conftest.py) runs etcd + kube-apiserver on 127.0.0.1. The
control plane is shared by the session, so each test works in its own namespace and looks only
at its own objects; the reflectors watch all namespaces as the agent does.

How the 410 is forced: the API server serves watches from its watch cache, and etcd compaction
alone does not expire a resumed watch there. What does, in production as here, is a reflector
that missed events while an API server (re)started: the new server's cache begins after our
resourceVersion, so resuming from it gets "410 too old resource version". The test holds the
reflector's watch back with a gate, changes objects, restarts kube-apiserver and compacts etcd
(so the same holds with the watch cache off), then lets the watch resume.
"""
from __future__ import annotations

import itertools
import socket
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from kproxy_ebpf.kube.client import make_api_client
from kproxy_ebpf.kube.convert import Rejection, node_from_api, service_from_api, slice_from_api
from kproxy_ebpf.kube.events import EventRecorder
from kproxy_ebpf.kube.reflector import Event, EventType, Reflector, reflector_for

from ..builders import api_ep, api_service, api_slice
from ..support import wait_until

pytestmark = [pytest.mark.controlplane, pytest.mark.timeout(180)]
SYNC = EventType.SYNC


# ---------------------------------------------------------------------------------------------
# helpers

def wait_for(predicate: Callable[[], Any], timeout: float = 15.0, what: str = "condition") -> Any:
    return wait_until(predicate, timeout, what)


class Store:
    """What an agent keeps: the current objects by (namespace, name), plus a log of deliveries."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.objects: dict[tuple[str, str], dict] = {}
        self.log: list[tuple[str, Any]] = []

    def __call__(self, event: Event) -> None:
        etype, payload = event
        with self.lock:
            if etype is SYNC:
                keys = [_key(o) for o in payload]
                assert len(keys) == len(set(keys)), f"duplicate objects in one SYNC: {keys}"
                self.objects = {_key(o): o for o in payload}
                self.log.append((SYNC, keys))
            else:
                [payload] = payload
                key = _key(payload)
                if etype is EventType.DELETED:
                    self.objects.pop(key, None)
                else:
                    self.objects[key] = payload
                self.log.append((etype, key))

    def names(self, namespace: str) -> set[str]:
        with self.lock:
            return {name for ns, name in self.objects if ns == namespace}

    def get(self, namespace: str, name: str) -> dict | None:
        with self.lock:
            return self.objects.get((namespace, name))

    def events_for(self, namespace: str) -> list[tuple[str, Any]]:
        with self.lock:
            return [(t, k) for t, k in self.log if t != SYNC and k[0] == namespace]

    def syncs(self) -> int:
        with self.lock:
            return sum(1 for t, _ in self.log if t == SYNC)


def _key(obj: dict) -> tuple[str, str]:
    meta = obj["metadata"]
    return meta.get("namespace", ""), meta["name"]


class Gate:
    """Wraps a list function; while closed, new watch requests wait (the reflector is 'away')."""

    def __init__(self, fn: Callable[..., Any]) -> None:
        self.fn = fn
        self.open = threading.Event()
        self.open.set()
        self.waiting = threading.Event()
        self.watch_rvs: list[str] = []

    def __call__(self, **kwargs: Any) -> Any:
        if kwargs.get("watch"):
            if not self.open.is_set():
                self.waiting.set()
                self.open.wait(60)
            self.watch_rvs.append(kwargs.get("resource_version", ""))
        return self.fn(**kwargs)

    def hold(self, reflector: Reflector) -> None:
        """Close the gate and cut the current watch; return once the next watch waits here."""
        self.waiting.clear()
        self.open.clear()
        deadline = time.monotonic() + 15
        while not self.waiting.wait(0.2):
            # The test seam: drop the in-flight connection, as a network blip would. Repeated,
            # because the watch may still be connecting when we first try.
            reflector._cut()
            assert time.monotonic() < deadline, "the reflector did not come back for a new watch"


@pytest.fixture
def namespace(apiserver) -> Iterator[str]:
    api, _ = apiserver
    name = f"kproxy-refl-{uuid.uuid4().hex[:8]}"
    core = client.CoreV1Api(api)
    core.create_namespace({"metadata": {"name": name}})
    try:
        yield name
    finally:
        # No namespace controller runs in the lab, so delete the contents explicitly.
        for svc in core.list_namespaced_service(name).items:
            _ignore_404(core.delete_namespaced_service, svc.metadata.name, name)
        disc = client.DiscoveryV1Api(api)
        for eps in disc.list_namespaced_endpoint_slice(name).items:
            _ignore_404(disc.delete_namespaced_endpoint_slice, eps.metadata.name, name)
        core.delete_collection_namespaced_event(name)
        _ignore_404(core.delete_namespace, name)


@pytest.fixture
def reflector_api(apiserver) -> Iterator[client.ApiClient]:
    """A separate ApiClient for the reflectors, built by our own client.py from the kubeconfig."""
    _, kubeconfig = apiserver
    api = make_api_client(kubeconfig)
    try:
        yield api
    finally:
        api.close()


@pytest.fixture
def running() -> Iterator[Callable[[Reflector], Reflector]]:
    """Start reflectors and make sure they are stopped (promptly) at the end."""
    started: list[Reflector] = []

    def start(r: Reflector) -> Reflector:
        started.append(r.start())
        return r

    yield start
    for r in started:
        # Every watch here lasts 5 s or more (its server-side timeout): a thread gone within
        # 4 s was cut by stop(), it did not wait for the watch to time out.
        r.stop(timeout=4)
        assert not r.alive, f"{r.resource} reflector did not stop: stop() must cut the watch"


def _ignore_404(fn: Callable[..., Any], *args: Any) -> None:
    try:
        fn(*args)
    except ApiException as e:
        if e.status != 404:
            raise


def service_body(name: str, port: int = 80, labels: dict | None = None) -> dict:
    return api_service(name, None, meta={"labels": labels or {}},
                       ports=[{"name": "http", "port": port, "protocol": "TCP"}])


def slice_body(name: str, service: str, ips: list[str], ready: bool | None = True) -> dict:
    conditions = {} if ready is None else {"ready": ready}
    # managed-by: not the EndpointSlice controller's, which leaves these alone
    return api_slice(name, service, None, labels={"endpointslice.kubernetes.io/managed-by": "kproxy-test"},
                     ports=[{"name": "http", "port": 8080, "protocol": "TCP"}],
                     endpoints=[api_ep(ip, "kproxy-test-node", conditions) for ip in ips])


def services_reflector(api: client.ApiClient, store: Store, gate: bool = False,
                       **options: Any) -> tuple[Reflector, Gate | None]:
    fn = client.CoreV1Api(api).list_service_for_all_namespaces
    g = Gate(fn) if gate else None
    return Reflector("services", fn, g or fn, store, **options), g


def held_services_reflector(api: client.ApiClient, running) -> tuple[Store, Reflector, Gate]:
    """A services reflector behind a Gate: synced, its first watch open, then cut and held:
    its next watch waits at the gate until gate.open is set."""
    store = Store()
    r, gate = services_reflector(api, store, gate=True)
    running(r)
    assert r.synced.wait(15)
    wait_for(lambda: gate.watch_rvs, what="the first watch")
    gate.hold(r)
    return store, r, gate


# ---------------------------------------------------------------------------------------------
# list + watch

def test_services_list_then_watch(apiserver, reflector_api, namespace, running):
    api, _ = apiserver
    core = client.CoreV1Api(api)
    core.create_namespaced_service(namespace, service_body("before"))
    store = Store()
    r = running(reflector_for(reflector_api, "services", store))
    assert r.synced.wait(15), "no initial list"
    assert store.names(namespace) == {"before"}
    listed_rv = int(r.resource_version)

    core.create_namespaced_service(namespace, service_body("added", port=81))
    wait_for(lambda: "added" in store.names(namespace), what="ADDED")
    core.patch_namespaced_service("added", namespace, {"metadata": {"labels": {"kproxy-test": "patched"}}})
    wait_for(lambda: store.get(namespace, "added")["metadata"].get("labels", {}).get("kproxy-test") == "patched",
             what="MODIFIED")
    core.delete_namespaced_service("before", namespace)
    wait_for(lambda: "before" not in store.names(namespace), what="DELETED")

    assert store.events_for(namespace) == [("ADDED", (namespace, "added")), ("MODIFIED", (namespace, "added")),
                                           ("DELETED", (namespace, "before"))]
    assert int(r.resource_version) > listed_rv
    assert (r.lists, r.relists, r.handler_errors) == (1, 0, 0)

    # The raw JSON the server sent converts cleanly, with a real allocated ClusterIP.
    svc, rejections = service_from_api(store.get(namespace, "added"))
    assert rejections == []
    assert svc.key == (namespace, "added") and len(svc.cluster_ips) == 1
    assert svc.cluster_ips[0].startswith("10.96.") and svc.ports[0].port == 81
    assert svc.resource_version == store.get(namespace, "added")["metadata"]["resourceVersion"]


def test_endpointslices_list_then_watch(apiserver, reflector_api, namespace, running):
    api, _ = apiserver
    disc = client.DiscoveryV1Api(api)
    disc.create_namespaced_endpoint_slice(namespace, slice_body("web-1", "web", ["10.0.1.1"]))
    store = Store()
    r = running(reflector_for(reflector_api, "endpointslices", store))
    assert r.synced.wait(15)
    assert store.names(namespace) == {"web-1"}

    disc.create_namespaced_endpoint_slice(namespace, slice_body("web-2", "web", ["10.0.1.2"], ready=None))
    wait_for(lambda: "web-2" in store.names(namespace), what="ADDED slice")
    disc.replace_namespaced_endpoint_slice("web-1", namespace, slice_body("web-1", "web", ["10.0.1.1", "10.0.1.3"]))
    wait_for(lambda: len(store.get(namespace, "web-1")["endpoints"]) == 2, what="MODIFIED slice")
    disc.delete_namespaced_endpoint_slice("web-2", namespace)
    wait_for(lambda: "web-2" not in store.names(namespace), what="DELETED slice")

    eps, rejections = slice_from_api(store.get(namespace, "web-1"))
    assert rejections == []
    assert eps.service_name == "web" and eps.address_type == "IPv4"
    assert [e.address for e in eps.endpoints] == ["10.0.1.1", "10.0.1.3"]
    assert all(e.ready is True and e.serving is None and e.terminating is None for e in eps.endpoints)
    assert (r.relists, r.handler_errors) == (0, 0)


def create_node(api: client.ApiClient, name: str, internal_ip: str, zone: str | None = None) -> None:
    core = client.CoreV1Api(api)
    labels = {"topology.kubernetes.io/zone": zone} if zone else {}
    core.create_node({"metadata": {"name": name, "labels": labels}})
    core.patch_node_status(name, {"status": {"addresses": [
        {"type": "Hostname", "address": name}, {"type": "InternalIP", "address": internal_ip}]}})


def test_single_node_by_name(apiserver, reflector_api, running):
    api, _ = apiserver
    core = client.CoreV1Api(api)
    suffix = uuid.uuid4().hex[:6]
    mine, other = f"kproxy-refl-node-a-{suffix}", f"kproxy-refl-node-b-{suffix}"
    create_node(api, mine, "192.168.77.2", zone="zone-a")   # data only: nothing is sent there
    try:
        store = Store()
        r = running(reflector_for(reflector_api, "node", store, node_name=mine))
        assert r.synced.wait(15)
        assert set(store.objects) == {("", mine)}
        node = node_from_api(store.objects[("", mine)])
        assert (node.name, node.addresses, node.zone) == (mine, ("192.168.77.2",), "zone-a")

        create_node(api, other, "192.168.77.3")
        core.patch_node(mine, {"metadata": {"labels": {"topology.kubernetes.io/zone": "zone-b"}}})
        wait_for(lambda: node_from_api(store.objects.get(("", mine), {})).zone == "zone-b", what="node MODIFIED")
        assert set(store.objects) == {("", mine)}, "the field selector must keep other nodes out"
    finally:
        for name in (mine, other):
            _ignore_404(core.delete_node, name)


def test_pagination_delivers_one_complete_sync(apiserver, reflector_api, namespace, running):
    api, _ = apiserver
    core = client.CoreV1Api(api)
    for i in range(7):
        core.create_namespaced_service(namespace, service_body(f"s{i}"))
    calls: list[dict] = []
    fn = client.CoreV1Api(reflector_api).list_service_for_all_namespaces

    def list_fn(**kwargs: Any) -> Any:
        calls.append(kwargs)
        return fn(**kwargs)

    store = Store()
    r = running(Reflector("services", list_fn, fn, store, page_size=2))
    assert r.synced.wait(15)
    assert store.names(namespace) == {f"s{i}" for i in range(7)}
    assert store.syncs() == 1
    assert len(calls) >= 4 and all(c["limit"] == 2 for c in calls)
    assert "_continue" not in calls[0] and all(c.get("_continue") for c in calls[1:])


# ---------------------------------------------------------------------------------------------
# resume, relist, outages

def test_dropped_watch_resumes_from_last_resource_version(apiserver, reflector_api, namespace, running):
    api, _ = apiserver
    core = client.CoreV1Api(api)
    core.create_namespaced_service(namespace, service_body("keep"))
    core.create_namespaced_service(namespace, service_body("gone"))
    store, r, gate = held_services_reflector(reflector_api, running)
    rv_before = r.resource_version
    core.create_namespaced_service(namespace, service_body("new"))
    core.delete_namespaced_service("gone", namespace)
    gate.open.set()

    wait_for(lambda: store.names(namespace) == {"keep", "new"}, what="the missed events")
    assert gate.watch_rvs[-1] == rv_before, "the watch must resume from the last resourceVersion"
    assert (r.lists, r.relists) == (1, 0), "history was still there: no relist"
    assert store.events_for(namespace) == [("ADDED", (namespace, "new")), ("DELETED", (namespace, "gone"))]


def test_expired_resource_version_relists_without_duplicates_or_losses(apiserver, controlplane, reflector_api,
                                                                        namespace, running):
    api, _ = apiserver
    core = client.CoreV1Api(api)
    for name in ("stay", "change", "remove"):
        core.create_namespaced_service(namespace, service_body(name))
    store, r, gate = held_services_reflector(reflector_api, running)
    stale_rv = r.resource_version
    core.delete_namespaced_service("remove", namespace)
    core.patch_namespaced_service("change", namespace, {"metadata": {"labels": {"kproxy-test": "changed"}}})
    core.create_namespaced_service(namespace, service_body("appear"))
    controlplane.restart_apiserver()    # the new watch cache starts after stale_rv
    controlplane.compact_etcd()         # and etcd no longer has that history either
    gate.open.set()

    wait_for(lambda: r.relists >= 1, 30, "a relist after 410")
    wait_for(lambda: r.lists >= 2, 30, "the relist to complete")
    assert gate.watch_rvs[gate.watch_rvs.index(stale_rv)] == stale_rv, "it did try to resume first"
    assert isinstance(r.last_error, Exception) and "410" in str(r.last_error)

    # The consumer's set equals the server's: the deleted one is gone, nothing is duplicated
    # (Store asserts that per SYNC), nothing is lost, and the modified one is the new version.
    server = {s.metadata.name: s.metadata.resource_version for s in core.list_namespaced_service(namespace).items}
    assert server.keys() == {"stay", "change", "appear"}
    wait_for(lambda: store.names(namespace) == server.keys(), 10, "the consumer to match the server")
    for name, rv in server.items():
        assert store.get(namespace, name)["metadata"]["resourceVersion"] == rv
    assert store.get(namespace, "change")["metadata"]["labels"]["kproxy-test"] == "changed"
    # No per-object event reported the change: only the SYNC did, as a replacement.
    assert ("DELETED", (namespace, "remove")) not in store.events_for(namespace)

    # And it watches again from the new list.
    core.create_namespaced_service(namespace, service_body("after"))
    wait_for(lambda: "after" in store.names(namespace), 15, "events after the relist")


def test_apiserver_outage_deletes_nothing(apiserver, controlplane, reflector_api, namespace, running):
    api, _ = apiserver
    core = client.CoreV1Api(api)
    core.create_namespaced_service(namespace, service_body("a"))
    store = Store()
    r = running(reflector_for(reflector_api, "services", store, backoff_initial=0.2, backoff_max=1.0))
    assert r.synced.wait(15)
    restarts_before = r.restarts
    controlplane.restart_apiserver()
    core.create_namespaced_service(namespace, service_body("b"))
    wait_for(lambda: store.names(namespace) == {"a", "b"}, 30, "recovery after the restart")
    # Every delivery is in the log: none took "a" away (no DELETED, no SYNC without it).
    a = (namespace, "a")
    with store.lock:
        log = list(store.log)
    assert not [(etype, what) for etype, what in log
                if (etype == "DELETED" and what == a) or (etype == SYNC and a not in what)], \
        f"an object vanished while the API server was away: {log}"
    assert r.restarts > restarts_before or r.relists > 0, "the outage went unnoticed"


def test_bookmarks_advance_the_resource_version(apiserver, reflector_api, namespace, running):
    api, _ = apiserver
    core = client.CoreV1Api(api)
    store = Store()
    # A selector nothing matches: the watch gets no events, so only bookmarks can move the rv.
    r = running(reflector_for(reflector_api, "services", store, label_selector=f"kproxy-nothing={namespace}",
                              watch_timeout=5, watch_jitter=0.0))
    assert r.synced.wait(15)
    listed_rv = int(r.resource_version)
    created = core.create_namespaced_service(namespace, service_body("unmatched"))
    target = int(created.metadata.resource_version)
    # The server sends a bookmark 2 s before each watch's timeout, and only when the resource's
    # resourceVersion moved since the watch began: keep it moving (once a second) until one arrives.
    patches = itertools.count(1)

    def bookmarked() -> bool:
        if r.bookmarks >= 1 and int(r.resource_version) >= target:
            return True
        core.patch_namespaced_service("unmatched", namespace,
                                      {"metadata": {"annotations": {"n": str(next(patches))}}})
        return False

    wait_until(bookmarked, 40, f"a bookmark carrying resourceVersion >= {target} (listed at {listed_rv})",
               step=1.0)
    assert int(r.resource_version) > listed_rv
    assert r.events == 0 and store.names(namespace) == set()
    assert r.relists == 0


class Blackhole:
    """A TCP relay on the host's loopback in front of the API server. freeze() makes every
    connection it carries stop delivering, both ways, without closing: what a NAT or load
    balancer that dropped its state does. Connections made afterwards pass."""

    def __init__(self, upstream: str) -> None:
        host, _, port = upstream.removeprefix("https://").rpartition(":")
        self.upstream = (host, int(port))
        self.server = socket.create_server(("127.0.0.1", 0))
        self.url = f"https://127.0.0.1:{self.server.getsockname()[1]}"
        self.frozen: set[int] = set()
        self.socks: dict[int, tuple[socket.socket, socket.socket]] = {}
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        for cid in itertools.count():
            try:
                down, _ = self.server.accept()
            except OSError:
                return              # closed
            up = socket.create_connection(self.upstream)
            self.socks[cid] = (down, up)
            for a, b in ((down, up), (up, down)):
                threading.Thread(target=self._pipe, args=(a, b, cid), daemon=True).start()

    def _pipe(self, src: socket.socket, dst: socket.socket, cid: int) -> None:
        try:
            while data := src.recv(65536):
                if cid not in self.frozen:
                    dst.sendall(data)       # a frozen connection's bytes go nowhere
        except OSError:
            pass

    def freeze(self) -> None:
        self.frozen |= set(self.socks)

    def close(self) -> None:
        self.server.close()
        for pair in list(self.socks.values()):
            for sock in pair:
                sock.close()


def test_a_watch_that_stops_delivering_is_made_again(reflector_api, apiserver, namespace,
                                                     running):
    """No event and no bookmark for progress_timeout: the reflector takes the stream as dead
    and watches again from its resourceVersion (no relist); with only the read timeout of
    the watch's own length (+30 s) it would wait minutes."""
    api, _ = apiserver
    core = client.CoreV1Api(api)
    hole = Blackhole(reflector_api.configuration.host)
    try:
        reflector_api.configuration.host = hole.url
        store = Store()
        r = running(reflector_for(reflector_api, "services", store, progress_timeout=3,
                                  watch_timeout=120, watch_jitter=0.0))
        assert r.synced.wait(15)
        core.create_namespaced_service(namespace, service_body("before"))
        wait_for(lambda: "before" in store.names(namespace), what="the first Service")
        hole.freeze()
        stalls = r.stalls
        t0 = time.monotonic()
        core.create_namespaced_service(namespace, service_body("after"))
        wait_for(lambda: "after" in store.names(namespace), 15,
                 "the Service created while the watch was blackholed")
        assert time.monotonic() - t0 < 3 + 5          # the timeout, the backoff, a new watch
        assert r.stalls > stalls and r.relists == 0 and r.lists == 1
    finally:
        hole.close()


def test_stop_is_prompt_during_a_long_watch(reflector_api):
    store = Store()
    r = reflector_for(reflector_api, "services", store, watch_timeout=300).start()
    assert r.synced.wait(15)
    wait_for(lambda: r._response is not None, 15, "the watch to be open")
    # The watch lasts 300 s: a thread gone within stop()'s 2 s was cut by it.
    r.stop(timeout=2)
    assert not r.alive


def test_master_override(apiserver, controlplane, running):
    _, kubeconfig = apiserver
    api = make_api_client(kubeconfig, master=f"127.0.0.1:{controlplane.api_port}")
    try:
        assert api.configuration.host == f"https://127.0.0.1:{controlplane.api_port}"
        r = running(reflector_for(api, "services", Store()))
        assert r.synced.wait(15)
    finally:
        api.close()


# ---------------------------------------------------------------------------------------------
# Events

def test_event_recorder_posts_and_counts(apiserver, reflector_api, namespace):
    api, _ = apiserver
    core = client.CoreV1Api(api)
    created = core.create_namespaced_service(namespace, service_body("bad"))
    rejection = Rejection("Service", namespace, "bad", "InvalidPort", "spec.ports[1].port: 0 is not valid",
                          uid=created.metadata.uid)
    recorder = EventRecorder(reflector_api, host="kproxy-test-node", repeat_interval=0.0)
    try:
        recorder.rejected([rejection])

        def events() -> list:
            # Ours only: the API server's ClusterIP repair loop may post its own Event about
            # the same Service ("ClusterIPNotAllocated ... repairing") when its IPAddress
            # informer lags the create, as it did once under a loaded CI run.
            return [e for e in core.list_namespaced_event(
                        namespace, field_selector="involvedObject.name=bad").items
                    if e.source is not None and e.source.component == "kproxy-ebpf"]

        ev = wait_for(events, 10, "the Event")[0]
        assert (ev.type, ev.reason, ev.message, ev.count) == ("Warning", "InvalidPort", rejection.message, 1)
        assert (ev.involved_object.kind, ev.involved_object.uid) == ("Service", created.metadata.uid)
        assert (ev.source.component, ev.source.host) == ("kproxy-ebpf", "kproxy-test-node")

        recorder.rejected([rejection])
        wait_for(lambda: events()[0].count == 2, 10, "the count to grow")
        assert len(events()) == 1, "a repeat updates the Event instead of adding one"
        assert (recorder.posted, recorder.updated, recorder.failed) == (1, 1, 0)
    finally:
        recorder.stop()
