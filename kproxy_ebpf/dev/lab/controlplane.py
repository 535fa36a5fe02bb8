"""A real, minimal Kubernetes control plane for the lab and the integration tests.

etcd + kube-apiserver + kube-controller-manager (EndpointSlice controller only), all bound to
127.0.0.1 on free ports. There is no scheduler and no kubelet: tests create Nodes and Pods and
patch their status themselves (see kubeobjects.py), and the real EndpointSlice controller turns
them into the slices the agent consumes. Processes are started in their own sessions and
stopped only by the pids recorded here.
"""

from __future__ import annotations

import base64
import json
import shutil
import signal
import socket
import ssl
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO

from kproxy_ebpf.model.objects import hostport

from .pki import Pki, generate_pki, write_kubeconfig

LOOPBACK = "127.0.0.1"
# The lab's relay address: lab nodes reach the apiserver at RELAY_ADDRESS:RELAY_PORT through the
# lead's relay, and the `kubernetes` Service endpoint advertises this (never loopback) address.
RELAY_ADDRESS = "10.250.0.1"
RELAY_PORT = 6443
SERVICE_CIDR = "10.96.0.0/16"

# The resources the kproxy agent (and kube-proxy) list and watch.
WATCHED_RESOURCES = ("services", "endpointslices.discovery.k8s.io", "nodes")

READY_TIMEOUT = 60.0
STOP_GRACE = 10.0
START_ATTEMPTS = 3  # only port collisions are retried


class ControlPlaneError(RuntimeError):
    pass


class _PortInUse(ControlPlaneError):
    pass


def free_ports(n: int) -> list[int]:
    """`n` distinct TCP ports free on 127.0.0.1 right now (the kernel picks them). Another
    process may take one before we bind it; start() retries on "address already in use"."""
    socks = [socket.socket(socket.AF_INET, socket.SOCK_STREAM) for _ in range(n)]
    try:
        for s in socks:
            s.bind((LOOPBACK, 0))
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


@dataclass
class _Proc:
    name: str
    popen: subprocess.Popen[bytes]
    log: IO[bytes]
    log_path: Path
    log_offset: int  # where this run's output starts in the (appended) log

    def tail(self, lines: int = 30) -> str:
        try:
            with open(self.log_path, "rb") as f:
                f.seek(self.log_offset)
                text = f.read().decode(errors="replace")
        except OSError:
            return ""
        return "\n".join(text.splitlines()[-lines:])


class ControlPlane:
    """etcd, kube-apiserver and kube-controller-manager under `workdir`.

    Layout: workdir/etcd (data), workdir/pki, workdir/logs/<name>.log, workdir/admin.kubeconfig
    (https://127.0.0.1:<api_port>, for the host) and workdir/lab.kubeconfig
    (https://10.250.0.1:6443, for processes inside lab node namespaces; same credentials).
    """

    def __init__(
        self,
        workdir: Path,
        bin_dir: Path,
        *,
        advertise_address: str = RELAY_ADDRESS,
        lab_server: str = f"https://{RELAY_ADDRESS}:{RELAY_PORT}",
        lab_host_on_api_port: str | None = None,
        service_cidr: str = SERVICE_CIDR,
        api_port: int | None = None,
        uncached_resources: Sequence[str] = (),
        bitmap_ip_allocator: bool = False,
    ) -> None:
        """`uncached_resources` (e.g. WATCHED_RESOURCES) turns the apiserver's watch cache off
        for them, so their watches are served by etcd and compact_etcd() makes a watch from an
        older resourceVersion fail with 410 at once. With the cache on (the default, as in real
        clusters) the cache keeps serving old resourceVersions from its own window after a
        compaction; 410 then comes only after restart_apiserver() (the new cache starts at the
        current revision) or when the window moves on.

        `bitmap_ip_allocator` (the scale run past 20,000 Services): ClusterIPs from the bitmap
        allocator of Kubernetes 1.33 (the API server emulates 1.33, the last version where
        MultiCIDRServiceAllocator may be turned off). 1.36's allocator lists every IPAddress
        object twice per allocation for its metrics (ipallocator.go createIPAddress ->
        Used()/Free()), so a fill of N Services costs O(N^2): 44 s per 1,000 at 13,000,
        against 3.7 s per 2,000 at every fill level up to 12,000 with the bitmap. No
        ServiceCIDR object is made then: the caller creates it (Testbed).

        `lab_host_on_api_port` (a relay listening on the API server's own port there): the lab
        reaches the API at https://<that host>:<api_port>, whatever port a retry picks."""
        self.workdir = Path(workdir).resolve()
        self.bin_dir = Path(bin_dir)
        self.advertise_address = advertise_address
        self._lab_server = lab_server
        self._lab_host = lab_host_on_api_port
        self.service_cidr = service_cidr
        self._api_port = api_port
        self.uncached_resources = tuple(uncached_resources)
        self.bitmap_ip_allocator = bitmap_ip_allocator
        self._etcd_port: int | None = None
        self._etcd_peer_port: int | None = None
        self._kcm_port: int | None = None
        self._pki: Pki | None = None
        self._procs: dict[str, _Proc] = {}
        self.startup_seconds: dict[str, float] = {}

    # ---- public API -------------------------------------------------------------------------

    @property
    def lab_server(self) -> str:
        if self._lab_host is None:
            return self._lab_server
        return f"https://{hostport(self._lab_host, self.api_port)}"

    @property
    def api_port(self) -> int:
        if self._api_port is None:
            raise ControlPlaneError("control plane not started")
        return self._api_port

    @property
    def api_url(self) -> str:
        return f"https://{LOOPBACK}:{self.api_port}"

    @property
    def etcd_url(self) -> str:
        if self._etcd_port is None:
            raise ControlPlaneError("control plane not started")
        return f"http://{LOOPBACK}:{self._etcd_port}"

    @property
    def admin_kubeconfig(self) -> Path:
        return self.workdir / "admin.kubeconfig"

    @property
    def lab_kubeconfig(self) -> Path:
        return self.workdir / "lab.kubeconfig"

    @property
    def pki(self) -> Pki:
        if self._pki is None:
            raise ControlPlaneError("control plane not started")
        return self._pki

    def pids(self) -> dict[str, int]:
        """Pids of the processes this object started and that have not been reaped."""
        return {name: p.popen.pid for name, p in self._procs.items() if p.popen.poll() is None}

    def start(self) -> None:
        """Start etcd, kube-apiserver and kube-controller-manager; return once all are healthy.

        Any failure (or Ctrl-C) stops whatever was already started before re-raising.
        """
        if self._procs:
            raise ControlPlaneError("already started")
        fixed_api_port = self._api_port
        for attempt in range(1, START_ATTEMPTS + 1):
            try:
                self._start_once(fixed_api_port)
                return
            except _PortInUse:
                self.stop()
                if attempt == START_ATTEMPTS or fixed_api_port is not None:
                    raise
                # A fresh member on new ports: do not reuse the half-started etcd's data.
                shutil.rmtree(self.workdir / "etcd", ignore_errors=True)
            except BaseException:
                self.stop()
                raise

    def _start_once(self, fixed_api_port: int | None) -> None:
        (self.workdir / "logs").mkdir(parents=True, exist_ok=True)
        t0 = time.monotonic()
        if self._pki is None:
            self._pki = generate_pki(self.workdir / "pki")
        self._etcd_port, self._etcd_peer_port, api_port, self._kcm_port = free_ports(4)
        self._api_port = fixed_api_port or api_port
        write_kubeconfig(self.admin_kubeconfig, self.api_url, self._pki)
        write_kubeconfig(self.lab_kubeconfig, self.lab_server, self._pki)
        self.startup_seconds["pki"] = time.monotonic() - t0
        self._start_etcd()
        self._start_apiserver()
        self._start_kcm()
        self.startup_seconds["total"] = time.monotonic() - t0

    def stop(self) -> None:
        """Stop every started process in reverse start order (SIGTERM, then SIGKILL), and reap it."""
        for name in reversed(list(self._procs)):
            self._stop_proc(name)

    def stop_apiserver(self) -> None:
        """Stop kube-apiserver only (an API outage: etcd and the controller manager stay)."""
        self._stop_proc("kube-apiserver")

    def start_apiserver(self) -> float:
        """Start kube-apiserver again on the same port; returns seconds until ready."""
        t0 = time.monotonic()
        try:
            self._start_apiserver()
        except BaseException:
            self.stop()
            raise
        return time.monotonic() - t0

    def restart_controller_manager(self) -> None:
        """A fresh kube-controller-manager: after an API outage its informers back off for up to
        a minute (client-go: 30 s with 100 % jitter), which would slow every test after it."""
        self._stop_proc("kube-controller-manager")
        try:
            self._start_kcm()
        except BaseException:
            self.stop()
            raise

    def restart_apiserver(self) -> float:
        """Stop and restart kube-apiserver on the same port; returns seconds until ready again."""
        self.stop_apiserver()
        return self.start_apiserver()

    def compact_etcd(self) -> int:
        """Compact etcd at its current revision (physically); returns that revision.

        A watch from an older resourceVersion that reaches etcd then gets 410 Gone: for
        `uncached_resources` at once, for watch-cached ones only once the apiserver's cache no
        longer holds that version (see __init__)."""
        header = self._etcd_post("/v3/kv/range", {"key": base64.b64encode(b"\0").decode(), "limit": 1})["header"]
        revision = int(header["revision"])
        try:
            self._etcd_post("/v3/kv/compaction", {"revision": revision, "physical": True})
        except urllib.error.HTTPError as e:
            # Nothing written since the last compaction: already compacted at this revision.
            body = e.read().decode(errors="replace")
            if "compacted" not in body:
                raise ControlPlaneError(f"etcd compaction at {revision} failed: {e.code} {body}") from e
        return revision

    def __enter__(self) -> ControlPlane:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # ---- processes --------------------------------------------------------------------------

    def _start_etcd(self) -> None:
        peer = f"http://{LOOPBACK}:{self._etcd_peer_port}"
        self._spawn("etcd", [
            "--name=kproxy-etcd",
            f"--data-dir={self.workdir / 'etcd'}",
            f"--listen-client-urls={self.etcd_url}",
            f"--advertise-client-urls={self.etcd_url}",
            f"--listen-peer-urls={peer}",
            f"--initial-advertise-peer-urls={peer}",
            f"--initial-cluster=kproxy-etcd={peer}",
            "--unsafe-no-fsync=true",  # lab data is throwaway; fsync dominates write latency
            "--log-level=warn",
        ])
        self._wait_ready("etcd", self._etcd_healthy)

    def _apiserver_args(self) -> list[str]:
        pki = self.pki
        return [
            f"--etcd-servers={self.etcd_url}",
            f"--bind-address={LOOPBACK}",
            f"--secure-port={self.api_port}",
            # Must not be loopback (the `kubernetes` endpoint rejects it); need not exist on the host.
            f"--advertise-address={self.advertise_address}",
            f"--cert-dir={pki.dir}",
            f"--tls-cert-file={pki.server_cert}",
            f"--tls-private-key-file={pki.server_key}",
            f"--client-ca-file={pki.ca_cert}",
            "--service-account-issuer=https://kubernetes.default.svc",
            f"--service-account-key-file={pki.sa_pub}",
            f"--service-account-signing-key-file={pki.sa_key}",
            "--authorization-mode=RBAC",
            f"--service-cluster-ip-range={self.service_cidr}",
            # No KCM serviceaccount controllers run, so no default SA exists to admit pods against.
            "--disable-admission-plugins=ServiceAccount",
            "--allow-privileged=true",
            "--endpoint-reconciler-type=lease",
            # Benchmark tuning: no request queueing or in-flight limits in the lab.
            "--enable-priority-and-fairness=false",
            "--max-requests-inflight=0",
            "--max-mutating-requests-inflight=0",
            # Otherwise shutdown waits --request-timeout (60 s) for clients' open watch
            # connections; with this the HTTP server shutdown is bounded by 2 s.
            "--shutdown-send-retry-after=true",
            "--profiling=false",
            "--v=1",
        ] + ([f"--watch-cache-sizes={','.join(r + '#0' for r in self.uncached_resources)}"]
             if self.uncached_resources else []) + (
            ["--emulated-version=1.33", "--feature-gates=MultiCIDRServiceAllocator=false"]
            if self.bitmap_ip_allocator else [])

    def _start_apiserver(self) -> None:
        self._spawn("kube-apiserver", self._apiserver_args())
        self._wait_ready("kube-apiserver", self._apiserver_ready)

    def _start_kcm(self) -> None:
        self._spawn("kube-controller-manager", [
            f"--kubeconfig={self.admin_kubeconfig}",
            "--controllers=endpointslice-controller",
            "--leader-elect=false",
            f"--bind-address={LOOPBACK}",
            f"--secure-port={self._kcm_port}",
            "--kube-api-qps=200",
            "--kube-api-burst=400",
            "--profiling=false",
            "--v=1",
        ])
        self._wait_ready("kube-controller-manager", self._kcm_healthy)

    def _spawn(self, name: str, args: list[str]) -> None:
        log_path = self.workdir / "logs" / f"{name}.log"
        log = open(log_path, "ab")
        offset = log.tell()
        log.write(f"==== {time.strftime('%H:%M:%S')} starting {name}\n".encode())
        log.flush()
        try:
            popen = subprocess.Popen(
                [str(self.bin_dir / name), *args],
                stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                start_new_session=True,  # a Ctrl-C in the test terminal must not hit it first
                cwd=self.workdir,
            )
        except BaseException:
            log.close()
            raise
        self._procs[name] = _Proc(name, popen, log, log_path, offset)

    def _stop_proc(self, name: str) -> None:
        proc = self._procs.pop(name, None)
        if proc is None:
            return
        p = proc.popen
        try:
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)  # by pid: only the process we started
                try:
                    p.wait(timeout=STOP_GRACE)
                except subprocess.TimeoutExpired:
                    p.kill()
                    p.wait()
        finally:
            proc.log.close()

    def _wait_ready(self, name: str, probe) -> None:
        t0 = time.monotonic()
        deadline = t0 + READY_TIMEOUT
        last_error = ""
        while True:
            proc = self._procs[name]
            if proc.popen.poll() is not None:
                tail = proc.tail()
                if "address already in use" in tail:
                    raise _PortInUse(f"{name}: port collision, log {proc.log_path}:\n{tail}")
                raise ControlPlaneError(
                    f"{name} exited with code {proc.popen.returncode} during startup; "
                    f"log {proc.log_path}:\n{tail}"
                )
            try:
                if probe():
                    break
            except (OSError, ValueError) as e:  # refused, TLS not up yet, bad JSON
                last_error = str(e)
            if time.monotonic() > deadline:
                raise ControlPlaneError(
                    f"{name} not ready after {READY_TIMEOUT:.0f}s ({last_error}); "
                    f"log {proc.log_path}:\n{proc.tail()}"
                )
            time.sleep(0.1)
        self.startup_seconds[name] = time.monotonic() - t0

    # ---- probes -----------------------------------------------------------------------------

    def _etcd_healthy(self) -> bool:
        with urllib.request.urlopen(f"{self.etcd_url}/health", timeout=2) as r:
            return json.load(r).get("health") == "true"

    def _admin_tls(self) -> ssl.SSLContext:
        ctx = ssl.create_default_context(cafile=str(self.pki.ca_cert))
        ctx.load_cert_chain(str(self.pki.admin_cert), str(self.pki.admin_key))
        return ctx

    def _apiserver_ready(self) -> bool:
        try:
            with urllib.request.urlopen(f"{self.api_url}/readyz", timeout=2, context=self._admin_tls()) as r:
                return r.status == 200
        except urllib.error.HTTPError:  # 500 while post-start hooks run
            return False

    def _kcm_healthy(self) -> bool:
        ctx = ssl.create_default_context()
        ctx.check_hostname = False
        ctx.verify_mode = ssl.CERT_NONE  # KCM serves an in-memory self-signed cert
        try:
            with urllib.request.urlopen(f"https://{LOOPBACK}:{self._kcm_port}/healthz", timeout=2, context=ctx) as r:
                return r.status == 200
        except urllib.error.HTTPError:
            return False

    def _etcd_post(self, path: str, body: dict) -> dict:
        req = urllib.request.Request(
            f"{self.etcd_url}{path}", data=json.dumps(body).encode(),
            headers={"Content-Type": "application/json"}, method="POST",
        )
        with urllib.request.urlopen(req, timeout=10) as r:
            return json.load(r)

