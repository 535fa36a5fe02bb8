"""The compiled load generator and server (kpbench_*.c beside this file, built by `make bench-tools`
into build/bench) run inside lab pods: the client in a pod of node1, whose cgroup is where
node1's kproxy hooks attach, so the client is translated exactly like a workload."""
from __future__ import annotations

import json
import select
import subprocess
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from kproxy_ebpf.dev.lab import procs
from kproxy_ebpf.dev.lab.namespaces import Lab
from kproxy_ebpf.dev.lab.nsutil import LabError

CLIENT = "kpbench-client"
SERVER = "kpbench-server"


class ProxyDied(LabError):
    """The proxy under measurement exited on its own."""


def find_tools(tools_dir: str | Path) -> dict[str, Path]:
    d = Path(tools_dir).resolve()
    found = {name: d / name for name in (CLIENT, SERVER)}
    missing = [str(p) for p in found.values() if not (p.is_file() and p.stat().st_mode & 0o111)]
    if missing:
        raise LabError(f"benchmark programs missing: {', '.join(missing)} (run `make bench-tools`)")
    return found


class Client:
    """Runs kpbench-client in one lab target (netns and cgroup): `pod/<name>`, or `ext` for
    the external client."""

    def __init__(self, lab: Lab, binary: Path, target: str, cpu: int | None):
        self.lab, self.binary, self.target, self.cpu = lab, binary, target, cpu

    def _argv(self, mode: str, addrs: Sequence[str], port: int, **opts) -> list[str]:
        argv = [str(self.binary), mode, "--addr", ",".join(addrs), "--port", str(port)]
        for key, value in opts.items():
            if value is not None:
                argv += [f"--{key.replace('_', '-')}", str(value)]
        if self.cpu is not None:
            argv += ["--cpu", str(self.cpu)]
        return argv

    def run(self, mode: str, addrs: Sequence[str], port: int, *, duration: float | None = None,
            count: int | None = None, threads: int = 1, timeout_ms: int = 1000,
            window: int | None = None) -> dict:
        """One crr/rr/stream/udp run; returns the client's JSON."""
        argv = self._argv(mode, addrs, port, duration=duration, count=count, threads=threads,
                          timeout_ms=timeout_ms, window=window)
        limit = (duration or 0) + (count or 0) * timeout_ms / 1000 + 60
        r = self.lab.exec(self.target, argv, capture_output=True, text=True, timeout=limit)
        if r.returncode != 0:
            raise LabError(f"{' '.join(argv)}: rc {r.returncode}: {r.stderr.strip()}")
        return json.loads(r.stdout)

    def watch(self, addrs: Sequence[str], port: int, interval_us: int = 500,
              timeout_ms: int = 200) -> Watcher:
        return Watcher(self.lab, self.target, self._argv("watch", addrs, port,
                                                      interval_us=interval_us,
                                                      timeout_ms=timeout_ms))


class Watcher:
    """A long-running `kpbench-client watch`: `expect(name)` returns the wall-clock time
    (ns) at which the first connection answered by `name` started ("*": any answer)."""

    def __init__(self, lab: Lab, target: str, argv: list[str]):
        t = lab.target(target)
        # The lab's trampoline joins the pod's cgroup and netns before exec, as lab.exec does;
        # a watcher needs a pipe both ways, which subprocess.run cannot give.
        self.p = subprocess.Popen(procs.trampoline(t.netns, t.cgroup, argv),
                                  stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                                  bufsize=1)
        line = self.p.stdout.readline()
        if '"ready"' not in line:
            self.close()
            raise LabError(f"watch client did not start: {line!r}")

    def send(self, name: str, max_wait: float) -> None:
        self.p.stdin.write(f"expect {name} {max_wait}\n")
        self.p.stdin.flush()

    def result(self, alive: Callable[[], bool] | None = None) -> dict:
        """The answer to the last command. With `alive`, the wait gives up (LabError) as
        soon as alive() turns false (the proxy being measured died), checked twice a second."""
        while alive is not None:
            ready, _, _ = select.select([self.p.stdout], [], [], 0.5)
            if ready:
                break
            if not alive():
                raise ProxyDied("the proxy exited while the watch client waited")
        line = self.p.stdout.readline()
        if not line:
            raise LabError("watch client exited")
        return json.loads(line)

    def expect(self, name: str, max_wait: float) -> dict:
        self.send(name, max_wait)
        return self.result()

    def close(self) -> None:
        if self.p.poll() is None:
            try:
                self.p.stdin.write("quit\n")
                self.p.stdin.flush()
            except OSError:
                pass
            try:
                self.p.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self.p.kill()
                self.p.wait()

    def __enter__(self) -> Watcher:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def start_server(lab: Lab, binary: Path, pod: str, port: int, sink_port: int,
                 cpu: int | None, delay_us: int = 0) -> int:
    """kpbench-server in the pod; with delay_us, a slow one (one worker, delay_us per
    request) whose process name carries its port."""
    argv = [str(binary), "--name", pod, "--port", str(port), "--sink-port", str(sink_port)]
    if cpu is not None:
        argv += ["--cpu", str(cpu)]
    if delay_us:
        argv += ["--delay-us", str(delay_us)]
    return lab.spawn(f"pod/{pod}", argv,
                     f"kpbench-server-{pod}" + (f"-{port}" if delay_us else "")).pid


def wait_answers(client: Client, addr: str, port: int, want: str | None,
                 timeout: float = 10.0) -> None:
    """Until one direct connection to addr answers (with `want` as the name if given)."""
    deadline = time.monotonic() + timeout
    last: dict = {}
    while time.monotonic() < deadline:
        last = client.run("crr", [addr], port, count=1, timeout_ms=200)
        if last["ok"] == 1 and (want is None or want in last["backends"]):
            return
        time.sleep(0.05)
    raise LabError(f"{addr}:{port} does not answer ({want}): {last}")
