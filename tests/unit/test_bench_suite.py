"""The benchmark suite's configuration (no lab)."""
from kproxy_ebpf.bench.suite import BenchConfig


def test_full_run_measures_iptables_on_nft_for_cold_start_only_beside_legacy():
    assert BenchConfig.make(False).cold_only == ["iptables"]
    # --quick leaves legacy out, so the nft backend is the iptables baseline, in full
    assert BenchConfig.make(True).cold_only == []
    assert BenchConfig.make(False, modes=["iptables", "kproxy"]).cold_only == []
