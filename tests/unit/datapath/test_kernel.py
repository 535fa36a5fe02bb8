"""The start-up probe's verdict and message (the probes themselves run in tests/datapath)."""
import pytest

from kproxy_ebpf.datapath.load import kernel


def test_every_missing_feature_is_named_with_its_kernel():
    feats = [kernel.Feature("helper bpf_set_retval in cgroup sock_addr programs", "5.18", lambda: False),
             kernel.Feature("map type hash", "3.19", lambda: True),
             kernel.Feature("map type lru_hash", "4.10", lambda: False)]
    with pytest.raises(kernel.KernelUnsupported) as err:
        kernel.require(features=feats)
    msg = str(err.value)
    assert "needs Linux 5.18 or later" in msg
    assert "bpf_set_retval in cgroup sock_addr programs (Linux 5.18)" in msg
    assert "lru_hash (Linux 4.10)" in msg and "map type hash" not in msg


def test_nothing_missing_passes(tmp_path):
    kernel.require(features=[kernel.Feature("x", "1", lambda: True)])
    with pytest.raises(kernel.KernelUnsupported, match="not a cgroup v2 directory"):
        kernel.require(str(tmp_path), features=[])
