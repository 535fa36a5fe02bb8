"""M10's lookup cost as N grows: the kernel's own run time per run of each kproxy program.

With kernel.bpf_stats_enabled the kernel adds each program run's time to the program's
run_time_ns and counts it in run_cnt (bpftool prog show). Measured around one load run, the
difference is the datapath's cost per connect (socket hooks) or per packet (TC), with nothing
of the client, the stack or the scheduler in it. The sysctl costs two clock reads per run of
every program, so it is on only for these runs and restored after.
"""
from __future__ import annotations

import json
import subprocess
from contextlib import contextmanager
from pathlib import Path

SYSCTL = Path("/proc/sys/kernel/bpf_stats_enabled")
PREFIX = "kp_"          # kproxy's programs (bpf/*.c): kp_connect4, kp_from_outside, ...


@contextmanager
def stats_enabled(path: Path = SYSCTL):
    old = path.read_text().strip()
    path.write_text("1")
    try:
        yield
    finally:
        path.write_text(old)


def parse(bpftool_json: str) -> dict[str, tuple[int, int]]:
    """{program name: (run_cnt, run_time_ns)} summed over programs of one name (a second
    agent's, a cached load's)."""
    out: dict[str, tuple[int, int]] = {}
    for prog in json.loads(bpftool_json):
        name = prog.get("name", "")
        if name.startswith(PREFIX):
            cnt, ns = out.get(name, (0, 0))
            out[name] = (cnt + prog.get("run_cnt", 0), ns + prog.get("run_time_ns", 0))
    return out


def snapshot() -> dict[str, tuple[int, int]]:
    r = subprocess.run(["bpftool", "-j", "prog", "show"], capture_output=True, text=True,
                       check=True, timeout=30)
    return parse(r.stdout)


def per_run(before: dict[str, tuple[int, int]], after: dict[str, tuple[int, int]]) -> dict:
    """{program: {"runs": n, "ns": mean ns per run}} for the programs that ran in between."""
    out = {}
    for name, (cnt, ns) in sorted(after.items()):
        c0, n0 = before.get(name, (0, 0))
        if cnt > c0:
            out[name] = {"runs": cnt - c0, "ns": round((ns - n0) / (cnt - c0), 1)}
    return out


def measure(run) -> dict:
    """per_run() around run(), with the statistics on."""
    with stats_enabled():
        before = snapshot()
        run()
        return per_run(before, snapshot())
