"""kube-proxy's health semantics with a fake clock."""
from kproxy_ebpf.health import ProxyHealth


class Clock:
    def __init__(self):
        self.now = 1000.0

    def __call__(self):
        return self.now


def test_healthy_until_a_change_waits_longer_than_the_timeout():
    clock = Clock()
    h = ProxyHealth(timeout=60, clock=clock)
    assert h.status(with_node=True)[0] == 200
    h.queued_update()
    clock.now += 59
    assert h.status(with_node=True)[0] == 200
    clock.now += 2
    code, body = h.status(with_node=True)
    assert code == 503 and body["nodeEligible"] is True
    h.updated(started=clock.now)
    assert h.status(with_node=True)[0] == 200


def test_a_sync_that_started_before_the_change_does_not_clear_it():
    clock = Clock()
    h = ProxyHealth(timeout=10, clock=clock)
    started = clock.now
    clock.now += 1
    h.queued_update()
    h.updated(started)
    clock.now += 20
    assert h.status(with_node=False)[0] == 503


def test_a_node_being_deleted_fails_healthz_but_not_livez():
    h = ProxyHealth(timeout=10, clock=Clock())
    h.node_eligible = False
    assert h.status(with_node=True)[0] == 503
    assert h.status(with_node=False)[0] == 200
