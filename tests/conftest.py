"""Suite-wide guards. Root tests skip when not root, unless KPROXY_REQUIRE_ROOT=1 (set by
`make test` and CI): there a skipped datapath test would hide a broken machine, so it fails."""
import os

import pytest


def pytest_runtest_setup(item):
    if item.get_closest_marker("root") and os.geteuid() != 0:
        if os.environ.get("KPROXY_REQUIRE_ROOT") == "1":
            pytest.fail("needs root (KPROXY_REQUIRE_ROOT=1 forbids skipping)")
        pytest.skip("needs root")
