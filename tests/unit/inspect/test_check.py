"""`check`: desired frontends against what the maps hold (as reader.services() decodes it)."""

import pytest
from click.testing import CliRunner

from kproxy_ebpf.config import AgentConfig
from kproxy_ebpf.inspect.check import compare, desired_for
from kproxy_ebpf.kube.sources import SLICE_LABEL_SELECTOR
from kproxy_ebpf.model.desired import Action, FrontendKey, ServicePortName
from kproxy_ebpf.model.objects import Protocol

from ...builders import ListPage, api_ep, api_list, api_service, api_slice, fe

TCP = Protocol.TCP
SPN = ServicePortName("default", "web", "http", TCP)


def held(ip, backends=(), action="forward", service="default/web:http"):
    return {"address": ip, "port": 80, "protocol": "TCP", "type": "ClusterIP", "scope": 0,
            "service": service, "action": action, "affinity_timeout": 0,
            "backends": [{"slot": i + 1, "address": b, "port": 8080, "state": "ready"}
                         for i, b in enumerate(backends)]}


def test_in_sync():
    f = fe("10.96.0.10", backends=["10.244.1.10", "10.244.2.10"])
    assert compare({f.key: f}, [held("10.96.0.10", ["10.244.2.10", "10.244.1.10"])]) == []


def test_missing_stale_and_different():
    a, b = fe("10.96.0.10", backends=["10.244.1.10"]), fe("10.96.0.11", action=Action.REJECT)
    kernel = [held("10.96.0.10", ["10.244.9.9"]), held("10.96.0.12", service="default/old")]
    drifts = {(d.what, d.frontend) for d in compare({a.key: a, b.key: b}, kernel)}
    assert drifts == {("different", "10.96.0.10:80/TCP"), ("missing", "10.96.0.11:80/TCP"),
                      ("stale", "10.96.0.12:80/TCP")}


def test_the_tc_paths_rows_and_their_source_ranges_are_compared_too():
    """Scope-EXT rows (what traffic from outside meets) are checked apart from the socket
    scope's row of the same address, with a LoadBalancer IP's enforced source ranges."""
    from kproxy_ebpf.model.desired import FrontendKind, Scope

    lb = fe("192.0.2.7", backends=["10.244.1.10"], kind=FrontendKind.LOAD_BALANCER,
            scope=Scope.EXT, ranges=["198.51.100.0/24"])
    sock = fe("192.0.2.7", backends=["10.244.1.10"], kind=FrontendKind.LOAD_BALANCER)
    row = {**held("192.0.2.7", ["10.244.1.10"]), "type": "LoadBalancer"}
    in_sync = [row, {**row, "scope": 1, "source_ranges": ["198.51.100.0/24"]}]
    assert compare({lb.key: lb, sock.key: sock}, in_sync) == []
    drifted = [row, {**row, "scope": 1, "source_ranges": ["0.0.0.0/0"]}]
    [d] = compare({lb.key: lb, sock.key: sock}, drifted)
    assert (d.what, d.frontend) == ("different", "192.0.2.7:80/TCP (from outside)")
    assert "source_ranges" in d.detail
    [d] = compare({lb.key: lb, sock.key: sock}, [row])
    assert (d.what, d.frontend) == ("missing", "192.0.2.7:80/TCP (from outside)")


def test_a_frontend_without_its_maglev_table_is_drift():
    import dataclasses

    from kproxy_ebpf.model.desired import FrontendKind, Scope

    np_ = dataclasses.replace(fe("192.0.2.7", backends=["10.244.1.10"],
                                 kind=FrontendKind.NODE_PORT, scope=Scope.EXT), maglev=16381)
    row = {**held("192.0.2.7", ["10.244.1.10"]), "type": "NodePort", "scope": 1}
    assert compare({np_.key: np_}, [{**row, "maglev": 16381}]) == []
    [d] = compare({np_.key: np_}, [row])
    assert d.what == "different" and "maglev: kernel 0 != cluster 16381" in d.detail


# -- the cluster side: the agent's list code and the agent's configuration ------------------------

class FakeCluster:
    """kubernetes.client's CoreV1Api/DiscoveryV1Api for 5 Services with one slice each,
    serving at most 2 items per page (whatever `limit` says) so that paging is exercised."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, dict]] = []
        ips = [f"10.96.0.{i}" for i in range(1, 6)]
        self.items = {
            "services": [api_service(f"s{i}", "default", clusterIP=ip)
                         for i, ip in enumerate(ips)],
            "endpointslices": [api_slice(f"s{i}-x", f"s{i}", "default",
                                         ports=[{"name": "", "port": 8080}],
                                         endpoints=[api_ep(f"10.244.0.{i + 1}")])
                               for i in range(5)],
            "nodes": [{"metadata": {"name": "node-a"},
                       "status": {"addresses": [{"type": "InternalIP", "address": "192.168.0.1"}]}}],
            "servicecidrs": [{"metadata": {"name": "kubernetes"},
                              "spec": {"cidrs": ["10.96.0.0/16"]}}],
        }

    def _list(self, what: str, _preload_content=True, _continue=None, limit=None, **kw):
        assert _preload_content is False            # raw JSON, as the reflector reads it
        self.calls.append((what, {"_continue": _continue, "limit": limit, **kw}))
        start = int(_continue or 0)
        more = start + 2 < len(self.items[what])
        return ListPage(api_list(self.items[what][start:start + 2], "42",
                                 str(start + 2) if more else ""))

    def api(self, api_client):
        cluster = self

        class Api:
            def list_service_for_all_namespaces(self, **kw):
                return cluster._list("services", **kw)

            def list_endpoint_slice_for_all_namespaces(self, **kw):
                return cluster._list("endpointslices", **kw)

            def list_node(self, **kw):
                return cluster._list("nodes", **kw)

            def list_service_cidr(self, **kw):
                return cluster._list("servicecidrs", **kw)
        return Api()


@pytest.fixture
def cluster(monkeypatch):
    import kubernetes.client

    from kproxy_ebpf.kube import client as kube_client
    fake = FakeCluster()
    fake.clients = []
    monkeypatch.setattr(kubernetes.client, "CoreV1Api", fake.api)
    monkeypatch.setattr(kubernetes.client, "DiscoveryV1Api", fake.api)
    monkeypatch.setattr(kubernetes.client, "NetworkingV1Api", fake.api)
    monkeypatch.setattr(kube_client, "make_api_client",
                        lambda **kw: fake.clients.append(kw) or object())
    return fake


def test_check_lists_through_kube_with_pagination_and_the_agent_selectors(cluster):
    cfg = AgentConfig(hostname_override="node-a")
    desired = desired_for(cfg)
    assert sorted(k.ip for k in desired) == [f"10.96.0.{i}" for i in range(1, 6)]
    assert all(fe.action is Action.FORWARD for fe in desired.values())
    pages = [(what, kw["_continue"]) for what, kw in cluster.calls]
    assert pages == [("services", None), ("services", "2"), ("services", "4"),
                     ("endpointslices", None), ("endpointslices", "2"), ("endpointslices", "4"),
                     ("nodes", None), ("servicecidrs", None)]
    by_what = dict(cluster.calls)
    assert "label_selector" not in by_what["services"]      # kube-proxy 1.36: every Service
    assert by_what["endpointslices"]["label_selector"] == SLICE_LABEL_SELECTOR
    assert by_what["nodes"]["field_selector"] == "metadata.name=node-a"


def test_check_honours_the_agent_config_file(cluster, tmp_path, monkeypatch):
    from kproxy_ebpf.cli import check as check_cli
    from kproxy_ebpf.cli import main as cli
    from kproxy_ebpf.datapath.maps import reader

    config = tmp_path / "agent.yaml"
    config.write_text("kubeconfig: /etc/kproxy/kubeconfig\nmaster: 10.0.0.1:6443\n"
                      "hostnameOverride: Node-A\nbpffsDir: /sys/fs/bpf/kproxy-test\n")
    opened = []
    monkeypatch.setattr(check_cli, "open_maps", lambda d: opened.append(d) or {})
    monkeypatch.setattr(reader, "services", lambda maps: [])
    result = CliRunner().invoke(cli.main, ["check", "--config", str(config)])
    assert result.exit_code == 1, result.output          # nothing programmed: 5 missing
    # 5 frontends, and with them 5 ClusterIP rows and the range: none in the (empty) maps.
    assert "5 frontends, 5 ClusterIPs expected, 5 differences" in result.output
    assert cluster.clients == [{"kubeconfig": "/etc/kproxy/kubeconfig", "master": "10.0.0.1:6443"}]
    assert ("nodes", "metadata.name=node-a") in [(w, kw.get("field_selector"))
                                                  for w, kw in cluster.calls]
    assert opened == ["/sys/fs/bpf/kproxy-test"]
    # Flags win over the file, as with `run`.
    opened.clear()
    CliRunner().invoke(cli.main, ["check", "--config", str(config), "--bpffs-dir", "/x",
                                  "--master", "10.0.0.2:6443"])
    assert opened == ["/x"] and cluster.clients[-1]["master"] == "10.0.0.2:6443"


def test_check_with_manifests_from_the_config(tmp_path):
    (tmp_path / "web.yaml").write_text(
        "apiVersion: v1\nkind: Service\nmetadata: {name: web, namespace: default}\n"
        "spec: {clusterIP: 10.96.0.10, ports: [{port: 80}]}\n")
    config = tmp_path / "agent.yaml"
    config.write_text(f"hostnameOverride: node-a\nmanifests: [{tmp_path / 'web.yaml'}]\n")
    from kproxy_ebpf.config import load
    desired = desired_for(load(str(config), env={}))
    assert [(k, fe.action) for k, fe in desired.items()] == [(FrontendKey("10.96.0.10", 80, TCP), Action.REJECT)]


def test_an_unreachable_api_server_is_a_sentence_that_says_where_not_a_traceback(tmp_path):
    """Tried as a new user would: `check` where the kubeconfig's address is not reachable (a lab
    node with the host's kubeconfig). 127.0.0.1:1 refuses at once, on this host's loopback."""
    from kproxy_ebpf.cli import main as cli

    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(
        "apiVersion: v1\nkind: Config\ncurrent-context: c\n"
        "clusters: [{name: c, cluster: {server: 'https://127.0.0.1:1', "
        "insecure-skip-tls-verify: true}}]\n"
        "contexts: [{name: c, context: {cluster: c, user: u}}]\n"
        "users: [{name: u, user: {token: t}}]\n")
    result = CliRunner().invoke(cli.main, ["check", "--kubeconfig", str(kubeconfig),
                                           "--hostname-override", "node-a"])
    assert result.exit_code == 1
    assert "Traceback" not in result.output and result.exception.__class__ is SystemExit
    assert "cannot list the cluster at https://127.0.0.1:1" in result.output
    assert "pass --kubeconfig or --master" in result.output


def test_status_says_where_it_looked_for_the_agent(monkeypatch):
    from kproxy_ebpf.cli import main as cli
    from kproxy_ebpf.cli import node
    from kproxy_ebpf.datapath.maps import reader

    monkeypatch.setattr(node, "open_maps", lambda d: {"stats": None})
    monkeypatch.setattr(node, "fill", lambda m: {"entries": 0, "max_entries": 1})
    monkeypatch.setattr(reader, "hooks", lambda *a, **k: [])
    monkeypatch.setattr(reader, "counters", lambda m: {})
    result = CliRunner().invoke(cli.main, ["status", "--bpffs-dir", "/x", "--healthz",
                                           "http://127.0.0.1:1/healthz"])
    assert result.exit_code == 0, result.output
    assert "agent: unreachable at http://127.0.0.1:1/healthz (" in result.output
    assert "run status there" in result.output


def test_service_cidr_rows_are_compared_both_ways():
    from kproxy_ebpf.inspect.check import compare_cidrs
    from kproxy_ebpf.model.desired import ServiceCIDRSet

    want = ServiceCIDRSet(cidrs=frozenset({"10.96.0.0/16", "fd00::/108"}),
                          cluster_ips=frozenset({"10.96.0.1", "10.96.0.2"}),
                          foreign_ips=frozenset({"10.96.0.9"}))
    held = {"10.96.0.1": "reject", "10.96.0.9": "reject", "10.96.0.7": "reject"}
    got = [str(d).split() for d in compare_cidrs(want, held, {"10.96.0.0/16", "10.97.0.0/24"})]
    assert [(d[0], d[2]) for d in got] == [
        ("missing", "10.96.0.2"), ("different", "10.96.0.9"), ("stale", "10.96.0.7"),
        ("missing", "fd00::/108"), ("stale", "10.97.0.0/24")]
    assert compare_cidrs(want, {"10.96.0.1": "reject", "10.96.0.2": "reject",
                                "10.96.0.9": "pass"}, set(want.cidrs)) == []
