import pytest

from kproxy_ebpf.config import ConfigError, load, parse_duration


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
