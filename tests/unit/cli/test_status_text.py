"""`kproxy-ebpf status`'s sentences and counter table (status_text.py)."""
from kproxy_ebpf.cli.status_text import counter_rows, health_sentences

BODY = {"lastUpdated": "2026-12-06T10:00:10Z", "currentTime": "2026-12-06T10:00:12Z",
        "nodeEligible": True, "healthy": True,
        "status": {"IPv4": {"lastUpdated": "2026-12-06T10:00:10Z", "healthy": True},
                   "IPv6": {"lastUpdated": "2026-12-06T10:00:10Z", "healthy": True}}}


def test_health_reads_as_sentences_for_the_families_the_node_has():
    lines = health_sentences(200, BODY, ["IPv4"])
    assert lines == ["healthy: the last sync that programmed every change ended 2 s ago.",
                     "IPv4: healthy."]


def test_an_unhealthy_agent_and_an_ineligible_node_say_why():
    body = {**BODY, "healthy": False, "nodeEligible": False}
    lines = health_sentences(503, body, ["IPv4", "IPv6"])
    assert lines[0].startswith("UNHEALTHY")
    assert any("waited for a sync longer" in x for x in lines)
    assert any("not eligible" in x for x in lines)


def test_counters_are_a_table_of_the_non_zero_ones():
    rows = counter_rows({"forward": 12, "reject": 0, "drop": 3, "revnat": 7, "retry": 0})
    assert rows == [("forward 12", "drop 3", "revnat 7"), ("(2 others 0)",)]
