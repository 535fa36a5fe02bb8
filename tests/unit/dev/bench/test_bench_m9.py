"""M9 (NodePort from outside) and the kproxy-tc mode in the benchmark's report: figures,
ratios, goals, the M9 plot, the CPU-per-packet arithmetic and the NodePort Service objects.
The numbers are fixtures, not measurements."""
import pytest

from kproxy_ebpf.dev.bench import fill, goals, procstat, report, stats, suite

from .test_bench_report import by_goal, make_doc


def _m9(pps, softirq, crr=5000.0, rr=12000.0):
    return {"crr_rate": crr, "connect_us": {"p50": 60.0, "p99": 120.0},
            "rr_rate": rr, "rr_us": {"p50": 70.0, "p99": 140.0},
            "udp_rate": pps / 4, "udp_us": {"p50": 65.0, "p99": 130.0},
            "pps": pps, "softirq_ns_per_pkt": softirq, "failed": {"crr": 2, "udp": 0}}


def with_m9(doc, ours=(90000.0, 3000.0), ipt=(50000.0, 6000.0), direct=(100000.0, 2500.0)):
    for mode, (pps, cpu) in (("kproxy", ours), ("iptables", ipt), ("direct", direct),
                             ("nftables", (60000.0, 5000.0))):
        doc["results"][mode]["10000"]["M9"] = _m9(pps, cpu)
        doc["results"][mode]["100"]["M9"] = {"crr_rate": 4000.0}
    return doc


def test_m9_ratios_against_each_baseline():
    r = goals.ratios(with_m9(make_doc()))["10000"]
    assert r["m9_pps"] == {"iptables": 1.8, "nftables": 1.5, "direct": 0.9}
    assert r["m9_softirq"]["iptables"] == pytest.approx(0.5)
    assert r["m9_crr_rate"]["iptables"] == 1.0
    assert "m9_pps" not in goals.ratios(with_m9(make_doc()))["100"]   # largest N only


def test_m9_goals_met():
    # ours 99,000 pps at 2,600 ns per packet, plain forwarding 100,000 at 2,500
    rows = goals.evaluate(with_m9(make_doc(), ours=(99000.0, 2600.0)))
    pps = by_goal(rows, "NodePort pps")
    assert pps["status"] == "met" and "0.99x" in pps["measured"] and "1.04x" in pps["measured"]


@pytest.mark.parametrize("ours,why", [((97000.0, 2500.0), "pps 0.97x < 0.98x"),
                                      ((99000.0, 2700.0), "CPU 1.08x > 1.05x")])
def test_m9_goal_missed_on_either_half(ours, why):
    row = by_goal(goals.evaluate(with_m9(make_doc(), ours=ours)), "NodePort pps")
    assert row["status"] == "missed", why


def test_m9_goal_not_measured_without_direct():
    doc = with_m9(make_doc())
    del doc["results"]["direct"]["10000"]["M9"]
    assert by_goal(goals.evaluate(doc), "NodePort pps")["status"] == "not measured"


def test_m9_program_cost_goal_at_10k():
    doc = with_m9(make_doc())
    doc["results"]["kproxy"]["10000"]["M9"]["bpf_ns"] = {"kp_from_outside": {"ns": 282.0}}
    row = by_goal(goals.evaluate(doc), "kp_from_outside")
    assert row["status"] == "missed" and "282 ns" in row["measured"]
    doc["results"]["kproxy"]["10000"]["M9"]["bpf_ns"]["kp_from_outside"]["ns"] = 190.0
    assert by_goal(goals.evaluate(doc), "kp_from_outside")["status"] == "met"


def test_m9_rows_in_the_table_and_the_plot_is_written(tmp_path):
    doc = with_m9(make_doc())
    paths = report.write_bench(doc, tmp_path, None)
    assert any(p.name == "m9_nodeport.png" for p in paths)
    assert any(p.name == "m9_nodeport_crr.png" for p in paths)
    md = (tmp_path / "latest.md").read_text()
    row = next(line for line in md.splitlines() if line.startswith("| M9 NodePort UDP forwarded"))
    assert "| 100,000 |" in row and "| 50,000 |" in row and "| 1.8x |" in row
    assert any(line.startswith("| M9 NodePort failed connections | 2 |") for line in md.splitlines())


def test_tc_mode_gets_its_own_ratio_columns():
    doc = make_doc()
    doc["modes"]["kproxy-tc"] = {"status": "run"}
    doc["results"]["kproxy-tc"] = {"100": {"M2": {"rate_1": 4500.0}},
                                   "10000": {"M2": {"rate_1": 6000.0}}}
    doc["ratios"] = goals.ratios(doc)
    doc["ratios_tc"] = goals.ratios(doc, goals.OURS_TC)
    assert doc["ratios_tc"]["10000"]["m2_rate_1"]["iptables"] == 3.0      # 6000 / 2000
    lines = report.render_table(doc, 10000)
    assert lines[0].endswith("| tc/iptables | tc/nftables | tc/direct |")
    m2 = next(line for line in lines if line.startswith("| M2 new conn/s, 1 client"))
    assert m2.split(" | ")[-3] == "3x" and m2.split(" | ")[-6] == f"{9950 / 2000:.3g}x"
    # without tc results the table keeps its three ratio columns
    assert report.render_table(make_doc(), 10000)[0].endswith("| ours/direct |")


def test_a_mode_that_cannot_run_is_listed_with_the_agents_error():
    doc = {"modes": {"kproxy-tc": {"status": "run"}}, "results": {"kproxy-tc": {}}}
    suite.not_run(doc, "kproxy-tc", "the agent rejects --socket-lb=false: Error: No such "
                                    "option: --socket-lb")
    assert "kproxy-tc" not in doc["results"]
    assert doc["modes"]["kproxy-tc"] == {
        "status": "not run",
        "reason": "not run (the agent rejects --socket-lb=false: Error: No such option: "
                  "--socket-lb)"}


def test_softirq_ns_per_packet_from_proc_stat():
    tck = procstat.CLK_TCK
    a = procstat.parse_proc_stat(f"cpu  100 0 50 1000 0 0 {2 * tck} 0 0 0\ncpu0 1 2 3\n")
    b = procstat.parse_proc_stat(f"cpu  100 0 50 1000 0 0 {3 * tck} 0 0 0\n")
    assert b["softirq"] - a["softirq"] == pytest.approx(1.0)
    assert procstat.ns_per_packet(a, b, 1_000_000) == pytest.approx(1000.0)   # 1 s / 1 M
    assert procstat.ns_per_packet(a, b, 0) is None
    with pytest.raises(ValueError):
        procstat.parse_proc_stat("intr 1 2 3\n")


def test_median_or_none():
    assert stats.median_or_none([None, 3.0, 1.0, None, 2.0]) == 2.0
    assert stats.median_or_none([None]) is None


def test_nodeport_service_with_a_udp_port():
    svc = fill.service_obj("np", (("req", 80, 8080, "TCP"), ("udp", 80, 8080, "UDP")),
                           service_type="NodePort")
    assert svc["spec"]["type"] == "NodePort"
    assert [(p["name"], p["protocol"]) for p in svc["spec"]["ports"]] == [("req", "TCP"),
                                                                          ("udp", "UDP")]
    sl = fill.slice_obj("np", ["10.244.2.10"], [("req", 8080, "TCP"), ("udp", 8080, "UDP")])
    assert [(p["name"], p["port"], p["protocol"]) for p in sl["ports"]] == [
        ("req", 8080, "TCP"), ("udp", 8080, "UDP")]
    # the three-field forms stay TCP
    assert fill.service_obj("x")["spec"]["ports"][0]["protocol"] == "TCP"
    assert fill.slice_obj("x", ["10.128.0.2"])["ports"][0]["protocol"] == "TCP"


def test_quick_config_keeps_m9_short():
    quick = suite.BenchConfig.make(True)
    assert quick.m9_seconds < suite.BenchConfig.make(False).m9_seconds
    assert "kproxy-tc" in quick.modes and "kproxy-tc" in suite.DEFAULT_MODES


def test_an_m9_failure_is_reported_not_hidden():
    doc = make_doc()
    doc["results"]["kproxy"]["10000"]["M9"] = {"error": "kpbench-client udp: rc 2: usage"}
    doc["ratios"], doc["goals"] = goals.ratios(doc), goals.evaluate(doc)
    md = report.render_markdown(doc, [])
    assert "- kproxy at N=10000: M9 failed: kpbench-client udp: rc 2: usage" in md
    assert by_goal(doc["goals"], "NodePort pps")["status"] == "not measured"


def test_cold_start_cap_grows_beyond_10k():
    cfg = suite.BenchConfig.make(False)
    assert cfg.cold_timeout_for(100) == cfg.cold_timeout_for(10_000) == 60.0
    assert cfg.cold_timeout_for(30_000) == 180.0
