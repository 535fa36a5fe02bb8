"""The scale run's CPU-per-change arithmetic (bench/scale.py per_change_cpu)."""
import pytest

from kproxy_ebpf.dev.bench.scale import Sub, per_change_cpu


def test_background_and_counted_periodic_work_are_taken_out():
    # Background 10 ms/s; a counted full sync of 0.3 s lands in one idle and one busy
    # sub-window; each change costs 2 ms; 25 changes per 7.5 s sub-window.
    idle = [Sub(0.075 + (0.3 if i == 2 else 0), 0.3 if i == 2 else 0, 7.5, 0) for i in range(8)]
    busy = [Sub(0.075 + 0.05 + (0.3 if i == 5 else 0), 0.3 if i == 5 else 0, 7.5, 25)
            for i in range(8)]
    r = per_change_cpu(idle, busy)
    assert r["ms_per_change"] == pytest.approx(2.0)
    assert r["ms_min"] == pytest.approx(2.0) and r["ms_max"] == pytest.approx(2.0)
    assert r["idle_rate_ms_per_s"] == pytest.approx(10.0)
    assert r["periodic_s_excluded"] == {"idle": 0.3, "changes": 0.3}


def test_uncounted_periodic_work_moves_the_median_not_the_figure():
    """kube-proxy's resync is not counted: it shows in the spread (max), not the median."""
    idle = [Sub(0.1 + (1.0 if i == 0 else 0), 0, 10.0, 0) for i in range(8)]
    busy = [Sub(0.1 + 25 * 0.004 * (1 + i % 2 * 0.1) + (1.0 if i == 2 else 0), 0, 10.0, 25)
            for i in range(8)]
    r = per_change_cpu(idle, busy)
    assert 4.0 <= r["ms_per_change"] <= 4.4
    assert r["ms_min"] == pytest.approx(4.0)
    assert r["ms_max"] == pytest.approx(4.0 + 1000 / 25)
    assert r["idle_rate_ms_per_s"] == pytest.approx(10.0)


def test_sub_windows_of_unequal_length_are_scaled_by_their_wall_time():
    idle = [Sub(0.2, 0, 20.0, 0), Sub(0.1, 0, 10.0, 0), Sub(0.1, 0, 10.0, 0)]
    busy = [Sub(0.1 + 10 * 0.001, 0, 10.0, 10), Sub(0.3 + 30 * 0.001, 0, 30.0, 30)]
    assert per_change_cpu(idle, busy)["ms_sub_windows"] == [1.0, 1.0]


def test_a_window_without_changes_is_an_error_not_a_division_by_zero():
    with pytest.raises(ValueError):
        per_change_cpu([Sub(0.1, 0, 1.0, 0)], [Sub(0.1, 0, 1.0, 0)])
    with pytest.raises(ValueError):
        per_change_cpu([], [Sub(0.1, 0, 1.0, 1)])


def test_the_cold_start_meters_from_before_the_processes_exist(monkeypatch):
    """The agents are stopped, so no pid is there to meter: the nodes' cgroups are read
    before the start (a run once died here on the missing pid)."""
    from kproxy_ebpf.dev.bench import scale
    from kproxy_ebpf.dev.bench.procstat import CpuSample

    class Meter:
        def __init__(self, cpu):
            self.cpu = cpu

        def sample(self):
            return CpuSample(10.0, 2.0, self.cpu)

    class FakeTestbed:
        filled, pids = 20000, {}

        def stop_proxy(self):
            self.pids = {}

        def start_proxy(self, mode):
            self.pids = {"node1": 1, "node2": 2}

        def meter_cgroup_usage(self, node):
            return 100.0

        def meter(self, node):
            return Meter(103.0 if node == "node1" else 105.0)     # 3 s and 5 s of CPU

    run = object.__new__(scale.ScaleRun)
    run.tb, run.mode, run.log = FakeTestbed(), "kproxy", lambda _: None
    monkeypatch.setattr(scale.time, "monotonic", lambda: 0.0)
    monkeypatch.setattr(run, "_caught_up", lambda since: 2.5, raising=False)
    out = run._cold_start()
    assert out["wall_s"] == 2.5 and out["cpu_s_mean"] == pytest.approx(4.0)


def test_a_mode_the_api_server_fails_is_recorded_and_the_run_goes_on(monkeypatch):
    from kproxy_ebpf.dev.bench import scale
    from kproxy_ebpf.dev.bench.rawapi import ApiError

    class Testbed:
        filled = 39000

        def __init__(self, *a, **k):
            pass

    def fail(self):
        self._t_fill = 0.0
        raise ApiError("POST", "/api/v1/namespaces/kpbench/services", 422,
                       "failed to allocate IP: etcdserver: request timed out")

    monkeypatch.setattr(scale, "Testbed", Testbed)
    monkeypatch.setattr(scale.ScaleRun, "_run", fail)
    out = scale.ScaleRun(scale.ScaleConfig(n=50000), "nftables", lambda m: None).run()
    assert out["did_not_finish"].startswith("the API server failed: POST")
    assert out["did_not_finish"].endswith("at 39000 services")
    assert out["did_not_finish_after_s"] >= 0


def test_a_last_service_that_never_answers_bounds_the_mode_by_its_fill(monkeypatch):
    """kube-proxy nftables at 50k x 10 did not answer within the wait: a result (the run goes
    on to write its report), bounded below by the fill's time, not the run's."""
    from kproxy_ebpf.dev.bench import scale

    class Testbed:
        filled = 50000

        def __init__(self, *a, **k):
            pass

    def no_answer(self):
        self._t_fill = -5000.0                       # per-change windows included: not used
        raise scale.CatchUpTimeout("the last Service did not answer within 600s "
                                   "of its slice's write", after_s=1108.26)

    monkeypatch.setattr(scale, "Testbed", Testbed)
    monkeypatch.setattr(scale.ScaleRun, "_run", no_answer)
    out = scale.ScaleRun(scale.ScaleConfig(n=50000), "nftables", lambda m: None).run()
    assert out["did_not_finish"].startswith("the last Service did not answer")
    assert out["did_not_finish_after_s"] == 1108.3
