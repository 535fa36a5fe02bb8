#!/usr/bin/env python3
"""Where the agent's CPU and memory go at N Services x E endpoints, without a cluster or a kernel.

The objects are the JSON an API server sends (metadata with managedFields, full specs, slices
with targetRefs), serialised to bytes and fed through the agent's real ingest path: the
reflector's line parser and page handling, kube/convert/, the ApiSource handler, the Agent's
sink and ProxyState, and the Agent's sync (compute, problem reports, metrics). Only the datapath
writer is replaced by a stand-in that reads what the real writer reads (`desired[k]` for the
candidate keys, the whole table on a full sync) and writes nothing, so the numbers are the
agent's own and do not mix with the writer's map operations (measured by its own benchmark).

Phases (CPU is process time; a LIST's next page is made on a thread of its own, and its CPU,
the API server's work, is left out):
  list   an agent (re)starting on a full cluster: one paginated LIST of each resource, first sync
         (with the cyclic GC paused as Agent.start() pauses it; gc_resume_cpu_s is the freeze
         that ends the pause after the first sync)
  fill   an agent watching while the cluster is created: ADDED events, a partial sync every
         --events-per-sync events (the 200 ms minSyncPeriod at the rate objects arrive) and a
         full sync every --syncs-per-full partial syncs (the 30 s syncPeriod)
  change one endpoint of one slice flips readiness, then a partial sync; repeated, median CPU
  rss    resident memory after the fill, and what the imports alone cost

    .venv/bin/python -m kproxy_ebpf.dev.bench.agent_profile --services 10000 --endpoints 10
    .venv/bin/python -m kproxy_ebpf.dev.bench.agent_profile --services 10000 --cprofile fill --top 25
    .venv/bin/python -m kproxy_ebpf.dev.bench.agent_profile --services 10000 --tracemalloc --top 15
"""
from __future__ import annotations

import argparse
import cProfile
import gc
import json
import os
import pstats
import statistics
import sys
import tempfile
import time
import tracemalloc

from kproxy_ebpf.agent.agent import Agent
from kproxy_ebpf.config import AgentConfig
from kproxy_ebpf.datapath.write.apply_result import ApplyResult
from kproxy_ebpf.kube.reflector import Reflector
from kproxy_ebpf.kube.sources import ApiSource

try:        # one decode for LIST and WATCH (issue 43; before it, a LIST transform: older code too)
    from kproxy_ebpf.kube.sources import decoder
except ImportError:
    decoder = None
try:
    from kproxy_ebpf.kube.sources import _listed
except ImportError:
    _listed = None

NODE = "kproxy-node-1"
NODES = [f"kproxy-node-{i}" for i in range(1, 3)]
MANAGED = [{"manager": "kproxy-scale", "operation": "Update", "apiVersion": "v1",
            "time": "2026-11-30T10:00:00Z", "fieldsType": "FieldsV1",
            "fieldsV1": {"f:spec": {"f:ports": {".": {}, 'k:{"port":80,"protocol":"TCP"}': {
                ".": {}, "f:name": {}, "f:port": {}, "f:protocol": {}, "f:targetPort": {}}},
                "f:selector": {}, "f:sessionAffinity": {}, "f:type": {}}}}]


def rss_mib(field: str = "VmRSS") -> float:
    for line in open("/proc/self/status"):
        if line.startswith(field + ":"):
            return int(line.split()[1]) / 1024
    return 0.0


def cluster_ip(i: int) -> str:
    return f"10.96.{(i >> 8) & 255}.{i & 255}" if i < 65536 else f"10.97.{(i >> 8) & 255}.{i & 255}"


def service_json(i: int, rv: int) -> dict:
    name = f"svc-{i:05d}"
    ip = cluster_ip(i)
    return {
        "kind": "Service", "apiVersion": "v1",
        "metadata": {"name": name, "namespace": "scale", "uid": f"00000000-0000-4000-8000-{i:012d}",
                     "resourceVersion": str(rv), "creationTimestamp": "2026-11-30T10:00:00Z",
                     "labels": {"app": name, "kproxy-scale": "true"},
                     "managedFields": MANAGED},
        "spec": {"ports": [{"name": "http", "protocol": "TCP", "port": 80, "targetPort": 8080}],
                 "selector": {"app": name}, "clusterIP": ip, "clusterIPs": [ip],
                 "type": "ClusterIP", "sessionAffinity": "None", "ipFamilies": ["IPv4"],
                 "ipFamilyPolicy": "SingleStack", "internalTrafficPolicy": "Cluster"},
        "status": {"loadBalancer": {}},
    }


def slice_json(i: int, endpoints: int, rv: int, flip: int = -1) -> dict:
    svc = f"svc-{i:05d}"
    eps = []
    for e in range(endpoints):
        n = i * endpoints + e
        ready = e != flip
        eps.append({"addresses": [f"10.{64 + (n >> 16)}.{(n >> 8) & 255}.{n & 255}"],
                    "conditions": {"ready": ready, "serving": ready, "terminating": False},
                    "nodeName": NODES[n % len(NODES)],
                    "targetRef": {"kind": "Pod", "namespace": "scale", "name": f"{svc}-pod-{e}",
                                  "uid": f"10000000-0000-4000-8000-{n:012d}"}})
    return {
        "kind": "EndpointSlice", "apiVersion": "discovery.k8s.io/v1",
        "metadata": {"name": f"{svc}-abcde", "generateName": f"{svc}-", "namespace": "scale",
                     "uid": f"20000000-0000-4000-8000-{i:012d}", "resourceVersion": str(rv),
                     "generation": 1, "creationTimestamp": "2026-11-30T10:00:00Z",
                     "labels": {"kubernetes.io/service-name": svc,
                                "endpointslice.kubernetes.io/managed-by": "kproxy-scale"},
                     "managedFields": MANAGED},
        "addressType": "IPv4", "endpoints": eps,
        "ports": [{"name": "http", "protocol": "TCP", "port": 8080}],
    }


def node_json() -> dict:
    return {"kind": "Node", "apiVersion": "v1",
            "metadata": {"name": NODE, "resourceVersion": "1",
                         "labels": {"kubernetes.io/hostname": NODE}},
            "status": {"addresses": [{"type": "InternalIP", "address": "192.168.50.1"},
                                     {"type": "Hostname", "address": NODE}]}}


class Response:
    """A urllib3 response as the reflector reads it (the body of one LIST page)."""

    def __init__(self, data: bytes) -> None:
        self.data = data

    def release_conn(self) -> None:
        pass


class Pages:
    """A paginated LIST of `count` objects made by `make(i)`, as the API server sends it."""

    def __init__(self, count: int, make, page_size: int = 500) -> None:
        self.count, self.make, self.page_size = count, make, page_size
        self.cpu = 0.0          # spent making the pages: the API server's work, not ours

    def __call__(self, limit: int = 500, _continue: str | None = None, **_) -> Response:
        t0 = time.thread_time()     # its own thread's: the next page is made while one decodes
        try:
            return self._page(limit, _continue)
        finally:
            self.cpu += time.thread_time() - t0

    def _page(self, limit: int, _continue: str | None) -> Response:
        start = int(_continue or 0)
        stop = min(self.count, start + limit)
        body = {"kind": "List", "metadata": {"resourceVersion": "1000000"},
                "items": [self.make(i) for i in range(start, stop)]}
        if stop < self.count:
            body["metadata"]["continue"] = str(stop)
        return Response(json.dumps(body).encode())


class NullWriter:
    """Reads what MapWriter.apply reads and writes nothing (see the module docstring)."""

    def __init__(self) -> None:
        self.reads = 0
        self.frontends: set = set()

    def restore(self) -> int:
        return len(self.frontends)

    def apply(self, desired, candidates=None, res=None) -> ApplyResult:
        res = ApplyResult() if res is None else res
        keys = set(self.frontends) | set(desired) if candidates is None else set(candidates)
        for k in keys:
            if k in desired:
                desired[k]
                self.reads += 1
                if k not in self.frontends:
                    self.frontends.add(k)
                    res.updated += 1
            elif k in self.frontends:
                self.frontends.discard(k)
                res.deleted += 1
        return res

    def stats(self) -> dict[str, int]:
        return {"frontends": len(self.frontends), "backends": 0, "service_ports": 0}

    def take_freed_svc_ids(self) -> list[int]:
        return []

    def svc_ids_held(self) -> set[int]:
        return set()

    def row_counts(self) -> dict[str, int]:
        return {}


class MemoryMap:
    """A BPF hash map in a dict, keyed by the encoded bytes as the kernel keys it."""

    def __init__(self, spec) -> None:
        from kproxy_ebpf.datapath.maps import layout as L
        self.spec, self.raw, self.rows, self.max_entries = spec, L.raw, {}, 1 << 22

    def put(self, key, value) -> None:
        self.rows[self.raw(key)] = self.raw(value)

    def delete(self, key) -> bool:
        return self.rows.pop(self.raw(key), None) is not None

    # The batch calls, so that the writer plans and batches as it does on real maps.
    def put_batch(self, keys, values) -> None:
        for k, v in zip(keys, values, strict=True):
            self.put(k, v)

    def delete_batch(self, keys) -> None:
        for k in keys:
            self.delete(k)

    def items(self):
        return [(self.spec.key.from_buffer_copy(k), self.spec.value.from_buffer_copy(v))
                for k, v in self.rows.items()]

    def unpacked(self):
        """As PinnedMap.unpacked(): what restore() reads on a full sync's map re-read, packed
        as the kernel's batches are."""
        from kproxy_ebpf.datapath.maps.pinned import PinnedMap, UnpackedRows
        rows = list(self.rows.items())      # one moment: a sync may write beside a drift check
        step = PinnedMap._BATCH
        return UnpackedRows(self.spec.key_format, self.spec.value_format,
                            [(b"".join(k for k, _ in rows[i:i + step]),
                              b"".join(v for _, v in rows[i:i + step]))
                             for i in range(0, len(rows), step)])

    def raw_items(self):
        return list(self.rows.items())

    def keys(self):
        return [self.spec.key.from_buffer_copy(k) for k in self.rows]

    def get(self, key):
        v = self.rows.get(self.raw(key))
        return None if v is None else self.spec.value.from_buffer_copy(v)


WRITER = "null"


def make_agent() -> tuple[Agent, ApiSource, dict[str, Reflector]]:
    tmp = tempfile.mkdtemp(prefix="kproxy-profile-")
    cfg = AgentConfig(hostname_override=NODE, bpffs_dir=tmp, cgroup=tmp,
                      healthz_bind_address="", metrics_bind_address="")
    agent = Agent(cfg)
    from kproxy_ebpf.datapath.maps.layout import MAPS
    from kproxy_ebpf.datapath.write.cidr_writer import CidrWriter
    if WRITER == "maps":
        from kproxy_ebpf.datapath.write.writer import MapWriter
        # Every map the writer and the sync touch (per-socket storage has no rows to hold).
        agent.node.sock.maps = {n: MemoryMap(spec) for n, spec in MAPS.items()
                               if not spec.per_socket}
        agent.node.writer = MapWriter(agent.node.sock.maps)
    else:
        agent.node.writer = NullWriter()
    # The null writer frees no service id: the counters map the sync deletes from stays empty.
    agent.node.sock.maps.setdefault("svcstat", MemoryMap(MAPS["svcstat"]))
    cidr_maps = {n: MemoryMap(MAPS[n]) for n in ("clusterip", "servicecidr")}
    agent.node.sock.maps.update(cidr_maps)
    agent.node.cidrs = CidrWriter(cidr_maps)
    source = ApiSource.__new__(ApiSource)       # no API client: the reflectors are ours
    source.sink = getattr(agent, "sink", agent)     # the agent itself was the sink before
    refl = {}
    for resource, kind in ApiSource.RESOURCES.items():
        opts = ({"decode": decoder(kind)} if decoder else {"transform": _listed(kind)} if _listed else {})
        refl[resource] = Reflector(resource, lambda **_: None, None, source._handler(kind), **opts)
    source.reflectors = refl
    agent.source = source
    return agent, source, refl


def watch_line(etype: str, obj: dict) -> bytes:
    return json.dumps({"type": etype, "object": obj}).encode()


def phase_list(n: int, e: int) -> dict:
    agent, _, refl = make_agent()
    refl["node"]._list_fn = Pages(1, lambda i: node_json())
    refl["services"]._list_fn = Pages(n, lambda i: service_json(i, 10 + i))
    refl["endpointslices"]._list_fn = Pages(n, lambda i: slice_json(i, e, 10 + n + i))
    if hasattr(agent, "pause_gc"):      # as Agent.start() (absent in older code)
        agent.pause_gc()
    t0 = time.process_time()
    for r in refl.values():
        r._list()
    listed = time.process_time() - t0 - sum(r._list_fn.cpu for r in refl.values())
    t0 = time.process_time()
    agent.loop.sync(True)
    first = time.process_time() - t0
    resumed = getattr(agent, "gc_resume_cpu", 0.0)   # ends the first sync, after programming
    return {"list_cpu_s": round(listed, 2), "first_sync_cpu_s": round(first - resumed, 2),
            "gc_resume_cpu_s": round(resumed, 2), "agent": agent}


def phase_fill(n: int, e: int, events_per_sync: int, syncs_per_full: int) -> dict:
    agent, _, refl = make_agent()
    refl["node"]._list_fn = Pages(1, lambda i: node_json())
    refl["services"]._list_fn = Pages(0, None)
    refl["endpointslices"]._list_fn = Pages(0, None)
    for r in refl.values():
        r._list()
    agent.loop.sync(True)
    rv = 100
    events = syncs = 0
    checkpoints = {}
    cpu = 0.0           # the agent's part only: making the JSON is the API server's work
    for i in range(n):
        for resource, obj in (("services", service_json(i, rv)),
                              ("endpointslices", slice_json(i, e, rv + 1))):
            line = watch_line("ADDED", obj)
            t0 = time.process_time()
            refl[resource]._handle_line(line)
            events += 1
            if events % events_per_sync == 0:
                syncs += 1
                agent.loop.sync(syncs % syncs_per_full == 0)
            cpu += time.process_time() - t0
        rv += 2
        if i + 1 in (n // 10, n // 2):
            checkpoints[i + 1] = round(cpu, 2)
    t0 = time.process_time()
    agent.loop.sync(False)
    cpu += time.process_time() - t0
    checkpoints[n] = round(cpu, 2)
    return {"fill_cpu_s": round(cpu, 2), "fill_cpu_at": checkpoints, "syncs": syncs,
            "agent": agent, "refl": refl, "rv": rv}


def phase_change(agent: Agent, refl: dict, n: int, e: int, rv: int, changes: int) -> dict:
    """Median CPU of one endpoint readiness flip, event to end of the partial sync."""
    samples = []
    for c in range(changes):
        i = (c * 7919) % n
        rv += 1
        line = watch_line("MODIFIED", slice_json(i, e, rv, flip=c % e if c % 2 == 0 else -1))
        t0 = time.process_time()
        refl["endpointslices"]._handle_line(line)
        agent.loop.sync(False)
        samples.append(time.process_time() - t0)
    return {"change_cpu_us": round(statistics.median(samples) * 1e6, 1)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--services", type=int, default=10000)
    ap.add_argument("--endpoints", type=int, default=10)
    ap.add_argument("--events-per-sync", type=int, default=20,
                    help="events between two partial syncs during the fill (default 20: "
                         "100 objects/s at the 200 ms minSyncPeriod)")
    ap.add_argument("--syncs-per-full", type=int, default=150,
                    help="partial syncs between two full syncs (default 150: 30 s / 200 ms)")
    ap.add_argument("--changes", type=int, default=200)
    ap.add_argument("--phase", choices=["all", "list", "fill"], default="all")
    ap.add_argument("--cprofile", choices=["list", "fill", "change"])
    ap.add_argument("--tracemalloc", action="store_true", help="top allocations after the fill")
    ap.add_argument("--top", type=int, default=20)
    ap.add_argument("--writer", choices=["null", "maps"], default="null",
                    help="null (default): the agent's own cost only; maps: the real MapWriter "
                         "on in-memory maps (adds the writer's Python cost, not the syscalls)")
    args = ap.parse_args()
    global WRITER
    WRITER = args.writer
    n, e = args.services, args.endpoints

    # What the real agent imports of the client (leanly, kube/lean.py): count it in the baseline.
    from kproxy_ebpf.kube.client import make_api_client
    from kproxy_ebpf.kube.reflector import list_function
    api = make_api_client(master="127.0.0.1:1")
    for resource in ("services", "endpointslices"):
        list_function(api, resource)
    base = rss_mib()
    out: dict = {"services": n, "endpoints": e, "rss_imports_mib": round(base, 1),
                 "rss_anon_imports_mib": round(rss_mib("RssAnon"), 1)}
    prof = cProfile.Profile()
    if args.tracemalloc:
        tracemalloc.start(8)

    if args.phase in ("all", "list"):
        if args.cprofile == "list":
            prof.enable()
        res = phase_list(n, e)
        prof.disable()
        agent = res.pop("agent")
        out.update(res)
        gc.collect()
        out["rss_after_list_mib"] = round(rss_mib(), 1)
        del agent
    if args.phase in ("all", "fill"):
        if args.cprofile == "fill":
            prof.enable()
        res = phase_fill(n, e, args.events_per_sync, args.syncs_per_full)
        prof.disable()
        agent, refl, rv = res.pop("agent"), res.pop("refl"), res.pop("rv")
        out.update(res)
        gc.collect()
        out["rss_after_fill_mib"] = round(rss_mib(), 1)
        out["rss_anon_after_fill_mib"] = round(rss_mib("RssAnon"), 1)
        if args.tracemalloc:
            snap = tracemalloc.take_snapshot()
            print(f"tracemalloc: {sum(s.size for s in snap.statistics('filename')) / 2**20:.1f} "
                  "MiB traced after the fill")
            for stat in snap.statistics("lineno")[: args.top]:
                print(f"  {stat.size / 2**20:7.1f} MiB {stat.count:8d}  {stat.traceback[0]}")
        if args.cprofile == "change":
            prof.enable()
        out.update(phase_change(agent, refl, n, e, rv, args.changes))
        prof.disable()
    print(json.dumps(out))
    if args.cprofile:
        pstats.Stats(prof, stream=sys.stderr).sort_stats("cumulative").print_stats(args.top)
        pstats.Stats(prof, stream=sys.stderr).sort_stats("tottime").print_stats(args.top)


if __name__ == "__main__":
    os.environ.setdefault("PYTHONHASHSEED", "0")
    main()
