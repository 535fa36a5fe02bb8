"""The sync policy alone (kproxy_ebpf/agent/sync_policy.py): what each sync does, from the runner's
tick and the outcome of the syncs before, on a hand-driven clock. The same decisions drive
the agent's real syncs in test_sync_work.py."""
from __future__ import annotations

import pytest

from kproxy_ebpf.agent.sync_policy import FULL_MAP_RETRY_EVERY, KERNEL_CHECK_EVERY, SyncPolicy
from kproxy_ebpf.model.desired import FrontendKey, Scope
from kproxy_ebpf.model.objects import Protocol

TCP = Protocol.TCP
A, B = FrontendKey("10.96.0.1", 80, TCP), FrontendKey("10.96.0.2", 80, TCP)
EXT = FrontendKey("203.0.113.1", 80, TCP, Scope.EXT)


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def ran(policy: SyncPolicy, tick: bool, failed=(), full_maps=False, cidrs_done=True):
    """One sync that ran to its end: its plan, then the outcome the policy is told."""
    plan = policy.plan(tick)
    policy.applied(plan, failed, full_maps)
    policy.cidrs_written(cidrs_done)
    policy.finished()
    return plan


def started() -> tuple[SyncPolicy, Clock]:
    clock = Clock()
    policy = SyncPolicy(clock=clock)
    first = ran(policy, True)
    assert (first.diff_all, first.reread, first.recompute) == (True, False, False)
    return policy, clock


def test_the_first_sync_diffs_everything_without_a_reread():
    policy, _ = started()
    assert policy.synced_once


def test_a_change_is_a_partial_sync():
    policy, _ = started()
    plan = ran(policy, False)
    assert not (plan.diff_all or plan.reread or plan.recompute or plan.scheduled_full)
    assert plan.retry == frozenset() and not plan.cidrs_all


def test_ticks_are_partial_syncs_counted_as_periodic_work():
    """The maps are checked for drift off the sync thread (datapath/drift.py): no tick
    diffs everything or re-reads the maps."""
    policy, _ = started()
    plans = [ran(policy, True) for _ in range(2 * KERNEL_CHECK_EVERY)]
    assert not any(p.diff_all or p.reread or p.cidrs_all for p in plans)
    assert all(p.scheduled_full for p in plans)     # their CPU is periodic work, all of them
    assert ran(policy, False).diff_all is False


def test_drift_makes_the_next_sync_reread_and_diff_everything():
    policy, _ = started()
    policy.drift_found()
    plan = ran(policy, False)
    assert (plan.diff_all, plan.reread, plan.recompute, plan.cidrs_all) == (True, True, False, True)
    assert not ran(policy, True).diff_all


def test_a_failed_sync_makes_the_next_one_do_everything_at_once():
    policy, _ = started()
    policy.plan(False)
    policy.failed()
    plan = ran(policy, False)                         # not even a tick
    assert (plan.diff_all, plan.reread, plan.recompute, plan.scheduled_full) == (True,) * 4
    after = ran(policy, False)
    assert not (after.diff_all or after.reread or after.recompute)


def test_a_failure_before_the_first_sync_ends_still_rereads():
    policy = SyncPolicy(clock=Clock())
    policy.plan(True)
    policy.failed()
    plan = policy.plan(True)
    assert plan.diff_all and plan.reread and plan.recompute


def test_keys_left_by_a_full_map_are_retried_by_time():
    policy, clock = started()
    ran(policy, False, failed=[A, B], full_maps=True)
    assert policy.retry == {A, B} and policy.retry_map_full
    plan = ran(policy, False, failed=[EXT])          # 200 ms later: not retried, not forgotten
    assert plan.retry == frozenset() and policy.retry == {A, B, EXT} and policy.retry_map_full
    clock.now += FULL_MAP_RETRY_EVERY
    plan = ran(policy, False, failed=[B], full_maps=True)
    assert plan.retry == {A, B, EXT}
    assert policy.retry == {B} and policy.retry_at == clock.now + FULL_MAP_RETRY_EVERY


def test_a_sync_that_frees_rows_makes_what_did_not_fit_due_at_once():
    policy, clock = started()
    ran(policy, False, failed=[A], full_maps=True)
    plan = policy.plan(False)
    assert policy.applied(plan, [], False, freed=False) is False     # nothing freed: wait
    plan = policy.plan(False)
    assert plan.retry == frozenset()
    assert policy.applied(plan, [], False, freed=True) is True       # ask for a sync now
    assert policy.plan(False).retry == {A}                           # no wait for the timer


def test_freed_rows_ask_for_nothing_when_nothing_waits_for_room():
    policy, _ = started()
    assert policy.applied(policy.plan(False), [], False, freed=True) is False
    ran(policy, False, failed=[A])                                   # not a full map
    assert policy.applied(policy.plan(False), [], False, freed=True) is False


def test_a_full_map_is_no_reason_to_reread_but_another_failure_is():
    policy, clock = started()
    ran(policy, False, failed=[A], full_maps=True)
    for _ in range(KERNEL_CHECK_EVERY):
        assert not ran(policy, True, failed=[A], full_maps=True).diff_all
    clock.now += FULL_MAP_RETRY_EVERY
    ran(policy, False, failed=[A])                    # an OSError, say: retried at once
    assert policy.retry_at == clock.now and not policy.retry_map_full
    assert ran(policy, False).retry == {A}
    fresh = SyncPolicy(clock=clock)                   # a write failed before any sync ended:
    fresh.applied(fresh.plan(True), [A], False)
    assert fresh.plan(True).reread                    # the next full diff reads the maps first
    fresh = SyncPolicy(clock=clock)
    fresh.applied(fresh.plan(True), [A], True)
    assert not fresh.plan(True).reread


def test_a_full_diff_retries_everything_and_forgets_what_it_got_in():
    policy, _ = started()
    ran(policy, False, failed=[A], full_maps=True)
    policy.failed()
    plan = ran(policy, False)
    assert plan.diff_all and plan.retry == frozenset()     # the diff covers every key
    assert policy.retry == frozenset() and not policy.retry_map_full


def test_service_cidrs_are_written_whole_after_an_incomplete_write():
    policy, _ = started()
    ran(policy, False, cidrs_done=False)
    assert ran(policy, False).cidrs_all
    assert not ran(policy, False).cidrs_all


@pytest.mark.parametrize("changed,pod_path,purge", [
    ((), False, False),
    ((A,), False, False),            # socket-scope flows are the socket path's, not TC's
    ((A,), True, True),              # ...unless the pod path serves ClusterIPs per packet
    ((A, EXT), False, True),
])
def test_conntrack_is_purged_when_a_changed_frontend_can_have_tc_flows(changed, pod_path, purge):
    policy, _ = started()
    assert policy.plan(False).purges_conntrack(changed, pod_path) is purge
    policy.failed()
    assert policy.plan(False).purges_conntrack((), pod_path)     # a full diff: every flow
