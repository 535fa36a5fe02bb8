"""kube-proxy's leftovers on this node removed by the agent itself (`kubeProxyCleanup`), once
kube-proxy no longer runs here: the node-local half of a migration from kube-proxy.

Modes: `off` (the default: nothing is looked at), `dry-run` (the leftovers are listed in the
log, the gauge and an Event, nothing changes), `on` (they are removed, each one logged).

"kube-proxy no longer runs on this node" is decided on the node, every `interval` seconds
until the leftovers are gone, by two facts that must both hold:

1. No process named kube-proxy shares the agent's network namespace. The chart runs the agent
   with hostPID, so it sees the node's processes; kube-proxy runs with hostNetwork, so on its
   node it is in the same network namespace as the agent, and its rules are exactly the ones
   this namespace holds. Comparing namespaces, not just names, keeps kube-proxy of another
   network namespace (a kind node's, a VM's on a shared kernel) from counting.
2. The agent's healthz port is not held by another process (port_wait.py): kube-proxy listens
   on the same 10256, so an agent still waiting for its port most likely has kube-proxy beside
   it, under a name or in a pid namespace (1.) did not show.

Either fact alone has a gap: a kube-proxy binary renamed, or one run with another healthz
port. A process found but unreadable (its namespace link hidden) counts as running: removing
the rules of a running kube-proxy would only make it write them again, but the point of the
setting is that the agent never fights it. Nothing is removed before the agent's own first
sync: until then kube-proxy's rules may be what serves the node.
"""
from __future__ import annotations

import logging
import os
import threading
from collections.abc import Callable
from enum import StrEnum
from pathlib import Path

from prometheus_client import CollectorRegistry, Counter, Gauge

from . import kubeproxy_cleanup

log = logging.getLogger("kproxy_ebpf.agent")

PROCESS_NAME = "kube-proxy"
INTERVAL = 30.0


class Mode(StrEnum):
    OFF = "off"
    DRY_RUN = "dry-run"
    ON = "on"


def kube_proxy_pids(proc: Path = Path("/proc")) -> list[int]:
    """kube-proxy processes in this process's network namespace."""
    own = os.stat(proc / "self" / "ns" / "net")
    found = []
    for entry in proc.iterdir():
        if not entry.name.isdigit():
            continue
        try:
            if (entry / "comm").read_text().strip() != PROCESS_NAME:
                continue
        except OSError:
            continue                     # gone meanwhile
        try:
            ns = os.stat(entry / "ns" / "net")
        except FileNotFoundError:
            continue
        except OSError:
            found.append(int(entry.name))   # cannot tell: take it as ours
            continue
        if (ns.st_dev, ns.st_ino) == (own.st_dev, own.st_ino):
            found.append(int(entry.name))
    return sorted(found)


class Handover:
    """One check (check()) or a thread of them (start()) until the leftovers are gone."""

    def __init__(self, mode: Mode, registry: CollectorRegistry | None, *,
                 synced: Callable[[], bool], port_free: Callable[[], bool],
                 told: Callable[[str, str], None] | None = None,
                 cleanup: Callable[..., kubeproxy_cleanup.Report] = kubeproxy_cleanup.cleanup,
                 pids: Callable[[], list[int]] = kube_proxy_pids) -> None:
        self.mode = mode
        self.synced, self.port_free, self.told = synced, port_free, told
        self._cleanup, self._pids = cleanup, pids
        self.done = threading.Event()
        self._wake = threading.Event()
        self._said = ""
        self._errors_told: set[str] = set()
        self.running = Gauge("kproxy_kubeproxy_running",
                             "1 while kube-proxy is seen on this node (its process in the "
                             "agent's network namespace, or its healthz port held).",
                             registry=registry)
        self.leftovers = Gauge("kproxy_kubeproxy_leftovers",
                               "kube-proxy's leftovers (chains, tables, ipsets, devices) found "
                               "on this node at the last check; kubeProxyCleanup dry-run lists "
                               "them, on removes them.", registry=registry)
        self.removed = Counter("kproxy_kubeproxy_leftovers_removed",
                               "kube-proxy's leftovers the agent removed from this node.",
                               registry=registry)

    def start(self, stop: threading.Event, interval: float = INTERVAL) -> None:
        if self.mode is Mode.OFF:
            return

        def loop() -> None:
            while not stop.is_set() and not self._checked(interval):
                self._wake.wait(interval)
                self._wake.clear()

        threading.Thread(target=loop, name="kube-proxy-leftovers", daemon=True).start()

    def _checked(self, interval: float) -> bool:
        """check(), kept from ending the thread: an unforeseen failure (a tool missing from the
        image, say) is logged as a sentence and the check runs again later."""
        try:
            return self.check()
        except Exception as exc:  # noqa: BLE001
            log.error("kube-proxy's leftovers: the check failed (%s: %s); it runs again in %gs",
                      type(exc).__name__, exc, interval)
            return False

    def wake(self) -> None:
        """Check now, not at the next interval (the healthz port just came free; the agent
        stops)."""
        self._wake.set()

    def _say(self, message: str) -> None:
        """Logs a waiting reason once, not at every check."""
        if message != self._said:
            log.info("%s", message)
            self._said = message

    def check(self) -> bool:
        """One check; True once nothing is left to do (dry-run: once listed)."""
        if not self.synced():
            self._say("kube-proxy's leftovers: waiting for the agent's first sync")
            return False
        pids = self._pids()
        held = not self.port_free()
        self.running.set(1 if pids or held else 0)
        if pids or held:
            why = (f"kube-proxy runs in this network namespace (pid {', '.join(map(str, pids))})"
                   if pids else "another process holds the healthz port")
            self._say(f"kube-proxy's leftovers stay while {why}; checked again every "
                      f"{INTERVAL:g}s")
            return False
        dry = self.mode is Mode.DRY_RUN
        report = self._cleanup(dry_run=dry)
        for item in report.removed:
            log.info("kube-proxy leftover %s: %s", "found (dry-run)" if dry else "removed", item)
        for note in report.notes:
            log.info("kube-proxy leftovers: %s", note)
        for err in report.errors:
            if err not in self._errors_told:      # told once, not at every check
                log.warning("kube-proxy leftovers: could not remove: %s (tried again every "
                            "%gs)", err, INTERVAL)
        self._errors_told = set(report.errors)
        self.leftovers.set(len(report.removed) if dry else 0)
        if not dry:
            self.removed.inc(len(report.removed))
        if report.removed and self.told:
            self.told("KubeProxyLeftoversFound" if dry else "KubeProxyLeftoversRemoved",
                      f"{'would remove' if dry else 'removed'} {len(report.removed)} of "
                      f"kube-proxy's leftovers: {', '.join(report.removed[:10])}"
                      + (", ..." if len(report.removed) > 10 else ""))
        if report.errors:
            return False                 # tried again at the next check
        log.info("kube-proxy's leftovers: %s", "listed (dry-run: nothing changed)" if dry else
                 "none left on this node" if not report.removed else "all removed")
        self.done.set()
        return True
