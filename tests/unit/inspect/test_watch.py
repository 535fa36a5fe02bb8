"""`kproxy-ebpf watch`: the changes between two reads of the maps, in words, and polls that
wait out a read taken in the middle of a sync's writes."""
from __future__ import annotations

from kproxy_ebpf.inspect import watch
from kproxy_ebpf.inspect.watch import ChangeKind


def row(backends: dict[str, str], action: str = "forward", service: str = "default/web:http",
        address: str = "10.96.0.10") -> dict:
    """A reader.services() row."""
    return {"service": service, "type": "ClusterIP", "address": address, "port": 80,
            "protocol": "TCP", "scope": 0, "action": action, "affinity_timeout": 0,
            "backends": [{"slot": i + 1, "id": i, "address": a, "port": 8080, "state": s}
                         for i, (a, s) in enumerate(backends.items())]}


def test_scale_up_drain_and_removal_in_words():
    before = watch.snapshot([row({"10.244.1.2": "ready"}),
                             row({}, "reject", "default/gone:http", "10.96.0.11")])
    after = watch.snapshot([row({"10.244.1.2": "terminating", "10.244.2.3": "ready"})])
    changes = watch.diff(before, after)
    assert [c.kind for c in changes] == [ChangeKind.CHANGED, ChangeKind.REMOVED]
    assert changes[0].line() == ("~ default/web:http ClusterIP 10.96.0.10:80/TCP "
                                 "+10.244.2.3:8080 (ready), 10.244.1.2:8080 ready -> terminating")
    assert changes[1].line() == "- default/gone:http ClusterIP 10.96.0.11:80/TCP"
    added = watch.diff({}, after)
    assert added[0].line() == ("+ default/web:http ClusterIP 10.96.0.10:80/TCP forward backends: "
                               "10.244.1.2:8080 (terminating), 10.244.2.3:8080 (ready)")
    verdict = watch.diff(after, watch.snapshot([row({}, "reject")]))
    assert "verdict forward -> reject" in verdict[0].line()
    assert "-10.244.1.2:8080" in verdict[0].line()


def test_the_service_filter_keeps_one_service():
    rows = [row({}), row({}, service="other/db:sql", address="10.96.0.12")]
    assert [v.service for v in watch.snapshot(rows, "other/db").values()] == ["other/db:sql"]


def test_a_poll_waits_for_two_reads_that_agree():
    one, two = watch.snapshot([row({"10.244.1.2": "ready"})]), watch.snapshot([row({})])
    torn = watch.snapshot([row({"10.244.9.9": "ready"})])
    reads = iter([one, one, torn, two, two, two, two])
    sleeps: list[float] = []
    clock = iter([0.0, 0.5, 5.0])
    polls = list(watch.follow(lambda: next(reads), 1.0, deadline=2.0, sleep=sleeps.append,
                              clock=lambda: next(clock)))
    # The baseline; then the torn read is never reported, the state after it is.
    assert [len(c) for _, c in polls] == [0, 1]
    assert polls[1][0] == two and "-10.244.1.2:8080" in polls[1][1][0].line()
    assert 1.0 in sleeps and watch.SETTLE_S in sleeps
