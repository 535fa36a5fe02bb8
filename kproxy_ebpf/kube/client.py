"""Building the one `kubernetes.client.ApiClient` the agent shares between its watches and Events.

The choice of credentials follows kube-proxy: an explicit kubeconfig wins, then the Pod's
service account (in-cluster), then the default kubeconfig ($KUBECONFIG or ~/.kube/config).
`master` overrides the API server address as kube-proxy's --master does; this matters in-cluster,
where the proxy must not depend on the kubernetes Service it is about to program itself.

The Python client has no client-side QPS limiter to tune. What we do set: a connection pool big
enough for the watches, lists and Event posts that run at the same time, TCP keepalives so a
watch on a silently dead connection fails within about a minute instead of hanging until its
read timeout, and a User-Agent that names us in the API server's logs and audit trail.
"""
from __future__ import annotations

import os
import socket
from typing import TYPE_CHECKING

from kproxy_ebpf import __version__

if TYPE_CHECKING:   # imported lazily (and leanly, see lean.py): ~0.4 s and ~50 MiB in full
    import kubernetes.client

USER_AGENT = f"kproxy-ebpf/{__version__}"

# Keepalive after 30 s idle, then every 10 s, give up after 3 misses: ~60 s to notice a dead peer.
_KEEPALIVE = [
    (socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1),
    (socket.IPPROTO_TCP, socket.TCP_KEEPIDLE, 30),
    (socket.IPPROTO_TCP, socket.TCP_KEEPINTVL, 10),
    (socket.IPPROTO_TCP, socket.TCP_KEEPCNT, 3),
]


class ConfigError(RuntimeError):
    """No usable credentials or API server address."""


def _normalise_master(master: str) -> str:
    """'host:port' -> 'https://host:port'; a URL with a scheme is kept as given."""
    master = master.strip().rstrip("/")
    return master if "://" in master else f"https://{master}"


def make_api_client(
    kubeconfig: str | os.PathLike[str] | None = None,
    master: str | None = None,
    *,
    context: str | None = None,
    pool_maxsize: int = 16,
) -> kubernetes.client.ApiClient:
    """Return an ApiClient for the first source of credentials that applies.

    kubeconfig: explicit kubeconfig file (wins over everything else).
    master: API server address, "host:port" or a URL; overrides the one from the credentials.
            With no kubeconfig and not in a cluster, it alone is used (no credentials).
    Raises ConfigError when nothing applies.
    """
    from . import lean

    lean.install()          # only the parts of the client we use are imported (~50 MiB less)
    from kubernetes import client, config
    from kubernetes.config.config_exception import ConfigException

    cfg = client.Configuration()
    try:
        if kubeconfig is not None:
            if not os.path.exists(kubeconfig):
                raise ConfigError(f"kubeconfig {os.fspath(kubeconfig)} does not exist")
            config.load_kube_config(config_file=os.fspath(kubeconfig), context=context,
                                    client_configuration=cfg, persist_config=False)
        elif os.environ.get("KUBERNETES_SERVICE_HOST") and os.environ.get("KUBERNETES_SERVICE_PORT"):
            config.load_incluster_config(client_configuration=cfg)
        elif _default_kubeconfig_exists():
            config.load_kube_config(context=context, client_configuration=cfg, persist_config=False)
        elif not master:
            raise ConfigError("no kubeconfig given, not running in a cluster, and no default kubeconfig "
                              "($KUBECONFIG or ~/.kube/config); pass --kubeconfig or --master")
    except (ConfigException, OSError) as exc:
        raise ConfigError(f"cannot load Kubernetes credentials: {exc}") from exc
    if master:
        cfg.host = _normalise_master(master)
    cfg.connection_pool_maxsize = pool_maxsize
    cfg.socket_options = _default_socket_options() + _KEEPALIVE
    api = client.ApiClient(configuration=cfg)
    api.user_agent = USER_AGENT
    return api


def _default_kubeconfig_exists() -> bool:
    from kubernetes.config.kube_config import ENV_KUBECONFIG_PATH_SEPARATOR
    env = os.environ.get("KUBECONFIG")
    paths = env.split(ENV_KUBECONFIG_PATH_SEPARATOR) if env else ["~/.kube/config"]
    return any(p and os.path.exists(os.path.expanduser(p)) for p in paths)


def _default_socket_options() -> list:
    # Setting socket_options replaces urllib3's defaults (TCP_NODELAY); keep them.
    from urllib3.connection import HTTPConnection
    return list(HTTPConnection.default_socket_options)
