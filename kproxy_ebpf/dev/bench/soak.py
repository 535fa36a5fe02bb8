"""`make soak` (issue 26): churn at 1000 Services under continuous probing from pods on both
nodes, in a lab cluster running kproxy.

What runs, for the whole soak:
* 1000 filler Services (fill.py: real Service and EndpointSlice objects, endpoints never
  contacted) under endpoint churn (Churner: one endpoint of one filler moves, FILLER_CHURN/s)
  and Service churn (a filler deleted and created again every SERVICE_CHURN_EVERY s);
* "stable": a Service of two pods (one per node) that never changes;
* "churn-0..2": Services of three pods each whose membership changes every MEMBER_FLIP_EVERY s
  (a pod relabelled out, or back in; at least one always in), through the EndpointSlice
  controller, as a rollout or a readiness flap would;
* a prober per client pod (node1, node2) and probed Service: a new TCP connection every
  PROBE_INTERVAL s, each answer stamped with the pod that gave it.

What it checks, from the probers' lines and the membership log the driver keeps:
* an answer from a pod that was not a member of that Service at that moment, beyond the
  propagation window (a member removed at t may still answer until the agents have applied
  it; the largest such lateness is the measured window, reported), is a wrong connection;
* a failed probe of "stable" (which never changed) is an unexpected failure; those of the
  churned Services are reported (none are expected: a removed pod still answers);
* the agents' RSS and CPU, sampled every SAMPLE_EVERY s, are flat: the last fifth's median RSS
  against the first fifth's (after the fill), and CPU seconds per minute in both.

The result is a JSON document; report_markdown() renders bench/results/reliability.md.
"""
from __future__ import annotations

import random
import statistics
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from kproxy_ebpf.dev.lab.cluster import Cluster
from kproxy_ebpf.dev.lab.namespaces import PROBE_SCRIPT
from kproxy_ebpf.dev.lab.probe import is_reply, stamped

from . import fill
from .procstat import ProxyMeter
from .rawapi import RawApi

NODES = ("node1", "node2")
CLIENTS = {"client1": "node1", "client2": "node2"}
CHURNED = ("churn-0", "churn-1", "churn-2")
PROBE_INTERVAL = 0.05
FILLER_CHURN = 20.0          # filler endpoint changes per second
SERVICE_CHURN_EVERY = 5.0    # a filler Service deleted and created again
MEMBER_FLIP_EVERY = 1.0      # one churned Service's membership changes
SAMPLE_EVERY = 10.0
WINDOW = 2.0                 # the propagation window allowed (the measured one is reported)
NAMESPACE = "default"


@dataclass
class SoakConfig:
    minutes: float = 30.0
    services: int = 1000
    endpoints: int = 3
    lab_name: str = "soak"
    seed: int = 26


class Membership:
    """When each pod was a member of each probed Service: (start, end or None) intervals."""

    def __init__(self) -> None:
        self._spans: dict[tuple[str, str], list[list[float | None]]] = {}
        self._lock = threading.Lock()

    def joined(self, service: str, pod: str, at: float) -> None:
        with self._lock:
            self._spans.setdefault((service, pod), []).append([at, None])

    def left(self, service: str, pod: str, at: float) -> None:
        with self._lock:
            self._spans[(service, pod)][-1][1] = at

    def lateness(self, service: str, pod: str, at: float) -> float | None:
        """0 if `pod` was a member at `at`; the time since it left if it had left (the
        answer came through state not yet updated); None if it never was before `at`."""
        with self._lock:
            spans = [s for s in self._spans.get((service, pod), ()) if s[0] <= at]
        if not spans:
            return None
        if any(end is None or end >= at for _, end in spans):
            return 0.0
        return at - max(end for _, end in spans)   # type: ignore[type-var]


@dataclass
class ProbeTally:
    attempts: int = 0
    failures: int = 0
    wrong: int = 0                   # answers from a pod that was no member (beyond WINDOW)
    max_lateness: float = 0.0        # answers from a pod that had just left
    samples: list[str] = field(default_factory=list)

    def to_json(self) -> dict:
        return {"attempts": self.attempts, "failures": self.failures, "wrong": self.wrong,
                "max_lateness_s": round(self.max_lateness, 3), "samples": self.samples[:5]}


def _service(c: Cluster, name: str, app: str) -> str:
    from kubernetes import client

    body = {"apiVersion": "v1", "kind": "Service", "metadata": {"name": name},
            "spec": {"selector": {"app": app},
                     "ports": [{"name": "http", "port": 80, "targetPort": 8080}]}}
    return client.CoreV1Api(c.api()).create_namespaced_service(NAMESPACE, body).spec.cluster_ip


def _relabel(c: Cluster, pod: str, app: str) -> None:
    from kubernetes import client

    client.CoreV1Api(c.api()).patch_namespaced_pod(pod, NAMESPACE,
                                                   {"metadata": {"labels": {"app": app}}})


class Driver:
    """The changes to the probed Services and the fillers, and what they were when."""

    def __init__(self, c: Cluster, api: RawApi, cfg: SoakConfig, log: Callable[[str], None]):
        self.c, self.api, self.cfg, self.log = c, api, cfg, log
        self.rng = random.Random(cfg.seed)
        self.members = Membership()
        self.current = {s: {f"{s}-p{j}" for j in range(3)} for s in CHURNED}
        self.counts = {"member_flips": 0, "service_recreations": 0, "errors": 0}
        self.errors: list[str] = []

    def start_members(self, at: float) -> None:
        for s, pods in self.current.items():
            for p in pods:
                self.members.joined(s, p, at)
        for p in ("stable-a", "stable-b"):
            self.members.joined("stable", p, at)

    def flip(self) -> None:
        s = self.rng.choice(CHURNED)
        pods = sorted(self.current[s])
        out = sorted({f"{s}-p{j}" for j in range(3)} - self.current[s])
        if out and (len(pods) == 1 or self.rng.random() < 0.5):
            pod = self.rng.choice(out)
            self.members.joined(s, pod, time.time())     # before: it cannot answer earlier
            _relabel(self.c, pod, s)
            self.current[s].add(pod)
        else:
            pod = self.rng.choice(pods)
            _relabel(self.c, pod, f"{s}-off")
            self.members.left(s, pod, time.time())       # after: the change is in by then
            self.current[s].discard(pod)
        self.counts["member_flips"] += 1

    def recreate_filler(self) -> None:
        i = self.rng.randrange(self.cfg.services)
        name = fill.filler_name(i)
        self.api.delete(fill.services_path(name))
        self.api.delete(fill.slices_path(f"{name}-kpbench"))
        fill.create_service(self.api, name, [fill.filler_address(i, j, self.cfg.endpoints)
                                             for j in range(self.cfg.endpoints)])
        self.counts["service_recreations"] += 1

    def run(self, until: float, stop: threading.Event) -> None:
        next_flip, next_svc = time.monotonic(), time.monotonic() + SERVICE_CHURN_EVERY
        while time.monotonic() < until and not stop.is_set():
            now = time.monotonic()
            try:
                if now >= next_flip:
                    self.flip()
                    next_flip += MEMBER_FLIP_EVERY
                if now >= next_svc:
                    self.recreate_filler()
                    next_svc += SERVICE_CHURN_EVERY
            except Exception as exc:  # noqa: BLE001 - counted and reported, the soak goes on
                self.counts["errors"] += 1
                self.errors.append(str(exc)[:200])
            stop.wait(max(0.0, min(next_flip, next_svc) - time.monotonic()))


def _tally(log_path: Path, service: str, members: Membership, t0: float,
           t1: float) -> ProbeTally:
    tally = ProbeTally()
    for at, result in stamped(log_path.read_text(), t0, t1):
        tally.attempts += 1
        if not is_reply(result):
            tally.failures += 1
            if len(tally.samples) < 5:
                tally.samples.append(f"{at:.3f} {result}")
            continue
        pod = result.split()[0]
        late = members.lateness(service, pod, at)
        if late is None or late > WINDOW:
            tally.wrong += 1
            if len(tally.samples) < 5:
                tally.samples.append(f"{at:.3f} {pod} (lateness {late})")
        else:
            tally.max_lateness = max(tally.max_lateness, late)
    return tally


def _flat(series: list[float]) -> dict:
    """The first and last fifth's medians of a series, and the growth between them."""
    k = max(1, len(series) // 5)
    first, last = statistics.median(series[:k]), statistics.median(series[-k:])
    return {"first": first, "last": last, "growth": last - first,
            "growth_pct": round(100 * (last - first) / first, 1) if first else None}


def _by_minute(series: list[tuple[float, int | None, float | None]]) -> list[float]:
    """The median RSS (MiB) of each minute of the run: the shape, not only its ends."""
    if not series:
        return []
    t0 = series[0][0]
    minutes: dict[int, list[float]] = {}
    for at, rss, _ in series:
        if rss is not None:
            minutes.setdefault(int((at - t0) // 60), []).append(rss / 2 ** 20)
    return [round(statistics.median(v), 1) for _, v in sorted(minutes.items())]


def run_soak(cfg: SoakConfig, log: Callable[[str], None]) -> dict:
    c = Cluster(cfg.lab_name)
    c.down()
    log(f"lab {cfg.lab_name}: 2 nodes, kproxy")
    c.up(nodes=2, proxy="kproxy")
    probers: list[tuple[int, str, str, Path]] = []
    try:
        for client_pod, node in CLIENTS.items():
            c.create_pod(client_pod, node)
        c.create_pod("stable-a", "node1", labels={"app": "stable"})
        c.create_pod("stable-b", "node2", labels={"app": "stable"})
        for s in CHURNED:
            for j in range(3):
                c.create_pod(f"{s}-p{j}", NODES[j % 2], labels={"app": s})
        ips = {"stable": _service(c, "stable", "stable")}
        ips.update({s: _service(c, s, s) for s in CHURNED})
        api = RawApi(c.info.admin_kubeconfig)
        fill.ensure_namespace(api)
        t_fill = time.monotonic()
        filled = fill.fill(api, 0, cfg.services, cfg.endpoints)
        log(f"filled {filled.created} Services x {cfg.endpoints} endpoints in "
            f"{time.monotonic() - t_fill:.0f} s")
        _wait_programmed(c, cfg.services + len(ips))
        driver = Driver(c, api, cfg, log)
        t0 = time.time()
        driver.start_members(t0 - 60)
        count = int(cfg.minutes * 60 / PROBE_INTERVAL) + 100
        for client_pod in CLIENTS:
            for svc, ip in ips.items():
                name = f"probe-{client_pod}-{svc}"
                rec = c.lab.spawn(f"pod/{client_pod}", [
                    c.lab.python, "-I", "-S", PROBE_SCRIPT, f"{ip}:80", "--count", str(count),
                    "--interval", str(PROBE_INTERVAL), "--timeout", "1", "--stamp"], name)
                probers.append((rec.pid, client_pod, svc, Path(c.lab.log_path(name))))
        meters = {n: ProxyMeter(c.proxy_pid(n), None) for n in NODES}
        samples: dict[str, list[tuple[float, int | None, float | None]]] = {n: [] for n in NODES}
        stop = threading.Event()
        until = time.monotonic() + cfg.minutes * 60
        log(f"soak: {cfg.minutes:g} min of churn under probes")
        with fill.Churner(api, FILLER_CHURN, _filler_change(cfg)) as churner:
            th = threading.Thread(target=driver.run, args=(until, stop), daemon=True)
            th.start()
            while time.monotonic() < until:
                for n, m in meters.items():
                    s = m.sample()
                    samples[n].append((s.at, m.rss(), s.proc))
                time.sleep(min(SAMPLE_EVERY, max(0.0, until - time.monotonic())))
            stop.set()
            th.join()
        t1 = time.time()
        for pid, *_ in probers:
            c.lab.kill(pid)
        tallies = {f"{client_pod} -> {svc}": _tally(path, svc, driver.members, t0 + 1, t1)
                   for _, client_pod, svc, path in probers}
        return _document(cfg, tallies, samples, driver, churner.result, t1 - t0)
    finally:
        problems = c.down()
        if problems:
            log(f"lab down left: {problems}")


def _filler_change(cfg: SoakConfig) -> Callable[[int], tuple[str, list]]:
    def change(k: int) -> tuple[str, list]:
        i = (k * 7919) % cfg.services
        return (fill.slices_path(f"{fill.filler_name(i)}-kpbench"),
                fill.replace_endpoint_op(k % cfg.endpoints, fill.churn_address(k)))
    return change


def _wait_programmed(c: Cluster, frontends: int, timeout: float = 180.0) -> None:
    def programmed(node: str) -> float:
        return next((float(line.split()[1]) for line in c.agent_metrics(node).splitlines()
                     if line.startswith("kproxy_frontends ")), 0.0)

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if all(programmed(n) >= frontends for n in NODES):
            return
        time.sleep(1)
    raise RuntimeError(f"the agents did not program {frontends} frontends in {timeout:.0f} s")


def _cpu_per_min(cpu: list[tuple[float, float]]) -> float | None:
    """CPU seconds per minute between the first and last of these samples."""
    if len(cpu) < 2 or cpu[-1][0] <= cpu[0][0]:
        return None
    return round((cpu[-1][1] - cpu[0][1]) / (cpu[-1][0] - cpu[0][0]) * 60, 2)


def _agent_summary(series: list[tuple[float, int | None, float | None]]) -> dict:
    """RSS (first and last fifth, by minute) and CPU (first and last fifth) of one agent."""
    rss = [r / 2 ** 20 for _, r, _ in series if r is not None]
    cpu = [(at, p) for at, _, p in series if p is not None]
    k = max(2, len(cpu) // 5)
    flat = ({key: round(v, 1) if isinstance(v, float) else v for key, v in _flat(rss).items()}
            if rss else None)
    return {"rss_mib": flat, "rss_mib_by_minute": _by_minute(series),
            "cpu_s_per_min": {"first": _cpu_per_min(cpu[:k]), "last": _cpu_per_min(cpu[-k:])},
            "samples": len(series)}


def _document(cfg: SoakConfig, tallies: dict[str, ProbeTally], samples: dict, driver: Driver,
              churn, seconds: float) -> dict:
    agents = {n: _agent_summary(series) for n, series in samples.items()}
    stable = [t for k, t in tallies.items() if k.endswith("-> stable")]
    from .env import collect

    doc = {
        "environment": collect(),
        "config": {"minutes": cfg.minutes, "services": cfg.services, "endpoints": cfg.endpoints,
                   "filler_churn_per_s": FILLER_CHURN, "service_churn_every_s": SERVICE_CHURN_EVERY,
                   "member_flip_every_s": MEMBER_FLIP_EVERY, "probe_interval_s": PROBE_INTERVAL,
                   "window_allowed_s": WINDOW},
        "seconds": round(seconds, 1),
        "probes": {k: t.to_json() for k, t in sorted(tallies.items())},
        "changes": {**driver.counts, "filler_endpoint_changes": churn.changes if churn else 0,
                    "filler_churn_errors": churn.errors if churn else 0,
                    "driver_errors": driver.errors[:5]},
        "propagation_window_s": round(max((t.max_lateness for t in tallies.values()),
                                          default=0.0), 3),
        "agents": agents,
    }
    doc["verdict"] = {
        "wrong_connections": sum(t.wrong for t in tallies.values()),
        "unexpected_failures": sum(t.failures for t in stable),
        "churned_failures": sum(t.failures for k, t in tallies.items()
                                if not k.endswith("-> stable")),
        "rss_flat": all(a["rss_mib"] is not None and a["rss_mib"]["growth"] < max(
            8.0, 0.05 * a["rss_mib"]["first"]) for a in agents.values()),
    }
    return doc


def soak_passed(doc: dict) -> bool:
    v = doc["verdict"]
    return v["wrong_connections"] == 0 and v["unexpected_failures"] == 0 and v["rss_flat"]


def report_markdown(doc: dict) -> str:
    v, cfg = doc["verdict"], doc["config"]
    lines = [
        "# Reliability: the churn soak (`make soak`)",
        "",
        "Written by `kproxy_ebpf/dev/bench/soak.py` (`kproxy-ebpf bench --soak MINUTES`); the "
        "design and the checks are in its opening comment. Run "
        f"{doc['environment'].get('date')} at commit "
        f"{(doc['environment'].get('git') or {}).get('commit', '?')}.",
        "",
        f"{cfg['minutes']:g} min ({doc['seconds']:.0f} s), {cfg['services']} filler Services x "
        f"{cfg['endpoints']} endpoints, filler endpoint churn {cfg['filler_churn_per_s']:g}/s, "
        f"a filler Service recreated every {cfg['service_churn_every_s']:g} s, a membership "
        f"change of a probed Service every {cfg['member_flip_every_s']:g} s; a new TCP "
        f"connection per prober every {cfg['probe_interval_s']:g} s from a pod on each node.",
        "",
        "| verdict | value |",
        "|---|---|",
        f"| connections to a pod that was no endpoint then (beyond {cfg['window_allowed_s']:g} s) "
        f"| {v['wrong_connections']} |",
        f"| failed connections to the Service that did not change | {v['unexpected_failures']} |",
        f"| failed connections to the churned Services | {v['churned_failures']} |",
        f"| propagation window measured (latest answer from a pod after it left) | "
        f"{doc['propagation_window_s']:.3f} s |",
        f"| agents' RSS flat | {'yes' if v['rss_flat'] else 'NO'} |",
        "",
        "| prober | attempts | failed | wrong pod | latest answer after leaving |",
        "|---|---|---|---|---|",
    ]
    for name, t in doc["probes"].items():
        lines.append(f"| {name} | {t['attempts']} | {t['failures']} | {t['wrong']} | "
                     f"{t['max_lateness_s']:.3f} s |")
    ch = doc["changes"]
    lines += ["", f"Changes made: {ch['member_flips']} membership changes, "
              f"{ch['service_recreations']} Service recreations, "
              f"{ch['filler_endpoint_changes']} filler endpoint changes "
              f"({ch['filler_churn_errors']} refused, {ch['errors']} driver errors).", "",
              "| agent | RSS first fifth (MiB) | RSS last fifth (MiB) | growth | CPU s/min first "
              "| CPU s/min last |", "|---|---|---|---|---|---|"]
    for n, a in doc["agents"].items():
        r = a["rss_mib"] or {}
        lines.append(f"| {n} | {r.get('first')} | {r.get('last')} | {r.get('growth')} MiB "
                     f"({r.get('growth_pct')} %) | {a['cpu_s_per_min']['first']} | "
                     f"{a['cpu_s_per_min']['last']} |")
    lines += ["", "RSS (MiB) by minute, the median of each minute's samples:", ""]
    lines += [f"* {n}: {' '.join(str(x) for x in a.get('rss_mib_by_minute', []))}"
              for n, a in doc["agents"].items()]
    return "\n".join(lines) + "\n"
