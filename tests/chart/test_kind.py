"""What `make kind-up` needs, short of making a cluster (tests/kind does that): the scripts
parse, and the chart renders with kind-up's values into something the agent accepts."""
from __future__ import annotations

import re
import subprocess

from kproxy_ebpf.dev.lab import agent_image
from kproxy_ebpf.dev.lab.binaries import repo_root

HACK = repo_root() / "hack"


def test_scripts_parse():
    for script in sorted(p.name for p in HACK.glob("kind-*.sh")):
        r = subprocess.run(["bash", "-n", str(HACK / script)], capture_output=True, text=True)
        assert r.returncode == 0, r.stderr


def test_chart_renders_with_kind_up_values(helm, tmp_path):
    text = (HACK / "kind-up.sh").read_text()
    sets = dict(re.findall(r"--set ([\w.]+)=(\S+)", text))
    assert {"apiServer.host", "apiServer.port", "image.pullPolicy"} <= set(sets)
    objects = agent_image.helm_template({"apiServer": {"host": "kproxy-control-plane",
                                                       "port": int(sets["apiServer.port"])},
                                         "image": {"repository": "localhost/kproxy-ebpf",
                                                   "tag": "0.1.0",
                                                   "pullPolicy": sets["image.pullPolicy"]}})
    agent_image.check_against_agent(objects, tmp_path)
