"""CPU and memory of a proxy, its children included, read from the kernel (never `ps`).

kube-proxy does much of its work in short-lived iptables-restore / nft children. Two sources
count them: the cgroup the lab runs the node's processes in (cpu.stat usage_usec covers every
process that ran there, live or exited), and /proc/<pid>/stat, whose cutime/cstime add the
children once the parent has reaped them. The cgroup figure is used when the kernel provides
it; /proc is always recorded beside it.
"""
from __future__ import annotations

import os
import time
from dataclasses import dataclass

CLK_TCK = os.sysconf("SC_CLK_TCK")


def parse_stat(text: str) -> dict[str, float]:
    """utime, stime, cutime, cstime (seconds) from a /proc/<pid>/stat line."""
    fields = text.rsplit(")", 1)[1].split()
    # fields[0] is field 3 (state); utime is field 14
    ut, st, cut, cst = (int(fields[i]) / CLK_TCK for i in (11, 12, 13, 14))
    return {"utime": ut, "stime": st, "cutime": cut, "cstime": cst}


def parse_cpu_stat(text: str) -> dict[str, int]:
    out = {}
    for line in text.splitlines():
        key, _, value = line.partition(" ")
        if value.strip().isdigit():
            out[key] = int(value)
    return out


def rss_bytes(pid: int) -> int | None:
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


@dataclass
class CpuSample:
    at: float                     # monotonic seconds
    proc: float | None            # utime+stime+cutime+cstime of the pid
    cgroup: float | None          # cpu.stat usage of the cgroup, seconds

    def best(self) -> float | None:
        return self.cgroup if self.cgroup is not None else self.proc


class ProxyMeter:
    """Samples one proxy process (pid) and the cgroup it runs in."""

    def __init__(self, pid: int, cgroup: str | None):
        self.pid = pid
        self.cgroup = cgroup

    def sample(self) -> CpuSample:
        proc = cg = None
        try:
            with open(f"/proc/{self.pid}/stat") as f:
                s = parse_stat(f.read())
            proc = s["utime"] + s["stime"] + s["cutime"] + s["cstime"]
        except OSError:
            pass
        if self.cgroup:
            try:
                with open(os.path.join(self.cgroup, "cpu.stat")) as f:
                    usage = parse_cpu_stat(f.read()).get("usage_usec")
                cg = usage / 1e6 if usage is not None else None
            except OSError:
                pass
        return CpuSample(time.monotonic(), proc, cg)

    def rss(self) -> int | None:
        return rss_bytes(self.pid)


def cpu_between(a: CpuSample, b: CpuSample) -> dict:
    """CPU seconds from a to b by both sources, the wall time, and the best figure's rate."""
    wall = b.at - a.at
    cg = b.cgroup - a.cgroup if a.cgroup is not None and b.cgroup is not None else None
    proc = b.proc - a.proc if a.proc is not None and b.proc is not None else None
    best = cg if cg is not None else proc
    return {"wall_s": wall, "cpu_s": best, "cpu_s_cgroup": cg, "cpu_s_proc": proc,
            "cores": best / wall if best is not None and wall > 0 else None,
            "source": "cgroup" if cg is not None else "proc"}


# -- machine-wide CPU time by kind (M9: the per-packet forwarding runs in softirq) -----------

PROC_STAT_FIELDS = ("user", "nice", "system", "idle", "iowait", "irq", "softirq", "steal")


def parse_proc_stat(text: str) -> dict[str, float]:
    """Seconds per kind, summed over all CPUs, from /proc/stat's first ("cpu") line."""
    for line in text.splitlines():
        parts = line.split()
        if parts and parts[0] == "cpu":
            # strict=False: the line goes on (guest, guest_nice: already counted in user, nice).
            return {k: int(v) / CLK_TCK for k, v in zip(PROC_STAT_FIELDS, parts[1:], strict=False)}
    raise ValueError("no cpu line in /proc/stat")


def read_proc_stat() -> dict[str, float]:
    with open("/proc/stat") as f:
        return parse_proc_stat(f.read())


def ns_per_packet(before: dict[str, float], after: dict[str, float], packets: int,
                  kinds: tuple[str, ...] = ("softirq",)) -> float | None:
    """CPU nanoseconds of `kinds` per packet between two read_proc_stat() samples."""
    if packets <= 0:
        return None
    return sum(after[k] - before[k] for k in kinds) * 1e9 / packets
