"""The periodic drift check, off the sync thread: do the maps still hold what the writers
wrote? (Something else may have written them: a second agent by mistake, bpftool, a bug.)

Reading the maps back is O(N): ~5 s of CPU at 50,000 Services x 10 endpoints, and a sync that
did it held every change behind it for that long. So the check reads in its own thread while
syncs go on, and only its verdict comes to the sync thread:

1. begin() (sync lock held): the writers start a journal of what they apply from now on, and
   their bookkeeping's frontends and ClusterIPs are copied (references, O(N) in C).
2. read() (no lock): the maps read back into a fresh Ledger and ClusterIP table, repairing
   nothing (restore.read_back with repair=False: a sync may be between two of its writes).
3. suspects() (no lock): the frontends and ClusterIPs where the two differ. A sync that wrote
   meanwhile makes some differ, and may change a frontend's record under the comparison.
4. confirm() (sync lock held): suspects the journal does not name are compared again; what
   still differs is drift. The journal stops.

What is compared is what the programs read: each frontend's slot 0 (kind, service, action,
affinity, count, the source-range flag), its slot rows 1..count with their backends, its
source ranges, and the ClusterIP rows and ranges. Drift found makes the agent re-read and
rewrite everything on the sync thread (SyncPolicy.drift_found), as every check did before;
at rest a check costs the sync thread two short lock holds.
"""
from __future__ import annotations

from dataclasses import dataclass

from kproxy_ebpf.datapath.maps.encode import as_stored
from kproxy_ebpf.datapath.upgrade.restore import read_back
from kproxy_ebpf.model.desired import FrontendKey

from .cidr_writer import CidrWriter
from .programmed import Ledger, Programmed
from .writer import MapWriter


def _view(p: Programmed | None) -> tuple | None:
    """What the programs read of a frontend's rows (None: no slot 0, nothing they read)."""
    if p is None or p.count is None:
        return None
    n = p.count or 0
    return (p.kind, p.service and as_stored(p.service), p.action, p.affinity, p.count, p.range_flag, p.ranges,
            tuple(p.rows.get(s) for s in range(1, n + 1)))


@dataclass
class Snapshot:
    ledger: Ledger
    cluster_ips: dict[str, int]
    cidrs: set[str]

    def release(self) -> None:
        """Freed piece by piece (Ledger.release), not in one GIL-holding cascade."""
        self.ledger.release()
        while self.cluster_ips:
            self.cluster_ips.popitem()


class DriftCheck:
    def __init__(self, writer: MapWriter, cidrs: CidrWriter) -> None:
        self.writer, self.cidrs = writer, cidrs
        self._keys: set[FrontendKey] = set()
        self._ips: set[str] = set()
        self._held: dict[FrontendKey, Programmed] = {}
        self._cluster_ips: dict[str, int] = {}
        self._ranges: set[str] = set()

    def begin(self) -> None:
        """With the sync lock held."""
        self._keys, self._ips = set(), set()
        self.writer.journal, self.cidrs.journal = self._keys, self._ips
        self._held = dict(self.writer.held.frontends)
        self._cluster_ips, self._ranges = dict(self.cidrs.cluster_ips), set(self.cidrs.cidrs)

    def read(self) -> Snapshot:
        """Without the lock: the maps as they are, nothing written."""
        w = self.writer
        led = read_back(w.svc, w.be, w.meta, w.src, None, None, repair=False)
        fresh = CidrWriter({"clusterip": self.cidrs.cip, "servicecidr": self.cidrs.cidr})
        fresh.restore()
        return Snapshot(led, fresh.cluster_ips, fresh.cidrs)

    def suspects(self, snap: Snapshot) -> tuple[set[FrontendKey], set[str]]:
        """Without the lock: where the maps and the bookkeeping copied at begin() differ."""
        fronts = set()
        kernel = snap.ledger.frontends
        for key in kernel.keys() | self._held.keys():
            try:
                if _view(kernel.get(key)) != _view(self._held.get(key)):
                    fronts.add(key)
            except (IndexError, RuntimeError):   # a sync rewrote it under the comparison
                fronts.add(key)
        ips = {ip for ip in snap.cluster_ips.keys() | self._cluster_ips.keys()
               if snap.cluster_ips.get(ip) != self._cluster_ips.get(ip)}
        if snap.cidrs != self._ranges:
            ips.add("")
        return fronts, ips

    def confirm(self, snap: Snapshot, fronts: set[FrontendKey], ips: set[str]) -> list[str]:
        """With the sync lock held: the drift, one line per frontend or row (empty: none).
        Ends the journal. A restore() since begin() voids the check (it re-read anyway)."""
        w, c = self.writer, self.cidrs
        void = w.journal is not self._keys or c.journal is not self._ips
        w.journal = c.journal = None
        self._held, self._cluster_ips = {}, {}
        if void:
            return []
        held, kernel = w.held.frontends, snap.ledger.frontends
        out = [f"frontend {k}: {_describe(kernel.get(k), held.get(k))}"
               for k in sorted(fronts - self._keys)
               if _view(kernel.get(k)) != _view(held.get(k))]
        if "" in ips - self._ips and snap.cidrs != c.cidrs:
            out.append(f"ServiceCIDRs: the maps hold {sorted(snap.cidrs)}, written "
                       f"{sorted(c.cidrs)}")
        out += [f"ClusterIP {ip}: the map holds {snap.cluster_ips.get(ip)}, written "
                f"{c.cluster_ips.get(ip)}" for ip in sorted(ips - self._ips - {""})
                if snap.cluster_ips.get(ip) != c.cluster_ips.get(ip)]
        return out


def _describe(kernel: Programmed | None, held: Programmed | None) -> str:
    if kernel is None:
        return "missing from the maps"
    if held is None:
        return "in the maps, never written"
    return f"the maps hold count {kernel.count} ({kernel.action.value}), written {held.count}"
