"""Tuning of the agent's own process: the C heap (glibc's arenas and malloc_trim) and the
cyclic garbage collector's pause over the cold start. Nothing here changes what is programmed;
it only keeps the agent's memory and latency in bounds (see docs/architecture.md).
"""
from __future__ import annotations

import ctypes
import ctypes.util
import gc
import logging
import os
import threading
import time

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
