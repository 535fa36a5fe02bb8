"""tests/unit mirrors the package: each folder of it is a package of kproxy_ebpf/ (the bench's
tests beside the benches, under dev/bench), so a module's tests are found where it lives."""
from __future__ import annotations

from pathlib import Path

import kproxy_ebpf

PACKAGE = Path(kproxy_ebpf.__file__).resolve().parent
UNIT = Path(__file__).resolve().parent


def test_every_folder_of_the_unit_tests_is_a_package():
    folders = {p.relative_to(UNIT) for p in UNIT.rglob("*") if p.is_dir()
               and p.name != "__pycache__"}
    assert folders and all((PACKAGE / f / "__init__.py").exists() for f in folders), folders
