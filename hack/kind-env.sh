#!/usr/bin/env bash
# Runs a command in the kind path's environment (hack/kind-lib.sh: the provider, podman's
# configuration, the cached binaries on PATH), e.g. `hack/kind-env.sh kind load ...`.
set -euo pipefail
. "$(dirname "$0")/kind-lib.sh"
exec "$@"
