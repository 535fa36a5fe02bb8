"""The per-packet datapath: tc_lb.c at ingress/egress of the node's external devices
(north-south) and, with `socketLB: false`, of its pod-facing devices (ClusterIP per packet,
kept on every new pod's veth by pod_devices.PodDeviceWatcher).

Attached as pinned tcx links (tcx.py, kernel 6.6+): no qdisc to create, whose graft drops a
packet or so; the links outlive the agent, and a new agent swaps their programs atomically.
On a kernel that refuses tcx (logged once), as direct-action cls_bpf filters under a clsact
qdisc, with pyroute2: a filter holds its program too, and `tc filter replace` on the same
priority and handle swaps it atomically. An older agent's filters are deleted once the tcx
links run (they would no longer run anyway: a tcx program's TC_ACT_OK ends the hook); the
clsact qdisc stays, other tools may share it.

Ours are recognised by their BPF name (kp_from_outside, kp_to_outside, kp_from_pod,
kp_to_pod), so `cleanup` and a mode switch find them without any record of where they went.

Devices: `devices` from the configuration, otherwise those of the default routes, otherwise
(the lab has no default route) every device with a global IPv4 or IPv6 address.
"""
from __future__ import annotations

import ipaddress
import logging
import os
import socket
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path

from kproxy_ebpf.datapath.flows import ct_upgrade
from kproxy_ebpf.datapath.maps import layout as L
from kproxy_ebpf.datapath.maps.map_sizes import MapSizes
from kproxy_ebpf.datapath.maps.pinned import PinnedMap, cpu_id_bound
from kproxy_ebpf.datapath.upgrade.carry import RowCarry

from . import tcx
from .pod_devices import PodDeviceWatcher
from .progload import SCHED_CLS, LoadJob, Program, spawn

log = logging.getLogger(__name__)

INGRESS = 0xFFFFFFF2      # TC_H_MAKE(TC_H_CLSACT, TC_H_MIN_INGRESS)
EGRESS = 0xFFFFFFF3
PRIO = 1                  # first: our rewrite must happen before any other classifier
HANDLE = 0x6B70           # "kp"
# program in tc_lb.c -> clsact parent
EXT_PROGRAMS = {"kp_from_outside": INGRESS, "kp_to_outside": EGRESS}
POD_PROGRAMS = {"kp_from_pod": INGRESS, "kp_to_pod": EGRESS}
PROGRAMS = {**EXT_PROGRAMS, **POD_PROGRAMS}
WHERE = {INGRESS: "ingress", EGRESS: "egress"}
ETH_P_ALL = 0x0003


def tc_programs() -> list[Program]:
    """tc_lb.c's programs, for the load child (datapath/progload.py)."""
    return [Program("tc_lb.c", prog, SCHED_CLS) for prog in PROGRAMS]


def _ipr():
    from pyroute2 import IPRoute  # late: only root code paths need netlink

    return IPRoute()


def detect_devices() -> list[str]:
    """The node's external devices, from its routes (see the module comment)."""
    with _ipr() as ipr:
        names = {link["index"]: link.get_attr("IFLA_IFNAME") for link in ipr.get_links()}
        devs = [names[r.get_attr("RTA_OIF")] for family in (socket.AF_INET, socket.AF_INET6)
                for r in ipr.get_default_routes(family=family) if r.get_attr("RTA_OIF") in names]
        if not devs:
            devs = [names[a["index"]] for family in (socket.AF_INET, socket.AF_INET6)
                    for a in ipr.get_addr(family=family)
                    if a["scope"] == 0 and names.get(a["index"]) != "lo"]
    return sorted(set(devs))


def device_addresses(dev: str) -> tuple[str, ...]:
    """The first global address of each family on a device, IPv4 first (the SNAT sources
    remote backends see); () when it has none or does not exist."""
    out = []
    with _ipr() as ipr:
        idx = ipr.link_lookup(ifname=dev)
        if not idx:
            return ()
        for family in (socket.AF_INET, socket.AF_INET6):
            out += [a.get_attr("IFA_ADDRESS") for a in ipr.get_addr(family=family, index=idx[0])
                    if a["scope"] == 0][:1]
    return tuple(out)


def snat_addresses(devices: Iterable[str]) -> tuple[str, ...]:
    """The SNAT source of each family: the first of the devices' addresses in it."""
    first: dict[int, str] = {}
    for dev in devices:
        for addr in device_addresses(dev):
            first.setdefault(ipaddress.ip_address(addr).version, addr)
    return tuple(first[v] for v in sorted(first))


@dataclass
class TcDatapath:
    """Loads tc_lb.c against the pinned maps and attaches it to `devices` (external) and, when
    `pod_globs` is set, to every pod-facing device whose name matches one of them."""
    bpffs_dir: Path
    devices: list[str]
    # At most one per family; a family without one has no SNAT (remote EXT backends, hairpin).
    snat_addrs: tuple[str, ...]
    snat_ports: tuple[int, int] = (61000, 65535)
    sizes: MapSizes = field(default_factory=MapSizes)
    pod_globs: tuple[str, ...] | None = None
    # PodDeviceWatcher's runner (tests: enter the node's netns)
    runner: Callable[[Callable[[], None]], None] | None = None
    _fds: dict[str, int] = field(default_factory=dict)
    _tcx: bool = True         # False once the kernel refused a tcx link: clsact filters
    _pods: PodDeviceWatcher | None = None
    _upgrade: RowCarry | None = None

    def load(self, job: LoadJob | None = None) -> None:
        """Takes the programs from a load child (started here unless `job`, one that was
        given tc_programs(), is passed), writes the SNAT configuration and carries the flows
        of an older conntrack layout over (ct_upgrade.py: first copy)."""
        fds = (job or spawn(self.bpffs_dir, tc_programs(), self.sizes)).result()
        self._fds = {prog: fds[prog] for prog in PROGRAMS}
        try:
            self.write_config()
            self._upgrade = ct_upgrade.find(self.bpffs_dir)
            if self._upgrade:
                log.info("carried %d tracked flows over to %s (before attaching)",
                         self._upgrade.copy(), L.MAPS["ct"].name)
        except BaseException:
            self.close()
            raise

    def write_config(self) -> None:
        write_config(self.bpffs_dir, self.snat_addrs, self.snat_ports)

    def attach(self) -> None:
        # pins of devices deleted while no agent ran (pod veths): the watcher never saw them go
        tcx.remove_defunct(self.bpffs_dir)
        with _ipr() as ipr:
            for dev in self.devices:
                idx = ipr.link_lookup(ifname=dev)
                if not idx:
                    raise RuntimeError(f"device {dev} does not exist")
                self._attach_dev(ipr, idx[0], dev, EXT_PROGRAMS)
        if self.pod_globs is not None and self._pods is None:
            self._pods = PodDeviceWatcher(
                self.pod_globs, lambda ipr, index, name: self._attach_dev(
                    ipr, index, name, POD_PROGRAMS), exclude=self.devices, runner=self.runner,
                forget=lambda index: tcx.remove_defunct(self.bpffs_dir, index))
            self._pods.start()
        if self._upgrade:
            # Every filter runs the new programs now: the old map takes no new flows.
            log.info("carried %d more tracked flows over to %s (after attaching)",
                     self._upgrade.copy(), L.MAPS["ct"].name)
            self._upgrade.close()
            self._upgrade = None

    def reattach(self) -> None:
        """Attaches the external devices' filters again (replace-filter: those still there are
        left as they are), for a self-check that found some missing."""
        with _ipr() as ipr:
            for dev in self.devices:
                idx = ipr.link_lookup(ifname=dev)
                if idx:
                    self._attach_dev(ipr, idx[0], dev, EXT_PROGRAMS)

    def _attach_dev(self, ipr, index: int, dev: str, programs: dict[str, int]) -> None:
        # Egress first: until it runs, a reply of a flow the ingress program translated would
        # leave with its backend's address (a client from outside resets such a SYN-ACK);
        # egress alone changes nothing, it only reverses flows that ingress recorded.
        order = sorted(programs.items(), key=lambda pp: pp[1] != EGRESS)
        if self._tcx:
            try:
                swapped = [tcx.attach(self.bpffs_dir, index, WHERE[parent], self._fds[prog])
                           for prog, parent in order]
            except tcx.Unsupported as exc:
                self._tcx = False
                log.warning("the kernel refuses tcx links (%s): attaching through a clsact "
                            "qdisc, whose creation may drop a packet or so", exc)
            else:
                legacy = _del_filters(ipr, index, programs)
                log.info("attached %s to %s (tcx, %s%s)", ", ".join(programs), dev,
                         "programs swapped" if all(swapped) else "new links",
                         "; the older agent's clsact filters removed" if legacy else "")
                return
        _ensure_clsact(ipr, index)
        for prog, parent in order:
            ipr.tc("replace-filter", "bpf", index, HANDLE, parent=parent, prio=PRIO,
                   protocol=ETH_P_ALL, fd=self._fds[prog], name=prog, direct_action=True)
        log.info("attached %s to %s (clsact)", ", ".join(programs), dev)

    def close(self) -> None:
        if self._upgrade:
            self._upgrade.close()
            self._upgrade = None
        if self._pods is not None:
            self._pods.stop()
            self._pods = None
        for fd in self._fds.values():
            os.close(fd)
        self._fds.clear()


def write_config(bpffs_dir: Path, snat_addrs: Iterable[str], ports: tuple[int, int]) -> None:
    """The SNAT addresses (at most one per family) and port range (kp_tccfg[0]), read by every
    packet that needs SNAT, and the CPU id bound (pinned.cpu_id_bound), which splits the range
    into per-CPU slices for reusing the ports of ended flows (lib/snat.h kp_snat_alloc). One row of
    fixed-size fields, rewritten whole: a reader sees the old or the new one."""
    row = L.TcCfg(port_min=ports[0], port_max=ports[1], ncpus=cpu_id_bound())
    for addr in snat_addrs:
        field_name = "snat_addr6" if ipaddress.ip_address(addr).version == 6 else "snat_addr4"
        setattr(row, field_name, L.ip16(addr))
    with PinnedMap(bpffs_dir / L.MAPS["tccfg"].name, L.MAPS["tccfg"]) as cfg:
        cfg.put(L.U32(0), row)


def _ensure_clsact(ipr, index: int) -> None:
    from pyroute2 import NetlinkError

    try:
        ipr.tc("add", "clsact", index)
    except NetlinkError as exc:
        if exc.code != 17:        # EEXIST: already there (ours or another tool's): share it
            raise


def _filter_name(f) -> str | None:
    opts = f.get_attr("TCA_OPTIONS")
    if not opts:
        return None
    name = opts.get_attr("TCA_BPF_NAME")
    return name.split(":")[0] if name else None


def _del_filters(ipr, index: int, programs: dict[str, int]) -> list[str]:
    """Deletes our cls_bpf filter where it runs one of `programs`; returns the directions."""
    removed = []
    for parent in (EGRESS, INGRESS):
        names = {_filter_name(f) for f in ipr.get_filters(index=index, parent=parent)}
        if names & set(programs):
            ipr.tc("del-filter", "bpf", index, HANDLE, parent=parent, prio=PRIO,
                   protocol=ETH_P_ALL)
            removed.append(WHERE[parent])
    return removed


def attachments() -> list[tuple[str, str, str, str]]:
    """(device, "ingress"/"egress", program, "tcx"/"clsact") of every kproxy TC program
    attached in this netns."""
    out = []
    with _ipr() as ipr:
        for link in ipr.get_links():
            dev = link.get_attr("IFLA_IFNAME")
            for parent, where in WHERE.items():
                out += [(dev, where, name, "tcx") for name, _ in tcx.programs(link["index"], where)
                        if name in PROGRAMS]
                out += [(dev, where, name, "clsact") for name in map(
                    _filter_name, ipr.get_filters(index=link["index"], parent=parent))
                    if name in PROGRAMS]
    return sorted(set(out))


def attached() -> list[tuple[str, str, str]]:
    """(device, "ingress"/"egress", program) of every kproxy TC program in this netns."""
    return sorted({a[:3] for a in attachments()})


def missing_filters(devices: Iterable[str]) -> list[str]:
    """The external devices' programs that are not attached ("eth0 ingress kp_from_outside"):
    removed behind the agent (a `tc filter del`, a link detached, a device made anew)."""
    have = set(attached())
    return [f"{dev} {WHERE[parent]} {prog}" for dev in devices
            for prog, parent in EXT_PROGRAMS.items() if (dev, WHERE[parent], prog) not in have]


def detach_all(programs: dict[str, int] = PROGRAMS, bpffs_dir: Path | None = None) -> list[str]:
    """Detaches every kproxy tcx link and cls_bpf filter of this netns running one of
    `programs` (`cleanup`: all of them; a mode switch: the other path's), and with `bpffs_dir`
    unpins the links made defunct so. The clsact qdisc stays, as other tools may share it.
    Returns what was removed."""
    removed = []
    with _ipr() as ipr:
        for link in ipr.get_links():
            dev = link.get_attr("IFLA_IFNAME")
            for where in WHERE.values():
                if tcx.detach(link["index"], where, set(programs)):
                    removed.append(f"tcx {dev} {where}")
            removed += [f"tc {dev} {where}" for where in _del_filters(ipr, link["index"],
                                                                       programs)]
    if bpffs_dir is not None:
        removed += tcx.remove_defunct(bpffs_dir)
    return removed
