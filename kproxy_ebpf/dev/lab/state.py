"""The lab's on-disk state, shared by separate CLI invocations.

`lab up`, `lab pod create`, `lab exec` and `lab down` run as separate processes, so what one of
them built (nodes, pods, addresses, the processes it started) lives in
/run/kproxy/<lab>/state.json. Every read-modify-write happens under an fcntl lock on a sibling
lock file and the JSON is replaced atomically (write + rename), so a crash never leaves a half
written file. The state is a record, not the source of truth for cleanup: `Lab.down()` also
removes objects by name prefix, so a lost or partial state file cannot leak namespaces.
"""
from __future__ import annotations

import fcntl
import json
import os
import re
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field

RUN_ROOT = "/run/kproxy"
STATE_VERSION = 1

# Lab names become part of netns, cgroup and bpffs names, and pod names part of netns names:
# keep both to DNS labels so nothing needs quoting and names stay short.
_LABEL = re.compile(r"^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$")


def check_name(kind: str, name: str) -> str:
    if not _LABEL.match(name):
        raise ValueError(f"invalid {kind} name {name!r}: use a DNS label (a-z, 0-9, '-'), max 63")
    return name


def state_dir(lab: str, run_root: str = RUN_ROOT) -> str:
    return os.path.join(run_root, check_name("lab", lab))


@dataclass
class ProcRec:
    """A process the lab started; pid alone is never trusted (pids get reused)."""

    pid: int
    argv: list[str]
    starttime: int  # field 22 of /proc/<pid>/stat, in clock ticks since boot
    target: str  # where it runs, e.g. "pod/a", "node/node1", "ext", "net"
    log: str
    name: str = ""


@dataclass
class NodeRec:
    index: int
    ip: str
    next_host: int = 10  # next pod host number to try, so freed IPs are not reused at once


@dataclass
class PodRec:
    node: str
    ip: str
    veth: str  # host end, in the node's netns
    ports: list[tuple[str, int]]
    labels: dict[str, str] = field(default_factory=dict)
    echo_pid: int | None = None
    ips: list[str] = field(default_factory=list)   # every family's, primary first (ip)


@dataclass
class LabState:
    lab: str
    families: list[str] = field(default_factory=lambda: ["IPv4"])  # the cluster's, primary first
    nodes: dict[str, NodeRec] = field(default_factory=dict)
    pods: dict[str, PodRec] = field(default_factory=dict)
    external: str | None = None  # the external client's IP once created
    external_routes: dict[str, str] = field(default_factory=dict)  # CIDR -> node (lab route)
    external_addresses: list[str] = field(default_factory=list)   # the client's extra sources
    procs: dict[int, ProcRec] = field(default_factory=dict)
    objects: list[str] = field(default_factory=list)  # "netns:<name>", "cgroup:<path>", ...
    up: bool = False  # set when up() finished

    def note(self, obj: str) -> None:
        if obj not in self.objects:
            self.objects.append(obj)

    def forget(self, obj: str) -> None:
        if obj in self.objects:
            self.objects.remove(obj)

    def to_json(self) -> dict:
        d = asdict(self)
        d["version"] = STATE_VERSION
        d["procs"] = {str(k): v for k, v in d["procs"].items()}
        return d

    @classmethod
    def from_json(cls, d: dict) -> LabState:
        st = cls(lab=d["lab"], families=list(d.get("families", ["IPv4"])))
        st.nodes = {k: NodeRec(**v) for k, v in d.get("nodes", {}).items()}
        for k, v in d.get("pods", {}).items():
            v = dict(v)
            v["ports"] = [(str(p), int(n)) for p, n in v.get("ports", [])]
            st.pods[k] = PodRec(**v)
        st.external = d.get("external")
        st.external_routes = dict(d.get("external_routes", {}))
        st.external_addresses = list(d.get("external_addresses", []))
        st.procs = {int(k): ProcRec(**v) for k, v in d.get("procs", {}).items()}
        st.objects = list(d.get("objects", []))
        st.up = bool(d.get("up", False))
        return st


def _path(lab: str, run_root: str) -> str:
    return os.path.join(state_dir(lab, run_root), "state.json")


def load(lab: str, run_root: str = RUN_ROOT) -> LabState | None:
    """Read the state without locking (a snapshot for read-only callers); None if absent."""
    try:
        with open(_path(lab, run_root)) as f:
            return LabState.from_json(json.load(f))
    except FileNotFoundError:
        return None


def save(st: LabState, run_root: str = RUN_ROOT) -> None:
    path = _path(st.lab, run_root)
    tmp = f"{path}.tmp.{os.getpid()}"
    with open(tmp, "w") as f:
        json.dump(st.to_json(), f, indent=1, sort_keys=True)
        f.write("\n")
    os.replace(tmp, path)


@contextmanager
def locked(lab: str, run_root: str = RUN_ROOT, create: bool = True) -> Iterator[LabState | None]:
    """Hold the lab lock, yield the state (fresh if none), save it on the way out.

    The state is saved also when the body raises: every step records an object as soon as it
    exists, so the saved state is what `down()` needs to clean up after a partial failure.
    With create=False and no state directory, yields None and saves nothing.
    """
    d = state_dir(lab, run_root)
    if not create and not os.path.isdir(d):
        yield None
        return
    os.makedirs(os.path.join(d, "logs"), mode=0o755, exist_ok=True)
    fd = os.open(os.path.join(d, "state.lock"), os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        try:
            st = load(lab, run_root)
        except (ValueError, KeyError, TypeError):
            # A corrupt file must not block `down()`; start from an empty record.
            st = None
        st = st or LabState(lab=lab)
        try:
            yield st
        finally:
            if os.path.isdir(d):  # down() may have removed the directory meanwhile
                save(st, run_root)
    finally:
        os.close(fd)
