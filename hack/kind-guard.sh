#!/usr/bin/env bash
# The egress guards' drop counters of cluster CLUSTER as one JSON object: every node's own
# (tools/kind/node/egress-guard.sh) and the host side's (hack/kind-lib.sh), in packets.
set -euo pipefail
. "$(dirname "$0")/kind-lib.sh"
sep=""
printf '{"nodes": {'
for n in $(nodes); do printf '%s"%s": %s' "$sep" "$n" "$(node_guard_drops "$n")"; sep=", "; done
printf '}, "host": %s}\n' "$(host_guard_drops)"
