"""`lab up --agent image`: each node's agent runs from the container image with the pod spec of
the Helm chart's DaemonSet, so a capability the chart forgot, a wrong mount or a flag the
agent does not know fails in the lab before any user meets it.

What is taken from `helm template` (nothing is restated here):
  * the container's command, args and env (fieldRefs resolved as the kubelet would for this
    node; the kubelet's service variables KUBERNETES_SERVICE_HOST/PORT injected first, so the
    chart's own values must override them, as on a node without kube-proxy);
  * the ConfigMap volumes (written to files, mounted read-only);
  * securityContext: capabilities (drop/add), privileged (refused: the point is not to need
    it), readOnlyRootFilesystem, allowPrivilegeEscalation, runAsUser, seccompProfile;
  * hostPath volumes, mapped to this node's view of the host (below); emptyDirs as tmpfs;
  * resources.limits.memory;
  * the ServiceAccount: every rendered object is applied to the lab's API server, and the
    container gets a TokenRequest token of the chart's ServiceAccount, so the chart's RBAC is
    what the agent can do.

A lab node is a network namespace and a cgroup, not a machine: its "host paths" are
  /sys/fs/bpf    -> /sys/fs/bpf/kproxy-<lab>-node<i>   (a directory of the one bpffs)
  /sys/fs/cgroup -> the node's cgroup v2 directory      (where its pods' processes live)
  /var/cache/kproxy-ebpf/programs -> the node's files in the lab (the program cache, removed
                   by `lab down` with them)
  /run/netns     -> /run/netns (the machine's, where the lab's pod namespaces are pinned)
A hostPath the lab cannot map fails. The container joins the node's network namespace
(hostNetwork) and lives inside the node's cgroup (podman --cgroup-parent), never privileged.

Podman on this machine (Debian's 4.3): `--runtime runc` (crun refuses the hybrid cgroup
layout) and explicit nofile/nproc ulimits (its defaults exceed what runc may set here).
"""
from __future__ import annotations

import dataclasses
import json
import os
import re
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from .binaries import ensure_binaries, repo_root
from .namespaces import CONTROL_PLANE_IP, NodeInfo
from .nsutil import LabError, netns_path

CHART = repo_root() / "charts" / "kproxy-ebpf"
RELEASE = "kproxy-ebpf"
NAMESPACE = "kube-system"
PODMAN = ["podman", "--runtime", "runc"]
NPROC = 4096
CGROUP_V1_ROOT = "/sys/fs/cgroup"
SA_DIR = "/var/run/secrets/kubernetes.io/serviceaccount"
PROGRAM_CACHE = "/var/cache/kproxy-ebpf/programs"   # the chart's hostPaths.programCache default
_PROPAGATION = {"HostToContainer": "rslave", "Bidirectional": "rshared", "None": "rprivate"}


def default_image() -> str:
    """The tag `make image` builds: localhost/kproxy-ebpf:<package version>."""
    from kproxy_ebpf import __version__

    return os.environ.get("KPROXY_IMAGE", f"localhost/kproxy-ebpf:{__version__}")


def container_name(lab: str, node: str) -> str:
    return f"kproxy-{lab}-agent-{node}"


@dataclass(frozen=True)
class LabEndpoint:
    """What the image's agents need of a lab cluster (lab/cluster.py makes it)."""

    lab: str                  # the lab's name: its agent containers carry it
    files_dir: Path           # the agents' files: pod spec, ConfigMaps, ServiceAccount token
    api_port: int             # the API server's port, at CONTROL_PLANE_IP from the nodes
    admin_kubeconfig: str     # applies the chart
    ca_cert: Path             # the API server's CA: the ServiceAccount's ca.crt


# -- the chart -------------------------------------------------------------------------------

def helm_template(values: dict[str, Any] | None = None, release: str = RELEASE,
                  namespace: str = NAMESPACE, extra_args: tuple[str, ...] = ()) -> list[dict]:
    """The chart rendered by the pinned helm (tools/k8s), as a list of objects."""
    helm = ensure_binaries(build=False, names=("helm",)) / "helm"
    with tempfile.NamedTemporaryFile("w", suffix=".yaml") as f:
        yaml.safe_dump(values or {}, f)
        f.flush()
        r = subprocess.run([str(helm), "template", release, str(CHART), "--namespace", namespace,
                            "-f", f.name, *extra_args], capture_output=True, text=True)
    if r.returncode != 0:
        raise LabError(f"helm template failed: {r.stderr.strip()}")
    return [o for o in yaml.safe_load_all(r.stdout) if o]


def lab_values(lab: LabEndpoint, image: str) -> dict[str, Any]:
    """The values a lab install uses: the API server's lab address (the ClusterIP would need a
    running proxy), the local image."""
    repo, _, tag = image.rpartition(":")
    return {"image": {"repository": repo, "tag": tag, "pullPolicy": "Never"},
            "apiServer": {"host": CONTROL_PLANE_IP, "port": lab.api_port}}


@dataclass
class AgentSpec:
    """The agent container of the chart's DaemonSet, with what it references."""

    image: str
    command: list[str] | None
    args: list[str]
    env: list[dict]
    security: dict
    mounts: list[dict]
    volumes: dict[str, dict]
    config_maps: dict[str, dict[str, str]]
    service_account: str
    namespace: str
    memory_limit: str | None
    host_pid: bool = False

    @classmethod
    def from_objects(cls, objects: list[dict]) -> AgentSpec:
        ds = [o for o in objects if o.get("kind") == "DaemonSet"]
        if len(ds) != 1:
            raise LabError(f"the chart must render one DaemonSet, not {len(ds)}")
        pod = ds[0]["spec"]["template"]["spec"]
        if not pod.get("hostNetwork"):
            raise LabError("the chart's DaemonSet must use hostNetwork")
        (container,) = pod["containers"]
        return cls(
            image=container["image"], command=container.get("command"),
            args=[str(a) for a in container.get("args", [])], env=container.get("env", []),
            security=container.get("securityContext", {}),
            mounts=container.get("volumeMounts", []),
            volumes={v["name"]: v for v in pod.get("volumes", [])},
            config_maps={o["metadata"]["name"]: o.get("data", {}) for o in objects
                         if o.get("kind") == "ConfigMap"},
            service_account=pod.get("serviceAccountName", "default"),
            namespace=ds[0]["metadata"].get("namespace", NAMESPACE),
            memory_limit=container.get("resources", {}).get("limits", {}).get("memory"),
            host_pid=bool(pod.get("hostPID")))

    def to_json(self) -> str:
        return json.dumps(self.__dict__)

    @classmethod
    def from_json(cls, text: str) -> AgentSpec:
        return cls(**json.loads(text))


def check_against_agent(objects: list[dict], workdir: Path) -> None:
    """Raises LabError when the rendered DaemonSet passes `kproxy-ebpf run` a flag, a config
    file key or a KPROXY_* variable that the agent does not know, or a value it rejects.

    The flags go through the real click command; the ConfigMap's file through config.load (which
    refuses unknown keys), written under `workdir` where the container would see it."""
    import click

    from kproxy_ebpf import config
    from kproxy_ebpf.agent.run import run

    spec = AgentSpec.from_objects(objects)
    if spec.command and spec.command[-1:] != ["run"]:
        raise LabError(f"the chart overrides the entrypoint with {spec.command}")
    fields = {f.name.upper() for f in dataclasses.fields(config.AgentConfig)}
    unknown_env = [e["name"] for e in spec.env
                   if e["name"].startswith("KPROXY_") and e["name"][7:] not in fields]
    if unknown_env:
        raise LabError(f"the agent has no setting for {unknown_env}")
    args = list(spec.args)
    for m in spec.mounts:       # container paths of ConfigMap files -> local copies
        vol = spec.volumes.get(m["name"], {})
        if "configMap" in vol:
            d = workdir / m["name"]
            d.mkdir(parents=True, exist_ok=True)
            for key, text in spec.config_maps.get(vol["configMap"]["name"], {}).items():
                (d / key).write_text(text)
            args = [a.replace(m["mountPath"].rstrip("/") + "/", f"{d}/") for a in args]
    try:
        ctx = run.make_context("kproxy-ebpf run", args)
    except click.ClickException as exc:
        raise LabError(f"`kproxy-ebpf run` rejects the chart's args {spec.args}: "
                       f"{exc.format_message()}") from exc
    config_file = ctx.params.get("config_file")
    try:
        config.load(config_file, env={})
    except config.ConfigError as exc:
        raise LabError(f"the chart's agent configuration: {exc}") from exc


# -- from the pod spec to podman flags ---------------------------------------------------------

def node_host_path(path: str, node: NodeInfo, files_dir: Path | None = None) -> str:
    """A lab node's view of a host path (see the module docstring)."""
    norm = os.path.normpath(path)
    if norm == PROGRAM_CACHE and files_dir is not None:
        os.makedirs(files_dir / "programs", exist_ok=True)
        return str(files_dir / "programs")
    if norm == "/sys/fs/bpf":
        os.makedirs(node.bpffs, exist_ok=True)
        return node.bpffs
    if norm == "/sys/fs/cgroup":
        return node.cgroup
    if norm == "/run/netns":
        # The machine's: every lab's pods are there, and the agent touches only the sockets
        # of its own node's cgroup.
        os.makedirs(norm, exist_ok=True)
        return norm
    raise LabError(f"the lab cannot give a node hostPath {path!r} (it maps /sys/fs/bpf, "
                   "/sys/fs/cgroup and /run/netns): a new hostPath in the chart needs a lab "
                   "mapping")


def _field_ref(path: str, node: NodeInfo, spec: AgentSpec) -> str:
    values = {"spec.nodeName": node.name, "status.hostIP": node.ip, "status.podIP": node.ip,
              "metadata.namespace": spec.namespace}
    if path not in values:
        raise LabError(f"the lab does not resolve fieldRef {path!r}")
    return values[path]


def resolve_env(spec: AgentSpec, node: NodeInfo, service_env: dict[str, str]) -> dict[str, str]:
    """The container's environment as the kubelet builds it: service variables first, then the
    container's own env in order ($(VAR) references expanded)."""
    env = dict(service_env)
    for item in spec.env:
        if "value" in item:
            value = re.sub(r"\$\(([A-Za-z_][A-Za-z0-9_]*)\)",
                           lambda m: env.get(m.group(1), m.group(0)), str(item["value"]))
        elif "fieldRef" in item.get("valueFrom", {}):
            value = _field_ref(item["valueFrom"]["fieldRef"]["fieldPath"], node, spec)
        else:
            raise LabError(f"the lab does not resolve env {item['name']}: {item}")
        env[item["name"]] = value
    return env


def expand_args(args: list[str], env: dict[str, str]) -> list[str]:
    return [re.sub(r"\$\(([A-Za-z_][A-Za-z0-9_]*)\)", lambda m: env.get(m.group(1), m.group(0)),
                   a) for a in args]


def _memory_bytes(quantity: str) -> int:
    m = re.fullmatch(r"(\d+)(Ki|Mi|Gi|k|M|G)?", quantity)
    if not m:
        raise LabError(f"the lab does not parse memory limit {quantity!r}")
    unit = {"Ki": 1024, "Mi": 1024 ** 2, "Gi": 1024 ** 3, "k": 1000, "M": 1000 ** 2,
            "G": 1000 ** 3, None: 1}[m.group(2)]
    return int(m.group(1)) * unit


def security_flags(sec: dict) -> list[str]:
    """podman flags for a container securityContext; anything the lab cannot honour fails."""
    if sec.get("privileged"):
        raise LabError("the chart's agent must not be privileged")
    caps = sec.get("capabilities", {})
    drop = [c.upper() for c in caps.get("drop", [])]
    if drop != ["ALL"]:
        raise LabError(f"the chart must drop ALL capabilities and add what it needs (drop={drop})")
    flags = ["--cap-drop", "all"]
    for cap in caps.get("add", []):
        flags += ["--cap-add", f"CAP_{cap.upper().removeprefix('CAP_')}"]
    if sec.get("readOnlyRootFilesystem"):
        flags += ["--read-only", "--read-only-tmpfs=false"]   # no tmpfs the pod would not get
    if sec.get("allowPrivilegeEscalation") is False:
        flags += ["--security-opt", "no-new-privileges"]
    if "runAsUser" in sec:
        flags += ["--user", str(sec["runAsUser"])]
    seccomp = sec.get("seccompProfile", {}).get("type", "RuntimeDefault")
    if seccomp == "Unconfined":
        flags += ["--security-opt", "seccomp=unconfined"]
    elif seccomp != "RuntimeDefault":
        raise LabError(f"the lab does not run seccompProfile {seccomp}")
    return flags


def mount_flags(spec: AgentSpec, node: NodeInfo, files_dir: Path) -> list[str]:
    flags: list[str] = []
    for m in spec.mounts:
        vol = spec.volumes.get(m["name"])
        if vol is None:
            raise LabError(f"volumeMount {m['name']} has no volume")
        ro = m.get("readOnly", False)
        if "hostPath" in vol:
            src = node_host_path(vol["hostPath"]["path"], node, files_dir)
            opts = ["ro"] if ro else []
            prop = m.get("mountPropagation")
            if prop:
                opts.append(_PROPAGATION[prop])
            flags += ["-v", f"{src}:{m['mountPath']}" + (f":{','.join(opts)}" if opts else "")]
        elif "configMap" in vol:
            name = vol["configMap"]["name"]
            if name not in spec.config_maps:
                raise LabError(f"volume {m['name']}: the chart renders no ConfigMap {name}")
            d = files_dir / "configmaps" / name
            d.mkdir(parents=True, exist_ok=True)
            for key, text in spec.config_maps[name].items():
                (d / key).write_text(text)
            flags += ["-v", f"{d}:{m['mountPath']}:ro"]
        elif "emptyDir" in vol:
            size = vol["emptyDir"].get("sizeLimit")
            flags += ["--tmpfs", m["mountPath"] + (f":size={_memory_bytes(size)}" if size else "")]
        else:
            raise LabError(f"the lab does not mount volume {vol}")
    return flags


def podman_argv(spec: AgentSpec, lab: str, node: NodeInfo, netns_path: str, files_dir: Path,
                sa_dir: Path, env: dict[str, str]) -> list[str]:
    """`podman run` for one node's agent (attached: the lab records the podman process, and
    SIGTERM to it reaches the agent through podman's signal proxy)."""
    nofile = os.sysconf("SC_OPEN_MAX")
    # --replace: a container of a killed agent may still be on its way out under this name.
    argv = [*PODMAN, "run", "--rm", "--replace", "--name", container_name(lab, node.name),
            "--network", f"ns:{netns_path}", "--hostname", node.name,
            # Inside the node's cgroup, as a pod's containers are inside the node's.
            "--cgroup-parent", "/" + os.path.relpath(node.cgroup, cgroup_v2_root()) + "/agent",
            "--ulimit", f"nofile={nofile}:{nofile}", "--ulimit", f"nproc={NPROC}:{NPROC}",
            "--pull", "never",
            *security_flags(spec.security), *mount_flags(spec, node, files_dir),
            "-v", f"{sa_dir}:{SA_DIR}:ro"]
    if spec.host_pid:
        argv += ["--pid", "host"]        # the lab's pods are processes of the machine's
    if spec.memory_limit:
        argv += ["--memory", str(_memory_bytes(spec.memory_limit))]
    for key, value in env.items():
        argv += ["-e", f"{key}={value}"]
    if spec.command:
        argv += ["--entrypoint", json.dumps(spec.command)]
    return [*argv, spec.image, *expand_args(spec.args, env)]


def cgroup_v2_root() -> str:
    from . import cgroups

    return cgroups.ROOT


# -- lab integration -----------------------------------------------------------------------------

def check_image(image: str) -> None:
    if shutil.which("podman") is None:
        raise LabError("--agent image needs podman (make image installs it)")
    if subprocess.run([*PODMAN, "image", "exists", image]).returncode != 0:
        raise LabError(f"image {image} not found: run `make image` first")


def apply(lab: LabEndpoint, objects: list[dict]) -> None:
    """Server-side apply of the rendered objects (helm test hooks excluded) to the lab."""
    kubectl = ensure_binaries(build=False, names=("kubectl",)) / "kubectl"
    docs = [o for o in objects if "helm.sh/hook" not in o["metadata"].get("annotations", {})]
    r = subprocess.run([str(kubectl), "--kubeconfig", lab.admin_kubeconfig, "apply",
                        "--server-side", "--field-manager", "kproxy-lab", "-f", "-"],
                       input=yaml.safe_dump_all(docs), capture_output=True, text=True)
    if r.returncode != 0:
        raise LabError(f"applying the chart to the lab failed: {r.stderr.strip()}")


def service_account_token(api, namespace: str, name: str, seconds: int = 24 * 3600) -> str:
    """A bound token of the ServiceAccount from the TokenRequest API (what the kubelet mounts)."""
    from kubernetes import client

    body = client.AuthenticationV1TokenRequest(
        spec=client.V1TokenRequestSpec(audiences=[], expiration_seconds=seconds))
    return client.CoreV1Api(api).create_namespaced_service_account_token(
        name, namespace, body).status.token


def prepare(lab: LabEndpoint, api, image: str | None = None) -> AgentSpec:
    """Renders the chart for this lab, applies it, and stores the pod spec and the
    ServiceAccount's credentials for start_command() (which a later process may call).
    api: a kubernetes ApiClient on the lab's admin credentials."""
    from kubernetes import client

    image = image or default_image()
    check_image(image)
    objects = helm_template(lab_values(lab, image))
    d = lab.files_dir
    check_against_agent(objects, d / "check")
    spec = AgentSpec.from_objects(objects)
    apply(lab, objects)
    sa = d / "serviceaccount"
    sa.mkdir(parents=True, exist_ok=True)
    (sa / "token").write_text(service_account_token(api, spec.namespace, spec.service_account))
    shutil.copy(lab.ca_cert, sa / "ca.crt")
    (sa / "namespace").write_text(spec.namespace)
    svc = client.CoreV1Api(api).read_namespaced_service("kubernetes", "default")
    port = next(p.port for p in svc.spec.ports if p.name == "https")
    (d / "service-env.json").write_text(json.dumps({
        "KUBERNETES_SERVICE_HOST": svc.spec.cluster_ip, "KUBERNETES_SERVICE_PORT": str(port)}))
    (d / "spec.json").write_text(spec.to_json())
    return spec


def start_command(lab: LabEndpoint, node: NodeInfo) -> tuple[list[str], dict[str, str]]:
    """argv and environment of the `podman run` for this node's agent."""
    d = lab.files_dir
    spec = AgentSpec.from_json((d / "spec.json").read_text())
    env = resolve_env(spec, node, json.loads((d / "service-env.json").read_text()))
    argv = podman_argv(spec, lab.lab, node, netns_path(node.netns), d / node.name,
                       d / "serviceaccount", env)
    # podman's default sysctls (net.ipv4.ping_group_range) are refused by runc in a network
    # namespace the container does not own; a pod with hostNetwork gets none either.
    conf = d / "containers.conf"
    conf.write_text("[containers]\ndefault_sysctls = []\n")
    return argv, {**os.environ, "CONTAINERS_CONF": str(conf)}


def kill(lab: str, node: str) -> None:
    """SIGKILL to the node's agent (a crash: its pins stay, as with a host process)."""
    subprocess.run([*PODMAN, "kill", "--signal", "KILL", container_name(lab, node)],
                   capture_output=True, check=True)


def remove_containers(lab: str) -> list[str]:
    """Stops and removes the lab's agent containers; returns problems. (Then, once the lab's
    processes are gone, remove_v1_cgroups().)"""
    if shutil.which("podman") is None:
        return []
    problems = []
    r = subprocess.run([*PODMAN, "ps", "-a", "--format", "{{.Names}}",
                        "--filter", f"name=^kproxy-{lab}-agent-"], capture_output=True, text=True)
    names = [n for n in r.stdout.split() if n.startswith(f"kproxy-{lab}-agent-")]
    if names:
        rm = subprocess.run([*PODMAN, "rm", "-f", "-t", "5", *names], capture_output=True,
                            text=True)
        if rm.returncode != 0:
            problems.append(f"podman rm {names}: {rm.stderr.strip()}")
    return problems


def remove_v1_cgroups(lab: str) -> list[str]:
    """rmdir <controller>/kproxy-<lab>/... that podman made in every cgroup v1 hierarchy
    (--cgroup-parent), deepest first; only trees named kproxy-<lab> at the top are touched.
    The lab removes its cgroup v2 tree itself."""
    problems = []
    try:
        controllers = os.listdir(CGROUP_V1_ROOT)
    except FileNotFoundError:
        return []
    for ctrl in controllers:
        top = os.path.join(CGROUP_V1_ROOT, ctrl, f"kproxy-{lab}")
        if os.path.realpath(top) == os.path.realpath(cgroup_v2_root() + f"/kproxy-{lab}"):
            continue            # the v2 tree belongs to the lab
        if not os.path.isdir(top) or os.path.islink(os.path.join(CGROUP_V1_ROOT, ctrl)):
            continue
        dirs = sorted((p for p, _d, _f in os.walk(top)), key=lambda p: p.count(os.sep),
                      reverse=True)
        for path in dirs:
            try:
                os.rmdir(path)
            except OSError as e:
                problems.append(f"rmdir {path}: {e.strerror}")
    return problems
