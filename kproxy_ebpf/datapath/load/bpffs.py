"""The agent's bpffs directory: bpffs mounted under it, the load children's staging
directories, the pinned maps opened without compiling anything, and every pin removed
(`cleanup`).

Layout of the directory: one pin per map (<name>_v<version>, layout.py), links/ with a pinned
BPF link per socket hook (sock_hooks.py), tcx/ with one per device and direction (tcx.py),
and for a moment stage_<pid>_<ns>/, where a load child pins the programs it loaded until its
parent takes them (progload.py).
"""
from __future__ import annotations

import logging
import subprocess
from pathlib import Path

from kproxy_ebpf.datapath.maps.layout import MAPS
from kproxy_ebpf.datapath.maps.pinned import PinnedMap

from .kernel import fs_magic
from .tcx import PIN_DIR as TCX_PIN_DIR

log = logging.getLogger(__name__)

BPFFS_MAGIC = 0xCAFE4A11


def ensure_bpffs(directory: Path) -> None:
    """Creates the pin directory, mounting bpffs at /sys/fs/bpf first if nothing is there."""
    root = Path("/sys/fs/bpf")
    if not _is_bpffs(root):
        log.info("mounting bpffs at %s", root)
        if subprocess.run(["mount", "-t", "bpf", "bpf", str(root)]).returncode != 0:
            raise RuntimeError(f"{root} is not bpffs and could not be mounted")
    directory.mkdir(parents=True, exist_ok=True)
    if not _is_bpffs(directory):
        raise RuntimeError(f"{directory} is not on a bpffs mount")


def _is_bpffs(path: Path) -> bool:
    return path.exists() and fs_magic(path) == BPFFS_MAGIC


def remove_stage(stage: Path) -> None:
    if stage.is_dir():
        for entry in stage.iterdir():
            entry.unlink()
        stage.rmdir()


def remove_stale_stages(bpffs_dir: Path, keep_live: bool = True) -> list[str]:
    """Staging directories of load children whose agent is gone (killed mid-load): their pins
    would hold programs nobody uses. With keep_live=False (cleanup), every one."""
    removed = []
    for stage in bpffs_dir.glob("stage_*") if bpffs_dir.is_dir() else ():
        pid = stage.name.split("_")[1]
        if keep_live and pid.isdigit() and Path(f"/proc/{pid}").exists():
            continue
        remove_stage(stage)
        removed.append(str(stage))
    return removed


def open_pinned_maps(bpffs_dir: Path) -> dict[str, PinnedMap]:
    """Opens the maps an agent pinned, without compiling anything (for the CLI)."""
    out = {}
    for name, spec in MAPS.items():
        path = bpffs_dir / spec.name
        if path.exists():
            out[name] = PinnedMap(path, spec)
    return out


def remove_pins(bpffs_dir: Path) -> list[str]:
    """Detaches the hooks (unpinning a link releases it) and drops the maps: `cleanup`."""
    removed = remove_stale_stages(bpffs_dir, keep_live=False)
    for sub in (bpffs_dir / "links", bpffs_dir / TCX_PIN_DIR, bpffs_dir):
        if not sub.is_dir():
            continue
        for entry in sorted(sub.iterdir()):
            if entry.is_file():
                entry.unlink()
                removed.append(str(entry))
        sub.rmdir()
    return removed
