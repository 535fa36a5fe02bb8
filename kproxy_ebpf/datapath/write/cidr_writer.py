"""Applies a ServiceCIDRSet to the two maps of bpf/lib/servicecidr.h: kp_cip (allocated
ClusterIP -> reject or pass) and kp_svccidr (LPM trie of the ServiceCIDRs), both families.

Kept apart from writer.py on purpose: these rows never reference frontends or backends, so the
two writers share nothing but the ApplyResult they report into. Writes are O(changes): the
writer diffs against what it wrote (rebuilt from the maps by restore()).

Order, so that no lookup sees a range without the exceptions it needs: ClusterIP rows are
written before new ranges are added (a foreign ClusterIP is never dropped for an instant), and
removed ranges go before the ClusterIP rows they covered. The agent writes the additions before
the frontends and the removals after them (`CidrChanges`), so a ClusterIP that answers on its
ports also refuses the ports it does not have, from its first connection to its last.
"""
from __future__ import annotations

import ipaddress
from collections.abc import Mapping
from dataclasses import dataclass

from kproxy_ebpf.datapath.maps import layout as L
from kproxy_ebpf.datapath.maps.pinned import MapFull, PinnedMap
from kproxy_ebpf.model.desired import ServiceCIDRSet

from .apply_result import ApplyResult
from .batch import BATCH_MIN

CIP_REJECT, CIP_PASS = L.const("KP_CIP_REJECT"), L.const("KP_CIP_PASS")
ACTIONS = {"reject": CIP_REJECT, "pass": CIP_PASS, None: None}


def _cidr_key(cidr: str) -> L.CidrKey:
    net = ipaddress.ip_network(cidr)
    addr = str(net.network_address)
    return L.CidrKey(prefixlen=L.prefix_bits(addr, net.prefixlen), addr=L.ip16(addr))


@dataclass(frozen=True)
class CidrChanges:
    """One sync's ServiceCIDR work: the ranges wanted and the ClusterIP rows to set (KP_CIP_*)
    or remove (None)."""
    cidrs: frozenset[str]
    actions: Mapping[str, int | None]


class CidrWriter:
    def __init__(self, maps: Mapping[str, PinnedMap]):
        self.cip, self.cidr = maps["clusterip"], maps["servicecidr"]
        self.cluster_ips: dict[str, int] = {}     # ip -> KP_CIP_* as written
        self.cidrs: set[str] = set()
        # While the drift check reads the maps (drift.py): the ClusterIPs written, "" for a
        # range; a restore() replaces it with None.
        self.journal: set[str] | None = None

    def restore(self) -> None:
        """Rebuilds the bookkeeping from the maps (a restarted agent rewrites nothing)."""
        self.journal = None
        self.cluster_ips = {L.ip_text(k): v.action for k, v in self.cip.items()}
        self.cidrs = {f"{L.ip_text(k.addr)}/{L.prefix_len(k.addr, k.prefixlen)}"
                      for k in self.cidr.keys()}

    def written(self) -> ServiceCIDRSet:
        """What this writer holds written, as the set it was asked for."""
        return ServiceCIDRSet(cidrs=frozenset(self.cidrs),
                              cluster_ips=frozenset(ip for ip, a in self.cluster_ips.items()
                                                    if a == CIP_REJECT),
                              foreign_ips=frozenset(ip for ip, a in self.cluster_ips.items()
                                                    if a == CIP_PASS))

    def held(self) -> tuple[dict[str, str], set[str]]:
        """What the maps hold now (read afresh, the bookkeeping untouched): ClusterIP ->
        "reject" | "pass", and the ranges."""
        fresh = CidrWriter({"clusterip": self.cip, "servicecidr": self.cidr})
        fresh.restore()
        names = {CIP_REJECT: "reject", CIP_PASS: "pass"}
        return ({ip: names.get(a, str(a)) for ip, a in fresh.cluster_ips.items()}, fresh.cidrs)

    def row_counts(self) -> dict[str, int]:
        return {"clusterip": len(self.cluster_ips), "servicecidr": len(self.cidrs)}

    def whole(self, want: ServiceCIDRSet) -> CidrChanges:
        """What a full sync writes: every ClusterIP row, and the removal of those not wanted."""
        actions: dict[str, str | None] = dict.fromkeys(want.foreign_ips, "pass")
        actions.update((ip, "reject") for ip in want.cluster_ips)
        gone = dict.fromkeys(self.cluster_ips.keys() - actions.keys())
        return self.changes(want.cidrs, {**actions, **gone})

    def changes(self, cidrs: frozenset[str], wanted: Mapping[str, str | None]) -> CidrChanges:
        """The ranges, and the rows of the ClusterIPs in `wanted` ("reject", "pass", or None: no
        longer allocated), the others untouched: a partial sync costs what changed."""
        return CidrChanges(cidrs, {ip: ACTIONS[a] for ip, a in wanted.items()})

    def apply(self, want: ServiceCIDRSet, res: ApplyResult) -> bool:
        """Both phases of `whole(want)` at once; True when all was written."""
        ch = self.whole(want)
        return self.write_additions(ch, res) & self.write_removals(ch, res)

    def write_additions(self, ch: CidrChanges, res: ApplyResult) -> bool:
        """ClusterIP rows put, then new ranges (before the frontends are written). Failures go
        into `res`; True when all was written (else the caller retries with a full apply)."""
        self._note(ch)
        to_put = {ip: a for ip, a in ch.actions.items()
                  if a is not None and self.cluster_ips.get(ip) != a}
        puts = sorted(to_put)
        complete = True
        for ip in () if self._put_ips_batched(puts, to_put, res) else puts:
            complete &= self._try(res, f"ClusterIP {ip}",
                                  lambda ip=ip: self._put_ip(ip, to_put[ip]))
        # A range added while one of its ClusterIP rows is missing would drop that address.
        for cidr in sorted(ch.cidrs - self.cidrs) if complete else ():
            complete &= self._try(res, f"ServiceCIDR {cidr}", lambda c=cidr: self._put_cidr(c))
        return complete

    def write_removals(self, ch: CidrChanges, res: ApplyResult) -> bool:
        """Ranges gone, then the ClusterIP rows no longer allocated (after the frontends)."""
        self._note(ch)
        complete = True
        for cidr in sorted(self.cidrs - ch.cidrs):
            complete &= self._try(res, f"ServiceCIDR {cidr}", lambda c=cidr: self._delete_cidr(c))
        for ip in sorted(ip for ip, a in ch.actions.items() if a is None and ip in self.cluster_ips):
            complete &= self._try(res, f"ClusterIP {ip}", lambda ip=ip: self._delete_ip(ip))
        return complete

    def _note(self, ch: CidrChanges) -> None:
        if self.journal is not None:
            self.journal.update(ch.actions)
            if ch.cidrs != self.cidrs:
                self.journal.add("")

    def _put_ips_batched(self, ips: list[str], actions: Mapping[str, int], res: ApplyResult) -> bool:
        """ClusterIP rows in batches (a cold start writes one per Service: 10,000 single
        puts cost ~60 ms). Only where they surely fit; on any failure nothing is recorded and
        the caller writes them one by one, which ties each error to its address."""
        if not ips:
            return True
        if (len(ips) < BATCH_MIN or not hasattr(self.cip, "put_batch")
                or len(self.cluster_ips) + len(ips) > self.cip.max_entries):
            return False
        values = {a: L.raw(L.CipVal(action=a)) for a in set(actions.values())}
        try:
            self.cip.put_batch([L.addr_key(ip) for ip in ips],
                               [values[actions[ip]] for ip in ips])
        except (MapFull, OSError):
            return False
        self.cluster_ips.update((ip, actions[ip]) for ip in ips)
        res.writes += len(ips)
        return True

    def _put_ip(self, ip: str, action: int) -> None:
        self.cip.put(L.addr_key(ip), L.CipVal(action=action))
        self.cluster_ips[ip] = action

    def _delete_ip(self, ip: str) -> None:
        self.cip.delete(L.addr_key(ip))
        del self.cluster_ips[ip]

    def _put_cidr(self, cidr: str) -> None:
        self.cidr.put(_cidr_key(cidr), L.U32(0))
        self.cidrs.add(cidr)

    def _delete_cidr(self, cidr: str) -> None:
        self.cidr.delete(_cidr_key(cidr))
        self.cidrs.discard(cidr)

    @staticmethod
    def _try(res: ApplyResult, what: str, fn) -> bool:
        if not res.attempt(what, fn):
            return False
        res.writes += 1
        return True
