"""A connection held open in a lab target by probe.py (--keep), shared by the stale-socket
tests and the conformance scenarios that watch one connection across a change."""
from __future__ import annotations

from pathlib import Path

from kproxy_ebpf.dev.lab.cluster import Cluster
from kproxy_ebpf.dev.lab.namespaces import PROBE_SCRIPT
from kproxy_ebpf.dev.lab.probe import is_reply, stamped

from .support import wait_until


class Held:
    """probe.py holding one connection (--keep) in a lab target, ten attempts a second,
    each line stamped; read back from its log."""

    def __init__(self, c: Cluster, target: str, ip: str, port: int, name: str,
                 udp: bool = True, once: bool = False, interval: float = 0.1,
                 timeout: float = 0.3) -> None:
        argv = [c.lab.python, "-I", "-S", PROBE_SCRIPT, f"{ip}:{port}", "--keep", "--stamp",
                "--count", "100000", "--interval", str(interval), "--timeout", str(timeout)]
        argv += (["--udp"] if udp else []) + (["--once"] if once else [])
        self.c, self.rec = c, c.lab.spawn(target, argv, name)
        self.log = Path(c.lab.log_path(name))

    def lines(self) -> list[tuple[float, str]]:
        return stamped(self.log.read_text())

    def answers(self, since: float = 0.0) -> list[tuple[float, str]]:
        """(time, pod) of every reply after `since`."""
        return [(t, r.split()[0]) for t, r in self.lines() if t > since and is_reply(r)]

    def first_pod(self) -> str:
        return wait_until(lambda: next((p for _, p in self.answers()), None), 10,
                          f"a first answer in {self.log}")

    def answered_by(self, pods: set[str], since: float) -> float | None:
        """When the first answer from one of `pods` came after `since`."""
        return next((t for t, p in self.answers(since) if p in pods), None)

    def stop(self) -> None:
        self.c.lab.kill(self.rec.pid)

    def __enter__(self) -> Held:
        return self

    def __exit__(self, *exc) -> None:
        self.stop()
