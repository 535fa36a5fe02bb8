"""What the numbers were measured on: kernel, CPU, versions (Kubernetes, iptables and its
backend, nft, bcc), date, git commit and whether the tree was dirty, and how busy the machine
was (load average), so a reader can tell a quiet run from a noisy one."""
from __future__ import annotations

import os
import platform
import subprocess
from datetime import UTC, datetime
from pathlib import Path

REPO = Path(__file__).resolve().parents[3]


def _run(argv: list[str], cwd: Path | None = None) -> str | None:
    try:
        r = subprocess.run(argv, capture_output=True, text=True, timeout=20, cwd=cwd)
    except (OSError, subprocess.TimeoutExpired):
        return None
    out = (r.stdout or r.stderr).strip()
    return out if r.returncode == 0 and out else None


def cpu_model() -> str | None:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return None


def iptables_info() -> dict:
    """`iptables -V` says "(nf_tables)" or "(legacy)": the backend kube-proxy's iptables mode
    uses here, since it runs the host's iptables binary."""
    version = _run(["iptables", "-V"])
    backend = None
    if version:
        backend = "nft" if "nf_tables" in version else "legacy" if "legacy" in version else None
    return {"version": version, "backend": backend,
            "binary": os.path.realpath(_which("iptables") or "") or None,
            "legacy_version": _run(["iptables-legacy", "-V"])}


def _which(name: str) -> str | None:
    for d in os.environ.get("PATH", "/usr/sbin:/usr/bin:/sbin:/bin").split(":"):
        p = os.path.join(d, name)
        if os.access(p, os.X_OK):
            return p
    return None


def git_state() -> dict:
    commit = _run(["git", "rev-parse", "HEAD"], cwd=REPO)
    status = _run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=REPO)
    branch = _run(["git", "rev-parse", "--abbrev-ref", "HEAD"], cwd=REPO)
    return {"commit": commit, "branch": branch, "dirty": bool(status),
            "dirty_files": status.splitlines() if status else []}


def k8s_version(bin_dir: Path | None) -> str | None:
    if bin_dir is None:
        return None
    return _run([str(bin_dir / "kube-proxy"), "--version"])


def collect(bin_dir: Path | None = None) -> dict:
    uname = platform.uname()
    try:
        import bcc  # Debian's python3-bpfcc

        bcc_version = getattr(bcc, "__version__", None)
    # Its import loads libbcc and LLVM, which fail in more ways than ImportError; the bench
    # does not need bcc itself, the agent does.
    except Exception:  # noqa: BLE001 - any failure means no version to record
        bcc_version = None
    return {
        "date": datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "kernel": uname.release,
        "machine": uname.machine,
        "cpu_model": cpu_model(),
        "cpus": os.cpu_count(),
        "loadavg_at_start": os.getloadavg(),
        "kubernetes": k8s_version(bin_dir),
        "iptables": iptables_info(),
        "nft": _run(["nft", "--version"]),
        "python": platform.python_version(),
        "bcc": bcc_version,
        "cc": (_run(["cc", "--version"]) or "").splitlines()[0] or None,
        "git": git_state(),
    }
