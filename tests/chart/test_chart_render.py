"""The Helm chart with the pinned helm (tools/k8s): lint, render, schema, and every rendered
flag, config key and KPROXY_* variable checked against the real `kproxy-ebpf run`. No root."""
from __future__ import annotations

import copy
import subprocess

import pytest
import yaml

from kproxy_ebpf.agent import uninstall
from kproxy_ebpf.config import load as load_config
from kproxy_ebpf.datapath.load.pod_devices import DEFAULT_GLOBS
from kproxy_ebpf.datapath.maps.layout import MAPS
from kproxy_ebpf.dev.lab import agent_image
from kproxy_ebpf.dev.lab.nsutil import LabError


@pytest.fixture(scope="module")
def rendered(helm) -> list[dict]:
    return agent_image.helm_template({"apiServer": {"host": "10.0.0.1", "port": 6443}})


def by_kind(objects: list[dict], kind: str) -> list[dict]:
    return [o for o in objects if o["kind"] == kind]


def test_helm_lint_passes(helm):
    r = subprocess.run([helm, "lint", "--strict", str(agent_image.CHART)], capture_output=True,
                       text=True)
    assert r.returncode == 0, r.stdout + r.stderr


def test_every_rendered_flag_key_and_variable_is_known_to_the_agent(rendered, tmp_path):
    agent_image.check_against_agent(rendered, tmp_path)


@pytest.mark.parametrize("doctor,message", [
    (lambda c, cm: c["args"].append("--no-such-flag"), "No such option: --no-such-flag"),
    (lambda c, cm: cm["data"].__setitem__("config.yaml", cm["data"]["config.yaml"]
                                          + "noSuchSetting: 1\n"), "unknown setting 'noSuchSetting'"),
    (lambda c, cm: c["env"].append({"name": "KPROXY_NODE_PORT_RANGE", "value": "1-2"}),
     "KPROXY_NODE_PORT_RANGE"),
    (lambda c, cm: cm["data"].__setitem__("config.yaml", cm["data"]["config.yaml"]
                                          .replace('"200ms"', '"soon"')), "not a duration"),
], ids=["flag", "config-key", "env", "config-value"])
def test_a_flag_or_key_the_agent_does_not_know_fails_the_check(rendered, tmp_path, doctor,
                                                               message):
    """The check above can fail: the same render with one thing the agent does not know."""
    objects = copy.deepcopy(rendered)
    container = by_kind(objects, "DaemonSet")[0]["spec"]["template"]["spec"]["containers"][0]
    doctor(container, by_kind(objects, "ConfigMap")[0])
    with pytest.raises(LabError, match=message):
        agent_image.check_against_agent(objects, tmp_path)


def test_daemonset_is_what_an_operator_expects(rendered):
    (ds,) = by_kind(rendered, "DaemonSet")
    spec = ds["spec"]
    pod = spec["template"]["spec"]
    (c,) = pod["containers"]
    assert spec["updateStrategy"] == {"type": "RollingUpdate",
                                      "rollingUpdate": {"maxUnavailable": 1}}
    assert pod["hostNetwork"] is True and pod["dnsPolicy"] == "Default"
    assert pod["hostPID"] is True          # the owners of stale UDP sockets (reconnect.py)
    assert pod["priorityClassName"] == "system-node-critical"
    assert pod["tolerations"] == [{"operator": "Exists"}]
    sec = c["securityContext"]
    assert sec["privileged"] is False
    assert sec["capabilities"] == {"drop": ["ALL"], "add": ["BPF", "NET_ADMIN", "SYS_ADMIN",
                                                            "SYS_PTRACE", "DAC_READ_SEARCH",
                                                            "NET_RAW"]}
    assert "allowPrivilegeEscalation" not in sec     # the API forbids false with SYS_ADMIN
    assert c["readinessProbe"]["httpGet"]["path"] == "/healthz"
    assert c["livenessProbe"]["httpGet"]["path"] == "/livez"
    env = {e["name"]: e for e in c["env"]}
    assert env["KUBERNETES_SERVICE_HOST"]["value"] == "10.0.0.1"
    assert env["KUBERNETES_SERVICE_PORT"]["value"] == "6443"
    assert env["KPROXY_HOSTNAME_OVERRIDE"]["valueFrom"]["fieldRef"]["fieldPath"] == "spec.nodeName"
    host_paths = {v["name"]: v["hostPath"]["path"] for v in pod["volumes"] if "hostPath" in v}
    assert host_paths == {"bpffs": "/sys/fs/bpf", "cgroup": "/sys/fs/cgroup",
                          "program-cache": "/var/cache/kproxy-ebpf/programs",
                          "netns": "/run/netns"}
    mounts = {m["name"]: m["mountPath"] for m in c["volumeMounts"]}
    assert env["KPROXY_PROGRAM_CACHE"]["value"] == mounts["program-cache"] == \
        "/var/cache/kproxy-ebpf/programs"


def test_the_program_cache_can_be_turned_off(helm):
    (ds,) = by_kind(agent_image.helm_template({"hostPaths": {
        "bpffs": "/sys/fs/bpf", "cgroupRoot": "/sys/fs/cgroup", "programCache": ""}}),
        "DaemonSet")
    pod = ds["spec"]["template"]["spec"]
    (c,) = pod["containers"]
    assert "program-cache" not in {v["name"] for v in pod["volumes"]}
    assert {e["name"]: e.get("value") for e in c["env"]}["KPROXY_PROGRAM_CACHE"] == ""


def test_rbac_only_reads_and_reports(rendered):
    (role,) = by_kind(rendered, "ClusterRole")
    verbs = {(g, r): set(rule["verbs"]) for rule in role["rules"]
             for g in rule["apiGroups"] for r in rule["resources"]}
    assert verbs == {("", "services"): {"get", "list", "watch"},
                     ("", "nodes"): {"get", "list", "watch"},
                     ("discovery.k8s.io", "endpointslices"): {"get", "list", "watch"},
                     ("networking.k8s.io", "servicecidrs"): {"get", "list", "watch"},
                     ("", "events"): {"create", "patch"},
                     ("events.k8s.io", "events"): {"create", "patch"}}
    (binding,) = by_kind(rendered, "ClusterRoleBinding")
    (sa,) = by_kind(rendered, "ServiceAccount")
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": sa["metadata"]["name"],
                                    "namespace": "kube-system"}]
    # and, in its own namespace, its own DaemonSet only (uninstall or restart, at exit)
    (ds,) = by_kind(rendered, "DaemonSet")
    (own,) = by_kind(rendered, "Role")
    assert own["metadata"]["namespace"] == "kube-system"
    assert own["rules"] == [{"apiGroups": ["apps"], "resources": ["daemonsets"],
                             "resourceNames": [ds["metadata"]["name"]],
                             "verbs": ["get", "list", "watch"]}]
    (own_binding,) = by_kind(rendered, "RoleBinding")
    assert own_binding["subjects"] == binding["subjects"]
    assert own_binding["roleRef"]["name"] == own["metadata"]["name"]


def test_config_follows_values(helm):
    objects = agent_image.helm_template({"config": {"logLevel": "debug", "syncPeriod": "1m",
                                                    "mapSizes": {"svc": 1024}},
                                         "metricsService": {"enabled": False}})
    (cm,) = by_kind(objects, "ConfigMap")
    cfg = yaml.safe_load(cm["data"]["config.yaml"])
    assert cfg["logLevel"] == "debug" and cfg["syncPeriod"] == "1m"
    assert cfg["mapSizes"]["svc"] == 1024
    # The chart's defaults are the header's (bpf/kproxy.h KP_MAPS sizes).
    assert {k: v for k, v in cfg["mapSizes"].items() if k != "svc"} == \
        {k: MAPS[k].default_size for k in cfg["mapSizes"] if k != "svc"}
    assert cfg["metricsBindAddress"] == "127.0.0.1:10249"      # no Service: loopback only
    assert not [o for o in objects if o["kind"] == "Service"]


def test_config_change_rolls_the_agents(helm):
    def checksum(values):
        (ds,) = by_kind(agent_image.helm_template(values), "DaemonSet")
        return ds["spec"]["template"]["metadata"]["annotations"]["checksum/config"]
    assert checksum({}) != checksum({"config": {"logLevel": "debug"}})


@pytest.mark.parametrize("values,message", [
    ({"config": {"logLevel": "verbose"}}, "logLevel"),
    ({"config": {"minSyncPeriod": "soon"}}, "minSyncPeriod"),
    ({"config": {"mapSizes": {"svcs": 1}}}, "svcs"),
    ({"hostPaths": {"bpffs": "sys/fs/bpf", "cgroupRoot": "/sys/fs/cgroup"}}, "bpffs"),
    ({"config": {"kubeProxyCleanup": "yes"}}, "kubeProxyCleanup"),
    ({"config": {"kubeProxyCleanup": True}}, "kubeProxyCleanup"),
    ({"nosuchvalue": 1}, "nosuchvalue"),
])
def test_schema_rejects_bad_values(helm, values, message):
    with pytest.raises(LabError, match=message):
        agent_image.helm_template(values)


@pytest.mark.parametrize("values,message", [
    ({"datapath": {"nodePortRange": "30000-32767"}}, "not a setting"),
])
def test_settings_this_agent_cannot_honour_are_refused_not_ignored(helm, values, message):
    with pytest.raises(LabError, match=message):
        agent_image.helm_template(values)


def test_devices_reach_the_agents_configuration(helm):
    objects = agent_image.helm_template({"datapath": {"devices": ["eth0", "eth1"]}})
    (cm,) = by_kind(objects, "ConfigMap")
    assert yaml.safe_load(cm["data"]["config.yaml"])["devices"] == ["eth0", "eth1"]


@pytest.mark.parametrize("values,expected", [
    ({}, (True, None)),
    ({"datapath": {"socketLB": False}}, (False, None)),
    ({"datapath": {"socketLB": False, "podDevices": ["cali*", "eni*"]}}, (False, ["cali*", "eni*"])),
])
def test_socket_lb_and_pod_devices_reach_the_agents_configuration(helm, tmp_path, values,
                                                                  expected):
    (cm,) = by_kind(agent_image.helm_template(values), "ConfigMap")
    config = yaml.safe_load(cm["data"]["config.yaml"])
    assert (config["socketLB"], config.get("podDevices")) == expected
    (tmp_path / "config.yaml").write_text(cm["data"]["config.yaml"])
    cfg = load_config(str(tmp_path / "config.yaml"), env={})
    assert (cfg.socket_lb, cfg.pod_devices) == (expected[0], expected[1] or list(DEFAULT_GLOBS))


def test_helm_test_hook_checks_the_kubernetes_clusterip(helm):
    objects = agent_image.helm_template({}, extra_args=("--show-only",
                                                        "templates/tests/test-clusterip.yaml"))
    (pod,) = objects
    assert pod["metadata"]["annotations"]["helm.sh/hook"] == "test"
    assert "KUBERNETES_SERVICE_HOST" in pod["spec"]["containers"][0]["command"][-1]
    assert pod["spec"].get("hostNetwork") is not True          # from the pod network


@pytest.mark.parametrize("values,expected", [({}, True),
                                             ({"datapath": {"staleSocketsTCP": False}}, False)])
def test_stale_sockets_tcp_reaches_the_agents_configuration(helm, tmp_path, values, expected):
    (cm,) = by_kind(agent_image.helm_template(values), "ConfigMap")
    (tmp_path / "config.yaml").write_text(cm["data"]["config.yaml"])
    assert load_config(str(tmp_path / "config.yaml"), env={}).stale_sockets_tcp is expected


@pytest.mark.parametrize("netns,mounted", [("/run/netns", True), ("", False)])
def test_pod_network_namespaces_are_mounted_read_only_for_the_stale_socket_search(
        helm, netns, mounted):
    (ds,) = by_kind(agent_image.helm_template({"hostPaths": {"netns": netns}}), "DaemonSet")
    spec = ds["spec"]["template"]["spec"]
    mounts = {m["name"]: m for m in spec["containers"][0]["volumeMounts"]}
    volumes = {v["name"]: v for v in spec["volumes"]}
    assert ("netns" in mounts, "netns" in volumes) == (mounted, mounted)
    if mounted:
        assert mounts["netns"] == {"name": "netns", "mountPath": "/run/netns", "readOnly": True,
                                   "mountPropagation": "HostToContainer"}
        assert volumes["netns"]["hostPath"]["path"] == "/run/netns"


@pytest.mark.parametrize("values,expected", [({}, "off"),
                                             ({"config": {"kubeProxyCleanup": "dry-run"}}, "dry-run"),
                                             ({"config": {"kubeProxyCleanup": "on"}}, "on")])
def test_kube_proxy_cleanup_reaches_the_agents_configuration(helm, tmp_path, values, expected):
    (cm,) = by_kind(agent_image.helm_template(values), "ConfigMap")
    (tmp_path / "config.yaml").write_text(cm["data"]["config.yaml"])
    cfg = load_config(str(tmp_path / "config.yaml"), env={})
    assert cfg.kube_proxy_cleanup == expected      # a string, not YAML 1.1's boolean off/on


@pytest.mark.parametrize("remove", [True, False])
def test_the_agent_knows_its_own_daemonset_to_tell_an_uninstall_from_a_restart(helm, remove):
    objects = agent_image.helm_template({"datapath": {"removeOnUninstall": remove}})
    (ds,) = by_kind(objects, "DaemonSet")
    pod = ds["spec"]["template"]["spec"]
    env = {e["name"]: e for e in pod["containers"][0]["env"]}
    # the API reads at exit fit in the grace period (agent/uninstall.py: 10 s at most)
    assert pod["terminationGracePeriodSeconds"] == 30 > uninstall.DEADLINE + 5
    if not remove:
        assert "KPROXY_DAEMONSET_NAME" not in env and not by_kind(objects, "Role")
        return
    assert env["KPROXY_DAEMONSET_NAME"]["value"] == ds["metadata"]["name"]
    assert env["KPROXY_DAEMONSET_NAMESPACE"]["valueFrom"]["fieldRef"]["fieldPath"] == \
        "metadata.namespace"
