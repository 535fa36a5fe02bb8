"""`kproxy-ebpf status` warns when the hooks sit on the machine's root cgroup (the kind trap)."""
from kproxy_ebpf.cli.node import _attach_warnings


def test_status_warns_only_for_the_machines_root_cgroup():
    node = [{"hook": "connect4", "pinned": True, "cgroup_id": 7777}]
    root = [{"hook": "connect4", "pinned": True, "cgroup_id": 1},
            {"hook": "sendmsg4", "pinned": False}]
    assert _attach_warnings(node) == []
    (warning,) = _attach_warnings(root)
    assert "connect4" in warning and "ROOT cgroup" in warning and "sendmsg4" not in warning
