"""What `make kind-up` needs, short of `kind create cluster` (no Docker engine here): the kind
config disables kube-proxy, the scripts parse, and the chart renders with kind-up's values into
something the agent accepts."""
from __future__ import annotations

import re
import subprocess

import yaml

from kproxy_ebpf.lab import agent_image
from kproxy_ebpf.lab.binaries import repo_root

from .test_chart_render import helm  # noqa: F401  (fixture)

HACK = repo_root() / "hack"


def test_kind_config_disables_kube_proxy():
    cfg = yaml.safe_load((HACK / "kind-config.yaml").read_text())
    assert cfg["kind"] == "Cluster" and cfg["apiVersion"] == "kind.x-k8s.io/v1alpha4"
    assert cfg["networking"]["kubeProxyMode"] == "none"
    assert any(m["containerPort"] == 30080 for m in cfg["nodes"][0]["extraPortMappings"])


def test_scripts_parse():
    for script in ("kind-up.sh", "kind-down.sh"):
        r = subprocess.run(["bash", "-n", str(HACK / script)], capture_output=True, text=True)
        assert r.returncode == 0, r.stderr


def test_chart_renders_with_kind_up_values(helm, tmp_path):  # noqa: F811
    text = (HACK / "kind-up.sh").read_text()
    sets = dict(re.findall(r"--set ([\w.]+)=(\S+)", text))
    assert {"apiServer.host", "apiServer.port", "image.pullPolicy"} <= set(sets)
    objects = agent_image.helm_template({"apiServer": {"host": "kproxy-control-plane",
                                                       "port": int(sets["apiServer.port"])},
                                         "image": {"repository": "localhost/kproxy-ebpf",
                                                   "tag": "0.1.0",
                                                   "pullPolicy": sets["image.pullPolicy"]}})
    agent_image.check_against_agent(objects, tmp_path)
