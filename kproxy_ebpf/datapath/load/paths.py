"""Where the BPF sources and the kernel header tree for bcc live on this machine."""
from __future__ import annotations

import os
import re
from pathlib import Path

# A source checkout keeps bpf/ next to the package; an image installs it under /usr/share.
_CANDIDATES = (Path(__file__).resolve().parents[3] / "bpf", Path("/usr/share/kproxy-ebpf/bpf"))

# tools/setup-headers.sh merges Debian's linux-headers-*-common and -cloud-amd64 packages here.
HEADERS_CACHE = Path(os.environ.get("KPROXY_CACHE", "/var/cache/kproxy-ebpf")) / "headers"


def bpf_dir() -> Path:
    override = os.environ.get("KPROXY_BPF_DIR")
    for cand in ([Path(override)] if override else []) + list(_CANDIDATES):
        if (cand / "kproxy.h").is_file():
            return cand
    raise FileNotFoundError("bpf/kproxy.h not found (set KPROXY_BPF_DIR)")


def version_order(path: Path) -> tuple:
    """A tree's sort key in version order, the order `sort -V` gives tools/setup-headers.sh:
    digit runs compare as numbers, so linux-headers-6.1.0-9-* comes before 6.1.0-10-*."""
    return tuple(int(part) if part.isdigit() else part for part in re.split(r"(\d+)", path.name))


def kernel_headers() -> Path:
    """The header tree bcc compiles against: BCC_KERNEL_SOURCE, else the newest merged tree.

    The programs use only UAPI types, so any recent tree works; we never write /lib/modules."""
    env = os.environ.get("BCC_KERNEL_SOURCE")
    if env:
        return Path(env)
    trees = sorted((p for p in HEADERS_CACHE.glob("*") if (p / "include").is_dir()),
                   key=version_order)
    if not trees:
        raise FileNotFoundError(
            f"no kernel header tree under {HEADERS_CACHE}: run `make setup` "
            "(or set BCC_KERNEL_SOURCE)")
    return trees[-1]
