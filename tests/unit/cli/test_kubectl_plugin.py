"""`kubectl kproxy` (kubectl_plugin.py) against a fake kubectl on PATH that records its argv
and answers the agent pod listing: which pod each command runs in, and the sentences for what
cannot be done."""
from __future__ import annotations

import json
import os
import stat

import pytest

from kproxy_ebpf.cli import kubectl_plugin

PODS = {"items": [
    {"metadata": {"name": "kproxy-ebpf-aaaaa"}, "spec": {"nodeName": "worker"},
     "status": {"phase": "Running"}},
    {"metadata": {"name": "kproxy-ebpf-bbbbb"}, "spec": {"nodeName": "control-plane"},
     "status": {"phase": "Running"}},
    {"metadata": {"name": "kproxy-ebpf-ccccc"}, "spec": {"nodeName": "gone"},
     "status": {"phase": "Pending"}}]}


@pytest.fixture
def kubectl(tmp_path, monkeypatch):
    log = tmp_path / "calls"
    script = tmp_path / "kubectl"
    script.write_text(f"""#!/bin/sh
printf "%s\\n" "$*" >> {log}
case "$*" in *" get pods "*) cat {tmp_path / 'pods.json'} ;; esac
""")
    script.chmod(script.stat().st_mode | stat.S_IEXEC)
    (tmp_path / "pods.json").write_text(json.dumps(PODS))
    monkeypatch.setenv("PATH", f"{tmp_path}{os.pathsep}{os.environ['PATH']}")
    return lambda: [line.split() for line in log.read_text().splitlines()]


def execs(calls) -> list[list[str]]:
    return [c for c in calls if "exec" in c]


def test_a_command_runs_in_the_agent_pod_of_its_node(kubectl):
    assert kubectl_plugin.main(["--node", "worker", "services", "--service", "web"]) == 0
    assert execs(kubectl()) == [["-n", "kube-system", "exec", "kproxy-ebpf-aaaaa", "-c", "agent",
                                 "--", "kproxy-ebpf", "services", "--service", "web"]]


def test_all_nodes_runs_on_each_running_agent_and_check_asks_one(kubectl, capsys):
    assert kubectl_plugin.main(["--context", "kind-x", "--all-nodes", "status"]) == 0
    pods = [c[c.index("exec") + 1] for c in execs(kubectl())]
    assert pods == ["kproxy-ebpf-bbbbb", "kproxy-ebpf-aaaaa"]         # by node name
    assert all(c[0] == "--context=kind-x" for c in kubectl())
    assert "== node worker (kproxy-ebpf-aaaaa)" in capsys.readouterr().out
    assert kubectl_plugin.main(["check", "--all-nodes"]) == 0
    assert len(execs(kubectl())) == 3


@pytest.mark.parametrize("argv,says", [
    (["services"], "give --node NODE (agents run on control-plane, worker) or --all-nodes"),
    (["--node", "gone", "services"], "no running kproxy-ebpf agent on node gone"),
    (["--node", "worker", "run"], "run is not a command kubectl kproxy runs on a node"),
    (["--all-nodes", "trace", "10.96.0.10:53"], "--all-nodes runs status"),
    ([], "give a command"),
])
def test_what_cannot_be_done_is_a_sentence_and_exit_1(kubectl, capsys, argv, says):
    assert kubectl_plugin.main(argv) == 1
    err = capsys.readouterr().err
    assert says in err and "Traceback" not in err


def test_completion_offers_the_commands_the_options_and_the_nodes(kubectl, capsys):
    assert kubectl_plugin.complete(["ser"]) == 0
    assert capsys.readouterr().out.splitlines() == ["services", ":4"]
    kubectl_plugin.complete(["--all"])
    assert capsys.readouterr().out.splitlines() == ["--all-nodes", ":4"]
    kubectl_plugin.complete(["services", "--serv"])           # kproxy-ebpf's own: not ours
    assert capsys.readouterr().out.splitlines() == [":4"]
