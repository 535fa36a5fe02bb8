#!/bin/bash
# The node's egress guard: nothing leaves eth0 unless it is for the kind network itself or for
# a pod. Runs at boot, before containerd and the kubelet, so it is in place before the first pod:
# until a proxy has programmed the node, a pod's connect() to a ClusterIP follows the default
# route out of eth0 (and on to the host's own default route, off the machine). Every packet the
# guard stops is counted by the DROP rule: `iptables -nvxL KPROXY-EGRESS` (make kind-up and
# make e2e report the counts).
set -euo pipefail
POD_CIDR=${POD_CIDR:-10.244.0.0/16}
[[ -r /etc/default/kproxy-egress-guard ]] && . /etc/default/kproxy-egress-guard

guard() {  # TOOL LOCAL-DESTINATION...
  local t=$1; shift
  "$t" -w -N KPROXY-EGRESS 2>/dev/null || "$t" -w -F KPROXY-EGRESS
  local d
  for d in "$@"; do "$t" -w -A KPROXY-EGRESS -d "$d" -j RETURN; done
  "$t" -w -A KPROXY-EGRESS -m comment --comment "kproxy egress guard: leaves the kind network" -j DROP
  local chain
  for chain in OUTPUT FORWARD; do
    "$t" -w -C "$chain" -o eth0 -j KPROXY-EGRESS 2>/dev/null || "$t" -w -I "$chain" 1 -o eth0 -j KPROXY-EGRESS
  done
}

# The kind network's subnets as eth0 carries them (podman assigned them before init started).
mapfile -t v4 < <(ip -4 -o route show dev eth0 scope link | awk '{print $1}')
mapfile -t v6 < <(ip -6 -o route show dev eth0 | awk '$1 != "default" {print $1}')
(( ${#v4[@]} )) || { echo "egress guard: eth0 has no IPv4 subnet" >&2; exit 1; }
guard iptables "${v4[@]}" "$POD_CIDR"
# Link-local and multicast keep neighbour discovery working.
guard ip6tables "${v6[@]}" fe80::/10 ff00::/8 ${POD_CIDR6:+"$POD_CIDR6"}
echo "egress guard: eth0 to ${v4[*]} $POD_CIDR ${v6[*]} only"
