#!/usr/bin/env bash
# `make kind-down`: delete the kind cluster made by `make kind-up` (CLUSTER, default kproxy).
# When it was the last cluster on the project's podman network, the network, the host side of
# the egress guard and the runtime files go too: nothing of the kind path is left.
set -euo pipefail
. "$(dirname "$0")/kind-lib.sh"
kind delete cluster --name "$CLUSTER"
if [[ $KIND_PROVIDER == podman ]] && [[ -z $(podman ps -aq --filter "network=$KIND_NET") ]]; then
  host_guard_down
  podman network exists "$KIND_NET" && podman network rm "$KIND_NET" >/dev/null
  rm -rf "$RUN_DIR"
  log "removed network $KIND_NET and the host's egress guard"
fi
