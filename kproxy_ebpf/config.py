"""Agent configuration: a YAML file, then KPROXY_* environment variables, then flags.

Names follow kube-proxy's KubeProxyConfiguration where one exists (camelCase in the file,
hostnameOverride, minSyncPeriod, syncPeriod, healthzBindAddress, metricsBindAddress); the
environment uses the same names in upper snake case (KPROXY_MIN_SYNC_PERIOD).
"""
from __future__ import annotations

import dataclasses
import logging
import os
import re
import socket
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from .datapath.load.pod_devices import DEFAULT_GLOBS as DEFAULT_POD_GLOBS
from .datapath.maps.map_sizes import MapSizes
from .model import maglev
from .model.objects import LBAlgorithm

log = logging.getLogger(__name__)


class ConfigError(ValueError):
    pass


KUBE_PROXY_CLEANUP = ("off", "dry-run", "on")


@dataclass
class AgentConfig:
    kubeconfig: str | None = None         # None: in-cluster config, else ~/.kube/config
    master: str | None = None             # API server host:port, overrides the kubeconfig's
    hostname_override: str | None = None  # the Node name; default: the host name
    bpffs_dir: str = "/sys/fs/bpf/kproxy"
    # Compiled programs by a hash of their inputs (datapath/progcache.py): a restart or an
    # upgrade with identical programs loads them without clang. "" disables the cache.
    program_cache: str = "/var/cache/kproxy-ebpf/programs"
    # No default on purpose: the hooks go where the operator says (in a cluster, the cgroup2
    # root of the node; in the lab, the simulated node's cgroup), never by accident.
    cgroup: str | None = None
    min_sync_period: float = 0.2          # seconds between two syncs at the most often
    sync_period: float = 30.0             # a sync at least this often; 10 of them: a drift check
    # A watch with neither an event nor a bookmark for this long is taken as dead and made
    # again (the API server sends a bookmark about every minute).
    watch_progress_timeout: float = 150.0
    healthz_bind_address: str = "0.0.0.0:10256"
    metrics_bind_address: str = "127.0.0.1:10249"
    # Per-Service metrics (kproxy_service_*): about 8 series per service port, for the first
    # this many service ports by namespace/name/port; 0: none. Bounds a scrape at 10k Services.
    service_metrics_limit: int = 1000
    map_sizes: MapSizes = field(default_factory=MapSizes)
    manifests: list[str] = field(default_factory=list)   # static Service/EndpointSlice YAML
    prefer_same_node: bool = True         # the PreferSameTrafficDistribution feature gate
    # North-south (TC): NodePort/ExternalIP/LoadBalancer traffic from outside the node.
    north_south: bool = True
    devices: list[str] = field(default_factory=list)   # external devices; []: from the routes
    node_port_addresses: list[str] = field(default_factory=list)  # CIDRs or "primary"; []: primary
    snat_port_range: str = "61000-65535"  # above Linux's ephemeral range (32768-60999)
    # How frontends pick a backend for a new connection: random; round-robin or least-conn
    # (IPVS's rr and lc, on both paths); or maglev (frontends for traffic from outside only:
    # every node picks the same backend for a flow, for ECMP in front of the nodes; a table of
    # maglevTableSize entries, a prime, at least 100 per backend). A Service's annotation
    # kproxy-ebpf.io/lb-algorithm overrides it.
    lb_algorithm: str = "random"
    maglev_table_size: int = 16381
    # ExternalIPs outside these CIDRs are not programmed (CVE-2020-8554); None: all allowed.
    external_ip_allowlist: list[str] | None = None
    # false: no cgroup hooks; ClusterIPs are served per packet at TC on the pod-facing devices
    # (those whose name matches podDevices), for clients the socket hooks do not cover.
    socket_lb: bool = True
    pod_devices: list[str] = field(default_factory=lambda: list(DEFAULT_POD_GLOBS))
    # A TCP socket our hooks connected to a backend that left its Service is reset (as
    # Calico does; kube-proxy leaves TCP flows alone). UDP ones are always disconnected.
    stale_sockets_tcp: bool = True
    log_level: str = "info"
    # Conntrack timeouts of the node's network namespace, as kube-proxy sets them (its
    # conntrack.tcpEstablishedTimeout and tcpCloseWaitTimeout); 0 leaves the kernel's.
    conntrack_tcp_established_timeout: float = 24 * 3600.0
    conntrack_tcp_close_wait_timeout: float = 3600.0
    # kube-proxy's leftovers on this node (agent/kubeproxy_handover.py), once kube-proxy no
    # longer runs here: off, dry-run (listed in the log), on (removed).
    kube_proxy_cleanup: str = "off"
    # The agent's own DaemonSet (the chart sets both): at exit, when it is gone or no longer
    # selects this node, the agent removes its datapath (agent/uninstall.py); unset: never.
    daemonset_name: str | None = None
    daemonset_namespace: str | None = None

    @property
    def node_name(self) -> str:
        return (self.hostname_override or socket.gethostname()).lower()

    @property
    def health_timeout(self) -> float:
        return 2 * self.sync_period          # as kube-proxy: 2 x syncPeriod

    @property
    def planning(self) -> dict:
        """The settings that decide which frontends are planned, as ProxyState takes them
        (northSouth on: the scope-EXT ones too). The agent and `check` both plan with these, so
        the drift check cannot plan otherwise than the agent it checks."""
        return {"prefer_same_node": self.prefer_same_node,
                "node_port_addresses": tuple(self.node_port_addresses) if self.north_south
                else None,
                "external_ip_allowlist": None if self.external_ip_allowlist is None
                else tuple(self.external_ip_allowlist),
                "lb_algorithm": LBAlgorithm(self.lb_algorithm),
                "maglev_table_size": self.maglev_table_size}

    @property
    def snat_ports(self) -> tuple[int, int]:
        lo, sep, hi = self.snat_port_range.partition("-")
        if not (sep and lo.isdigit() and hi.isdigit() and 1024 <= int(lo) <= int(hi) <= 65535):
            raise ConfigError(f"snatPortRange must be MIN-MAX within 1024-65535, not "
                              f"{self.snat_port_range!r}")
        return int(lo), int(hi)

    def validate(self) -> None:
        if not self.cgroup:
            raise ConfigError("cgroup is required (flag --cgroup, KPROXY_CGROUP or `cgroup:`)")
        if not Path(self.cgroup).is_dir():
            raise ConfigError(f"cgroup {self.cgroup} does not exist")
        self.cgroup = _cgroup2(self.cgroup)
        if self.min_sync_period < 0 or self.sync_period <= 0:
            raise ConfigError("sync periods must be positive")
        if self.watch_progress_timeout <= 0:
            raise ConfigError("watchProgressTimeout must be positive (default 150s)")
        from .proxy.external import validate_cidrs, validate_node_port_addresses

        errors = validate_node_port_addresses(self.node_port_addresses)
        errors += validate_cidrs(self.external_ip_allowlist or [], "externalIpAllowlist")
        if self.lb_algorithm not in {a.value for a in LBAlgorithm}:
            errors.append(f"lbAlgorithm must be one of {', '.join(a.value for a in LBAlgorithm)}, "
                          f"not {self.lb_algorithm!r}")
        if (why := maglev.validate_size(self.maglev_table_size)) is not None:
            errors.append(why)
        if self.kube_proxy_cleanup not in KUBE_PROXY_CLEANUP:
            errors.append(f"kubeProxyCleanup must be one of {', '.join(KUBE_PROXY_CLEANUP)}, "
                          f"not {self.kube_proxy_cleanup!r}")
        if not self.socket_lb and not [g for g in self.pod_devices if g]:
            errors.append("socketLB false needs podDevices (the globs of the pod-facing devices)")
        if errors:
            raise ConfigError("; ".join(errors))
        self.snat_ports  # noqa: B018 (raises ConfigError)
        for name in ("healthz_bind_address", "metrics_bind_address"):
            value = getattr(self, name)
            if value and not re.fullmatch(r"[^:]*:\d+", value):
                raise ConfigError(f"{name} must be host:port (or empty to disable), not {value!r}")


def _cgroup2(path: str) -> str:
    from .datapath.load.kernel import cgroup2_at

    found = cgroup2_at(path)
    if found is None:
        raise ConfigError(
            f"cgroup {path} is cgroup v1 (or no cgroup at all) and has no cgroup v2 hierarchy "
            f"at {path}/unified, but the socket hooks attach to cgroup v2: set cgroup (the "
            f"chart's hostPaths.cgroupRoot) to the node's cgroup2 mount, /sys/fs/cgroup on a "
            f"unified host or /sys/fs/cgroup/unified on a hybrid one, and on a node that has "
            f"none (a kind node on a hybrid or v1 host) mount one first, as `make kind-up` does "
            f"(mount -t cgroup2 none /run/kproxy-cgroup2)")
    if found != path:
        log.info("cgroup %s is the hybrid layout's cgroup v1 root: the socket hooks attach to "
                 "its cgroup2 hierarchy %s", path, found)
    return found


_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(ms|s|m|h)?\s*$")
_UNIT = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, None: 1.0}


def parse_duration(value: object) -> float:
    """'200ms', '1s', '5m', or a number of seconds."""
    if isinstance(value, (int, float)):
        return float(value)
    m = _DURATION.match(str(value))
    if not m:
        raise ConfigError(f"not a duration: {value!r} (use 200ms, 1s, 5m)")
    return float(m.group(1)) * _UNIT[m.group(2)]


# File keys whose spelling is not plain camelCase (the chart's datapath.socketLB, Cilium's too).
_KEY_NAMES = {"socket_lb": "socketLB", "stale_sockets_tcp": "staleSocketsTCP"}


def _camel(name: str) -> str:
    if name in _KEY_NAMES:
        return _KEY_NAMES[name]
    head, *rest = name.split("_")
    return head + "".join(p.title() for p in rest)


def _bool(name: str, value: object) -> bool:
    if isinstance(value, bool):
        return value
    text = str(value).strip().lower()
    if text in ("1", "true", "yes"):
        return True
    if text in ("0", "false", "no"):
        return False
    raise ConfigError(f"{_camel(name)} must be true or false, not {value!r}")


def _coerce(name: str, value: object) -> object:
    if name in ("min_sync_period", "sync_period", "watch_progress_timeout",
                "conntrack_tcp_established_timeout",
                "conntrack_tcp_close_wait_timeout"):
        return parse_duration(value)
    if name in ("prefer_same_node", "north_south", "socket_lb", "stale_sockets_tcp"):
        return _bool(name, value)
    if name in ("manifests", "devices", "node_port_addresses", "external_ip_allowlist",
                "pod_devices"):
        return [str(v) for v in value] if isinstance(value, list) else [
            p for p in str(value).split(",") if p]
    if name == "kube_proxy_cleanup" and isinstance(value, bool):
        return "on" if value else "off"      # YAML 1.1 reads a bare off/on as a boolean
    if name == "maglev_table_size":
        try:
            return int(str(value))
        except ValueError:
            raise ConfigError(f"maglevTableSize must be a whole number (a prime such as 16381), "
                              f"not {value!r}") from None
    if name == "service_metrics_limit":
        try:
            n = int(str(value))
        except ValueError:
            n = -1
        if n < 0:
            raise ConfigError(f"serviceMetricsLimit must be a whole number >= 0, not {value!r}")
        return n
    if name == "map_sizes":
        if not isinstance(value, dict):
            raise ConfigError("mapSizes must be a mapping of map name to entries")
        known = {f.name for f in dataclasses.fields(MapSizes)}
        bad = set(value) - known
        if bad:
            raise ConfigError(f"unknown map in mapSizes: {sorted(bad)} (known: {sorted(known)})")
        return MapSizes(**{k: int(v) for k, v in value.items()})
    return None if value is None else str(value)


def load(path: str | None = None, env: Mapping[str, str] | None = None,
         overrides: dict[str, object] | None = None) -> AgentConfig:
    cfg = AgentConfig()
    names = [f.name for f in dataclasses.fields(AgentConfig)]
    if path:
        data = yaml.safe_load(Path(path).read_text()) or {}
        if not isinstance(data, dict):
            raise ConfigError(f"{path}: expected a mapping")
        by_camel = {_camel(n): n for n in names}
        for key, value in data.items():
            name = by_camel.get(key, key if key in names else None)
            if name is None:
                raise ConfigError(f"{path}: unknown setting {key!r}")
            setattr(cfg, name, _coerce(name, value))
    env = os.environ if env is None else env
    for name in names:
        value = env.get("KPROXY_" + name.upper())
        if value is not None and name != "map_sizes":
            setattr(cfg, name, _coerce(name, value))
    for name, value in (overrides or {}).items():
        if value is not None and value != ():
            setattr(cfg, name, _coerce(name, list(value) if isinstance(value, tuple) else value))
    return cfg
