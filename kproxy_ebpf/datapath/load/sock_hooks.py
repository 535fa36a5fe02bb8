"""The socket hooks: sock_lb.c's programs attached to a cgroup through pinned BPF links.

SockDatapath starts the load child (progload.py) for them and for any other programs that
share the maps (the TC ones), takes the socket programs' fds, opens every pinned map for the
agent, attaches the hooks and detaches them (`socketLB: false`).

Why links: a pinned link keeps its program attached after the agent exits (the datapath must
outlive a restart), and BPF_LINK_UPDATE swaps the program of a running link atomically, so a new
agent replaces the old programs with no instant where a connect goes unseen.
"""
from __future__ import annotations

import logging
import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from kproxy_ebpf.datapath.maps.layout import MAPS
from kproxy_ebpf.datapath.maps.map_sizes import MapSizes
from kproxy_ebpf.datapath.maps.pinned import PinnedMap
from kproxy_ebpf.datapath.upgrade import resize
from kproxy_ebpf.datapath.upgrade.carry import RowCarry

from . import kernel, libbpf
from .progload import CGROUP_SOCK, CGROUP_SOCK_ADDR, LoadJob, Program, spawn

log = logging.getLogger(__name__)

# program name in sock_lb.c -> (attach type, pin name of its link)
SOCK_HOOKS = {
    "kp_connect4": (libbpf.ATTACH_CGROUP_INET4_CONNECT, "connect4"),
    "kp_sendmsg4": (libbpf.ATTACH_CGROUP_UDP4_SENDMSG, "sendmsg4"),
    "kp_recvmsg4": (libbpf.ATTACH_CGROUP_UDP4_RECVMSG, "recvmsg4"),
    "kp_getpeername4": (libbpf.ATTACH_CGROUP_INET4_GETPEERNAME, "getpeername4"),
    # IPv4 Services through AF_INET6 sockets (IPv4-mapped addresses)
    "kp_connect6": (libbpf.ATTACH_CGROUP_INET6_CONNECT, "connect6"),
    "kp_sendmsg6": (libbpf.ATTACH_CGROUP_UDP6_SENDMSG, "sendmsg6"),
    "kp_recvmsg6": (libbpf.ATTACH_CGROUP_UDP6_RECVMSG, "recvmsg6"),
    "kp_getpeername6": (libbpf.ATTACH_CGROUP_INET6_GETPEERNAME, "getpeername6"),
    # a socket's close, both families: the end of what least-conn counts (kp_skconn)
    "kp_release": (libbpf.ATTACH_CGROUP_INET_SOCK_RELEASE, "release"),
}


def sock_programs() -> list[Program]:
    """The socket hooks of sock_lb.c, as the child process loads them."""
    return [Program("sock_lb.c", prog,
                    CGROUP_SOCK if attach_type == libbpf.ATTACH_CGROUP_INET_SOCK_RELEASE
                    else CGROUP_SOCK_ADDR, attach_type)
            for prog, (attach_type, _) in SOCK_HOOKS.items()]


# Names maps had before their rows held either family (struct kp_ip: layout v3 of each, kp_ct
# v3, kp_rnat v2): an upgrade from an IPv4-only agent leaves these pins, which
# remove_stale_maps unpins (the conntrack ones after ct_upgrade.py copied their flows).
FORMER_BASES = frozenset({"kp_svc4", "kp_be4", "kp_sknat4", "kp_sksvc4", "kp_cip4", "kp_svccidr4",
                          "kp_srcrange4", "kp_extaddr4", "kp_extbe4", "kp_ct4", "kp_rnat4"})


# Maps whose rows come from the agent (the others the programs fill themselves).
AGENT_FILLED = frozenset({"svc", "backend", "meta", "clusterip", "servicecidr", "tccfg",
                          "srcrange", "extaddr", "extbe", "nssrc", "maglev"})


@dataclass
class SockDatapath:
    bpffs_dir: Path
    cgroup: Path
    sizes: MapSizes = field(default_factory=MapSizes)
    program_cache: Path | None = None      # datapath/progcache.py; None: always compile
    maps: dict[str, PinnedMap] = field(default_factory=dict)
    _progs: dict[str, int] = field(default_factory=dict)     # program name -> fd
    _pinned_before: frozenset[str] = frozenset()            # pins before the load child ran
    resized: list[str] = field(default_factory=list)        # maps made anew at a new size
    _carry: RowCarry | None = None                          # their program-written rows

    @property
    def links_dir(self) -> Path:
        return self.bpffs_dir / "links"

    def start_load(self, extra: Sequence[Program] = ()) -> LoadJob:
        """Starts compiling sock_lb.c (and `extra` programs, e.g. the TC ones, which share the
        maps) in a child process; bcc there adopts the maps already pinned in bpffs_dir."""
        kernel.require(str(self.cgroup))      # a clear error before bcc's compile errors
        if self.bpffs_dir.is_dir():
            self.resized = resize.stage(self.bpffs_dir, self.sizes)
            self._pinned_before = frozenset(p.name for p in self.bpffs_dir.iterdir())
        return spawn(self.bpffs_dir, sock_programs() + list(extra), self.sizes,
                     self.program_cache)

    def load(self, job: LoadJob | None = None) -> None:
        """Waits for the child (started here unless `job` is given), takes the socket
        programs' fds and opens every pinned map through BPF_OBJ_GET."""
        job = job or self.start_load()
        fds = job.result()
        self._progs = {name: fds[name] for name in SOCK_HOOKS}
        try:
            for name, spec in MAPS.items():
                self.maps[name] = PinnedMap(self.bpffs_dir / spec.name, spec)
            if self.resized:
                self._carry = resize.carry(self.bpffs_dir, self.resized)
                log.info("carried %d rows over to the resized maps (before attaching)",
                         self._carry.copy())
        except BaseException:
            self.close()
            raise

    def new_agent_maps(self) -> list[str]:
        """The maps the agent fills that this load created empty (a fresh node, or a map of
        a new layout version or size beside adopted ones): programs reading them must wait
        for the first sync."""
        return sorted(spec.name for name, spec in MAPS.items()
                      if name in AGENT_FILLED and (spec.name not in self._pinned_before
                                                   or name in self.resized))

    def made_beside_adopted(self, name: str) -> bool:
        """Whether this load created map `name` beside adopted ones (an upgrade from a version
        without it): what the programs would have written into it before is missing."""
        return (MAPS[name].name not in self._pinned_before
                and MAPS["svc"].name in self._pinned_before)

    def finish_resize(self) -> None:
        """Once every program reads the new maps: the rows the old ones wrote meanwhile, then
        the old maps' pins go."""
        if self._carry is not None:
            log.info("carried %d more rows over to the resized maps (after attaching)",
                     self._carry.copy())
            self._carry.close()
            self._carry = None
        if self.resized:
            resize.remove_aside(self.bpffs_dir)
            self.resized = []

    def attach(self) -> None:
        """Attaches every hook to the cgroup, replacing a previous agent's programs in place."""
        self.links_dir.mkdir(exist_ok=True)
        cgroup_id = os.stat(self.cgroup).st_ino     # a cgroup2 directory's inode is its id
        cg_fd = os.open(self.cgroup, os.O_RDONLY | os.O_DIRECTORY)
        try:
            for prog, (attach_type, pin) in SOCK_HOOKS.items():
                self._attach_one(self._progs[prog], cg_fd, cgroup_id, attach_type,
                                 self.links_dir / pin)
        finally:
            os.close(cg_fd)
        self.remove_stale_maps()

    def detach(self) -> list[str]:
        """Detaches the socket hooks a previous agent pinned (`socketLB: false`): unpinning a
        link releases it. Connections they already translated keep their backend."""
        removed = []
        for _, pin in SOCK_HOOKS.values():
            path = self.links_dir / pin
            if path.exists():
                path.unlink()
                removed.append(pin)
                log.info("detached %s: socket-level load balancing is off", pin)
        return removed

    def remove_stale_maps(self) -> list[str]:
        """Unpins maps of other layout versions (kp_svc4_v2 after an upgrade to kp_svc_v3).
        Safe only once our programs are attached: until then the old programs read them."""
        current = {spec.name for spec in MAPS.values()}
        bases = {spec.base for spec in MAPS.values()} | FORMER_BASES
        removed = []
        for entry in sorted(self.bpffs_dir.iterdir()):
            base, sep, version = entry.name.rpartition("_v")
            if sep and version.isdigit() and base in bases and entry.name not in current \
                    and entry.is_file():
                entry.unlink()
                removed.append(entry.name)
                log.info("removed %s: a map of another layout version, no longer read", entry)
        return removed

    def _attach_one(self, prog_fd: int, cg_fd: int, cgroup_id: int, attach_type: int,
                    pin: Path) -> None:
        if pin.exists():
            link_fd = libbpf.obj_get(str(pin))
            try:
                info = libbpf.link_info(link_fd)
                if info.cgroup_id == cgroup_id and info.attach_type == attach_type:
                    libbpf.link_update(link_fd, prog_fd)
                    log.info("replaced program of link %s", pin)
                    return
                log.warning("link %s is on another cgroup (id %d): moving it to %s", pin,
                            info.cgroup_id, self.cgroup)
            finally:
                os.close(link_fd)
        # Make the new link first and rename its pin over the old one: if anything fails,
        # the old attachment is still in place. (bpffs names may not contain a dot.)
        staged = pin.with_name(pin.name + "_new")
        link_fd = libbpf.link_create(prog_fd, cg_fd, attach_type)
        try:
            staged.unlink(missing_ok=True)
            libbpf.obj_pin(link_fd, str(staged))
            os.replace(staged, pin)         # the old link, now unpinned, detaches
        finally:
            os.close(link_fd)
        log.info("attached %s to %s", pin.name, self.cgroup)

    def close(self) -> None:
        if self._carry is not None:
            self._carry.close()
            self._carry = None
        for m in self.maps.values():
            m.close()
        self.maps.clear()
        for fd in self._progs.values():
            os.close(fd)
        self._progs.clear()
