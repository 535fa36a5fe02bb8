#!/usr/bin/env bash
# `make image`: builds the agent image from the repository's Dockerfile without any registry.
# The base (what users get as debian:bookworm-slim) is tools/image/base.sh's; podman builds the
# same Dockerfile on it.
# Debian's podman needs `--runtime runc` on this machine's hybrid cgroup layout (crun refuses
# it) and an explicit nofile ulimit (its default exceeds the hard limit and fails with EPERM).
# Prints the image name.
set -euo pipefail
cd "$(dirname "$0")/../.."
IMAGE=${IMAGE:-localhost/kproxy-ebpf:$(sed -n 's/^version = "\(.*\)"/\1/p' pyproject.toml)}
NOFILE=$(ulimit -Hn)
PODMAN=(podman --runtime runc)

echo "image: [+${SECONDS}s] base image (mmdebstrap, cached after the first build)" >&2
BASE=$(tools/image/base.sh)

echo "image: [+${SECONDS}s] podman build -> $IMAGE" >&2
# --network host: the RUN steps reach Debian's archive and PyPI as the host's own apt/pip do.
# The host's CA bundle goes in as a build secret: pip in the build then trusts what the host's
# pip trusts (e.g. a TLS-intercepting proxy); nothing of it stays in the image.
secret=()
CA_BUNDLE=${CA_BUNDLE:-/etc/ssl/certs/ca-certificates.crt}
[[ -s $CA_BUNDLE ]] && secret=(--secret "id=ca-bundle,src=$CA_BUNDLE")
"${PODMAN[@]}" build --quiet --network host --ulimit "nofile=$NOFILE:$NOFILE" "${secret[@]}" \
    --build-arg "BASE_IMAGE=$BASE" -t "$IMAGE" -f Dockerfile . >/dev/null
echo "image: [+${SECONDS}s] built" >&2
echo "$IMAGE"
