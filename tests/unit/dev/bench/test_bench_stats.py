"""The benchmark's statistics: percentiles, medians over runs, chi-square spread."""
import math

import pytest

from kproxy_ebpf.dev.bench import stats
from kproxy_ebpf.dev.bench.procstat import CpuSample, cpu_between, parse_cpu_stat, parse_stat


def test_percentile_nearest_rank():
    values = list(range(1, 101))            # 1..100
    assert stats.percentile(values, 50) == 50
    assert stats.percentile(values, 99) == 99
    assert stats.percentile(values, 99.9) == 100
    assert stats.percentile([7], 99) == 7
    assert stats.percentile([3, 1, 2], 50) == 2     # unsorted input
    with pytest.raises(ValueError):
        stats.percentile([], 50)


def test_median_and_median_of_runs():
    assert stats.median([3, 1, 2]) == 2
    assert stats.median([4, 1, 2, 3]) == 2.5
    runs = [{"p50": 10, "p99": 100}, {"p50": 12, "p99": 900}, {"p50": 11, "p99": 110}]
    # one disturbed run (p99 900) does not make the figure
    assert stats.median_of_runs(runs, ("p50", "p99")) == {"p50": 11, "p99": 110}
    assert stats.median_of_runs([], ("p50",)) == {}


def test_ratio():
    assert stats.ratio(2, 4) == 0.5
    assert stats.ratio(None, 4) is None
    assert stats.ratio(1, 0) is None


@pytest.mark.parametrize("x,dof,expected", [
    (3.841458820694124, 1, 0.05),      # the textbook 5 % critical values
    (16.918977604620448, 9, 0.05),
    (21.665994333461924, 9, 0.01),
    (9.0, 9, 0.4372),                   # the mean of chi2(9) is 9
    (0.5, 9, 0.99998),
])
def test_chi2_sf_matches_tables(x, dof, expected):
    assert stats.chi2_sf(x, dof) == pytest.approx(expected, rel=2e-3, abs=1e-4)


def test_chi2_sf_bounds():
    assert stats.chi2_sf(0, 3) == 1.0
    assert stats.chi2_sf(1e4, 9) < 1e-100
    with pytest.raises(ValueError):
        stats.chi2_sf(1, 0)


def test_spread_uniform_and_skewed():
    even = stats.spread({f"b{i}": 1000 for i in range(10)})
    assert even["chi2"] == 0 and even["p_value"] == 1.0 and even["max_deviation"] == 0
    skew = stats.spread({"a": 1500, "b": 500})
    assert skew["p_value"] < 1e-6
    assert skew["max_deviation"] == pytest.approx(0.5)


def test_spread_counts_missing_backends_as_zero_and_reports_strangers():
    r = stats.spread({"a": 100, "b": 100, "x": 5}, expected_names=["a", "b", "c"])
    assert r["backends"] == 3 and r["connections"] == 200 and r["unexpected"] == 5
    assert r["max_deviation"] == pytest.approx(1.0)      # "c" got nothing
    assert stats.spread({}, ["a"])["p_value"] is None


def test_merge_counts():
    assert stats.merge_counts([{"a": 1}, {"a": 2, "b": 3}]) == {"a": 3, "b": 3}


def test_proc_stat_parsing_counts_children():
    # comm with spaces and parentheses; utime..cstime are fields 14..17
    line = "42 (kube (proxy) x) S 1 42 42 0 -1 4194560 1 2 3 4 " + " ".join(
        str(v) for v in (100, 50, 300, 200)) + " 20 0 1 0 5 6 7"
    s = parse_stat(line)
    tck = s["utime"] / 100
    assert math.isclose(s["cutime"], 300 * tck) and math.isclose(s["cstime"], 200 * tck)
    assert parse_cpu_stat("usage_usec 1500\nuser_usec 1000\nnr_periods x\n") == \
        {"usage_usec": 1500, "user_usec": 1000}


def test_cpu_between_prefers_cgroup():
    a, b = CpuSample(0.0, 1.0, 10.0), CpuSample(2.0, 2.0, 13.0)
    c = cpu_between(a, b)
    assert c["cpu_s"] == 3.0 and c["source"] == "cgroup" and c["cores"] == 1.5
    assert c["cpu_s_proc"] == 1.0
    c = cpu_between(CpuSample(0.0, 1.0, None), CpuSample(2.0, 2.0, None))
    assert c["cpu_s"] == 1.0 and c["source"] == "proc"


def test_median_ci_is_the_sign_tests_interval():
    # n=15: the 4th and 12th values hold the median with 96.5 % (Binomial(15, 1/2) tails of
    # 1.76 % each); n=20: the 6th and 15th (95.9 %); five values cannot give 95 % at all.
    assert stats.median_ci(list(range(15, 0, -1))) == (4, 12)
    assert stats.median_ci(list(range(1, 21))) == (6, 15)
    assert stats.median_ci([1, 2, 3, 4, 5]) is None
    assert stats.median_ci([0.9, 0.95, 1.0, 1.02, 0.97, 0.99], level=0.9) == (0.9, 1.02)
