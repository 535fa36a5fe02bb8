"""At exit: which answers of the API server mean "leaving the node" (remove the datapath) and
which mean a restart (keep it). The real thing: tests/integration/test_agent_handover.py."""
import pytest

from kproxy_ebpf.agent import uninstall

NODE = {"metadata": {"name": "node1", "labels": {"kubernetes.io/os": "linux", "pool": "a",
                                                  "cores": "8"}}, "spec": {}}


def ds(pod_spec: dict | None = None, **meta) -> dict:
    return {"metadata": {"name": "kproxy-ebpf", **meta},
            "spec": {"template": {"spec": pod_spec or {}}}}


def test_the_daemonset_gone_or_being_deleted_is_an_uninstall():
    assert uninstall.leaving(None, NODE, "kube-system", "kproxy-ebpf", "node1") == \
        (True, "DaemonSet kube-system/kproxy-ebpf is gone (uninstalled)")
    leave, why = uninstall.leaving(ds(deletionTimestamp="2026-12-07T00:00:00Z"), NODE,
                                   "kube-system", "kproxy-ebpf", "node1")
    assert leave and "being deleted" in why
    assert uninstall.leaving(ds(), None, "ns", "x", "node1")[0]        # the Node left


def test_the_daemonset_still_selecting_the_node_is_a_restart():
    leave, why = uninstall.leaving(ds({"nodeSelector": {"kubernetes.io/os": "linux"}}), NODE,
                                   "kube-system", "kproxy-ebpf", "node1")
    assert not leave and "restart" in why


@pytest.mark.parametrize("pod_spec,selected", [
    ({}, True),
    ({"nodeSelector": {"pool": "b"}}, False),
    ({"nodeSelector": {"pool": "a", "kubernetes.io/os": "linux"}}, True),
    ({"affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
        "nodeSelectorTerms": [{"matchExpressions": [{"key": "pool", "operator": "NotIn",
                                                     "values": ["a"]}]}]}}}}, False),
    # terms are ORed, the requirements of one term ANDed
    ({"affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
        "nodeSelectorTerms": [
            {"matchExpressions": [{"key": "pool", "operator": "In", "values": ["b"]}]},
            {"matchExpressions": [{"key": "cores", "operator": "Gt", "values": ["4"]},
                                  {"key": "gpu", "operator": "DoesNotExist"}]}]}}}}, True),
    ({"affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
        "nodeSelectorTerms": [{"matchFields": [{"key": "metadata.name", "operator": "In",
                                                "values": ["node2"]}]}]}}}}, False),
    # an empty term matches no node, as the scheduler has it
    ({"affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
        "nodeSelectorTerms": [{}]}}}}, False),
    # preferred affinity never takes a pod off a node
    ({"affinity": {"nodeAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": [
        {"weight": 1, "preference": {"matchExpressions": [
            {"key": "pool", "operator": "In", "values": ["b"]}]}}]}}}, True),
])
def test_selection_by_node_selector_and_required_affinity(pod_spec, selected):
    assert uninstall.selects(pod_spec, NODE) is selected


@pytest.mark.parametrize("taint,tolerations,selected", [
    ({"key": "maintenance", "effect": "NoExecute"}, [], False),
    ({"key": "maintenance", "effect": "NoExecute"}, [{"operator": "Exists"}], True),
    ({"key": "maintenance", "value": "yes", "effect": "NoExecute"},
     [{"key": "maintenance", "operator": "Equal", "value": "yes"}], True),
    ({"key": "maintenance", "value": "yes", "effect": "NoExecute"},
     [{"key": "maintenance", "operator": "Equal", "value": "no"}], False),
    ({"key": "maintenance", "effect": "NoSchedule"}, [], True),       # a running pod stays
    ({"key": "node.kubernetes.io/unreachable", "effect": "NoExecute"}, [], True),
])
def test_a_noexecute_taint_not_tolerated_takes_the_node_out(taint, tolerations, selected):
    node = {**NODE, "spec": {"taints": [taint]}}
    assert uninstall.selects({"tolerations": tolerations}, node) is selected


def test_no_answer_or_no_daemonset_keeps_the_datapath(monkeypatch):
    assert uninstall.decide(None, "kube-system", "kproxy-ebpf", "node1")[0] is False
    assert uninstall.decide(object(), None, None, "node1")[0] is False

    def unreachable(*args):
        raise ConnectionRefusedError("connection refused")

    from kproxy_ebpf.kube import owner
    monkeypatch.setattr(owner, "daemonset_and_node", unreachable)
    leave, why = uninstall.decide(object(), "kube-system", "kproxy-ebpf", "node1")
    assert not leave and "keeping the datapath" in why and "kproxy-ebpf cleanup" in why


def test_an_answer_too_late_keeps_the_datapath(monkeypatch):
    import threading

    from kproxy_ebpf.kube import owner
    never = threading.Event()
    monkeypatch.setattr(owner, "daemonset_and_node", lambda *a: never.wait(5))
    leave, why = uninstall.decide(object(), "kube-system", "kproxy-ebpf", "node1", deadline=0.1)
    never.set()
    assert not leave and "no answer within 0.1s" in why


def test_an_uninstall_the_watch_saw_needs_no_question(monkeypatch):
    """helm uninstall deletes the agent's ServiceAccount with the DaemonSet: by SIGTERM its
    token is refused, so what the watch saw decides."""
    from kproxy_ebpf.kube import owner

    def refused(*args):
        raise RuntimeError("401 Unauthorized")

    monkeypatch.setattr(owner, "daemonset_and_node", refused)
    assert uninstall.decide(object(), "kube-system", "kproxy-ebpf", "node1",
                            watched=(True, None)) == \
        (True, "DaemonSet kube-system/kproxy-ebpf is gone (uninstalled)")
    leave, why = uninstall.decide(object(), "kube-system", "kproxy-ebpf", "node1",
                                  watched=(True, ds(deletionTimestamp="2026-12-07T00:00:00Z")))
    assert leave and "being deleted" in why
    # a DaemonSet the watch still has, or no watch yet: the API server is asked (and here
    # refuses, so everything is kept)
    for watched in ((True, ds()), (False, None)):
        leave, why = uninstall.decide(object(), "kube-system", "kproxy-ebpf", "node1",
                                      watched=watched)
        assert not leave and "401 Unauthorized" in why
