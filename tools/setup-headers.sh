#!/usr/bin/env bash
# Merges Debian's kernel header packages (linux-headers-*-common + the arch flavour) into one
# tree under the cache, for bcc's BCC_KERNEL_SOURCE. Our programs use only UAPI types, so any
# recent tree works; the host's /lib/modules is never touched. Prints the tree's path.
set -euo pipefail
CACHE=${KPROXY_CACHE:-/var/cache/kproxy-ebpf}
# The flavour package (e.g. linux-headers-6.1.0-57-cloud-amd64) pairs with the -common package
# of the same ABI version (linux-headers-6.1.0-57-common): take the newest flavour present.
flavour=$(ls -d /usr/src/linux-headers-*-amd64 2>/dev/null | sort -V | tail -1 || true)
[[ -n $flavour ]] || { echo "no linux-headers-*-amd64 package under /usr/src (make setup installs it)" >&2; exit 1; }
version=$(basename "$flavour" | sed -E 's/^linux-headers-([0-9.]+-[0-9]+)-.*$/\1/')
common=/usr/src/linux-headers-$version-common
[[ -d $common ]] || { echo "missing $common" >&2; exit 1; }
dest=$CACHE/headers/$(basename "$flavour")
if [[ ! -f $dest/.complete ]]; then
  rm -rf "$dest.tmp"; mkdir -p "$dest.tmp"
  cp -a "$common/." "$dest.tmp/"
  cp -a "$flavour/." "$dest.tmp/"
  touch "$dest.tmp/.complete"
  rm -rf "$dest"; mv "$dest.tmp" "$dest"
fi
echo "$dest"
