"""Remove what upstream kube-proxy left in a node's network namespace, as `kube-proxy --cleanup`
does, for a node moving from kube-proxy to kproxy-ebpf; whichever mode it ran in.

iptables (IPv4 and IPv6, through iptables-legacy and iptables-nft, whichever exist): the jump
rules from built-in chains into kube-proxy's chains, then kube-proxy's own chains flushed and
deleted, in one iptables-restore per table (atomic for that table):

  nat     KUBE-SERVICES KUBE-NODEPORTS KUBE-POSTROUTING KUBE-MARK-MASQ KUBE-PROXY-CANARY
          and every per-service chain (KUBE-SVC- KUBE-SVL- KUBE-SEP- KUBE-FW- KUBE-EXT-);
          IPVS mode: KUBE-NODE-PORT KUBE-LOAD-BALANCER
  filter  KUBE-SERVICES KUBE-EXTERNAL-SERVICES KUBE-FORWARD KUBE-NODEPORTS
          KUBE-PROXY-FIREWALL KUBE-PROXY-CANARY; IPVS mode: KUBE-NODE-PORT
          KUBE-SOURCE-RANGES-FIREWALL KUBE-IPVS-FILTER KUBE-IPVS-OUT-FILTER
  mangle  KUBE-PROXY-CANARY

The kubelet's chains (KUBE-FIREWALL, KUBE-KUBELET-CANARY, KUBE-IPTABLES-HINT, and the
KUBE-MARK-DROP an older kubelet made) are kept, as kube-proxy keeps them: they belong to the
kubelet, which still runs. (Chain sets: kubernetes v1.36 pkg/proxy/iptables/cleanup.go and
pkg/proxy/ipvs/proxier.go iptablesCleanupChains.)

nftables: the tables `ip kube-proxy` and `ip6 kube-proxy`, deleted whole.

Before any of it, the tables `ip/ip6 kproxy-nat-hold` are made, which keep the NAT of
kube-proxy's established connections applied once its rules are gone (datapath/load/nat_hold.py).

IPVS mode's own objects (virtual servers, kube-ipvs0, its ipsets): ipvs_leftovers.py, after
the iptables rules, since an ipset that a rule still names cannot be destroyed.

Everything runs in the caller's network namespace: only ever call this on the node (or, in
the lab, inside the node's namespace).
"""
from __future__ import annotations

import shutil
import subprocess
from dataclasses import dataclass, field

from ..datapath.load import nat_hold

OWN_CHAINS = {
    "nat": {"KUBE-SERVICES", "KUBE-NODEPORTS", "KUBE-POSTROUTING", "KUBE-MARK-MASQ",
            "KUBE-PROXY-CANARY",
            "KUBE-NODE-PORT", "KUBE-LOAD-BALANCER"},                        # IPVS mode
    "filter": {"KUBE-SERVICES", "KUBE-EXTERNAL-SERVICES", "KUBE-FORWARD", "KUBE-NODEPORTS",
               "KUBE-PROXY-FIREWALL", "KUBE-PROXY-CANARY",
               "KUBE-NODE-PORT", "KUBE-SOURCE-RANGES-FIREWALL", "KUBE-IPVS-FILTER",
               "KUBE-IPVS-OUT-FILTER"},                                       # IPVS mode
    "mangle": {"KUBE-PROXY-CANARY"},
}
# Per-service chains (nat only), named by kube-proxy from a hash of the service port.
SERVICE_CHAIN_PREFIXES = ("KUBE-SVC-", "KUBE-SVL-", "KUBE-SEP-", "KUBE-FW-", "KUBE-EXT-")
NFT_TABLE = "kube-proxy"
NFT_FAMILIES = ("ip", "ip6")
# (family, backend) pairs; the ones whose tools are installed are used.
IPTABLES_BACKENDS = [(fam, backend) for backend in ("legacy", "nft") for fam in ("ip", "ip6")]
TABLES = ("nat", "filter", "mangle")


@dataclass
class Report:
    removed: list[str] = field(default_factory=list)   # "iptables-nft nat KUBE-SERVICES", ...
    errors: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)     # what could not be looked at, and why


def is_kube_proxy_chain(table: str, chain: str) -> bool:
    if chain in OWN_CHAINS.get(table, ()):
        return True
    return table == "nat" and chain.startswith(SERVICE_CHAIN_PREFIXES)


def restore_script(table: str, saved: str) -> tuple[str, list[str]]:
    """From `iptables-save -t TABLE` output: the iptables-restore --noflush input that removes
    kube-proxy's chains and every rule elsewhere that jumps into them, and the chains removed.
    Empty script when there is nothing of kube-proxy's."""
    chains: list[str] = []
    jumps: list[str] = []
    for line in saved.splitlines():
        if line.startswith(":"):
            name = line[1:].split()[0]
            if is_kube_proxy_chain(table, name):
                chains.append(name)
        elif line.startswith("-A "):
            parts = line.split()
            chain = parts[1]
            target = _target(parts)
            if (target and is_kube_proxy_chain(table, target)
                    and not is_kube_proxy_chain(table, chain)):
                jumps.append("-D " + line[3:])
    if not chains:
        return "", []
    # Declaring a chain in a --noflush restore flushes it; then the foreign jumps go, then the
    # chains (no reference is left to any of them).
    lines = [f"*{table}", *(f":{c} - [0:0]" for c in chains), *jumps,
             *(f"-X {c}" for c in chains), "COMMIT", ""]
    return "\n".join(lines), chains


def _target(parts: list[str]) -> str | None:
    for flag in ("-j", "-g", "--jump", "--goto"):
        if flag in parts:
            i = parts.index(flag)
            if i + 1 < len(parts):
                return parts[i + 1]
    return None


def _run(argv: list[str], stdin: str | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(argv, input=stdin, capture_output=True, text=True)


def _tables(family: str, backend: str) -> tuple[str, ...]:
    """The tables to look at. Legacy: only those that exist in this namespace (listing one
    with `-t` would instantiate it, leaving empty legacy tables behind); nft: listing creates
    nothing."""
    if backend == "nft":
        return TABLES
    try:
        with open(f"/proc/net/{family}_tables_names") as f:
            present = set(f.read().split())
    except FileNotFoundError:
        return ()
    return tuple(t for t in TABLES if t in present)


def cleanup_iptables(report: Report, dry_run: bool = False) -> None:
    for family, kind in IPTABLES_BACKENDS:
        backend = f"{family}tables-{kind}"
        save, restore = f"{backend}-save", f"{backend}-restore"
        if not (shutil.which(save) and shutil.which(restore)):
            continue
        for table in _tables(family, kind):
            r = _run([save, "-t", table])
            if r.returncode != 0:
                # A table that the backend cannot list (module missing) has nothing of ours.
                if "does not exist" not in r.stderr and "insmod" not in r.stderr:
                    report.errors.append(f"{save} -t {table}: {r.stderr.strip()}")
                continue
            script, chains = restore_script(table, r.stdout)
            if not chains:
                continue
            if not dry_run:
                w = _run([restore, "--noflush", "-w"], script)
                if w.returncode != 0:
                    report.errors.append(f"{restore} ({table}): {w.stderr.strip()}")
                    continue
            report.removed += [f"{backend} {table} {c}" for c in chains]


def cleanup_nftables(report: Report, dry_run: bool = False) -> None:
    nft = shutil.which("nft")
    if not nft:
        return
    for family in NFT_FAMILIES:
        if _run([nft, "list", "table", family, NFT_TABLE]).returncode != 0:
            continue            # no such table
        if not dry_run:
            r = _run([nft, "delete", "table", family, NFT_TABLE])
            if r.returncode != 0:
                report.errors.append(f"nft delete table {family} {NFT_TABLE}: {r.stderr.strip()}")
                continue
        report.removed.append(f"nftables table {family} {NFT_TABLE}")


def cleanup(dry_run: bool = False) -> Report:
    """Removes kube-proxy's leftovers from this network namespace (see the module docstring);
    dry_run: only lists them (`removed` then names what would go)."""
    from . import ipvs_leftovers

    report = Report()
    if not dry_run:
        # Before kube-proxy's rules go: its established connections keep their NAT.
        found = Report()
        cleanup_iptables(found, dry_run=True)
        cleanup_nftables(found, dry_run=True)
        if found.removed:
            report.errors += nat_hold.hold()
            report.notes.append(f"nftables tables {nat_hold.TABLE} hold the NAT of kube-proxy's "
                                "connections until kproxy-ebpf is removed")
    cleanup_iptables(report, dry_run)
    cleanup_nftables(report, dry_run)
    removed, errors, notes = ipvs_leftovers.cleanup(dry_run)
    report.removed += removed
    report.errors += errors
    report.notes += notes
    return report
