# Shared by hack/kind-up.sh, hack/kind-down.sh and hack/kind-e2e.sh (sourced, not run).
#
# Two ways to get a kind cluster:
#   registry  kind's own node image and CNI (kindnetd), pulled from their registries: the
#             ordinary path on a machine with Docker and internet (the default with Docker).
#   local     everything made here (tools/kind/images.sh: the node image and every component
#             and test image from Debian packages and pinned Go modules), ptp/host-local CNI
#             configured by kind-up, no registry ever asked, no packet off the machine (the
#             default with podman, which is what a machine without a Docker engine has).
# KIND_IMAGES=local|registry overrides the choice; KIND_PROVIDER=docker|podman the engine.
cd "$(dirname "${BASH_SOURCE[0]}")/.."
. tools/k8s/versions.env
export KPROXY_CACHE=${KPROXY_CACHE:-/var/cache/kproxy-ebpf}
CLUSTER=${CLUSTER:-kproxy}
RUN_DIR=/run/kproxy-kind
# One podman network for every cluster of ours: its name server answers from its own table only.
KIND_NET=${KIND_NET:-kproxy-kind}
POD_SUBNET=10.244.0.0/16
SERVICE_SUBNET=10.96.0.0/16
# IP_FAMILY=dual: kind's dual-stack cluster (IPv4 primary); each node then has an IPv4 and an
# IPv6 InternalIP and podCIDR, and the IPv6 ranges below join the IPv4 ones.
IP_FAMILY=${IP_FAMILY:-ipv4}
POD_SUBNET6=fd00:10:244::/56
SERVICE_SUBNET6=fd00:10:96::/112
log() { echo "kind: [+${SECONDS}s] $*" >&2; }  # steps with the time since the start
die() { echo "kind: $*" >&2; exit 1; }
case $IP_FAMILY in ipv4|dual) ;; *) die "IP_FAMILY=$IP_FAMILY: use ipv4 or dual" ;; esac

if [[ -z ${KIND_PROVIDER:-} ]]; then
  if command -v docker >/dev/null && docker info >/dev/null 2>&1; then KIND_PROVIDER=docker
  elif command -v podman >/dev/null; then KIND_PROVIDER=podman
  else die "neither a Docker engine nor podman is available: install one (Debian: apt install podman runc)"; fi
fi
KIND_IMAGES=${KIND_IMAGES:-$([[ $KIND_PROVIDER == podman ]] && echo local || echo registry)}
ENGINE=("$KIND_PROVIDER")
if [[ $KIND_PROVIDER == podman ]]; then
  export KIND_EXPERIMENTAL_PROVIDER=podman KIND_EXPERIMENTAL_PODMAN_NETWORK=$KIND_NET
  # Debian's podman: runc (crun refuses hybrid cgroup layouts) and ulimits within the hard
  # limit (its defaults exceed it and the node container fails with EPERM).
  mkdir -p "$RUN_DIR"
  # Once the network exists, every container of ours (nodes, clients, the e2e runner) asks its
  # name server only: without this podman adds the host's resolver, and a container's first
  # lookups (kind's entrypoint runs before the node's egress guard) head off the machine.
  write_containers_conf() {
    local nofile dns=""
    nofile=$(ulimit -Hn)
    if podman network exists "$KIND_NET"; then
      dns=$(podman network inspect "$KIND_NET" --format '{{range .Subnets}}{{.Gateway}} {{end}}' | awk '{print $1}')
    fi
    {
      echo "[containers]"
      echo "default_ulimits = [\"nofile=$nofile:$nofile\", \"nproc=32768:32768\"]"
      [[ -n $dns ]] && printf 'dns_servers = ["%s"]\ndns_searches = ["dns.podman"]\n' "$dns"
      echo "[engine]"
      echo 'runtime = "runc"'
    } > "$RUN_DIR/containers.conf"
  }
  write_containers_conf
  export CONTAINERS_CONF=$RUN_DIR/containers.conf
  # podman's name server (dnsmasq, started by the dnsname CNI plugin found on PATH) answers
  # the network's container names and nothing else: no upstream resolver.
  mkdir -p "$RUN_DIR/bin"
  cat > "$RUN_DIR/bin/dnsmasq" <<'WRAP'
#!/bin/sh
exec /usr/sbin/dnsmasq --no-resolv --no-hosts "$@"
WRAP
  chmod +x "$RUN_DIR/bin/dnsmasq"
  export PATH=$RUN_DIR/bin:$PATH
  ENGINE=(podman)
fi

# The binaries: built into the cache on the local path; taken from PATH (or built) otherwise.
if [[ $KIND_IMAGES == local ]] || ! command -v kind >/dev/null || ! command -v helm >/dev/null; then
  BIN=$(tools/k8s/build.sh kind | tail -1)
  export PATH=$BIN:$PATH
fi
for tool in kind kubectl helm; do command -v "$tool" >/dev/null || die "$tool not found"; done
CTX=kind-$CLUSTER
kc() { kubectl --context "$CTX" "$@"; }
nodes() { kind get nodes --name "$CLUSTER"; }
in_node() { local n=$1; shift; "${ENGINE[@]}" exec -i "$n" "$@"; }

# The host side of the egress guard (the nodes carry their own, tools/kind/node/egress-guard.sh):
# what a container of the kind network sends through the host to anywhere but that network is
# dropped and counted, so no test packet can follow the host's default route off the machine.
HOST_GUARD=KPROXY-KIND-GUARD
HOST_GUARD_LOG=kproxy-kind-guard:
host_guard_up() {  # BRIDGE
  local t
  for t in iptables ip6tables; do
    "$t" -w -N "$HOST_GUARD" 2>/dev/null || "$t" -w -F "$HOST_GUARD"
    "$t" -w -A "$HOST_GUARD" -o "$1" -j RETURN
    # Each dropped packet's headers in the kernel log (make migrate ties them to its steps).
    "$t" -w -A "$HOST_GUARD" -m limit --limit 50/s -j LOG --log-prefix "$HOST_GUARD_LOG "
    "$t" -w -A "$HOST_GUARD" -m comment --comment "kproxy kind: leaves the kind network" -j DROP
    "$t" -w -C FORWARD -i "$1" -j "$HOST_GUARD" 2>/dev/null || "$t" -w -I FORWARD 1 -i "$1" -j "$HOST_GUARD"
  done
}
host_guard_down() {
  local t rule
  for t in iptables ip6tables; do
    while rule=$("$t" -w -S FORWARD | grep -m1 -- "-j $HOST_GUARD\$"); do
      # shellcheck disable=SC2086  # the rule's words, as -S printed them
      "$t" -w ${rule/-A/-D}
    done
    "$t" -w -F "$HOST_GUARD" 2>/dev/null && "$t" -w -X "$HOST_GUARD" || true
  done
}
host_guard_drops() {  # packets dropped (IPv4 + IPv6)
  local t n sum=0
  for t in iptables ip6tables; do
    n=$("$t" -w -nvxL "$HOST_GUARD" 2>/dev/null | awk '$3 == "DROP" {print $1}')
    sum=$((sum + ${n:-0}))
  done
  echo "$sum"
}
node_guard_drops() {  # NODE: packets the node's own guard dropped (IPv4 + IPv6)
  in_node "$1" sh -c 'for t in iptables ip6tables; do $t -w -nvxL KPROXY-EGRESS | awk "\$3 == \"DROP\" {print \$1}"; done' \
    | awk '{s += $1} END {print s + 0}'
}
kind_bridge() { podman network inspect "$KIND_NET" --format '{{.NetworkInterface}}'; }
