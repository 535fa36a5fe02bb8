"""bpfcost: bpftool's run statistics per kproxy program, and the sysctl restored."""
import json

from kproxy_ebpf.dev.bench import bpfcost


def test_per_run_is_the_mean_over_the_runs_in_between_summed_per_name():
    def show(cnt, ns, tc_cnt, tc_ns):
        return json.dumps([
            {"id": 1, "name": "kp_connect4", "run_cnt": cnt, "run_time_ns": ns},
            {"id": 2, "name": "kp_from_outside", "run_cnt": tc_cnt, "run_time_ns": tc_ns},
            {"id": 3, "name": "kp_from_outside", "run_cnt": 1, "run_time_ns": 100},
            {"id": 4, "name": "sd_devices"},              # no statistics, not ours
            {"id": 5, "name": "kp_sendmsg4", "run_cnt": 7, "run_time_ns": 700}])
    before = bpfcost.parse(show(10, 10_000, 0, 0))
    after = bpfcost.parse(show(1010, 1_510_000, 400, 80_000))
    assert after["kp_from_outside"] == (401, 80_100)
    assert bpfcost.per_run(before, after) == {
        "kp_connect4": {"runs": 1000, "ns": 1500.0},
        "kp_from_outside": {"runs": 400, "ns": 200.0}}     # kp_sendmsg4 did not run


def test_the_sysctl_is_restored_even_when_the_run_fails(tmp_path):
    sysctl = tmp_path / "bpf_stats_enabled"
    sysctl.write_text("0\n")
    try:
        with bpfcost.stats_enabled(sysctl):
            assert sysctl.read_text() == "1"
            raise RuntimeError("client died")
    except RuntimeError:
        pass
    assert sysctl.read_text() == "0"
