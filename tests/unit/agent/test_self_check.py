"""The agent's /checkz (self_check.py) and `check --all-nodes`' reading of it (check_nodes.py):
drift, detached hooks and an unhealthy or silent agent are each a problem; a check found drift
asks the agent to re-read its maps, once, and repeated requests are answered from one check."""
from __future__ import annotations

from kproxy_ebpf.agent import self_check
from kproxy_ebpf.datapath.maps import layout as L
from kproxy_ebpf.inspect import check_nodes

from ...builders import fe, table

HOOKS = [{"hook": "connect4", "pinned": True}, {"hook": "sendmsg4", "pinned": True}]


def kernel_row(ip: str, backends: list[str]) -> dict:
    """A reader.services() row of builders.fe()'s frontend."""
    return {"address": ip, "port": 80, "protocol": "TCP", "scope": L.SCOPE_SOCK,
            "service": "default/web:http", "type": "ClusterIP", "action": "forward",
            "affinity_timeout": 0, "source_ranges": [],
            "backends": [{"address": b, "port": 8080} for b in backends]}


def inp(kernel, hooks=HOOKS, **kw) -> self_check.CheckInput:
    return self_check.CheckInput(node="n1", desired=table(fe(backends=["10.244.1.10"])),
                                 kernel=kernel, hooks=hooks, hooks_expected=True, synced=True,
                                 **kw)


def test_a_clean_node_and_each_kind_of_problem():
    ok = self_check.evaluate(inp([kernel_row("10.96.0.10", ["10.244.1.10"])]))
    assert ok.clean and ok.drift_count == 0 and ok.hooks_attached == 2
    gone = self_check.evaluate(inp([]))
    assert not gone.clean and gone.drift_count == 1 and gone.drift[0].startswith("missing")
    detached = self_check.evaluate(inp([kernel_row("10.96.0.10", ["10.244.1.10"])],
                                       hooks=[HOOKS[0], {"hook": "sendmsg4", "pinned": False}]))
    assert detached.problems == ("hooks not attached: sendmsg4",)
    early = self_check.evaluate(self_check.CheckInput("n1", {}, [], [], True, synced=False))
    assert early.problems == ("not synced yet",)


def test_drift_asks_for_one_reread_and_requests_share_a_check():
    now, asked, taken = [0.0], [], []

    def take():
        taken.append(1)
        return inp([])

    check = self_check.SelfCheck(take, lambda body: asked.append(1), clock=lambda: now[0])
    assert check()["driftCount"] == 1 and check()["driftCount"] == 1
    assert len(taken) == 1 and len(asked) == 1
    now[0] += self_check.MIN_INTERVAL_S
    check()
    assert len(taken) == 2
    # Frontends a full map left behind are the agent's to retry: no re-read for them.
    quiet = self_check.SelfCheck(lambda: inp([], unprogrammed=1), lambda body: asked.append(1))
    quiet()
    assert len(asked) == 2


def test_all_nodes_reads_each_agents_answers():
    bodies = {"http://10.0.0.1:10256/healthz": (200, {}),
              "http://10.0.0.1:10256/checkz": (200, self_check.evaluate(
                  inp([kernel_row("10.96.0.10", ["10.244.1.10"])])).body()),
              "http://10.0.0.2:10256/healthz": (503, {}),
              "http://10.0.0.2:10256/checkz": (200, self_check.evaluate(inp([])).body())}

    def get(url):
        if "10.0.0.3" in url:
            raise OSError("connection refused")
        return bodies[url]

    reports = check_nodes.ask_all([("a", "10.0.0.1"), ("b", "10.0.0.2"), ("c", "10.0.0.3"),
                                   ("d", None)], 10256, get)
    assert [r.clean for r in reports] == [True, False, False, False]
    assert reports[1].problems[0].startswith("/healthz 503")
    assert "1 frontends differ from the API" in reports[1].problems
    assert reports[2].problems == ["no agent answers at http://10.0.0.3:10256 (connection refused)"]
    assert reports[3].problems == ["the Node has no address"]
    header, lines = check_nodes.table(reports)
    assert header[0] == "NODE" and lines[0][-1] == "ok" and lines[1][4] == 1


def test_a_service_cidr_row_deleted_behind_the_writer_is_drift():
    from kproxy_ebpf.datapath.write.apply_result import ApplyResult
    from kproxy_ebpf.datapath.write.cidr_writer import CidrWriter
    from kproxy_ebpf.model.desired import ServiceCIDRSet

    from ...fakemaps import fake_maps

    maps = fake_maps(("clusterip", "servicecidr"))
    w = CidrWriter(maps)
    assert w.apply(ServiceCIDRSet(cidrs=frozenset({"10.96.0.0/16"}),
                                  cluster_ips=frozenset({"10.96.0.10"}),
                                  foreign_ips=frozenset({"10.96.0.11"})), ApplyResult())
    row = [kernel_row("10.96.0.10", ["10.244.1.10"])]
    clean = self_check.evaluate(inp(row, cidrs_written=w.written(), cidrs_held=w.held()))
    assert clean.clean, clean
    maps["clusterip"].delete(L.ip16("10.96.0.11"))
    got = self_check.evaluate(inp(row, cidrs_written=w.written(), cidrs_held=w.held()))
    assert got.drift_count == 1 and got.drift[0].split()[:3] == ["missing", "ClusterIP",
                                                                     "10.96.0.11"], got


def test_a_missing_tc_filter_is_a_problem_and_asks_for_a_repair():
    row = [kernel_row("10.96.0.10", ["10.244.1.10"])]
    asked = []
    check = self_check.SelfCheck(lambda: inp(row, tc_missing=("eth0 ingress kp_from_outside",)),
                                 lambda body: asked.append(1))
    body = check()
    assert body["problems"] == ["TC filters not attached: eth0 ingress kp_from_outside"]
    assert not body["clean"] and asked == [1]
