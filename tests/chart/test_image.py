"""The agent's image holds what a node runs and nothing of the harness: every module of
kproxy_ebpf/ but dev/ (the lab and the benchmarks) is installed there and imports, no copy of
it is anywhere in the image, the node's commands run, and `lab`/`bench` say they are not installed.

Needs podman and the image (`make image`; KPROXY_IMAGE names another tag). The agent itself
runs from the image in tests/integration/test_proxy_modes.py and tests/conformance (image
column).
"""
from __future__ import annotations

import json
import os
import subprocess

import pytest

from kproxy_ebpf.dev.lab import agent_image
from kproxy_ebpf.dev.lab.binaries import repo_root
from kproxy_ebpf.dev.lab.nsutil import LabError

pytestmark = pytest.mark.root

HARNESS = "dev"  # the lab and the benchmarks: the harness, apart from what a node runs
# The commands an operator runs on a node (their --help parses every option and imports nothing
# more; `maps list` below runs a body for real).
NODE_COMMANDS = ("run", "status", "services", "check", "maps list", "maps dump", "ct list",
                 "stats", "cleanup", "trace", "watch")

# Runs inside the image with its python: what is installed, what imports, what the CLI says.
_PROBE = """
import importlib, json, os, pkgutil, subprocess, sys
import kproxy_ebpf
BPF = "/usr/share/kproxy-ebpf/bpf"
root = os.path.dirname(kproxy_ebpf.__file__)
files = sorted(os.path.relpath(os.path.join(d, f), root) for d, dirs, fs in os.walk(root)
               for f in fs if "__pycache__" not in d)
failed = {}
for m in pkgutil.walk_packages(kproxy_ebpf.__path__, "kproxy_ebpf."):
    try:
        importlib.import_module(m.name)
    except Exception as exc:
        failed[m.name] = repr(exc)
copies = []
for d, dirs, _ in os.walk("/"):
    dirs[:] = [x for x in dirs if os.path.join(d, x) not in ("/proc", "/sys", "/dev")]
    copies += [os.path.join(d, x) for x in dirs if x == "kproxy_ebpf"]
def cli(*args):
    r = subprocess.run(["kproxy-ebpf", *args], capture_output=True, text=True)
    return [r.returncode, r.stdout + r.stderr]
print(json.dumps({
    "root": root, "files": files, "import_failed": failed, "copies": copies,
    "help": {c: cli(*c.split(), "--help")[0] for c in sys.argv[1:]},
    "top_help": cli("--help"), "maps_list": cli("maps", "list", "--bpffs-dir", "/tmp/none"),
    "lab": cli("lab", "up"), "bench": cli("bench"),
    "bpf": sorted(os.path.relpath(os.path.join(d, f), BPF) for d, _, fs in os.walk(BPF) for f in fs)}))
"""


def _agent_files() -> list[str]:
    """The package's files as the source tree has them, dev/ left out."""
    root = repo_root() / "kproxy_ebpf"
    return sorted(str(p.relative_to(root)) for p in root.rglob("*.py")
                  if p.relative_to(root).parts[0] != HARNESS and "__pycache__" not in p.parts)


@pytest.fixture(scope="module")
def probe() -> dict:
    image = agent_image.default_image()
    try:
        agent_image.check_image(image)
    except LabError as exc:
        pytest.fail(str(exc))
    nofile = os.sysconf("SC_OPEN_MAX")
    r = subprocess.run(
        [*agent_image.PODMAN, "run", "--rm", "--network", "none", "--pull", "never",
         "--ulimit", f"nofile={nofile}:{nofile}",
         "--ulimit", f"nproc={agent_image.NPROC}:{agent_image.NPROC}",
         "--entrypoint", "/opt/kproxy-ebpf/venv/bin/python", image, "-c", _PROBE,
         *NODE_COMMANDS], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout.strip().splitlines()[-1])


def test_the_image_holds_the_agents_modules_and_no_lab_or_bench(probe):
    assert not [f for f in probe["files"] if f.split("/")[0] == HARNESS]
    assert probe["files"] == _agent_files()
    assert probe["import_failed"] == {}
    assert probe["copies"] == [probe["root"]] and probe["root"].startswith("/opt/kproxy-ebpf/venv/")


def test_the_image_holds_the_programs_sources_and_not_their_test_harness(probe):
    """The agent compiles bpf/*.c and their headers on the node; bpf/tests is tests/datapath's."""
    bpf = repo_root() / "bpf"
    sources = sorted(str(p.relative_to(bpf)) for p in bpf.rglob("*") if p.is_file())
    assert probe["bpf"] == [f for f in sources if not f.startswith("tests/")]
    assert "sock_lb.c" in probe["bpf"] and "tc_lb.c" in probe["bpf"]


def test_the_node_commands_run_and_lab_and_bench_say_they_are_not_installed(probe):
    assert probe["help"] == dict.fromkeys(NODE_COMMANDS, 0)
    code, text = probe["top_help"]
    listed = [line.split()[0] for line in text.partition("Commands:")[2].splitlines()
              if line.strip()]
    assert code == 0 and listed == ["check", "cleanup", "ct", "maps", "run", "services", "stats",
                                    "status", "trace", "watch"]
    code, text = probe["maps_list"]
    assert code == 1 and "no kproxy maps pinned under /tmp/none" in text
    for name in ("lab", "bench"):     # the commands of dev/lab and dev/bench
        code, text = probe[name]
        assert code == 2 and f"`{name}` is not installed here" in text, text
