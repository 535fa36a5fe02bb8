"""A partial sync does work proportional to the change, not to the cluster (issues 6 and 11).

The agent's real sync (SyncLoop.sync: ProxyState.compute, problem reports, metrics, the real
MapWriter on in-memory maps) runs one change at a time on a cluster of 100 and of 10,000
unchanged Services. What it does is counted, not timed:

- Services recomputed and frontends built by the policy code,
- problem evaluations (a walk of every Service for problems was O(N) per sync),
- reads of the desired table by the writer, and whether it iterated the whole table,
- the writer's map operations (put/delete on the fake maps),
- Python lines executed in the whole sync (catches any loop over the Services, wherever it is),
- the peak of memory allocated during the sync (catches C-level copies: dict(table), sorted(...)).

Every count must be the same for both cluster sizes (lines and memory within a small margin
for hash-order details); before the fix, the table copy and the problem walk made several of
them grow 100-fold.
"""
from __future__ import annotations

import dataclasses
import sys
import tracemalloc
from collections.abc import Mapping

import pytest

from kproxy_ebpf.agent import process_tuning, reporting, sync_policy, sync_report
from kproxy_ebpf.agent.agent import Agent
from kproxy_ebpf.agent.drift_watch import DriftWatch
from kproxy_ebpf.config import AgentConfig
from kproxy_ebpf.datapath.maps import layout as L
from kproxy_ebpf.datapath.write.cidr_writer import CidrWriter
from kproxy_ebpf.datapath.write.drift import DriftCheck
from kproxy_ebpf.datapath.write.programmed import Ledger
from kproxy_ebpf.datapath.write.writer import MapWriter
from kproxy_ebpf.model.objects import (
    EndpointPort,
    Kind,
    Node,
    Protocol,
    ServicePort,
)
from kproxy_ebpf.proxy import state as state_mod
from kproxy_ebpf.proxy.claims import Claims

from ...builders import ep, numbered_slice, numbered_svc, sl
from ...fakemaps import FakeMap

TCP = Protocol.TCP
NODE = "node-a"


class CountingTable(Mapping):
    """The desired table as the writer sees it, counting what it reads."""

    def __init__(self, table: Mapping, counts: dict) -> None:
        self.table, self.counts = table, counts

    def __getitem__(self, key):
        self.counts["table_reads"] += 1
        return self.table[key]

    def __contains__(self, key) -> bool:
        self.counts["table_reads"] += 1
        return key in self.table

    def __iter__(self):
        self.counts["table_walks"] += 1
        return iter(self.table)

    def __len__(self) -> int:
        return len(self.table)


class Harness:
    def __init__(self, n: int, monkeypatch) -> None:
        cfg = AgentConfig(hostname_override=NODE, cgroup="/nonexistent/kproxy-unit",
                          bpffs_dir="/nonexistent/kproxy-unit", healthz_bind_address="",
                          metrics_bind_address="")  # never loaded: the writer gets fake maps
        self.agent = Agent(cfg)
        self.maps = {name: FakeMap(spec, max_entries=100_000) for name, spec in L.MAPS.items()
                     if name in ("svc", "backend", "meta", "clusterip", "servicecidr", "svcstat")}
        self.agent.node.sock.maps = self.maps
        self.agent.node.writer = MapWriter(self.maps)
        self.agent.node.cidrs = CidrWriter(self.maps)
        self.counts = dict.fromkeys(("recomputed", "frontends", "problem_evals", "table_reads",
                                     "table_walks"), 0)
        self._spy(monkeypatch)
        self.agent.sink.replace(Kind.NODE, [Node(NODE, addresses=("192.168.0.1",))])
        # Unchanged Services: one with a problem (a bad port), the rest healthy.
        self.agent.sink.replace(Kind.SERVICE, [numbered_svc(i) for i in range(n)]
                           + [numbered_svc(n, ports=(ServicePort("x", TCP, 0),))])
        self.agent.sink.replace(Kind.ENDPOINT_SLICE, [numbered_slice(i) for i in range(n)])
        assert self.agent.loop.sync(True)
        assert len(self.agent.node.writer.programmed) == n

    def _spy(self, monkeypatch) -> None:
        counts = self.counts
        real_frontends, real_problems = state_mod.service_frontends, Claims._problems_of
        real_apply = MapWriter.apply

        def service_frontends(*args, **kw):
            fronts, probs = real_frontends(*args, **kw)
            counts["recomputed"] += 1
            counts["frontends"] += len(fronts)
            return fronts, probs

        def problems_of(claims, key):
            counts["problem_evals"] += 1
            return real_problems(claims, key)

        def apply(writer, desired, candidates=None, res=None):
            return real_apply(writer, CountingTable(desired, counts), candidates, res)

        monkeypatch.setattr(state_mod, "service_frontends", service_frontends)
        monkeypatch.setattr(Claims, "_problems_of", problems_of)
        monkeypatch.setattr(MapWriter, "apply", apply)
        # Row gauges are refreshed by time (ROW_COUNT_EVERY), never on a partial sync here.
        monkeypatch.setattr(sync_report, "ROW_COUNT_EVERY", float("inf"))

    def measure(self, change) -> dict:
        """Apply `change` (through the agent's sink) and one partial sync; what it cost."""
        for k in self.counts:
            self.counts[k] = 0
        ops_before = sum(len(m.ops) for m in self.maps.values())
        lines = 0

        def tracer(frame, event, arg):
            nonlocal lines
            if event == "line":
                lines += 1
            return tracer

        change(self.agent)
        tracemalloc.start()
        sys.settrace(tracer)
        try:
            assert self.agent.loop.sync(False)
        finally:
            sys.settrace(None)
            _, peak = tracemalloc.get_traced_memory()
            tracemalloc.stop()
        return {**self.counts, "map_ops": sum(len(m.ops) for m in self.maps.values()) - ops_before,
                "lines": lines, "peak_bytes": peak}


# A problem the policy finds (the second port is skipped): an address that is no IP is the
# API edge's to reject (kube/convert.py), and never reaches the agent's sync.
DUPLICATE_PORTS = (ServicePort("http", TCP, 80), ServicePort("again", TCP, 80))

CHANGES = {
    "endpoint turns unready": lambda a: a.sink.upsert(Kind.ENDPOINT_SLICE, numbered_slice(7, (True, False, True))),
    "endpoint added": lambda a: a.sink.upsert(Kind.ENDPOINT_SLICE, numbered_slice(7, (True, True, True, True))),
    "service added": lambda a: (a.sink.upsert(Kind.SERVICE, numbered_svc(20_000)),
                                a.sink.upsert(Kind.ENDPOINT_SLICE, numbered_slice(20_000))),
    "service deleted": lambda a: a.sink.delete(Kind.SERVICE, "ns", "svc-3"),
    "service gets a problem": lambda a: a.sink.upsert(Kind.SERVICE, numbered_svc(5, ports=DUPLICATE_PORTS)),
}


@pytest.fixture(scope="module")
def costs():
    """The cost of each change at 100 and at 10,000 unchanged Services."""
    mp = pytest.MonkeyPatch()
    try:
        out = {}
        for n in (100, 10_000):
            h = Harness(n, mp)
            out[n] = {name: h.measure(change) for name, change in CHANGES.items()}
        return out
    finally:
        mp.undo()


@pytest.mark.parametrize("change", list(CHANGES))
def test_partial_sync_work_does_not_grow_with_unchanged_services(costs, change):
    small, large = costs[100][change], costs[10_000][change]
    exact = ("recomputed", "frontends", "problem_evals", "table_reads", "table_walks", "map_ops")
    assert {k: large[k] for k in exact} == {k: small[k] for k in exact}
    assert large["table_walks"] == 0            # the writer never iterates the whole table
    assert large["recomputed"] <= 2             # only the changed Service(s)
    # Whole-sync measures: any loop over the Services or copy of the table is 100x here.
    assert large["lines"] <= small["lines"] * 1.2 + 50
    assert large["peak_bytes"] <= small["peak_bytes"] * 1.5 + 32_768


def test_the_changes_were_done(costs):
    """The counted syncs did real work (a test that counts nothing proves nothing)."""
    for change, cost in costs[10_000].items():
        assert cost["problem_evals"] >= 1, change
        if change != "service gets a problem":      # same frontends, only a new problem
            assert cost["map_ops"] > 0, change
        if change != "service deleted":             # nothing left to compute
            assert cost["recomputed"] >= 1, change


def test_problems_are_told_once_while_current_and_again_when_they_return(monkeypatch, caplog):
    """Incremental problem reports behave as the whole-list ones did."""
    h = Harness(3, monkeypatch)

    def told():
        return [r.getMessage() for r in caplog.records if "is listed twice" in r.getMessage()]

    bad, good = numbered_svc(1, ports=DUPLICATE_PORTS), numbered_svc(1)
    for change, expected in ((lambda a: a.sink.upsert(Kind.SERVICE, bad), 1),
                             (lambda a: a.sink.upsert(Kind.ENDPOINT_SLICE, numbered_slice(2, (False,))), 1),
                             (lambda a: a.sink.upsert(Kind.SERVICE, dataclasses.replace(bad, resource_version="2")), 1),
                             (lambda a: a.sink.upsert(Kind.SERVICE, good), 1),
                             (lambda a: a.sink.upsert(Kind.SERVICE, bad), 2)):
        h.measure(change)
        assert len(told()) == expected
    assert dict(h.agent.state.problem_counts()) == {"DuplicatePort": 1, "InvalidPort": 1}
    h.measure(lambda a: a.sink.delete(Kind.SERVICE, "ns", "svc-1"))
    assert dict(h.agent.state.problem_counts()) == {"InvalidPort": 1}
    assert set(h.agent.reporter.told) == {("ns", "svc-3")}


def test_a_full_map_is_retried_by_time_not_on_every_sync(monkeypatch, caplog):
    """Frontends that did not fit are retried at most every FULL_MAP_RETRY_EVERY seconds by
    partial syncs (full syncs diff everything), and the log says so in a bounded number of
    lines: at 10k Services a full map used to be retried and logged per frontend per sync."""
    candidates: list[set] = []
    real_apply = MapWriter.apply

    def apply(writer, desired, keys=None, res=None):
        candidates.append(None if keys is None else set(keys))
        return real_apply(writer, desired, keys, res)
    monkeypatch.setattr(MapWriter, "apply", apply)
    h = Harness.__new__(Harness)
    h.agent = Agent(AgentConfig(hostname_override=NODE, cgroup="/nonexistent/kproxy-unit",
                                bpffs_dir="/nonexistent/kproxy-unit"))
    h.maps = {name: FakeMap(spec, max_entries=5 * 4 if name == "svc" else 1000)
              for name, spec in L.MAPS.items()
              if name in ("svc", "backend", "meta", "clusterip", "servicecidr", "svcstat")}
    h.agent.node.sock.maps = h.maps
    h.agent.node.writer = MapWriter(h.maps)
    h.agent.node.cidrs = CidrWriter(h.maps)
    h.agent.sink.replace(Kind.SERVICE, [numbered_svc(i) for i in range(20)])
    h.agent.sink.replace(Kind.ENDPOINT_SLICE, [numbered_slice(i) for i in range(20)])
    assert not h.agent.loop.sync(True)                 # 5 of 20 fit (4 rows each)
    failed = set(h.agent.loop.policy.retry)
    assert len(failed) == 15 and h.agent.loop.policy.retry_map_full
    errors = [r for r in caplog.records if r.levelname == "ERROR"]
    assert len(errors) == reporting.ERROR_LINES + 1 and "15 more" not in errors[-1].getMessage()
    assert "raise their size" in errors[-1].getMessage()

    h.agent.sink.upsert(Kind.ENDPOINT_SLICE, numbered_slice(0, (True, False, True)))
    h.agent.loop.sync(False)
    assert candidates[-1] & failed == set()        # not retried 200 ms later
    assert h.agent.loop.policy.retry == failed          # ...and not forgotten
    h.agent.loop.policy.retry_at = 0.0                  # FULL_MAP_RETRY_EVERY has passed
    h.agent.sink.upsert(Kind.ENDPOINT_SLICE, numbered_slice(0))
    h.agent.loop.sync(False)
    assert failed <= candidates[-1]
    h.agent.sink.delete(Kind.SERVICE, "ns", "svc-0")  # room for one more (the writer deletes
    h.agent.loop.sync(False)                           # after it writes): the next retry gets it in
    h.agent.loop.policy.retry_at = 0.0
    h.agent.loop.sync(False)
    assert len(h.agent.loop.policy.retry) == 14 and h.agent.loop.policy.retry < failed


def drift_watch(h: Harness, found: list) -> DriftWatch:
    return DriftWatch(DriftCheck(h.agent.node.writer, h.agent.node.cidrs), h.agent.loop.lock,
                      h.agent.metrics, lambda lines: (found.append(lines),
                                                      h.agent.loop.kernel_drift(lines)))


def test_periodic_syncs_do_no_whole_table_work(monkeypatch):
    """At rest the runner's ticks cost what a partial sync with no change costs, whatever N
    is: no tick walks the table or re-reads the maps (the drift check does that in its own
    thread, below)."""
    h = Harness(30, monkeypatch)
    restores = []
    real = MapWriter.restore
    monkeypatch.setattr(MapWriter, "restore", lambda w: (restores.append(1), real(w)))
    for _ in range(2 * sync_policy.KERNEL_CHECK_EVERY):
        h.counts["table_walks"] = 0
        assert h.agent.loop.sync(True)                     # the runner's periodic tick
        assert h.counts["table_walks"] == 0
    assert restores == []
    h.agent.loop.policy.force_full = True                   # after a failure: full at once
    assert h.agent.loop.sync(False) and h.counts["table_walks"] > 0


def test_the_drift_check_finds_nothing_at_rest_and_a_row_changed_behind_the_agent(monkeypatch):
    h = Harness(5, monkeypatch)
    found: list = []
    watch = drift_watch(h, found)

    def value(name):
        return h.agent.metrics.registry.get_sample_value(name) or 0.0

    assert watch.run_once() == [] and found == []
    assert value("kproxy_datapath_drift_checks_total") == 1
    assert value("kproxy_datapath_drift_check_cpu_seconds_total") > 0
    svc = h.maps["svc"]
    slot = next(k for k in svc.rows if L.MAPS["svc"].key.from_buffer_copy(k).slot == 2)
    del svc.rows[slot]                                 # a row gone behind the agent's back
    restores = []
    real = MapWriter.restore
    monkeypatch.setattr(MapWriter, "restore", lambda w: (restores.append(1), real(w)))
    drift = watch.run_once()
    assert len(drift) == 1 and "frontend" in drift[0] and found == [drift]
    assert h.agent.loop.sync(False) and restores == [1]    # the next sync re-reads and rewrites
    assert slot in svc.rows
    assert watch.run_once() == []


def test_the_drift_check_frees_its_read_back_before_the_collector_returns(monkeypatch):
    """The read-back is emptied entry by entry while the cyclic GC is still paused (else its
    objects are the next collection's young generation, one long GIL hold); what the writer
    holds is not touched, and the GC is back on after the check."""
    import gc

    h = Harness(5, monkeypatch)
    seen = []
    real = DriftCheck.read

    def read(check):
        snap = real(check)
        seen.append(snap)
        return snap

    monkeypatch.setattr(DriftCheck, "read", read)
    released = []
    real_release = Ledger.release
    monkeypatch.setattr(Ledger, "release",
                        lambda led: (released.append(gc.isenabled()), real_release(led)))
    held = len(h.agent.node.writer.held.frontends)
    assert gc.isenabled() and drift_watch(h, []).run_once() == []
    assert released == [False] and gc.isenabled()
    (snap,) = seen
    assert not snap.ledger.frontends and not snap.ledger.backend_ids and not snap.cluster_ips
    assert held and len(h.agent.node.writer.held.frontends) == held


def test_syncs_while_the_drift_check_reads_are_no_drift(monkeypatch):
    """Changes written between the check's read and its comparison (the journal) are not
    drift; the journal ends with the check."""
    h = Harness(5, monkeypatch)
    check = DriftCheck(h.agent.node.writer, h.agent.node.cidrs)
    with h.agent.loop.lock:
        check.begin()
    snap = check.read()
    h.agent.sink.upsert(Kind.ENDPOINT_SLICE, numbered_slice(2, (True, False)))
    h.agent.sink.upsert(Kind.SERVICE, numbered_svc(6))
    h.agent.sink.upsert(Kind.ENDPOINT_SLICE, numbered_slice(6))
    assert h.agent.loop.sync(False)
    fronts, ips = check.suspects(snap)
    assert fronts                  # svc-2's record was rewritten in place: a suspect...
    with h.agent.loop.lock:
        assert check.confirm(snap, fronts, ips) == []  # ...and is theirs, not drift
    assert h.agent.node.writer.journal is None and h.agent.node.cidrs.journal is None


def test_full_sync_cpu_is_counted_and_partial_syncs_are_not(monkeypatch):
    """The benchmarks take kproxy's periodic work out of their per-change windows by this
    counter: every tick and full sync adds to it (the drift check too), a partial sync for
    a change does not."""
    h = Harness(3, monkeypatch)

    def value():
        return h.agent.metrics.registry.get_sample_value("kproxy_sync_full_cpu_seconds_total") or 0.0

    assert h.agent.loop.sync(True)
    after_full = value()
    assert after_full > 0
    h.agent.sink.upsert(Kind.ENDPOINT_SLICE, numbered_slice(0, (True, False, True)))
    assert h.agent.loop.sync(False)
    assert value() == after_full


def test_the_cyclic_gc_is_paused_until_the_first_sync(monkeypatch):
    """start() pauses the collector; the first sync ends the pause (the startup objects are
    frozen, not scanned), after the node is programmed; a later sync changes nothing."""
    import gc

    resumed = []
    real_resume = process_tuning.resume_gc
    monkeypatch.setattr(process_tuning, "resume_gc", lambda: resumed.append(1) or real_resume())
    h = Harness(3, monkeypatch)         # its first sync ran with the collector on: no pause
    assert gc.isenabled() and not resumed
    h.agent.loop.policy.synced_once = False  # as a fresh agent: start() pauses, the first sync ends it
    try:
        h.agent.pause_gc()
        assert not gc.isenabled()
        h.agent.sink.upsert(Kind.ENDPOINT_SLICE, numbered_slice(0, (True, False, True)))
        assert h.agent.loop.sync(False)
        assert gc.isenabled() and resumed == [1] and gc.get_freeze_count() > 0
        assert h.agent.loop.sync(True) and resumed == [1]
    finally:
        h.agent.gc_pause.resume()
        gc.unfreeze()           # the test process's objects go back to the collector
        gc.enable()


def test_the_gc_pause_ends_by_time_when_no_sync_comes(monkeypatch):
    """An API server that never answers must not keep the collector off."""
    import gc

    monkeypatch.setattr(process_tuning, "GC_PAUSE_MAX", 0.01)
    h = Harness(1, monkeypatch)
    h.agent.loop.policy.synced_once = False
    try:
        h.agent.pause_gc()
        assert h.agent.gc_pause.timer is not None
        h.agent.gc_pause.timer.join(5)
        assert gc.isenabled() and not h.agent.gc_pause.paused
    finally:
        gc.unfreeze()
        gc.enable()


def test_a_clusterip_row_outlives_its_frontends(monkeypatch):
    """A new Service's kp_cip row is written before its frontend and a deleted one's removed
    after it: a probe on a port the Service lacks is refused whenever another port answers
    (CI once saw EHOSTUNREACH in the window between the two writes)."""
    h = Harness(3, monkeypatch)
    order: list[str] = []
    for name in ("svc", "clusterip"):
        m = h.maps[name]
        for op in ("put", "delete"):
            real = getattr(m, op)
            monkeypatch.setattr(m, op, lambda *a, _r=real, _w=f"{op} {name}", **kw:
                                (order.append(_w), _r(*a, **kw))[1])
    h.measure(CHANGES["service added"])
    assert "put clusterip" in order and "put svc" in order
    assert order.index("put clusterip") < order.index("put svc")
    order.clear()
    h.measure(lambda a: a.sink.delete(Kind.SERVICE, "ns", "svc-1"))
    assert "delete clusterip" in order and "delete svc" in order
    assert order.index("delete svc") < order.index("delete clusterip")


def test_a_port_name_longer_than_the_maps_keep_is_no_drift(monkeypatch):
    """The maps keep 15 bytes of a port name (Service port names may have 63): the drift check
    compares names as the maps hold them, or every check found such a frontend drifted and
    had the next sync rewrite it."""
    h = Harness(2, monkeypatch)
    long = "a-port-name-of-30-characters-x"
    port = EndpointPort(long, Protocol.TCP, 8080)
    h.agent.sink.upsert(Kind.SERVICE, numbered_svc(7, ports=(ServicePort(long, Protocol.TCP, 80),)))
    h.agent.sink.upsert(Kind.ENDPOINT_SLICE, sl(ep("10.0.7.1", "node-b"), name="svc-7-abc",
                                                svc="svc-7", ports=(port,)))
    assert h.agent.loop.sync(False)
    found: list = []
    assert drift_watch(h, found).run_once() == [] and found == []
