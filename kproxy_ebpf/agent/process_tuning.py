"""Tuning of the agent's own process: the C heap (glibc's arenas and malloc_trim) and the
cyclic garbage collector's pause over the cold start. Nothing here changes what is programmed;
it only keeps the agent's memory and latency in bounds (see docs/design/memory.md).
"""
from __future__ import annotations

import ctypes
import ctypes.util
import gc
import logging
import os
import sys
import threading
import time
from contextlib import contextmanager

log = logging.getLogger(__name__)

M_ARENA_MAX = -8            # mallopt parameter (glibc malloc.h)
MALLOC_ARENAS = 2
# The cyclic GC is paused from start() until the first sync has programmed the node, at most
# this long (an API server that never answers must not let cyclic garbage pile up for good).
GC_PAUSE_MAX = 120.0


def _libc() -> ctypes.CDLL:
    return ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")


def release_heap() -> None:
    """Give freed C heap back to the kernel. bcc's compile (LLVM) frees ~50 MiB and a first LIST
    of a large cluster frees its JSON, but glibc keeps such memory in its arenas, so the
    agent's resident size would stay at its peak for good; malloc_trim returns what is free.
    A no-op where the C library has no malloc_trim (musl)."""
    try:
        _libc().malloc_trim(0)
    except (OSError, AttributeError):
        pass


def limit_malloc_arenas(arenas: int = MALLOC_ARENAS) -> None:
    """glibc gives each thread that meets contention an arena of its own, up to 8 per core,
    and memory freed in one arena serves only that arena, so the JSON pages each reflector
    thread decodes leave free heap scattered over several arenas that malloc_trim cannot
    always return. The agent's threads mostly wait on sockets: two arenas cost no measurable
    contention. Must run before the threads start; MALLOC_ARENA_MAX in the environment, if an
    operator sets it, wins."""
    if os.environ.get("MALLOC_ARENA_MAX"):
        return
    try:
        _libc().mallopt(M_ARENA_MAX, arenas)
    except (OSError, AttributeError):
        pass


def pause_gc() -> bool:
    """Pause Python's cyclic garbage collector; False if it was off already.

    A cold start allocates millions of objects that all stay alive (the LIST's JSON, the model
    objects, the desired table), and every 700 allocations CPython's collector scans the young
    ones, every so often all of them: at 10k Services x 10 endpoints that was a third of the
    compute and of the LIST's conversion, for no garbage found. Reference counting still frees
    everything that is not a cycle."""
    if not gc.isenabled():
        return False
    gc.disable()
    return True


def resume_gc() -> float:
    """End the pause; returns the CPU seconds spent. Everything the cold start made is frozen
    (gc.freeze: moved where no collection ever scans it) instead of collected: at 10k
    Services x 10 the collection scanned ~550,000 live objects for ~1,800 cyclic ones (import
    leftovers) and held the GIL for ~230 ms just after the node was programmed, so /metrics
    and /healthz answered late and the first change waited; later collections skip those
    objects too. The price is bounded: cycles among frozen objects are never freed, and the
    state's own objects (frozen dataclasses, tuples, strings) form none; replaced ones still
    go by reference counting."""
    cpu0 = time.thread_time()
    gc.freeze()
    gc.enable()
    return time.thread_time() - cpu0


@contextmanager
def collector_paused():
    """The cyclic GC off over a burst of short-lived allocations: the drift check's map
    read-back makes millions of acyclic tuples that reference counting frees, and they would
    otherwise trigger full collections of the whole heap, each holding the GIL while changes
    wait (~0.5 s at 50,000 Services)."""
    was = pause_gc()
    try:
        yield
    finally:
        if was:
            gc.enable()


# While a background thread holds the GIL for seconds of Python, a thread that wants it back
# waits up to the switch interval (5 ms by default) each time it gave it up, and a sync gives
# it up at every syscall (a map write, a netlink message): dozens of waits per sync.
BACKGROUND_SWITCH_S = 0.0005


@contextmanager
def sharing_the_gil():
    """The interpreter's switch interval shortened while a background thread computes, so the
    threads that serve changes get the GIL back within BACKGROUND_SWITCH_S."""
    old = sys.getswitchinterval()
    sys.setswitchinterval(min(old, BACKGROUND_SWITCH_S))
    try:
        yield
    finally:
        sys.setswitchinterval(old)


SLOW_FULL_GC_S = 0.05


class FullCollections:
    """Freezes what survives a slow full collection. The cold start's objects are frozen at
    the first sync (resume_gc), but a cluster filled later through watch events leaves its
    objects to the oldest generation, and every full collection then scans all of them: at
    50,000 Services one held the GIL for ~0.5 s. After a full collection that took longer
    than SLOW_FULL_GC_S, everything that survived it is live (the collection just removed the
    garbage), so nothing is garbage when it is frozen; later full collections scan only what
    came after. The price, as for the cold start's freeze: a cycle those objects form later
    is never freed (the state's frozen dataclasses, tuples and strings form none).
    The freeze itself runs in settle(), which the sync thread calls after each sync
    (gc.freeze() inside the collector's own callback is not for us to risk)."""

    _installed: FullCollections | None = None

    def __init__(self) -> None:
        self._t0 = 0.0
        self.pending = False
        self.frozen = 0

    @classmethod
    def install(cls) -> FullCollections:
        """The process's one watcher (gc.callbacks is process-wide)."""
        if cls._installed is None:
            cls._installed = cls()
            gc.callbacks.append(cls._installed._callback)
        return cls._installed

    def _callback(self, phase: str, info: dict) -> None:
        if info.get("generation") != 2:
            return
        if phase == "start":
            self._t0 = time.perf_counter()
        elif time.perf_counter() - self._t0 > SLOW_FULL_GC_S:
            self.pending = True

    def settle(self) -> None:
        if not self.pending:
            return
        self.pending = False
        gc.freeze()
        self.frozen += 1
        log.info("a full collection was slow: what survived it is frozen (%d objects now "
                 "never scanned)", gc.get_freeze_count())


class GcPause:
    """The collector's pause over the cold start: begun by pause(), ended by resume() (the
    first sync) or after GC_PAUSE_MAX seconds, whichever comes first; both are idempotent."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.paused = False
        self.timer: threading.Timer | None = None
        self.resume_cpu = 0.0               # CPU of the collection that ended the pause

    def pause(self) -> None:
        with self._lock:
            if pause_gc():
                self.paused = True
                self.timer = threading.Timer(GC_PAUSE_MAX, self.resume)
                self.timer.daemon = True
                self.timer.start()

    def resume(self) -> None:
        with self._lock:
            if not self.paused:
                return
            self.paused = False
            if self.timer is not None:
                self.timer.cancel()
            self.resume_cpu = resume_gc()
        log.info("cyclic GC resumed (startup objects frozen: %.0f ms CPU)", self.resume_cpu * 1000)
