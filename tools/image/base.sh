#!/usr/bin/env bash
# The Debian base every image of the project starts from (what users get as
# debian:bookworm-slim), made from Debian's packages with mmdebstrap and imported into podman,
# because no registry is reachable. Made once; prints its name.
set -euo pipefail
SUITE=${SUITE:-bookworm}
MIRROR=${MIRROR:-http://deb.debian.org/debian}
SECURITY=${SECURITY:-http://deb.debian.org/debian-security}
BASE=${BASE_IMAGE:-localhost/kproxy-debian:$SUITE-slim}
PODMAN=(podman --runtime runc)
# Two builds at once (make image and the kind images) would both run mmdebstrap.
mkdir -p /run/lock
exec 8>/run/lock/kproxy-ebpf-base-image.lock
flock 8
if ! "${PODMAN[@]}" image exists "$BASE"; then
  echo "base: mmdebstrap $SUITE -> $BASE" >&2
  # minbase: Essential packages plus apt, as debian:*-slim.
  mmdebstrap --quiet --variant=minbase --format=tar \
      --aptopt='Acquire::Retries "3"' \
      --customize-hook='rm -rf "$1"/var/lib/apt/lists/* "$1"/var/cache/apt/*.bin' \
      "$SUITE" - \
      "deb $MIRROR $SUITE main" "deb $MIRROR $SUITE-updates main" \
      "deb $SECURITY $SUITE-security main" \
    | "${PODMAN[@]}" import --change 'CMD ["bash"]' - "$BASE" >/dev/null
fi
echo "$BASE"
