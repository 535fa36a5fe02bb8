"""Where the lab's pinned control-plane binaries live, and how to get them.

tools/k8s/build.sh builds kube-apiserver, kube-controller-manager, kube-proxy, kubectl, etcd
and helm into a cache directory keyed on the versions pinned in tools/k8s/versions.env. This
module computes the same directory in Python (so the lab and the tests agree with the script
without running it) and builds on demand when the caller allows a long build.
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterable
from pathlib import Path

ALL_BINARIES = ("etcd", "kube-apiserver", "kube-controller-manager", "kube-proxy", "kubectl", "helm")
CONTROL_PLANE_BINARIES = ("etcd", "kube-apiserver", "kube-controller-manager")

# Same default as build.sh's KPROXY_CACHE.
_DEFAULT_CACHE = "/var/cache/kproxy-ebpf"


class BinariesMissing(RuntimeError):
    """The pinned binaries are not built (and the caller did not allow a build)."""


def repo_root() -> Path:
    # kproxy_ebpf/dev/lab/binaries.py -> repository root (source checkout or editable install).
    return Path(__file__).resolve().parents[3]


def cli_module(tree: Path | str | None = None) -> str:
    """What `python -m` runs the command from, in this checkout or in another one (`tree`):
    the upgrade tests and the change-cost bench run older checkouts' agents, and the command
    moved from kproxy_ebpf/cli.py to kproxy_ebpf/cli/main.py."""
    root = Path(tree) if tree else repo_root()
    return "kproxy_ebpf.cli.main" if (root / "kproxy_ebpf/cli/main.py").exists() else "kproxy_ebpf.cli"


def build_script() -> Path:
    return repo_root() / "tools" / "k8s" / "build.sh"


def read_versions(path: Path | None = None) -> dict[str, str]:
    """Parse versions.env (KEY=VALUE lines, '#' comments) without running a shell."""
    path = path or repo_root() / "tools" / "k8s" / "versions.env"
    versions: dict[str, str] = {}
    for raw in path.read_text().splitlines():
        line = raw.split("#", 1)[0].strip()
        if not line or "=" not in line:
            continue
        key, value = line.split("=", 1)
        versions[key.strip()] = value.strip().strip("'\"")
    for key in ("K8S_VERSION", "ETCD_VERSION", "HELM_VERSION"):
        if key not in versions:
            raise ValueError(f"{path}: {key} is not set")
    return versions


def k8s_bin_dir() -> Path:
    """The directory build.sh writes to (or $KPROXY_K8S_BIN when set)."""
    override = os.environ.get("KPROXY_K8S_BIN")
    if override:
        return Path(override)
    v = read_versions()
    cache = Path(os.environ.get("KPROXY_CACHE") or _DEFAULT_CACHE)
    name = f"k8s-{v['K8S_VERSION']}-etcd-{v['ETCD_VERSION']}-helm-{v['HELM_VERSION']}"
    return cache / "k8s" / name / "bin"


def missing_binaries(bin_dir: Path, names: Iterable[str] = ALL_BINARIES) -> list[str]:
    return [n for n in names if not os.access(bin_dir / n, os.X_OK)]


def ensure_binaries(build: bool, names: Iterable[str] = ALL_BINARIES) -> Path:
    """Return the bin directory once `names` are all there.

    With build=True, runs tools/k8s/build.sh when something is missing (a cold build takes
    15-30 minutes); otherwise raises BinariesMissing telling the user how to build them.
    """
    names = tuple(names)
    bin_dir = k8s_bin_dir()
    missing = missing_binaries(bin_dir, names)
    if not missing:
        return bin_dir
    if not build or os.environ.get("KPROXY_K8S_BIN"):
        # An override directory is the user's; build.sh would write somewhere else.
        raise BinariesMissing(
            f"missing {', '.join(missing)} in {bin_dir}: run `make setup` "
            f"(or {build_script()}) to build the pinned Kubernetes/etcd/helm binaries"
        )
    proc = subprocess.run(["bash", str(build_script())], stdout=subprocess.PIPE, text=True)
    if proc.returncode != 0:
        raise BinariesMissing(f"{build_script()} failed with exit code {proc.returncode}")
    lines = proc.stdout.strip().splitlines()
    built = Path(lines[-1]) if lines else None
    if built is None or built.resolve() != bin_dir.resolve():
        raise BinariesMissing(f"{build_script()} reported {built}, expected {bin_dir}")
    missing = missing_binaries(bin_dir, names)
    if missing:
        raise BinariesMissing(f"{build_script()} finished but {', '.join(missing)} are still missing in {bin_dir}")
    return bin_dir
