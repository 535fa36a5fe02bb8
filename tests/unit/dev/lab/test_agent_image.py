"""The pod-spec -> podman translation of `lab up --agent image` (the real runs are in
tests/conformance and tests/integration/test_proxy_modes.py, image column): what the lab refuses, and what it maps."""
import pytest

from kproxy_ebpf.dev.lab import agent_image as ai
from kproxy_ebpf.dev.lab.namespaces import NodeInfo
from kproxy_ebpf.dev.lab.nsutil import LabError

NODE = NodeInfo(name="node1", ip="10.250.0.11", netns="kproxy-t-node1",
                cgroup="/sys/fs/cgroup/unified/kproxy-t/node1",
                host_cgroup="/sys/fs/cgroup/unified/kproxy-t/node1/host",
                pod_cidr="10.244.1.0/24", bpffs="/tmp/kproxy-t-node1-bpffs", index=1)


def spec(**kw):
    base = dict(image="i:1", command=None, args=[], env=[], security={}, mounts=[], volumes={},
                config_maps={}, service_account="sa", namespace="kube-system", memory_limit=None)
    return ai.AgentSpec(**{**base, **kw})


def test_capabilities_and_security_options():
    flags = ai.security_flags({"capabilities": {"drop": ["ALL"], "add": ["BPF", "NET_ADMIN"]},
                               "readOnlyRootFilesystem": True, "runAsUser": 0,
                               "seccompProfile": {"type": "Unconfined"}})
    assert flags[:2] == ["--cap-drop", "all"]
    assert ["--cap-add", "CAP_BPF"] == flags[2:4] and ["--cap-add", "CAP_NET_ADMIN"] == flags[4:6]
    assert "--read-only" in flags and "seccomp=unconfined" in flags
    assert "--privileged" not in flags


@pytest.mark.parametrize("sec,message", [
    ({"privileged": True}, "privileged"),
    ({"capabilities": {"add": ["BPF"]}}, "drop ALL"),
    ({"capabilities": {"drop": ["ALL"]}, "seccompProfile": {"type": "Localhost"}}, "Localhost"),
])
def test_what_the_lab_refuses(sec, message):
    with pytest.raises(LabError, match=message):
        ai.security_flags(sec)


def test_host_paths_map_to_the_nodes_view(tmp_path):
    assert ai.node_host_path("/sys/fs/cgroup", NODE) == NODE.cgroup
    node = NodeInfo(**{**NODE.__dict__, "bpffs": str(tmp_path / "bpffs")})
    assert ai.node_host_path("/sys/fs/bpf/", node) == node.bpffs
    with pytest.raises(LabError, match="/lib/modules"):
        ai.node_host_path("/lib/modules", NODE)


def test_env_as_the_kubelet_builds_it():
    s = spec(env=[{"name": "KPROXY_HOSTNAME_OVERRIDE",
                   "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}},
                  {"name": "KUBERNETES_SERVICE_HOST", "value": "10.250.0.1"},
                  {"name": "GREETING", "value": "on $(KPROXY_HOSTNAME_OVERRIDE)"}])
    env = ai.resolve_env(s, NODE, {"KUBERNETES_SERVICE_HOST": "10.96.0.1",
                                   "KUBERNETES_SERVICE_PORT": "443"})
    assert env == {"KUBERNETES_SERVICE_HOST": "10.250.0.1", "KUBERNETES_SERVICE_PORT": "443",
                   "KPROXY_HOSTNAME_OVERRIDE": "node1", "GREETING": "on node1"}
    with pytest.raises(LabError, match="fieldRef"):
        ai.resolve_env(spec(env=[{"name": "X", "valueFrom": {"fieldRef": {
            "fieldPath": "metadata.uid"}}}]), NODE, {})


def test_volumes(tmp_path):
    s = spec(mounts=[{"name": "cfg", "mountPath": "/etc/k", "readOnly": True},
                     {"name": "cg", "mountPath": "/run/cg", "readOnly": True},
                     {"name": "tmp", "mountPath": "/tmp"}],
             volumes={"cfg": {"name": "cfg", "configMap": {"name": "c"}},
                      "cg": {"name": "cg", "hostPath": {"path": "/sys/fs/cgroup"}},
                      "tmp": {"name": "tmp", "emptyDir": {"sizeLimit": "64Mi"}}},
             config_maps={"c": {"config.yaml": "logLevel: info\n"}})
    flags = ai.mount_flags(s, NODE, tmp_path)
    assert flags == ["-v", f"{tmp_path}/configmaps/c:/etc/k:ro",
                     "-v", f"{NODE.cgroup}:/run/cg:ro", "--tmpfs", f"/tmp:size={64 << 20}"]
    assert (tmp_path / "configmaps" / "c" / "config.yaml").read_text() == "logLevel: info\n"


def test_a_nodes_podman_command_needs_only_the_labs_endpoint(tmp_path):
    """start_command reads what prepare() stored for the lab (no cluster object involved)."""
    lab = ai.LabEndpoint(lab="t", files_dir=tmp_path, api_port=6443,
                         admin_kubeconfig=str(tmp_path / "admin.kubeconfig"),
                         ca_cert=tmp_path / "ca.crt")
    (tmp_path / "spec.json").write_text(spec(args=["--config=/etc/k/config.yaml"], security={
        "capabilities": {"drop": ["ALL"]}}).to_json())
    (tmp_path / "service-env.json").write_text('{"KUBERNETES_SERVICE_HOST": "10.96.0.1"}')
    argv, env = ai.start_command(lab, NODE)
    assert argv[argv.index("--name") + 1] == ai.container_name("t", "node1")
    assert argv[argv.index("--network") + 1] == "ns:/run/netns/kproxy-t-node1"
    assert argv[argv.index("--cgroup-parent") + 1] == "/kproxy-t/node1/agent"
    assert argv[argv.index("-v") + 1] == f"{tmp_path}/serviceaccount:{ai.SA_DIR}:ro"
    assert "KUBERNETES_SERVICE_HOST=10.96.0.1" in argv
    assert argv[-2:] == ["i:1", "--config=/etc/k/config.yaml"]
    assert env["CONTAINERS_CONF"] == str(tmp_path / "containers.conf")
    assert ai.lab_values(lab, "localhost/kproxy-ebpf:x")["apiServer"] == {
        "host": "10.250.0.1", "port": 6443}
