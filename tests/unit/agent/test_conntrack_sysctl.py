"""kube-proxy's conntrack timeouts, written by the agent: on a procfs laid out in a temporary
directory (the real one is the node's, see tools/kind/e2e.py's "KubeProxy should set TCP
CLOSE_WAIT timeout")."""
from kproxy_ebpf.agent import conntrack_sysctl
from kproxy_ebpf.config import load

NF = "sys/net/netfilter"


def proc(tmp_path, **values):
    (tmp_path / NF).mkdir(parents=True)
    for name, value in values.items():
        (tmp_path / NF / f"nf_conntrack_tcp_timeout_{name}").write_text(f"{value}\n")
    return tmp_path


def test_kube_proxy_defaults_are_written_where_they_differ(tmp_path):
    p = proc(tmp_path, established=432000, close_wait=60)
    cfg = load(None, env={})
    values = {n: int(getattr(cfg, n)) for n in conntrack_sysctl.SYSCTLS}
    assert values == {"conntrack_tcp_established_timeout": 86400,
                      "conntrack_tcp_close_wait_timeout": 3600}
    assert conntrack_sysctl.apply(values, proc=p) == []
    assert (p / NF / "nf_conntrack_tcp_timeout_established").read_text() == "86400\n"
    assert (p / NF / "nf_conntrack_tcp_timeout_close_wait").read_text() == "3600\n"


def test_zero_leaves_the_kernel_value_and_a_missing_sysctl_is_reported(tmp_path):
    p = proc(tmp_path, established=432000)
    problems = conntrack_sysctl.apply({"conntrack_tcp_established_timeout": 0,
                                       "conntrack_tcp_close_wait_timeout": 3600}, proc=p)
    assert (p / NF / "nf_conntrack_tcp_timeout_established").read_text() == "432000\n"
    assert len(problems) == 1 and "close_wait does not exist" in problems[0]


def test_the_timeouts_are_durations_in_the_config_file(tmp_path):
    f = tmp_path / "c.yaml"
    f.write_text("conntrackTcpCloseWaitTimeout: 30m\nconntrackTcpEstablishedTimeout: 0\n")
    cfg = load(str(f), env={})
    assert (cfg.conntrack_tcp_close_wait_timeout, cfg.conntrack_tcp_established_timeout) == (1800, 0)
