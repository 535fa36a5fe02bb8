"""`make faults` (issue 26): control-plane faults under continuous probing, in a lab cluster
running kproxy, with the figures of each fault for bench/results/reliability.md.

What runs for the whole run: Service "stable" (a pod on each node) probed from a client pod on
each node by a new TCP connection every PROBE_INTERVAL s and by one held connection reused
every HELD_INTERVAL s; both agents' /healthz read every second.

The faults, one after the other; after each, a change (a new Service, or one made during the
fault where the API allows it) must reach the datapath, and the time it takes is the recovery:
* apiserver-restart: kube-apiserver stopped and started again;
* etcd-compaction-410: node1's agent frozen (SIGSTOP) while a Service is created, etcd compacted
  past what it has seen and the API server restarted, so its watches can only get 410 Gone: it
  relists (counted) when it thaws, and the recovery runs from the thaw;
* watch-blackholed: node1's connections to the API server stop delivering both ways without
  closing (nft drop rules for their ports inside node1's namespace, what a NAT or load balancer
  that lost its state does); a Service created then reaches node1 once the agent's
  watchProgressTimeout takes the streams as dead (`kproxy_api_watch_stalls_total`);
* watch-stalled: every connection the lab's API relay carries stops delivering while its TCP
  stays alive (lab/relay.py SIGUSR1: keepalives are still answered, as behind a proxy whose
  upstream hung); only the watchProgressTimeout ends such a stream;
* api-unreachable: kube-apiserver down for `outage_s`; the datapath must keep serving and keep
  every row (the frontend count is read during the outage), and converge after.

The result is a JSON document; report_markdown() renders its part of reliability.md.
"""
from __future__ import annotations

import os
import signal
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from kproxy_ebpf.dev.lab.cluster import Cluster
from kproxy_ebpf.dev.lab.namespaces import PROBE_SCRIPT
from kproxy_ebpf.dev.lab.probe import is_reply, stamped

NODES = ("node1", "node2")
CLIENTS = {"client1": "node1", "client2": "node2"}
BACKENDS = ("stable-a", "stable-b")
PROBE_INTERVAL = 0.05
HELD_INTERVAL = 0.1
NAMESPACE = "default"
FAULTS = ("apiserver-restart", "etcd-compaction-410", "watch-blackholed", "watch-stalled",
          "api-unreachable")
COUNTERS = ("kproxy_api_relists_total", "kproxy_api_watch_restarts_total",
            "kproxy_api_watch_stalls_total")


@dataclass
class FaultConfig:
    outage_s: float = 180.0                   # api-unreachable
    progress_timeout_s: float | None = None   # the agents' watchProgressTimeout; None: default
    lab_name: str = "faults"


@dataclass
class Window:
    """One fault: when it ran, what it did, how long the change took to reach each node."""
    name: str
    start: float = 0.0
    end: float = 0.0
    recovery_s: dict[str, float | None] = field(default_factory=dict)
    counters: dict[str, dict[str, float]] = field(default_factory=dict)   # node -> deltas
    notes: dict[str, object] = field(default_factory=dict)


def _service(c: Cluster, name: str) -> str:
    from kubernetes import client

    body = {"apiVersion": "v1", "kind": "Service", "metadata": {"name": name},
            "spec": {"selector": {"app": "stable"},
                     "ports": [{"name": "http", "port": 80, "targetPort": 8080}]}}
    return client.CoreV1Api(c.api()).create_namespaced_service(NAMESPACE, body).spec.cluster_ip


def _served(c: Cluster, client_pod: str, ip: str) -> bool:
    line = c.lab.probe(f"pod/{client_pod}", ip, 80, count=1, timeout=0.5)[0]
    return is_reply(line) and line.split()[0] in BACKENDS


def _await_served(c: Cluster, ip: str, nodes: tuple[str, ...], since: float,
                  timeout: float) -> dict[str, float | None]:
    """Seconds from `since` (a monotonic time) until ip answered on each node's client."""
    out: dict[str, float | None] = dict.fromkeys(nodes)
    clients = {n: pod for pod, n in CLIENTS.items()}
    deadline = since + timeout
    while time.monotonic() < deadline and any(v is None for v in out.values()):
        for n in nodes:
            if out[n] is None and _served(c, clients[n], ip):
                out[n] = round(time.monotonic() - since, 2)
        time.sleep(0.1)
    return out


def _counters(c: Cluster) -> dict[str, dict[str, float]]:
    """Per node, each counter of COUNTERS summed over its labels."""
    out = {}
    for n in NODES:
        sums = dict.fromkeys(COUNTERS, 0.0)
        for line in c.agent_metrics(n).splitlines():
            name = line.split("{", 1)[0].split(" ", 1)[0]
            if name in sums:
                sums[name] += float(line.rsplit(" ", 1)[1])
        out[n] = sums
    return out


def _frontends(c: Cluster, node: str) -> float:
    return next((float(line.split()[1]) for line in c.agent_metrics(node).splitlines()
                 if line.startswith("kproxy_frontends ")), 0.0)


class HealthLog:
    """Both agents' /healthz codes, once a second, stamped."""

    SCRIPT = ("import urllib.request, urllib.error\n"
              "try:\n print(urllib.request.urlopen('http://127.0.0.1:10256/healthz', "
              "timeout=1).status)\n"
              "except urllib.error.HTTPError as e: print(e.code)\n"
              "except Exception: print(0)\n")

    def __init__(self, c: Cluster) -> None:
        self.c, self.samples = c, []        # (time, node, code)
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self.stop.wait(1.0):
            for n in NODES:
                out = self.c.lab.exec(f"node/{n}", [sys.executable, "-c", self.SCRIPT],
                                      capture_output=True, text=True)
                code = int(out.stdout.strip() or 0) if out.returncode == 0 else 0
                self.samples.append((time.time(), n, code))

    def codes(self, t0: float, t1: float) -> dict[str, dict[str, int]]:
        out: dict[str, dict[str, int]] = {n: {} for n in NODES}
        for at, n, code in self.samples:
            if t0 <= at <= t1:
                out[n][str(code)] = out[n].get(str(code), 0) + 1
        return out


def api_port(c: Cluster) -> int:
    """The port lab nodes reach the API server on (the relay's, from their kubeconfig)."""
    import yaml

    with open(c.info.lab_kubeconfig) as f:
        server = yaml.safe_load(f)["clusters"][0]["cluster"]["server"]
    return int(server.rsplit(":", 1)[1])


def _api_ports(c: Cluster, node: str, port: int) -> list[int]:
    """Local ports of the node's established TCP connections to the API server's port."""
    script = ("for line in open('/proc/net/tcp').read().splitlines()[1:]:\n"
              " f = line.split()\n"
              f" if f[3] == '01' and int(f[2].split(':')[1], 16) == {port}:\n"
              "  print(int(f[1].split(':')[1], 16))\n")
    out = c.lab.exec(f"node/{node}", [sys.executable, "-c", script], capture_output=True,
                     text=True, check=True).stdout
    return sorted({int(p) for p in out.split()})


def _blackhole(c: Cluster, node: str, ports: list[int], api: int) -> None:
    ports_set = ", ".join(str(p) for p in ports)
    rules = (f"table inet kpfault {{\n"
             f" chain out {{ type filter hook output priority 0; "
             f"tcp sport {{ {ports_set} }} tcp dport {api} drop; }}\n"
             f" chain in {{ type filter hook input priority 0; "
             f"tcp dport {{ {ports_set} }} tcp sport {api} drop; }}\n}}\n")
    c.lab.exec(f"node/{node}", ["nft", "-f", "-"], input=rules, text=True, check=True)


def _unblackhole(c: Cluster, node: str) -> None:
    c.lab.exec(f"node/{node}", ["nft", "delete", "table", "inet", "kpfault"],
               capture_output=True, text=True)


class Faults:
    def __init__(self, c: Cluster, cfg: FaultConfig, log: Callable[[str], None]) -> None:
        self.c, self.cfg, self.log = c, cfg, log
        self.timeout = 60.0 + (cfg.progress_timeout_s or 150.0)
        self.n = 0

    def _change(self) -> str:
        self.n += 1
        return _service(self.c, f"after-{self.n}")

    def apiserver_restart(self, w: Window) -> None:
        w.notes["apiserver_start_s"] = round(self.c.restart_apiserver(), 2)
        t = time.monotonic()
        ip = self._change()
        w.recovery_s = _await_served(self.c, ip, NODES, t, self.timeout)

    def etcd_compaction_410(self, w: Window) -> None:
        from kubernetes import client

        pid = self.c.proxy_pid("node1")
        assert pid is not None
        os.kill(pid, signal.SIGSTOP)
        try:
            ip = self._change()
            core = client.CoreV1Api(self.c.api())
            for i in range(20):
                core.create_namespaced_config_map(NAMESPACE, {"metadata": {
                    "name": f"fault-{self.n}-{i}"}})
            w.notes["compacted_to"] = self.c.compact_etcd()
            self.c.restart_apiserver()
        finally:
            os.kill(pid, signal.SIGCONT)
        t = time.monotonic()
        w.recovery_s = _await_served(self.c, ip, ("node1",), t, self.timeout)

    def watch_blackholed(self, w: Window) -> None:
        api = api_port(self.c)
        ports = _api_ports(self.c, "node1", api)
        w.notes["connections_blackholed"] = len(ports)
        if not ports:
            raise RuntimeError("node1's agent holds no connection to the API server")
        _blackhole(self.c, "node1", ports, api)
        try:
            t = time.monotonic()
            ip = self._change()
            w.recovery_s = _await_served(self.c, ip, ("node1",), t, self.timeout)
        finally:
            _unblackhole(self.c, "node1")

    def watch_stalled(self, w: Window) -> None:
        pid = self.c.relay_pid()
        if pid is None:
            raise RuntimeError("the lab's API relay is not running")
        os.kill(pid, signal.SIGUSR1)
        t = time.monotonic()
        ip = self._change()
        w.recovery_s = _await_served(self.c, ip, NODES, t, self.timeout)

    def api_unreachable(self, w: Window) -> None:
        before = {n: _frontends(self.c, n) for n in NODES}
        self.c.stop_apiserver()
        try:
            time.sleep(self.cfg.outage_s / 2)
            w.notes["frontends_before"] = before
            w.notes["frontends_during"] = {n: _frontends(self.c, n) for n in NODES}
            time.sleep(self.cfg.outage_s / 2)
        finally:
            w.notes["apiserver_start_s"] = round(self.c.start_apiserver(), 2)
        w.notes["outage_s"] = self.cfg.outage_s
        t = time.monotonic()
        ip = self._change()
        w.recovery_s = _await_served(self.c, ip, NODES, t, self.timeout)


def _tally(path: Path, t0: float, t1: float) -> dict:
    attempts = failures = wrong = 0
    samples: list[str] = []
    for at, result in stamped(path.read_text(), t0, t1):
        attempts += 1
        if not is_reply(result):
            failures += 1
        elif result.split()[0] not in BACKENDS:
            wrong += 1
        else:
            continue
        if len(samples) < 3:
            samples.append(f"{at:.3f} {result}")
    return {"attempts": attempts, "failures": failures, "wrong": wrong, "samples": samples}


def run_faults(cfg: FaultConfig, log: Callable[[str], None]) -> dict:
    c = Cluster(cfg.lab_name)
    c.down()
    log(f"lab {cfg.lab_name}: 2 nodes, kproxy")
    c.up(nodes=2, proxy="kproxy")
    probers: list[tuple[int, str, str, Path]] = []
    health = HealthLog(c)
    try:
        if cfg.progress_timeout_s:
            env = {**os.environ, "KPROXY_WATCH_PROGRESS_TIMEOUT": f"{cfg.progress_timeout_s:g}s"}
            for n in NODES:
                c.stop_proxy(n)
                c.start_proxy(n, env=env)
        for client_pod, node in CLIENTS.items():
            c.create_pod(client_pod, node)
        for pod, node in zip(BACKENDS, NODES, strict=True):
            c.create_pod(pod, node, labels={"app": "stable"})
        ip = _service(c, "stable")
        got = _await_served(c, ip, NODES, time.monotonic(), 60)
        if None in got.values():
            raise RuntimeError(f"Service stable is not served on every node: {got}")
        faults = Faults(c, cfg, log)
        total = 3600 / PROBE_INTERVAL
        for client_pod in CLIENTS:
            for kind, interval, extra in (("new", PROBE_INTERVAL, []),
                                          ("held", HELD_INTERVAL, ["--keep"])):
                name = f"probe-{client_pod}-{kind}"
                rec = c.lab.spawn(f"pod/{client_pod}", [
                    c.lab.python, "-I", "-S", PROBE_SCRIPT, f"{ip}:80", "--count", str(int(total)),
                    "--interval", str(interval), "--timeout", "1", "--stamp", *extra], name)
                probers.append((rec.pid, client_pod, kind, Path(c.lab.log_path(name))))
        health.thread.start()
        time.sleep(2.0)
        windows = []
        for name in FAULTS:
            w = Window(name)
            before = _counters(c)
            log(f"fault: {name}")
            w.start = time.time()
            getattr(faults, name.replace("-", "_"))(w)
            time.sleep(2.0)                 # the probes' lines after the recovery
            w.end = time.time()
            after = _counters(c)
            w.counters = {n: {k.removeprefix("kproxy_api_").removesuffix("_total"):
                              after[n][k] - before[n][k] for k in COUNTERS} for n in NODES}
            log(f"  recovery {w.recovery_s}, counters {w.counters}")
            windows.append(w)
        health.stop.set()
        health.thread.join()
        for pid, *_ in probers:
            c.lab.kill(pid)
        return _document(cfg, windows, probers, health)
    finally:
        health.stop.set()
        problems = c.down()
        if problems:
            log(f"lab down left: {problems}")


def _document(cfg: FaultConfig, windows: list[Window], probers, health: HealthLog) -> dict:
    from .env import collect

    faults = []
    for w in windows:
        probes = {f"{client_pod} {kind}": _tally(path, w.start, w.end)
                  for _, client_pod, kind, path in probers}
        faults.append({"fault": w.name, "seconds": round(w.end - w.start, 1),
                       "recovery_s": w.recovery_s, "counters": w.counters,
                       "healthz": health.codes(w.start, w.end), "notes": w.notes,
                       "probes": probes})
    doc = {"environment": collect(),
           "config": {"outage_s": cfg.outage_s,
                      "watch_progress_timeout_s": cfg.progress_timeout_s or 150.0,
                      "probe_interval_s": PROBE_INTERVAL, "held_interval_s": HELD_INTERVAL},
           "faults": faults}
    doc["verdict"] = {
        "failed_connections": sum(p["failures"] for f in faults for p in f["probes"].values()),
        "wrong_connections": sum(p["wrong"] for f in faults for p in f["probes"].values()),
        "unrecovered": [f["fault"] for f in faults if None in f["recovery_s"].values()],
        "rows_lost_during_outage": [
            n for f in faults if f["fault"] == "api-unreachable"
            for n, v in f["notes"]["frontends_during"].items()
            if v < f["notes"]["frontends_before"][n]],
    }
    return doc


def faults_passed(doc: dict) -> bool:
    v = doc["verdict"]
    return not (v["failed_connections"] or v["wrong_connections"] or v["unrecovered"]
                or v["rows_lost_during_outage"])


def report_markdown(doc: dict) -> str:
    v, cfg = doc["verdict"], doc["config"]
    lines = [
        "# Reliability: control-plane faults (`make faults`)",
        "",
        "Written by `kproxy_ebpf/dev/bench/faults.py` (`kproxy-ebpf bench --faults`); the faults "
        "and the checks are in its opening comment. Run "
        f"{doc['environment'].get('date')} at commit "
        f"{(doc['environment'].get('git') or {}).get('commit', '?')}; watchProgressTimeout "
        f"{cfg['watch_progress_timeout_s']:g} s, API outage {cfg['outage_s']:g} s, a new TCP "
        f"connection every {cfg['probe_interval_s']:g} s and a held one used every "
        f"{cfg['held_interval_s']:g} s from a pod on each node to a Service of two pods.",
        "",
        f"Failed connections: {v['failed_connections']}; to a pod that was no endpoint: "
        f"{v['wrong_connections']}; faults the agents did not recover from: "
        f"{', '.join(v['unrecovered']) or 'none'}; rows lost while the API was away: "
        f"{', '.join(v['rows_lost_during_outage']) or 'none'}.",
        "",
        "| fault | s | new conn. (attempted / failed) | held conn. uses (attempted / failed) "
        "| change reached node1 / node2 after | relists | watch restarts | stalls | /healthz "
        "codes seen |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for f in doc["faults"]:
        new = [p for k, p in f["probes"].items() if k.endswith(" new")]
        held = [p for k, p in f["probes"].items() if k.endswith(" held")]
        rec = " / ".join("-" if f["recovery_s"].get(n, "-") == "-" else
                         ("never" if f["recovery_s"][n] is None else f"{f['recovery_s'][n]:.2f} s")
                         for n in NODES)
        ctr = {k: int(sum(c[k] for c in f["counters"].values()))
               for k in ("relists", "watch_restarts", "watch_stalls")}
        codes = "; ".join(f"{n} " + ", ".join(f"{code}x{k}" for code, k in sorted(c.items()))
                          for n, c in f["healthz"].items())
        lines.append(
            f"| {f['fault']} | {f['seconds']:.0f} | {sum(p['attempts'] for p in new)} / "
            f"{sum(p['failures'] + p['wrong'] for p in new)} | {sum(p['attempts'] for p in held)}"
            f" / {sum(p['failures'] + p['wrong'] for p in held)} | {rec} | {ctr['relists']} | "
            f"{ctr['watch_restarts']} | {ctr['watch_stalls']} | {codes} |")
    outage = next((f for f in doc["faults"] if f["fault"] == "api-unreachable"), None)
    if outage:
        n = outage["notes"]
        lines += ["", "During the outage the agents kept their frontends (before / halfway): "
                  + "; ".join(f"{node} {n['frontends_before'][node]:.0f} / "
                              f"{n['frontends_during'][node]:.0f}" for node in NODES) + "."]
    lines += ["", "A change is a new Service made once the fault ended (etcd-compaction-410: "
              "while node1's agent was frozen, timed from its thaw; watch-blackholed and "
              "watch-stalled: while the streams delivered nothing, timed from its creation). "
              "`-`: that node was not part of the fault. A blackholed connection (packets "
              "dropped) is ended by the API client's TCP keepalive (30 s idle + 3 x 10 s "
              "probes, kube/client.py) when that comes first, counted as a watch restart; a "
              "stalled one (TCP alive, nothing delivered) only by the watchProgressTimeout, "
              "counted as a stall. /healthz code 0: no answer (etcd-compaction-410 freezes "
              "node1's agent). After an outage the agents reconnect at their next retry: the "
              "watch backoff doubles from 0.5 s to at most 30 s (with jitter), as client-go's "
              "reflector (800 ms to 30 s) does for kube-proxy."]
    return "\n".join(lines) + "\n"
