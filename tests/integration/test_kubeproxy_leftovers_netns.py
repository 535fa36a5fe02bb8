"""`kproxy-ebpf cleanup --kube-proxy-leftovers [--dry-run]` on every kind of leftover at once, in
a fresh network namespace of its own (no control plane): kube-proxy's chains in nat, filter
and mangle of iptables-legacy and iptables-nft, both families; its nftables tables; IPVS
mode's ipsets (both families), its kube-ipvs0 and an iptables rule matching one of its sets;
beside the kubelet's chains and someone else's table, set and rule, which must stay.

This kernel has no `dummy` link type and no ip_vs: kube-ipvs0 is made as a bridge (the cleanup
deletes it by name) and the virtual servers can only be reported as not looked at."""
from __future__ import annotations

import shutil
import subprocess
import sys
import uuid

import pytest

from ..support import require_root

pytestmark = pytest.mark.root

# (tool, table, chains, rules): one iptables-restore --noflush input each.
IPTABLES = [
    ("iptables-legacy", "nat", ["KUBE-SERVICES", "KUBE-SVC-ABCDEF", "KUBE-SEP-ABCDEF",
                                "KUBE-KUBELET-CANARY"],
     ['-A PREROUTING -m comment --comment "kubernetes service portals" -j KUBE-SERVICES',
      "-A KUBE-SERVICES -d 10.96.0.10/32 -p tcp --dport 53 -j KUBE-SVC-ABCDEF",
      "-A KUBE-SVC-ABCDEF -j KUBE-SEP-ABCDEF",
      "-A KUBE-SEP-ABCDEF -p tcp -j DNAT --to-destination 10.244.1.5:53"]),
    ("iptables-legacy", "filter", ["KUBE-FIREWALL", "KUBE-FORWARD", "KUBE-PROXY-CANARY"],
     ["-A INPUT -j KUBE-FIREWALL", "-A FORWARD -j KUBE-FORWARD",
      "-A KUBE-FIREWALL -m mark --mark 0x8000/0x8000 -j DROP"]),
    ("iptables-legacy", "mangle", ["KUBE-PROXY-CANARY", "KUBE-IPTABLES-HINT"], []),
    ("ip6tables-legacy", "nat", ["KUBE-SERVICES", "KUBE-POSTROUTING"],
     ["-A OUTPUT -j KUBE-SERVICES", "-A POSTROUTING -j KUBE-POSTROUTING"]),
    ("ip6tables-legacy", "filter", ["KUBE-EXTERNAL-SERVICES", "KUBE-FIREWALL"],
     ["-A INPUT -j KUBE-EXTERNAL-SERVICES", "-A INPUT -j KUBE-FIREWALL"]),
    ("iptables-nft", "nat", ["KUBE-SERVICES", "KUBE-LOAD-BALANCER", "KUBE-MARK-MASQ",
                             "KUBE-POSTROUTING", "KUBE-KUBELET-CANARY", "OTHER"],
     ["-A OUTPUT -j KUBE-SERVICES", "-A POSTROUTING -j KUBE-POSTROUTING",
      "-A KUBE-SERVICES -m set --match-set KUBE-LOAD-BALANCER dst,dst -j KUBE-LOAD-BALANCER",
      "-A KUBE-LOAD-BALANCER -j KUBE-MARK-MASQ", "-A OTHER -j KUBE-MARK-MASQ",
      "-A OTHER -p tcp --dport 1 -j RETURN"]),
    ("iptables-nft", "filter", ["KUBE-FIREWALL", "KUBE-PROXY-FIREWALL", "KUBE-NODE-PORT",
                                "KUBE-IPVS-FILTER"],
     ["-A INPUT -j KUBE-FIREWALL", "-A INPUT -j KUBE-PROXY-FIREWALL",
      "-A INPUT -j KUBE-NODE-PORT", "-A INPUT -j KUBE-IPVS-FILTER"]),
    ("iptables-nft", "mangle", ["KUBE-KUBELET-CANARY", "KUBE-PROXY-CANARY"], []),
    ("ip6tables-nft", "nat", ["KUBE-NODEPORTS", "KUBE-SVL-XYZ"],
     ["-A KUBE-NODEPORTS -j KUBE-SVL-XYZ"]),
    ("ip6tables-nft", "filter", ["KUBE-IPVS-OUT-FILTER", "KUBE-FORWARD", "KUBE-FIREWALL"],
     ["-A OUTPUT -j KUBE-IPVS-OUT-FILTER", "-A FORWARD -j KUBE-FORWARD"]),
    ("ip6tables-nft", "mangle", ["KUBE-PROXY-CANARY", "KUBE-IPTABLES-HINT"], []),
]
KUBELETS = {"KUBE-KUBELET-CANARY", "KUBE-FIREWALL", "KUBE-IPTABLES-HINT"}
IPSETS = [("KUBE-CLUSTER-IP", "hash:ip,port", "inet"), ("KUBE-LOAD-BALANCER", "hash:ip,port", "inet"),
          ("KUBE-6-CLUSTER-IP", "hash:ip,port", "inet6"),
          ("KUBE-NODE-PORT-TCP", "bitmap:port range 30000-32767", None),
          ("somebody-elses", "hash:ip", "inet")]
NFT = ("table ip kube-proxy { chain services { }; }\n"
       "table ip6 kube-proxy { chain services { }; }\n"
       "table ip somebody-else { chain input { type filter hook input priority 0; }; }\n")


@pytest.fixture
def netns():
    require_root()
    missing = [t for t in ("iptables-legacy-restore", "iptables-nft-restore", "nft", "ipset")
               if not shutil.which(t)]
    if missing:
        pytest.skip(f"missing {missing} (make apt)")
    name = f"kproxy-kpl-{uuid.uuid4().hex[:8]}"
    subprocess.run(["ip", "netns", "add", name], check=True)
    try:
        yield name
    finally:
        subprocess.run(["ip", "netns", "delete", name], check=False)


def run(ns: str, argv: list[str], stdin: str | None = None) -> str:
    r = subprocess.run(["ip", "netns", "exec", ns, *argv], input=stdin, capture_output=True,
                       text=True, timeout=60)
    assert r.returncode == 0, f"{argv}: {r.stdout}{r.stderr}"
    return r.stdout


def populate(ns: str) -> None:
    for name, kind, family in IPSETS:
        run(ns, ["ipset", "create", name, *kind.split(), *(["family", family] if family else [])])
    run(ns, ["ip", "link", "add", "kube-ipvs0", "type", "bridge"])   # no `dummy` here
    run(ns, ["nft", "-f", "-"], NFT)
    for tool, table, chains, rules in IPTABLES:
        script = "\n".join([f"*{table}", *(f":{c} - [0:0]" for c in chains), *rules,
                            "COMMIT", ""])
        run(ns, [f"{tool}-restore", "--noflush"], script)


def state(ns: str) -> dict[str, str]:
    out = {tool: run(ns, [f"{tool}-save"]) for tool in ("iptables-legacy", "ip6tables-legacy",
                                                       "iptables-nft", "ip6tables-nft")}
    out = {k: "\n".join(line for line in v.splitlines() if not line.startswith("#"))
           for k, v in out.items()}
    out["nft"] = run(ns, ["nft", "list", "tables"])
    out["ipset"] = run(ns, ["ipset", "list", "-n"])
    out["links"] = run(ns, ["ip", "-o", "link", "show"])
    return out


def chains(text: str) -> set[str]:
    return {line[1:].split()[0] for line in text.splitlines() if line.startswith(":KUBE")}


# The tools the agent's image installs for this cleanup (Dockerfile): no iproute2 among them.
IMAGE_TOOLS = [f"{fam}tables-{kind}-{op}" for fam in ("ip", "ip6") for kind in ("legacy", "nft")
               for op in ("save", "restore")] + ["nft", "ipset", "ipvsadm"]


@pytest.fixture(scope="module")
def image_path(tmp_path_factory) -> str:
    """A PATH of the image's tools only: the cleanup ran on kind without `ip` and failed
    there, where the host's PATH hid it."""
    bin_dir = tmp_path_factory.mktemp("image-bin")
    for tool in IMAGE_TOOLS:
        if found := shutil.which(tool):
            (bin_dir / tool).symlink_to(found)
    return str(bin_dir)


@pytest.fixture(scope="module")
def chart_caps() -> str:
    """The agent container's capabilities as the chart grants them, for setpriv: without
    NET_RAW iptables-legacy cannot even list a table (that failed every check on kind)."""
    from kproxy_ebpf.dev.lab import agent_image

    (ds,) = [o for o in agent_image.helm_template({}) if o["kind"] == "DaemonSet"]
    caps = ds["spec"]["template"]["spec"]["containers"][0]["securityContext"]["capabilities"]
    return "-all," + ",".join(f"+{c.lower()}" for c in caps["add"])


@pytest.fixture
def image_like(image_path, chart_caps) -> list[str]:
    """What runs the cleanup as the agent's pod would: the image's tools, the chart's
    capabilities (the bounding set; root keeps only those across exec)."""
    setpriv = shutil.which("setpriv") or "setpriv"
    return ["env", f"PATH={image_path}", setpriv, f"--bounding-set={chart_caps}"]


def cleanup(ns: str, image_like: list[str], *flags: str) -> str:
    return run(ns, [*image_like, sys.executable, "-m", "kproxy_ebpf.cli.main",
                    "cleanup", "--kube-proxy-leftovers", *flags])


def test_dry_run_lists_everything_then_cleanup_removes_it_and_keeps_the_kubelets(
        netns, image_like):
    populate(netns)
    before = state(netns)

    listed = cleanup(netns, image_like, "--dry-run")
    assert state(netns) == before                                  # nothing changed
    would = {line.removeprefix("would remove ") for line in listed.splitlines()
             if line.startswith("would remove ")}
    expected = {f"{tool} {table} {c}" for tool, table, cs, _ in IPTABLES for c in cs
                if c not in KUBELETS and c != "OTHER"}
    expected |= {"nftables table ip kube-proxy", "nftables table ip6 kube-proxy",
                 "link kube-ipvs0", "ipset KUBE-CLUSTER-IP", "ipset KUBE-LOAD-BALANCER",
                 "ipset KUBE-6-CLUSTER-IP", "ipset KUBE-NODE-PORT-TCP"}
    assert would == expected
    assert "note: IPVS virtual servers not looked at" in listed or "ipvsadm" in listed

    removed = cleanup(netns, image_like, "--yes")
    assert {line.removeprefix("removed ") for line in removed.splitlines()
            if line.startswith("removed ")} == expected
    after = state(netns)
    for tool in {t for t, *_ in IPTABLES}:
        kept = chains(after[tool])
        assert not {c for c in kept if c not in KUBELETS and c != "OTHER"}, (tool, kept)
    assert {"KUBE-KUBELET-CANARY", "KUBE-FIREWALL"} <= chains(after["iptables-nft"])
    assert "KUBE-IPTABLES-HINT" in chains(after["ip6tables-nft"])
    assert "-A INPUT -j KUBE-FIREWALL" in after["iptables-legacy"]     # the kubelet's jump stays
    assert "-A OTHER -p tcp -m tcp --dport 1 -j RETURN" in after["iptables-nft"]
    assert "KUBE-MARK-MASQ" not in after["iptables-nft"]               # and the jump into ours went
    assert "kube-proxy" not in after["nft"] and "somebody-else" in after["nft"]
    assert after["ipset"].split() == ["somebody-elses"]
    assert "kube-ipvs0" not in after["links"]

    assert cleanup(netns, image_like, "--yes").splitlines()[0] == "no kube-proxy leftovers"
    assert state(netns) == after

    # kube-proxy's tables gave way to the one that keeps its connections' NAT (nat_hold.py),
    # which kproxy's own cleanup removes with the rest of its datapath.
    assert {"table ip kproxy-nat-hold", "table ip6 kproxy-nat-hold"} <= set(
        after["nft"].splitlines())
    ours = run(netns, [sys.executable, "-m", "kproxy_ebpf.cli.main", "cleanup", "--yes",
                       "--bpffs-dir", "/sys/fs/bpf/kproxy-leftovers-none", "--program-cache", ""])
    assert "removed nftables table ip kproxy-nat-hold" in ours
    assert "kproxy-nat-hold" not in run(netns, ["nft", "list", "tables"])
