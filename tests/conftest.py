"""Suite-wide guards. Root tests skip when not root, unless KPROXY_REQUIRE_ROOT=1 (set by
`make test` and CI): there a skipped datapath test would hide a broken machine, so it fails."""
from .support import require_root


def pytest_runtest_setup(item):
    if item.get_closest_marker("root"):
        require_root()
