"""Certificates and kubeconfigs for the lab's control plane.

The apiserver serves TLS and authenticates the lab's clients by client certificate, so the lab
needs a tiny PKI: one CA, a serving cert valid for every name clients use (loopback on the
host, the relay address and the `kubernetes` Service inside the lab), an admin client cert in
system:masters (bypasses RBAC) and a service-account signing key. Generated with the openssl
CLI so no crypto library is needed; short-lived because every lab run makes a fresh set.
"""

from __future__ import annotations

import base64
import secrets
import subprocess
from dataclasses import dataclass
from pathlib import Path

import yaml

# Every name the apiserver is reached by: the host (127.0.0.1), the lab nodes through the lead's
# relay (10.250.0.1, fd00:250::1) and pods through the `kubernetes` Service (first IP of the
# primary Service range: 10.96.0.0/16 or fd00:96::/112, lab/addressing.py).
DEFAULT_SERVER_SANS = (
    "IP:127.0.0.1",
    "DNS:localhost",
    "IP:10.250.0.1",
    "IP:fd00:250::1",
    "IP:10.96.0.1",
    "IP:fd00:96::1",
    "DNS:kubernetes",
    "DNS:kubernetes.default",
    "DNS:kubernetes.default.svc",
    "DNS:kubernetes.default.svc.cluster.local",
)

ADMIN_USER = "kproxy-admin"
ADMIN_GROUP = "system:masters"


@dataclass(frozen=True)
class Pki:
    dir: Path
    ca_cert: Path
    ca_key: Path
    server_cert: Path
    server_key: Path
    admin_cert: Path
    admin_key: Path
    sa_key: Path  # private, for --service-account-signing-key-file
    sa_pub: Path  # public, for --service-account-key-file


def _openssl(*args: str, cwd: Path) -> None:
    proc = subprocess.run(["openssl", *args], cwd=cwd, capture_output=True, text=True)
    if proc.returncode != 0:
        raise RuntimeError(f"openssl {args[0]} failed: {proc.stderr.strip()}")


def _ec_key(path: Path) -> None:
    _openssl("genpkey", "-algorithm", "EC", "-pkeyopt", "ec_paramgen_curve:P-256", "-out", str(path), cwd=path.parent)
    path.chmod(0o600)


def _sign(d: Path, name: str, subject: str, extensions: list[str], days: int) -> None:
    """Issue d/<name>.crt for d/<name>.key, signed by d/ca.crt."""
    ext = d / f"{name}.ext"
    ext.write_text("\n".join(extensions) + "\n")
    _openssl("req", "-new", "-key", f"{name}.key", "-subj", subject, "-out", f"{name}.csr", cwd=d)
    _openssl(
        "x509", "-req", "-in", f"{name}.csr", "-CA", "ca.crt", "-CAkey", "ca.key",
        # A random serial instead of -CAcreateserial: no ca.srl state to keep.
        "-set_serial", "0x" + secrets.token_hex(16), "-days", str(days), "-sha256",
        "-extfile", ext.name, "-out", f"{name}.crt",
        cwd=d,
    )
    (d / f"{name}.csr").unlink()
    ext.unlink()


def generate_pki(directory: Path, days: int = 30, server_sans: tuple[str, ...] = DEFAULT_SERVER_SANS) -> Pki:
    """Create a fresh CA, apiserver serving cert, admin client cert and SA key pair in `directory`."""
    d = directory
    d.mkdir(parents=True, exist_ok=True)
    _ec_key(d / "ca.key")
    _openssl(
        "req", "-x509", "-new", "-key", "ca.key", "-subj", "/CN=kproxy-lab-ca", "-days", str(days), "-sha256",
        "-addext", "basicConstraints=critical,CA:TRUE",
        "-addext", "keyUsage=critical,keyCertSign,cRLSign,digitalSignature",
        "-out", "ca.crt",
        cwd=d,
    )
    leaf = ["subjectKeyIdentifier=hash", "authorityKeyIdentifier=keyid", "basicConstraints=critical,CA:FALSE",
            "keyUsage=critical,digitalSignature"]
    _ec_key(d / "apiserver.key")
    _sign(d, "apiserver", "/CN=kube-apiserver",
          leaf + ["extendedKeyUsage=serverAuth", "subjectAltName=" + ",".join(server_sans)], days)
    _ec_key(d / "admin.key")
    _sign(d, "admin", f"/O={ADMIN_GROUP}/CN={ADMIN_USER}", leaf + ["extendedKeyUsage=clientAuth"], days)
    _openssl("genpkey", "-algorithm", "RSA", "-pkeyopt", "rsa_keygen_bits:2048", "-out", "sa.key", cwd=d)
    (d / "sa.key").chmod(0o600)
    _openssl("pkey", "-in", "sa.key", "-pubout", "-out", "sa.pub", cwd=d)
    return Pki(
        dir=d, ca_cert=d / "ca.crt", ca_key=d / "ca.key", server_cert=d / "apiserver.crt",
        server_key=d / "apiserver.key", admin_cert=d / "admin.crt", admin_key=d / "admin.key",
        sa_key=d / "sa.key", sa_pub=d / "sa.pub",
    )


def _b64(path: Path) -> str:
    return base64.b64encode(path.read_bytes()).decode()


def write_kubeconfig(path: Path, server: str, pki: Pki, name: str = "kproxy-lab") -> Path:
    """Write a self-contained kubeconfig (certs embedded) for the admin user against `server`.

    Embedding keeps it usable from any mount namespace and by tools that resolve relative
    paths differently (helm, kube-proxy's config file, the Python client).
    """
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": name, "cluster": {"server": server, "certificate-authority-data": _b64(pki.ca_cert)}}],
        "users": [{"name": ADMIN_USER, "user": {
            "client-certificate-data": _b64(pki.admin_cert),
            "client-key-data": _b64(pki.admin_key),
        }}],
        "contexts": [{"name": name, "context": {"cluster": name, "user": ADMIN_USER}}],
        "current-context": name,
    }
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    path.chmod(0o600)
    return path
