"""The change-cost run's goals and page (bench/change_report.py) from a hand-made results
document: every figure is the run's, each goal met, missed or not measured as it says."""
from __future__ import annotations

from kproxy_ebpf.dev.bench import change_report, report


def cell(ms: float) -> dict:
    return {"ms_per_change": ms, "ms_min": ms * 0.9, "ms_max": ms * 1.1}


def per(paced: float, bursts: float) -> dict:
    return {"paced": cell(paced), "bursts": cell(bursts), "idle_mcpu": 1.0, "rss_mib": 60.0}


def doc() -> dict:
    return {"kind": "change-cost", "config": {"changes": 100, "rate": 4.0, "burst": 10},
            "environment": {"date": "2026-12-06T16:00:00Z"},
            "results": {"kproxy": {"100": {"5": per(1.6, 0.5), "100": per(1.7, 0.6)}},
                        "nftables": {"100": {"5": per(8.9, 6.5), "100": per(8.6, 7.5)}}}}


def test_each_density_and_pattern_against_nftables_and_the_spread_between_densities():
    rows = change_report.goals(doc())
    assert [r["status"] for r in rows] == ["met"] * 6
    assert rows[0]["goal"] == "CPU per change <= 1.0x nftables at N=100, 5 pods, paced"
    assert rows[0]["measured"] == "1.60 ms against 8.90 ms (0.18x)"
    assert rows[2]["measured"] == "1.60 ms with 5 pods, 1.70 ms with 100 (+6 %)"


def test_a_cost_that_grows_with_pods_misses_and_a_missing_mode_is_not_measured():
    d = doc()
    d["results"]["kproxy"]["100"]["100"] = per(136.9, 27.0)
    rows = {r["goal"]: r["status"] for r in change_report.goals(d)}
    assert rows["CPU per change <= 1.0x nftables at N=100, 100 pods, paced"] == "missed"
    assert rows["kproxy within 20 % between 5 and 100 pods, N=100, paced"] == "missed"
    del d["results"]["nftables"]
    assert {r["status"] for r in change_report.goals(d)
            if "nftables" in r["goal"]} == {"not measured"}


def test_the_page_holds_the_table_and_the_goals(tmp_path):
    paths = report.write_change_cost(doc(), tmp_path)
    md = (tmp_path / "change-cost-latest.md").read_text()
    assert "| 100 | 5 | paced | 1.60 (1.44..1.76) | 8.90 (8.01..9.79) | 0.18x |" in md
    assert "| 100 | 100 | 1.0, 60.0 | 1.0, 60.0 |" in md
    assert md.count("| met |") == 6
    assert {p.name for p in paths} >= {"change-cost-latest.json", "change-cost-latest.md"}
