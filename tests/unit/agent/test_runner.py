"""The sync schedule, driven by a fake clock (no sleeping)."""
import pytest

from kproxy_ebpf.agent.runner import Schedule


def run_at(s: Schedule, now: float, ok: bool = True) -> bool:
    at, full = s.due(now)
    assert at <= now, f"not due yet at {now} (due {at})"
    s.started(now, full)
    s.finished(ok)
    return full


def test_first_sync_is_full_and_immediate():
    s = Schedule(min_interval=1, max_interval=30)
    assert s.due(100.0) == (100.0, True)


def test_change_after_idle_syncs_at_once():
    s = Schedule(min_interval=1, max_interval=30)
    run_at(s, 0.0)
    s.request()
    assert s.due(10.0) == (10.0, False)


def test_burst_is_coalesced_to_min_interval():
    s = Schedule(min_interval=1, max_interval=30)
    run_at(s, 0.0)
    s.request()
    run_at(s, 0.1 + 0.9)
    for _ in range(50):          # a burst right after a sync
        s.request()
    at, full = s.due(1.05)
    assert at == pytest.approx(2.0) and not full


def test_periodic_full_resync():
    s = Schedule(min_interval=1, max_interval=30)
    run_at(s, 0.0)
    assert s.due(5.0) == (30.0, True)
    s.request()
    run_at(s, 10.0)              # a partial sync does not push the full one back
    assert s.due(11.0) == (30.0, True)


@pytest.mark.parametrize("failures,delay", [(1, 0.5), (2, 1.0), (3, 2.0), (10, 30.0)])
def test_failed_sync_retries_with_backoff(failures, delay):
    s = Schedule(min_interval=0.1, max_interval=300, retry_base=0.5, retry_cap=30)
    run_at(s, 0.0)
    for _ in range(failures):
        s.request()
        at, _ = s.due(s.last_run)
        run_at(s, max(at, s.last_run), ok=False)
    start = s.last_run
    assert s.due(start)[0] == pytest.approx(start + delay)
    run_at(s, start + delay, ok=True)
    assert s.failures == 0


def test_a_periodic_sync_does_not_hold_back_the_next_change():
    s = Schedule(min_interval=0.2, max_interval=30)
    run_at(s, 0.0)
    s.request()
    run_at(s, 5.0)               # a change
    assert run_at(s, 30.0)       # the periodic sync, nothing requested
    s.request()                  # a change 10 ms after it: synced at once
    assert s.due(30.01) == (30.01, False)
    run_at(s, 30.01)
    s.request()                  # the next change is spaced from the last change's sync
    assert s.due(30.05)[0] == pytest.approx(30.21)
