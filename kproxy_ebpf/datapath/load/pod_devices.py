"""Keeps the per-packet ClusterIP programs (kp_from_pod, kp_to_pod) on every pod-facing device.

Pods come and go, and a pod that starts and at once opens a connection to a ClusterIP must
find the programs already on its veth, so a thread watches the netns's links: every link
event (RTNLGRP_LINK) and every RESCAN_EVERY seconds it lists the links and attaches to those
whose name matches one of the configured globs (`podDevices`). pyroute2 may read several
events in one go and hand out one, so an event only triggers the listing; the listing is the
truth, and the periodic one bounds what a lost event could delay.

Each device is attached once per agent (tracked by ifindex and name); the first time, a
previous agent's program is replaced in place (atomic). A device seen to vanish is passed to
`forget` (tc.py: its defunct tcx pins go, one per deleted pod otherwise). A device that
vanishes between the listing and the attach is skipped; anything else is logged and retried
at the next listing, never fatal.
"""
from __future__ import annotations

import fnmatch
import logging
import select
import threading
from collections.abc import Callable, Iterable

log = logging.getLogger(__name__)

RESCAN_EVERY = 2.0          # seconds between two listings without any link event
DEFAULT_GLOBS = ("veth*", "cali*", "lxc*", "kpv*")   # bridge CNIs, Calico, Cilium, the lab


def matches(name: str, globs: Iterable[str]) -> bool:
    return any(fnmatch.fnmatchcase(name, g) for g in globs)


class PodDeviceWatcher:
    """attach(ipr, ifindex, name) puts the programs on one device; the watcher decides when.
    `runner` runs the loop (default: directly in the watcher's thread; tests pass one that
    enters the node's netns first)."""

    def __init__(self, globs: Iterable[str], attach: Callable[[object, int, str], None],
                 exclude: Iterable[str] = (), runner: Callable[[Callable[[], None]], None]
                 | None = None, forget: Callable[[int], object] | None = None):
        self.globs = tuple(globs)
        self.exclude = frozenset(exclude)
        self._attach = attach
        self._runner = runner or (lambda body: body())
        self._forget = forget
        self._stop = threading.Event()
        self._ready = threading.Event()
        self._error: BaseException | None = None
        self._thread: threading.Thread | None = None
        self.attached: dict[int, str] = {}     # ifindex -> name, attached by this agent

    def start(self, timeout: float = 30.0) -> None:
        """Starts watching; returns once every device present now is attached."""
        self._thread = threading.Thread(target=self._run, name="pod-devices", daemon=True)
        self._thread.start()
        if not self._ready.wait(timeout):
            raise RuntimeError("pod device watcher did not finish its first listing")
        if self._error is not None:
            raise RuntimeError(f"pod device watcher failed: {self._error}") from self._error

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
            self._thread = None

    def _run(self) -> None:
        try:
            self._runner(self._loop)
        except BaseException as exc:        # reported by start() or logged; never silent
            self._error = exc
            log.exception("pod device watcher stopped")
        finally:
            self._ready.set()

    def _loop(self) -> None:
        from pyroute2 import IPRoute
        from pyroute2.netlink.rtnl import RTMGRP_LINK

        with IPRoute() as events, IPRoute() as ipr:
            events.bind(groups=RTMGRP_LINK)    # before the first listing: no gap
            self.scan(ipr)
            self._ready.set()
            while not self._stop.is_set():
                readable, _, _ = select.select([events], [], [], RESCAN_EVERY)
                if readable:
                    events.get()
                self.scan(ipr)

    def scan(self, ipr) -> None:
        """Attaches to every matching device not attached yet; forgets vanished ones."""
        links = {link["index"]: link.get_attr("IFLA_IFNAME") for link in ipr.get_links()}
        for index in [i for i, name in self.attached.items() if links.get(i) != name]:
            del self.attached[index]
            if self._forget is not None:
                try:
                    self._forget(index)
                except Exception as exc:  # noqa: BLE001 (a leftover, retried at next start)
                    log.warning("could not clean up after device %d: %s", index, exc)
        for index, name in links.items():
            if index in self.attached or name in self.exclude or not matches(name, self.globs):
                continue
            try:
                self._attach(ipr, index, name)
            except Exception as exc:  # noqa: BLE001 (a device may vanish under us)
                if any(link["index"] == index for link in ipr.get_links()):
                    log.error("could not attach the ClusterIP programs to %s: %s", name, exc)
                continue
            self.attached[index] = name
            log.info("per-packet ClusterIP path on %s", name)
