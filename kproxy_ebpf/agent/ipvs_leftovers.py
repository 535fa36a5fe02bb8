"""What kube-proxy in IPVS mode leaves in a node's network namespace besides iptables rules,
removed as its own `--cleanup` removes it (kubernetes v1.36 pkg/proxy/ipvs/cleanup.go).

IPVS mode programs three kinds of objects of its own:

* IPVS virtual servers (and their real servers): one per ClusterIP, ExternalIP, LB IP and
  NodePort address:port. kube-proxy's cleanup flushes the whole IPVS table; so does this, but
  only on a node where kube-ipvs0 still exists, the sign that kube-proxy's IPVS mode ran here
  (another IPVS user without it keeps its table). Needs `ipvsadm` and the kernel's ip_vs; a
  node without ip_vs cannot hold virtual servers, and one without ipvsadm is told so.
* kube-ipvs0: the dummy device every Service address is bound to (so the node accepts it).
  Deleted by name, whatever its link type: the name is kube-proxy's. Through netlink
  (pyroute2), not `ip`: the agent's image has no iproute2.
* ipsets (`hash:ip,port`, `bitmap:port`, ...), which its iptables rules match with `-m set`:
  KUBE-LOOP-BACK KUBE-CLUSTER-IP KUBE-EXTERNAL-IP KUBE-EXTERNAL-IP-LOCAL KUBE-LOAD-BALANCER
  KUBE-LOAD-BALANCER-FW KUBE-LOAD-BALANCER-LOCAL KUBE-LOAD-BALANCER-SOURCE-IP
  KUBE-LOAD-BALANCER-SOURCE-CIDR KUBE-NODE-PORT-TCP KUBE-NODE-PORT-LOCAL-TCP
  KUBE-NODE-PORT-UDP KUBE-NODE-PORT-LOCAL-UDP KUBE-NODE-PORT-SCTP-HASH
  KUBE-NODE-PORT-LOCAL-SCTP-HASH KUBE-HEALTH-CHECK-NODE-PORT KUBE-IPVS-IPS, and the IPv6
  proxier's twins named KUBE-6-... (cut to ipset's 31 characters). Destroyed after the
  iptables rules that name them (kubeproxy_cleanup.py runs this last); the ipset tool is
  needed to see them.

Its iptables chains (KUBE-NODE-PORT, KUBE-LOAD-BALANCER, KUBE-IPVS-FILTER, ...) are in
kubeproxy_cleanup.py's chain sets with the other modes'. Everything runs in the caller's
network namespace.
"""
from __future__ import annotations

import errno
import os
import shutil
import subprocess
from collections.abc import Callable

from pyroute2 import IPRoute
from pyroute2.netlink.exceptions import NetlinkError

DEVICE = "kube-ipvs0"
IPSETS = ("KUBE-LOOP-BACK", "KUBE-CLUSTER-IP", "KUBE-EXTERNAL-IP", "KUBE-EXTERNAL-IP-LOCAL",
          "KUBE-LOAD-BALANCER", "KUBE-LOAD-BALANCER-FW", "KUBE-LOAD-BALANCER-LOCAL",
          "KUBE-LOAD-BALANCER-SOURCE-IP", "KUBE-LOAD-BALANCER-SOURCE-CIDR",
          "KUBE-NODE-PORT-TCP", "KUBE-NODE-PORT-LOCAL-TCP", "KUBE-NODE-PORT-UDP",
          "KUBE-NODE-PORT-LOCAL-UDP", "KUBE-NODE-PORT-SCTP-HASH",
          "KUBE-NODE-PORT-LOCAL-SCTP-HASH", "KUBE-HEALTH-CHECK-NODE-PORT", "KUBE-IPVS-IPS")
IPSET_NAME_MAX = 31


def ipset_names() -> list[str]:
    """Both proxiers' set names: the IPv6 one renames KUBE- to KUBE-6-, cut to 31 characters."""
    v6 = [("KUBE-6-" + name.removeprefix("KUBE-"))[:IPSET_NAME_MAX] for name in IPSETS]
    return [*IPSETS, *v6]


def _run(argv: list[str]) -> subprocess.CompletedProcess:
    return subprocess.run(argv, capture_output=True, text=True)


class _Found:
    def __init__(self, dry_run: bool) -> None:
        self.dry_run = dry_run
        self.removed: list[str] = []
        self.errors: list[str] = []
        self.notes: list[str] = []

    def remove(self, what: str, argv: list[str]) -> None:
        self.removed_by(what, lambda: _failure(argv))

    def removed_by(self, what: str, remove: Callable[[], str | None]) -> None:
        """`remove` returns why it failed, or None."""
        if not self.dry_run:
            error = remove()
            if error is not None:
                self.errors.append(error)
                return
        self.removed.append(what)


def _failure(argv: list[str]) -> str | None:
    r = _run(argv)
    return None if r.returncode == 0 else f"{' '.join(argv)}: {r.stderr.strip()}"


def _device_index() -> int | None:
    with IPRoute() as ipr:
        found = ipr.link_lookup(ifname=DEVICE)
    return found[0] if found else None


def _delete_device(index: int) -> str | None:
    try:
        with IPRoute() as ipr:
            ipr.link("del", index=index)
    except NetlinkError as exc:
        if exc.code != errno.ENODEV:            # gone meanwhile: what we wanted
            return f"deleting link {DEVICE}: {os.strerror(exc.code)}"
    return None


def cleanup(dry_run: bool = False) -> tuple[list[str], list[str], list[str]]:
    """Removes (dry_run: lists) IPVS mode's objects; returns (removed, errors, notes)."""
    found = _Found(dry_run)
    index = _device_index()
    if index is not None:
        _virtual_servers(found)
        found.removed_by(f"link {DEVICE}", lambda: _delete_device(index))
    _ipsets(found, index is not None)
    return found.removed, found.errors, found.notes


def _virtual_servers(found: _Found) -> None:
    ipvsadm = shutil.which("ipvsadm")
    if not ipvsadm:
        found.notes.append(f"{DEVICE} exists but ipvsadm is not installed: IPVS virtual "
                           f"servers were not looked at (install ipvsadm, or run "
                           f"`ipvsadm --clear` on the node)")
        return
    listed = _run([ipvsadm, "--save", "-n"])
    if listed.returncode != 0:
        # No ip_vs in this kernel: there can be no virtual server to remove.
        why = (listed.stderr.strip().splitlines() or ["no answer"])[0]
        found.notes.append(f"IPVS virtual servers not looked at ({why}): a kernel without "
                           f"ip_vs holds none")
        return
    servers = [line for line in listed.stdout.splitlines() if line.startswith("-A ")]
    if servers:
        found.remove(f"IPVS virtual servers ({len(servers)})", [ipvsadm, "--clear"])


def _ipsets(found: _Found, device: bool) -> None:
    ipset = shutil.which("ipset")
    if not ipset:
        if device:
            found.notes.append("ipset is not installed: kube-proxy's IPVS ipsets were not "
                               "looked at (install ipset, or destroy the KUBE-* sets by hand)")
        return
    listed = _run([ipset, "list", "-n"])
    if listed.returncode != 0:
        found.errors.append(f"ipset list -n: {listed.stderr.strip()}")
        return
    present = set(listed.stdout.split())
    for name in ipset_names():
        if name in present:
            found.remove(f"ipset {name}", [ipset, "destroy", name])
