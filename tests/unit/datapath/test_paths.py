"""Which kernel header tree bcc compiles against: the newest in version order, the order
tools/setup-headers.sh picks its flavour package in (`sort -V`)."""
import subprocess
from pathlib import Path

from kproxy_ebpf.datapath.load import paths

TREES = ["linux-headers-6.1.0-10-cloud-amd64", "linux-headers-6.1.0-9-cloud-amd64",
         "linux-headers-6.10.0-1-cloud-amd64", "linux-headers-6.1.0-28-cloud-amd64",
         "linux-headers-6.9.0-3-cloud-amd64"]


def test_the_newest_tree_wins_in_version_order_not_lexically(tmp_path, monkeypatch):
    for name in TREES:
        (tmp_path / name / "include").mkdir(parents=True)
    (tmp_path / "linux-headers-6.11.0-1-cloud-amd64.tmp").mkdir()    # no include/: half made
    monkeypatch.setattr(paths, "HEADERS_CACHE", tmp_path)
    monkeypatch.delenv("BCC_KERNEL_SOURCE", raising=False)
    assert paths.kernel_headers() == tmp_path / "linux-headers-6.10.0-1-cloud-amd64"
    (tmp_path / "linux-headers-6.10.0-1-cloud-amd64" / "include").rmdir()
    assert paths.kernel_headers() == tmp_path / "linux-headers-6.9.0-3-cloud-amd64"


def test_the_order_is_the_one_setup_headers_uses():
    by_sort_v = subprocess.run(["sort", "-V"], input="\n".join(TREES) + "\n", text=True,
                               capture_output=True, check=True).stdout.split()
    assert sorted(TREES, key=lambda n: paths.version_order(Path(n))) == by_sort_v
    assert by_sort_v[:2] == ["linux-headers-6.1.0-9-cloud-amd64",
                             "linux-headers-6.1.0-10-cloud-amd64"]
