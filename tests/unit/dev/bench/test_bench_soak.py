"""The soak's bookkeeping (kproxy_ebpf/dev/bench/soak.py): which answers are wrong, and when RSS
counts as flat. The soak itself runs in tests/integration/test_soak.py and `make soak`."""
from __future__ import annotations

from kproxy_ebpf.dev.bench.soak import WINDOW, Membership, _flat, _tally, soak_passed


def test_an_answer_is_judged_by_the_membership_at_its_moment():
    m = Membership()
    m.joined("s", "a", 100.0)
    m.left("s", "a", 110.0)
    m.joined("s", "a", 120.0)
    assert m.lateness("s", "a", 105.0) == 0.0             # a member then
    assert m.lateness("s", "a", 110.5) == 0.5             # just left: the window allows it
    assert m.lateness("s", "a", 118.0) == 8.0             # long gone: wrong
    assert m.lateness("s", "a", 125.0) == 0.0             # back in
    assert m.lateness("s", "a", 99.0) is None             # not yet a member: wrong
    assert m.lateness("s", "b", 105.0) is None            # never one


def test_the_tally_counts_failures_wrong_pods_and_the_lateness(tmp_path):
    m = Membership()
    m.joined("s", "a", 0.0)
    m.joined("s", "b", 0.0)
    m.left("s", "b", 10.0)
    log = tmp_path / "probe.log"
    log.write_text("\n".join([
        "1.000 a 10.244.1.10:4000",
        "2.000 TIMEOUT",
        f"{10 + WINDOW / 2:.3f} b 10.244.1.10:4001",       # late, within the window
        f"{10 + WINDOW + 1:.3f} b 10.244.1.10:4002",       # too late: wrong
        "3.000 c 10.244.1.10:4003",                         # never a member: wrong
        "99.000 a 10.244.1.10:4004",                        # after the window of the run
        "Traceback (most recent call last):",               # not a result line
    ]))
    t = _tally(log, "s", m, 0.5, 50.0)
    assert (t.attempts, t.failures, t.wrong) == (5, 1, 2)
    assert abs(t.max_lateness - WINDOW / 2) < 1e-6


def test_rss_is_flat_unless_its_last_fifth_grew():
    assert _flat([60.0] * 10)["growth"] == 0
    assert _flat([60.0] * 8 + [80.0, 80.0])["growth"] == 20.0


def test_the_soak_passes_only_with_no_wrong_connection_no_failure_and_flat_rss():
    ok = {"verdict": {"wrong_connections": 0, "unexpected_failures": 0, "rss_flat": True}}
    assert soak_passed(ok)
    for key, bad in (("wrong_connections", 1), ("unexpected_failures", 3), ("rss_flat", False)):
        assert not soak_passed({"verdict": {**ok["verdict"], key: bad}})


def test_rss_is_summarised_per_minute():
    from kproxy_ebpf.dev.bench.soak import _by_minute
    mib = 2 ** 20
    series = [(0.0, 60 * mib, 1.0), (30.0, 62 * mib, 2.0), (61.0, 64 * mib, 3.0),
              (90.0, None, 4.0), (125.0, 66 * mib, 5.0)]
    assert _by_minute(series) == [61.0, 64.0, 66.0]
