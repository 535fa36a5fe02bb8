"""tcx.remove_defunct: which pins under <bpffs>/tcx go (their link's device is gone, or an agent
died between pinning and renaming), with the kernel's answer faked."""
from pathlib import Path

import pytest

from kproxy_ebpf.datapath.load import tcx


@pytest.fixture
def pins(tmp_path: Path, monkeypatch) -> Path:
    # the ifindex each pinned link is on now: 0 once its device is deleted
    now = {"3-ingress": 3, "3-egress": 3, "5-ingress": 0, "5-egress": 0, "7-egress_new": 7,
           "9-ingress": 4}
    (tmp_path / tcx.PIN_DIR).mkdir()
    for name in now:
        (tmp_path / tcx.PIN_DIR / name).touch()
    monkeypatch.setattr(tcx, "_pinned_ifindex", lambda pin: now[pin.name])
    return tmp_path


def left(bpffs: Path) -> list[str]:
    return sorted(p.name for p in (bpffs / tcx.PIN_DIR).iterdir())


def test_one_device(pins: Path) -> None:
    assert [Path(p).name for p in tcx.remove_defunct(pins, 5)] == ["5-egress", "5-ingress"]
    assert tcx.remove_defunct(pins, 3) == [] and tcx.remove_defunct(pins, 7) == []
    assert left(pins) == ["3-egress", "3-ingress", "7-egress_new", "9-ingress"]


def test_every_pin(pins: Path) -> None:
    # 9-ingress: a link on another ifindex than its name says is not ours to keep either
    assert [Path(p).name for p in tcx.remove_defunct(pins)] == [
        "5-egress", "5-ingress", "7-egress_new", "9-ingress"]
    assert left(pins) == ["3-egress", "3-ingress"]


def test_no_directory(tmp_path: Path) -> None:
    assert tcx.remove_defunct(tmp_path) == []


def test_pin_names() -> None:
    assert tcx.pin_path(Path("/sys/fs/bpf/kp"), 12, "egress") == Path("/sys/fs/bpf/kp/tcx/12-egress")
