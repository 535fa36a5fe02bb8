"""The scheduler bench (bench/schedulers.py, bench/sched_report.py) from hand-made results: the
rounds' order, the slow backend, the figures (medians over the rounds, shares of all the
connections), the interleaved cost's blocks and ratios, and each goal met, missed or not
measured as it says. No lab and no timing here: the run itself is `make schedulers`."""
from __future__ import annotations

import json

from kproxy_ebpf.dev.bench import report, sched_report, schedulers
from kproxy_ebpf.dev.bench.schedulers import SchedConfig, cost_service, delays, round_order


def run(p50: float, p99: float, backends: dict, connect_ns: float = 2000.0,
        cost: list | None = None) -> dict:
    return {"mode": "kproxy", "seconds": 10.0,
            "M1": {"connect_us": {"p50": 70.0, "p99": 200.0}, "failed": 0},
            "M2": {"rate_1": 3000.0, "rate_2": 4000.0, "failed": 0},
            "bpf_ns": {"kp_connect4": {"runs": 3000, "ns": connect_ns},
                       "kp_release": {"runs": 3000, "ns": 800.0}},
            "interleaved_cost": cost or [],
            "slow": {"requests": 1000, "failed": 0, "errors": {}, "rate": 300.0,
                     "latency_ms": {"p50": p50, "p99": p99}, "backends": backends}}


def block(e: int, ns: dict[str, float]) -> list[dict]:
    return [{"backends": e, "algorithm": a, "bpf_ns": {"kp_connect4": {"runs": 3000, "ns": v}}}
            for a, v in ns.items()]


EVEN = {"kpbench-be-00": 100, "kpbench-be-01": 100, "kpbench-be-02": 100}
AWAY = {"kpbench-be-00": 950, "kpbench-be-01": 950, "kpbench-be-02": 100}


def doc() -> dict:
    cost = (block(10, {"random": 2000.0, "round-robin": 2100.0, "least-conn": 2150.0})
            + block(3, {"random": 1000.0, "round-robin": 1000.0, "least-conn": 1050.0})
            + block(10, {"least-conn": 4300.0, "round-robin": 4000.0, "random": 4000.0}))
    return {"kind": "schedulers", "service": "kpbench-sched",
            "config": {"rounds": 2, "threads": 8, "seconds": 5.0, "endpoints": 10,
                       "m1_runs": 5, "m2_runs": 3, "cost_pairs": 2, "quick": False},
            "environment": {"date": "2026-12-07T03:00:00Z"},
            "delays_us": {"kpbench-be-00": 1000, "kpbench-be-01": 1000, "kpbench-be-02": 10000},
            "slow_backend": "kpbench-be-02",
            "rounds": [
                {"random": run(1.5, 80.0, EVEN, cost=cost), "round-robin": run(1.5, 78.0, EVEN),
                 "least-conn": run(2.6, 30.0, AWAY)},
                {"round-robin": run(1.4, 76.0, EVEN), "least-conn": run(2.4, 28.0, AWAY),
                 "random": run(1.3, 90.0, EVEN)}]}


def test_each_round_rotates_the_algorithms_so_each_runs_in_every_position():
    algs = ["random", "round-robin", "least-conn"]
    orders = [round_order(algs, r) for r in range(3)]
    assert orders[1] == ["round-robin", "least-conn", "random"]
    assert [o.index("least-conn") for o in orders] == [2, 1, 0]
    assert round_order(algs, 3) == algs


def test_one_of_three_backends_is_ten_times_slower_and_quick_shortens_the_run():
    assert delays(SchedConfig(fast_us=500)) == {
        "kpbench-be-00": 500, "kpbench-be-01": 500, "kpbench-be-02": 5000}
    quick = SchedConfig.make(True, rounds=None, threads=4)
    assert (quick.rounds, quick.threads, quick.cost_pairs) == (2, 4, 2)
    assert SchedConfig.make(False).rounds == 3
    assert cost_service("least-conn", 3) == "kpbench-alg-least-conn-3"
    assert schedulers.ALGORITHMS["least-conn"] == "kproxy-lc"


def test_summary_takes_medians_over_the_rounds_and_shares_over_all_connections():
    s = sched_report.summary(doc())
    assert list(s) == ["random", "round-robin", "least-conn"]      # random first
    assert s["random"]["p99_ms"] == 85.0 and s["random"]["p99_ms_rounds"] == [80.0, 90.0]
    assert s["least-conn"]["p50_ms"] == 2.5
    assert s["least-conn"]["shares"] == {"kpbench-be-00": 0.475, "kpbench-be-01": 0.475,
                                         "kpbench-be-02": 0.05}
    assert s["random"]["connect_ns"] == 2000.0 and s["random"]["release_ns"] == 800.0
    assert sched_report.shares({}) == {}


def test_the_interleaved_cost_is_the_median_of_ratios_within_each_block():
    blocks = sched_report.cost_blocks(doc())
    assert [e for e, _ in blocks] == [10, 3, 10]     # a repeated algorithm opens a block
    cost = sched_report.interleaved_cost(doc())
    assert list(cost) == [10, 3]
    # least-conn: 2150/2000 and 4300/4000, both 1.075; its ns median mixes the two minutes
    assert cost[10]["least-conn"] == {"ns": 3225.0, "blocks": 2, "ratio": 1.075}
    assert cost[10]["round-robin"]["ratio"] == 1.025
    assert cost[3]["random"]["ratio"] == 1.0


def test_goals_met_and_missed():
    rows = {g["goal"]: g for g in sched_report.goals(doc())}
    p99 = rows["slow-backend case: least-conn's p99 below random's (in every round)"]
    assert p99["status"] == "met"
    assert p99["measured"] == "below in 2 of 2 rounds: 30.0 vs 80.0 ms, 28.0 vs 90.0 ms"
    lc = rows["least-conn: connect cost (kp_connect4, 10 backends) <= 1.10 x random's"]
    assert lc["status"] == "met" and lc["measured"].startswith("1.075x (3225 ns against")
    d = doc()
    d["rounds"][1]["least-conn"]["slow"]["latency_ms"]["p99"] = 95.0
    d["rounds"][0]["random"]["interleaved_cost"][2]["bpf_ns"]["kp_connect4"]["ns"] = 2300.0
    rows = {g["goal"]: g["status"] for g in sched_report.goals(d)}
    assert rows["slow-backend case: least-conn's p99 below random's (in every round)"] == "missed"
    assert rows["least-conn: connect cost (kp_connect4, 10 backends) <= 1.10 x random's"] == (
        "missed")                                         # 2300/2000 and 1.075: median 1.1125
    for r in d["rounds"]:
        del r["least-conn"]
        r["random"]["interleaved_cost"] = []
    assert [g["status"] for g in sched_report.goals(d)] == ["not measured"]


def test_the_page_and_the_files(tmp_path):
    d = doc()
    paths = report.write_schedulers(d, tmp_path)
    assert [p.name for p in paths] == ["schedulers-latest.json", "schedulers-latest.md"]
    assert (tmp_path / "schedulers-latest-2026-12-07T030000Z.json").exists()
    stored = json.loads(paths[0].read_text())
    assert stored["summary"]["least-conn"]["p99_ms"] == 29.0
    assert stored["goals"][0]["status"] == "met"
    md = paths[1].read_text()
    assert "share kpbench-be-02 (10000 us, slow)" in md
    assert "| least-conn | 2.50 | 29.00 | 30.0, 28.0 | 47.5% | 47.5% | 5.0% | 300 | 0 |" in md
    assert "| random | 70.00 | 200.00 | 3000 | 4000 | 2000 | 800 | 3000 | 1.000x | 1000 | 1.000x |" in md
    assert "**met**" in md and "Maglev is not a row" in md
