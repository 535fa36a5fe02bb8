"""The benchmark suite's configuration (no lab)."""
from kproxy_ebpf.bench.suite import BenchConfig


def test_full_run_measures_iptables_on_nft_for_cold_start_only_beside_legacy():
    assert BenchConfig.make(False).cold_only == ["iptables"]
    # --quick leaves legacy out, so the nft backend is the iptables baseline, in full
    assert BenchConfig.make(True).cold_only == []
    assert BenchConfig.make(False, modes=["iptables", "kproxy"]).cold_only == []


def test_m5_takes_all_changes_unless_they_outlast_the_budget_then_the_minimum():
    cfg = BenchConfig.make(False)
    assert (cfg.m5_changes, cfg.m5_min_changes, cfg.m5_budget_s) == (50, 20, 100.0)
    assert cfg.m5_more(49, 99.0) and not cfg.m5_more(50, 10.0)
    # over the budget: on to the minimum, then no more
    assert cfg.m5_more(19, 500.0) and not cfg.m5_more(20, 101.0)
    assert cfg.m5_more(20, 99.9)
    quick = BenchConfig.make(True)
    assert quick.m5_more(4, 0.0) and not quick.m5_more(5, 0.0)
