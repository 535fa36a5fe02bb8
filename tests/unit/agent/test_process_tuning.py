"""The collector's upkeep around the agent's large allocations (process_tuning.py): the drift
check's read-back with the collector paused, and a slow full collection's survivors frozen at
the next sync's end (gc.freeze stubbed: freezing the test process would be for good)."""
from __future__ import annotations

import gc
import time

from kproxy_ebpf.agent import process_tuning as pt


def test_a_slow_full_collection_freezes_its_survivors_at_the_next_settle(monkeypatch):
    frozen = []
    monkeypatch.setattr(gc, "freeze", lambda: frozen.append(1))
    watch = pt.FullCollections()
    watch._callback("start", {"generation": 1})
    watch._callback("stop", {"generation": 1})          # a young collection: nothing
    watch._callback("start", {"generation": 2})
    watch._callback("stop", {"generation": 2})          # a fast full one: nothing
    watch.settle()
    assert frozen == [] and not watch.pending
    watch._callback("start", {"generation": 2})
    time.sleep(pt.SLOW_FULL_GC_S + 0.01)
    watch._callback("stop", {"generation": 2})
    assert watch.pending and frozen == []               # not inside the collector's callback
    watch.settle()
    assert frozen == [1] and watch.frozen == 1 and not watch.pending


def test_the_collector_is_paused_only_where_it_ran_and_comes_back():
    assert gc.isenabled()
    with pt.collector_paused():
        assert not gc.isenabled()
    assert gc.isenabled()
    gc.disable()
    try:
        with pt.collector_paused():
            pass
        assert not gc.isenabled()                        # it was off: left off
    finally:
        gc.enable()


def test_one_watcher_per_process():
    assert pt.FullCollections.install() is pt.FullCollections.install()
    assert gc.callbacks.count(pt.FullCollections.install()._callback) == 1


def test_the_switch_interval_is_short_only_while_sharing():
    import sys

    before = sys.getswitchinterval()
    with pt.sharing_the_gil():
        assert sys.getswitchinterval() == pt.BACKGROUND_SWITCH_S
    assert sys.getswitchinterval() == before
