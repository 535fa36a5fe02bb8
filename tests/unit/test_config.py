from pathlib import Path

import pytest

from kproxy_ebpf.config import ConfigError, load, parse_duration


@pytest.fixture
def cgroup2():
    """The machine's own cgroup2 mount (read with statfs only; nothing attaches to it)."""
    for line in Path("/proc/self/mounts").read_text().splitlines():
        _, where, fstype, *_ = line.split()
        if fstype == "cgroup2":
            return where
    pytest.skip("this machine has no cgroup2 mount")


@pytest.mark.parametrize("text,seconds", [("200ms", 0.2), ("1s", 1.0), ("5m", 300.0), (3, 3.0),
                                          ("2.5s", 2.5)])
def test_durations(text, seconds):
    assert parse_duration(text) == pytest.approx(seconds)


def test_bad_duration():
    with pytest.raises(ConfigError):
        parse_duration("soon")


def test_file_then_env_then_flags(tmp_path):
    f = tmp_path / "c.yaml"
    f.write_text("hostnameOverride: from-file\nminSyncPeriod: 1s\nbpffsDir: /sys/fs/bpf/x\n"
                 "mapSizes: {svc: 1024, backend: 512}\n")
    cfg = load(str(f), env={"KPROXY_MIN_SYNC_PERIOD": "50ms"},
               overrides={"hostname_override": "from-flag", "bpffs_dir": None})
    assert cfg.node_name == "from-flag"
    assert cfg.min_sync_period == pytest.approx(0.05)
    assert cfg.bpffs_dir == "/sys/fs/bpf/x"
    assert (cfg.map_sizes.svc, cfg.map_sizes.backend, cfg.map_sizes.meta) == (1024, 512, 16384)


def test_unknown_setting_is_an_error(tmp_path):
    f = tmp_path / "c.yaml"
    f.write_text("syncPeriodd: 1s\n")
    with pytest.raises(ConfigError, match="syncPeriodd"):
        load(str(f), env={})


def test_cgroup_is_required():
    with pytest.raises(ConfigError, match="cgroup"):
        load(None, env={}).validate()


def test_a_cgroup_v1_directory_is_refused_with_the_setting_to_change(tmp_path):
    """A directory that is neither cgroup2 nor holds the hybrid layout's `unified` tree: one
    sentence that names the chart value and what to mount, not a kernel-probe error."""
    cfg = load(None, env={})
    cfg.cgroup = str(tmp_path)
    with pytest.raises(ConfigError) as e:
        cfg.validate()
    msg = str(e.value)
    assert f"cgroup {tmp_path} is cgroup v1" in msg
    assert "hostPaths.cgroupRoot" in msg and "mount -t cgroup2" in msg and "\n" not in msg


def test_a_cgroup2_mount_is_taken_as_it_is(cgroup2):
    cfg = load(None, env={})
    cfg.cgroup = cgroup2
    cfg.validate()
    assert cfg.cgroup == cgroup2


@pytest.mark.parametrize("text,expected", [("true", True), ("false", False), ("0", False),
                                           ("yes", True), ("False", False)])
def test_socket_lb_from_env(text, expected):
    assert load(None, env={"KPROXY_SOCKET_LB": text}).socket_lb is expected


def test_socket_lb_nonsense_is_an_error_not_false(tmp_path):
    f = tmp_path / "c.yaml"
    f.write_text("socketLB: flase\n")
    with pytest.raises(ConfigError, match="socketLB must be true or false"):
        load(str(f), env={})


@pytest.mark.parametrize("text,expected", [("", True), ("staleSocketsTCP: false\n", False),
                                           ("staleSocketsTCP: true\n", True)])
def test_stale_sockets_tcp_from_the_file(tmp_path, text, expected):
    f = tmp_path / "c.yaml"
    f.write_text(text)
    assert load(str(f), env={}).stale_sockets_tcp is expected


def test_stale_sockets_tcp_nonsense_is_an_error(tmp_path):
    f = tmp_path / "c.yaml"
    f.write_text("staleSocketsTCP: sometimes\n")
    with pytest.raises(ConfigError, match="staleSocketsTCP must be true or false"):
        load(str(f), env={})


def test_socket_lb_and_pod_devices_from_the_file(tmp_path):
    f = tmp_path / "c.yaml"
    f.write_text("socketLB: false\npodDevices: [cali*, eni*]\n")
    cfg = load(str(f), env={})
    assert (cfg.socket_lb, cfg.pod_devices) == (False, ["cali*", "eni*"])
    assert load(None, env={}).pod_devices == ["veth*", "cali*", "lxc*", "kpv*"]


def test_socket_lb_off_needs_pod_devices(cgroup2):
    cfg = load(None, env={"KPROXY_SOCKET_LB": "false", "KPROXY_POD_DEVICES": ","})
    cfg.cgroup = cgroup2
    with pytest.raises(ConfigError, match="podDevices"):
        cfg.validate()


@pytest.mark.parametrize("args,expected", [([], True), (["--socket-lb=false"], False),
                                           (["--socket-lb", "true"], True),
                                           (["--socket-lb=0"], False)])
def test_run_flag_socket_lb(monkeypatch, cgroup2, args, expected):
    """`kproxy-ebpf run --socket-lb=false` (the benchmark's kproxy-tc mode) reaches the config
    the agent gets."""
    from click.testing import CliRunner

    import kproxy_ebpf.agent.agent as agent_mod
    from kproxy_ebpf.cli.main import main

    seen = {}

    class FakeAgent:      # the agent itself needs root and a cluster; only its config matters
        def __init__(self, cfg):
            seen["cfg"] = cfg

        def run_until_signalled(self):
            pass

    monkeypatch.setattr(agent_mod, "Agent", FakeAgent)
    out = CliRunner().invoke(main, ["run", "--cgroup", cgroup2, *args], env={})
    assert out.exit_code == 0, out.output
    assert seen["cfg"].socket_lb is expected


def test_run_flag_socket_lb_rejects_nonsense(tmp_path):
    from click.testing import CliRunner

    from kproxy_ebpf.cli.main import main

    out = CliRunner().invoke(main, ["run", "--cgroup", str(tmp_path), "--socket-lb=maybe"])
    assert out.exit_code == 2 and "socket-lb" in out.output


def test_lb_algorithm_and_maglev_table_size(tmp_path, cgroup2):
    from kproxy_ebpf.model.objects import LBAlgorithm

    f = tmp_path / "c.yaml"
    f.write_text("lbAlgorithm: maglev\nmaglevTableSize: 4093\n")
    cfg = load(str(f), env={})
    cfg.cgroup = cgroup2
    cfg.validate()
    assert cfg.planning["lb_algorithm"] is LBAlgorithm.MAGLEV
    assert cfg.planning["maglev_table_size"] == 4093
    assert load(None, env={}).planning["lb_algorithm"] is LBAlgorithm.RANDOM


@pytest.mark.parametrize("text,why", [("lbAlgorithm: ring\n", "lbAlgorithm must be one of random, "
                                       "maglev"),
                                      ("maglevTableSize: 16384\n", "must be a prime"),
                                      ("maglevTableSize: 131071\n", "between 251 and 65521"),
                                      ("maglevTableSize: big\n", "a whole number")])
def test_bad_lb_settings_say_what_to_write(tmp_path, cgroup2, text, why):
    f = tmp_path / "c.yaml"
    f.write_text(text)
    with pytest.raises(ConfigError, match=why):
        cfg = load(str(f), env={})
        cfg.cgroup = cgroup2
        cfg.validate()


@pytest.mark.parametrize("text,expected", [("kubeProxyCleanup: off", "off"),       # YAML 1.1: False
                                           ("kubeProxyCleanup: on", "on"),
                                           ('kubeProxyCleanup: "dry-run"', "dry-run"),
                                           ("", "off")])
def test_kube_proxy_cleanup_from_the_file(tmp_path, text, expected):
    f = tmp_path / "c.yaml"
    f.write_text(text + "\n")
    assert load(str(f), env={}).kube_proxy_cleanup == expected


def test_kube_proxy_cleanup_nonsense_is_an_error(cgroup2):
    cfg = load(None, env={"KPROXY_KUBE_PROXY_CLEANUP": "yes"})
    cfg.cgroup = cgroup2
    with pytest.raises(ConfigError, match="kubeProxyCleanup must be one of off, dry-run, on"):
        cfg.validate()


def test_the_daemonset_from_the_environment():
    cfg = load(None, env={"KPROXY_DAEMONSET_NAME": "kproxy-ebpf",
                          "KPROXY_DAEMONSET_NAMESPACE": "kube-system"})
    assert (cfg.daemonset_namespace, cfg.daemonset_name) == ("kube-system", "kproxy-ebpf")
