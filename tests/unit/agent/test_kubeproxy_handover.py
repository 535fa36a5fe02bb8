"""When the agent removes kube-proxy's leftovers (kubeProxyCleanup): only after its own first
sync, only with no kube-proxy in its network namespace and its healthz port its own; dry-run
changes nothing; failures are retried. The removal itself: test_kubeproxy_leftovers_netns.py."""
import os

import pytest
from prometheus_client import CollectorRegistry

from kproxy_ebpf.agent import kubeproxy_handover as kh
from kproxy_ebpf.agent.kubeproxy_cleanup import Report


class World:
    def __init__(self):
        self.synced, self.port_free, self.pids = True, True, []
        self.calls: list[bool] = []
        self.report = Report(removed=["iptables-nft nat KUBE-SERVICES",
                                      "nftables table ip kube-proxy"])
        self.told: list[tuple[str, str]] = []

    def cleanup(self, dry_run):
        self.calls.append(dry_run)
        return self.report

    def handover(self, mode, registry=None):
        return kh.Handover(mode, registry, synced=lambda: self.synced,
                           port_free=lambda: self.port_free, told=lambda *a: self.told.append(a),
                           cleanup=self.cleanup, pids=lambda: self.pids)


@pytest.mark.parametrize("synced,port_free,pids", [(False, True, []), (True, False, []),
                                                   (True, True, [4242])])
def test_nothing_is_touched_while_kube_proxy_may_still_serve(synced, port_free, pids, caplog):
    caplog.set_level("INFO")
    w = World()
    w.synced, w.port_free, w.pids = synced, port_free, pids
    h = w.handover(kh.Mode.ON)
    assert h.check() is False and h.check() is False
    assert w.calls == []
    if pids:
        assert "kube-proxy runs in this network namespace (pid 4242)" in caplog.text
    assert caplog.text.count("leftovers") == 1            # the reason told once, not per check


def test_on_removes_logs_counts_and_tells_once_kube_proxy_is_gone(caplog):
    caplog.set_level("INFO")
    w, registry = World(), CollectorRegistry()
    h = w.handover(kh.Mode.ON, registry)
    assert h.check() is True and h.done.is_set()
    assert w.calls == [False]
    assert "kube-proxy leftover removed: nftables table ip kube-proxy" in caplog.text
    assert registry.get_sample_value("kproxy_kubeproxy_leftovers_removed_total") == 2
    assert registry.get_sample_value("kproxy_kubeproxy_running") == 0
    assert w.told[0][0] == "KubeProxyLeftoversRemoved" and "KUBE-SERVICES" in w.told[0][1]


def test_dry_run_only_lists():
    w, registry = World(), CollectorRegistry()
    assert w.handover(kh.Mode.DRY_RUN, registry).check() is True
    assert w.calls == [True]
    assert registry.get_sample_value("kproxy_kubeproxy_leftovers") == 2
    assert registry.get_sample_value("kproxy_kubeproxy_leftovers_removed_total") == 0
    assert w.told[0][0] == "KubeProxyLeftoversFound"


def test_a_failed_removal_is_tried_again(caplog):
    w = World()
    w.report = Report(removed=[], errors=["iptables-nft-restore (nat): busy"])
    h = w.handover(kh.Mode.ON)
    assert h.check() is False and h.check() is False and w.calls == [False, False]
    assert caplog.text.count("could not remove: iptables-nft-restore (nat): busy") == 1
    w.report = Report()
    assert h.check() is True


def test_an_unforeseen_failure_is_a_log_sentence_and_the_thread_checks_again(caplog):
    import threading

    w = World()
    failures = [FileNotFoundError(2, "No such file or directory: 'ip'")]

    def cleanup(dry_run):
        if failures:
            raise failures.pop()
        return w.cleanup(dry_run)

    h = kh.Handover(kh.Mode.ON, None, synced=lambda: True, port_free=lambda: True,
                    cleanup=cleanup, pids=lambda: [])
    stop = threading.Event()
    h.start(stop, interval=0.05)
    try:
        assert h.done.wait(10), "the thread ended at the failure"
    finally:
        stop.set()
    assert "the check failed (FileNotFoundError: [Errno 2] No such file or directory: 'ip'); " \
        "it runs again in 0.05s" in caplog.text
    assert "Traceback" not in caplog.text and w.calls == [False]


def test_kube_proxy_counts_only_in_our_network_namespace(tmp_path):
    proc = tmp_path
    (proc / "self" / "ns").mkdir(parents=True)
    ours = proc / "self" / "ns" / "net"
    ours.write_text("")
    for pid, comm, same_ns in ((100, "kube-proxy", True), (200, "kube-proxy", False),
                               (300, "bash", True)):
        (proc / str(pid) / "ns").mkdir(parents=True)
        (proc / str(pid) / "comm").write_text(comm + "\n")
        if same_ns:
            os.link(ours, proc / str(pid) / "ns" / "net")      # the same inode: our namespace
        else:
            (proc / str(pid) / "ns" / "net").write_text("")
    (proc / "400").mkdir()                                   # gone meanwhile: no comm
    assert kh.kube_proxy_pids(proc) == [100]
