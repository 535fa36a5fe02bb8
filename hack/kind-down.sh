#!/usr/bin/env bash
# `make kind-down`: delete the kind cluster made by `make kind-up`.
set -euo pipefail
kind delete cluster --name "${CLUSTER:-kproxy}"
