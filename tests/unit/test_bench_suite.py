"""The benchmark suite's own logic (no lab)."""
from kproxy_ebpf.bench.suite import next_write_ns


def test_m5_pacing_never_writes_inside_the_sync_interval():
    s = 10**9
    # A fast sync (30 ms): wait out the interval from "seen" (the sync may have started then).
    assert next_write_ns(0, 30_000_000, 1.0) == 30_000_000 + int(1.1 * s)
    # A sync longer than the interval: the next change follows as soon as this one is seen.
    assert next_write_ns(0, 6 * s, 1.0) == 6 * s + 50_000_000
    # In between: write + interval + margin, earlier than seen + interval.
    assert next_write_ns(0, int(0.9 * s), 1.0) == int(1.6 * s)
    # kproxy's 0.2 s interval: the margin never beats seen + 0.22 s for a 5 ms change.
    assert next_write_ns(0, 5_000_000, 0.2) == 5_000_000 + 220_000_000
