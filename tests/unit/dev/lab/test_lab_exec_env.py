"""`lab exec --node`: the kproxy-ebpf commands run there find that node's pins, hook cgroup,
its agent's kubeconfig and its name without flags, this checkout's commands on PATH, and a
user's own settings win."""
from __future__ import annotations

import os
import sys
from types import SimpleNamespace

from kproxy_ebpf.dev.lab.cli import node_env
from kproxy_ebpf.dev.lab.nsutil import LabError


class FakeCluster:
    def __init__(self, control_plane: bool = True):
        self.lab = SimpleNamespace(node=lambda name: SimpleNamespace(
            bpffs=f"/sys/fs/bpf/kproxy-t-{name}", cgroup=f"/sys/fs/cgroup/unified/kproxy-t/{name}"))
        self._cp = control_plane

    @property
    def info(self):
        if not self._cp:
            raise LabError("no control plane")
        return SimpleNamespace(lab_kubeconfig="/run/kproxy-t/lab.kubeconfig")


def test_a_node_command_gets_its_pins_kubeconfig_and_name():
    env = node_env(FakeCluster(), "node2", {"PATH": "/bin"})
    assert env == {"PATH": os.path.dirname(sys.executable) + os.pathsep + "/bin",
                   "KPROXY_BPFFS_DIR": "/sys/fs/bpf/kproxy-t-node2",
                   "KPROXY_CGROUP": "/sys/fs/cgroup/unified/kproxy-t/node2",
                   "KPROXY_HOSTNAME_OVERRIDE": "node2",
                   "KPROXY_KUBECONFIG": "/run/kproxy-t/lab.kubeconfig"}


def test_the_users_settings_win_and_a_lab_without_api_has_no_kubeconfig():
    env = node_env(FakeCluster(control_plane=False), "node1", {"KPROXY_BPFFS_DIR": "/mine"})
    assert env == {"PATH": os.path.dirname(sys.executable), "KPROXY_BPFFS_DIR": "/mine",
                   "KPROXY_CGROUP": "/sys/fs/cgroup/unified/kproxy-t/node1",
                   "KPROXY_HOSTNAME_OVERRIDE": "node1"}
