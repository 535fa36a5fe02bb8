"""The benchmark suite's configuration (no lab)."""
from types import SimpleNamespace

from kproxy_ebpf.dev.bench import suite
from kproxy_ebpf.dev.bench.fill import ChurnResult, churn_summary
from kproxy_ebpf.dev.bench.suite import BenchConfig


def test_full_run_measures_iptables_on_nft_for_cold_start_only_beside_legacy():
    assert BenchConfig.make(False).cold_only == ["iptables"]
    # --quick leaves legacy out, so the nft backend is the iptables baseline, in full
    assert BenchConfig.make(True).cold_only == []
    assert BenchConfig.make(False, modes=["iptables", "kproxy"]).cold_only == []


def test_m5_takes_all_changes_unless_they_outlast_the_budget_then_the_minimum():
    cfg = BenchConfig.make(False)
    assert (cfg.m5_changes, cfg.m5_min_changes, cfg.m5_budget_s) == (50, 20, 100.0)
    assert cfg.another_change(49, 99.0) and not cfg.another_change(50, 10.0)
    # over the budget: on to the minimum, then no more
    assert cfg.another_change(19, 500.0) and not cfg.another_change(20, 101.0)
    assert cfg.another_change(20, 99.9)
    quick = BenchConfig.make(True)
    assert quick.another_change(4, 0.0) and not quick.another_change(5, 0.0)


class _Churn:
    """Stands in for fill.Churner: records whether a churn is on."""
    on = False

    def __init__(self, *args):
        self.result = ChurnResult(50.0, 10, 0, 1.5, 0.01)

    def __enter__(self):
        _Churn.on = True
        return self

    def __exit__(self, *exc):
        _Churn.on = False


class _Client:
    def __init__(self, quiet_p99, churn_p99):
        self.p99 = {False: list(quiet_p99), True: list(churn_p99)}
        self.calls = []

    def run(self, mode, addrs, port, duration):
        self.calls.append(_Churn.on)
        failed = 1 if _Churn.on else 0
        return {"connect_ns": {"p99": self.p99[_Churn.on].pop(0) * 1000}, "ok": 100,
                "failed": failed, "errors": {"ECONNRESET": failed} if failed else {}}


def test_m8_alternates_quiet_and_churn_windows_and_takes_the_median_pair_ratio(monkeypatch):
    monkeypatch.setattr(suite, "Churner", _Churn)
    monkeypatch.setattr(suite.time, "sleep", lambda s: None)
    client = _Client(quiet_p99=[50, 40, 100, 50], churn_p99=[55, 60, 100, 50])
    tb = SimpleNamespace(client=client, api=None, rolling_change=None, pods={"p": "10.0.0.1"},
                         target_set=["p"], wait_programmed=lambda timeout: 0.0)
    run = suite.ModeRun(tb, BenchConfig.make(False), "direct", 100, False, lambda m: None)
    run.connect_during_rolling_update()
    m8 = run.out["M8"]
    assert client.calls == [False, True] * 4
    # pair ratios 1.1, 1.5, 1.0, 1.0: the median is 1.05 (a drift between pairs cancels)
    assert m8["inflation"] == 0.05
    assert m8["pairs"] == [[50, 55], [40, 60], [100, 100], [50, 50]]
    assert (m8["connect_p99_us"], m8["connect_p99_us_quiet"]) == (57.5, 50)
    assert (m8["failed"], m8["connections"], m8["errors"]) == (4, 404, {"ECONNRESET": 4})
    assert m8["churn"]["changes"] == 40 and m8["churn"]["windows"] == 4


def test_churn_summary_adds_up_windows():
    a = ChurnResult(50.0, 75, 1, 1.5, 0.02, ["boom"])
    b = ChurnResult(50.0, 75, 0, 1.5, 0.05)
    s = churn_summary([a, b])
    assert (s["changes"], s["errors"], s["seconds"], s["achieved_per_s"]) == (150, 1, 3.0, 50.0)
    assert s["max_lateness_s"] == 0.05 and s["error_samples"] == ["boom"]
