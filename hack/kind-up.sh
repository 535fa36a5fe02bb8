#!/usr/bin/env bash
# `make kind-up`: a kind cluster with kube-proxy disabled and kproxy-ebpf installed by its chart
# (PROXY=kproxy, the default), or the same cluster with upstream kube-proxy in nftables or
# iptables mode (PROXY=nftables|iptables: the oracle `make e2e` compares against).
#   1. the node image (local path: made here, see hack/kind-lib.sh) and the podman network,
#      its name server without upstream and the host side of the egress guard;
#   2. kind create cluster: 1 control plane + WORKERS workers (default 1), kubeProxyMode none
#      (or PROXY), the control plane schedulable so that two nodes take pods;
#   3. local path: CoreDNS's Corefile without any forward before its first start, then per
#      node a cgroup2 mount where the host gives none (hybrid or v1 hosts: then the chart's
#      hostPaths.cgroupRoot names it), bpffs, the CNI config
#      (ptp + host-local on the node's podCIDR + portmap), routes to the other nodes' podCIDRs
#      and masquerade for pod traffic leaving the cluster;
#   4. PROXY=kproxy: the agent image (make image) loaded into the nodes, helm upgrade --install,
#      the DaemonSet rolled out, helm test;
#   5. checks: CoreDNS ready, a ClusterIP by name through CoreDNS from a pod, a NodePort from a
#      client container on the kind network (outside every node), the `kubernetes` Service
#      (helm test), and the egress guards' drop counters.
# IP_FAMILY=dual (default ipv4): kind's dual-stack cluster, IPv4 first: the IPv6 pod and
# Service ranges of hack/kind-lib.sh beside the IPv4 ones, and per node the CNI's second
# host-local range (the node's IPv6 podCIDR), IPv6 routes to the other nodes' IPv6 podCIDRs,
# IPv6 forwarding, masquerade, and the IPv6 pod range let through the egress guard.
set -euo pipefail
. "$(dirname "$0")/kind-lib.sh"
# The whole script is read before it runs (a function called on the last line): a checkout
# that changes this file while a cluster comes up cannot make bash run half of each version.
# Every agent pod of the DaemonSet has finished a first sync, within $1 seconds.
agents_synced() {
  local deadline=$((SECONDS + $1)) pod port waiting
  while :; do
    waiting=()
    for pod in $(kc -n "$NS" get pod -l app.kubernetes.io/name=kproxy-ebpf -o name); do
      port=$(kc -n "$NS" get "$pod" -o jsonpath='{.spec.containers[0].ports[?(@.name=="healthz")].containerPort}')
      kc -n "$NS" exec "$pod" -- /opt/kproxy-ebpf/venv/bin/python -c '
import json, sys, urllib.request
body = json.load(urllib.request.urlopen(f"http://127.0.0.1:{sys.argv[1]}/healthz", timeout=3))
sys.exit(0 if "status" in body else 1)' "$port" >/dev/null 2>&1 || waiting+=("${pod#pod/}")
    done
    (( ${#waiting[@]} == 0 )) && return 0
    (( SECONDS < deadline )) || die "agents without a first sync after $1 s: ${waiting[*]}"
    sleep 2
  done
}

main() {
PROXY=${PROXY:-kproxy}
WORKERS=${WORKERS:-1}
IMAGE=${IMAGE:-localhost/kproxy-ebpf:$(sed -n 's/^version = "\(.*\)"/\1/p' pyproject.toml)}
NS=kube-system
case $PROXY in kproxy) mode=none ;; nftables|iptables) mode=$PROXY ;;
  *) die "PROXY=$PROXY: use kproxy, nftables or iptables" ;; esac

# A hybrid or v1 host (cgroup v1 at /sys/fs/cgroup) gives kind nodes v1 only: kubelet 1.36
# refuses v1 unless told, and the agent needs the node's cgroup v2 hierarchy (mounted below).
host_v2=$( [[ -f /sys/fs/cgroup/cgroup.controllers ]] && echo yes || echo no )
NODE_CGROUP2=/run/kproxy-cgroup2
# The agent's hostPaths.cgroupRoot: the chart's default where the node has cgroup v2.
cgroup_args=()
[[ $host_v2 == no ]] && cgroup_args=(--set "hostPaths.cgroupRoot=$NODE_CGROUP2")

node_image=()
if [[ $KIND_IMAGES == local ]]; then
  node_image=(--image "$(tools/kind/images.sh node | tail -1)")
  if ! podman network exists "$KIND_NET"; then
    log "network $KIND_NET"
    # As kind makes its own: a bridge, IPv4 from podman's pool and an IPv6 ULA subnet.
    podman network create -d bridge --ipv6 --subnet fc00:f853:ccd:e7a5::/64 "$KIND_NET" >/dev/null
  fi
  write_containers_conf
  host_guard_up "$(kind_bridge)"
fi

cfg=$(mktemp --suffix=.yaml); trap 'rm -f "$cfg"' EXIT
{
  cat <<YAML
kind: Cluster
apiVersion: kind.x-k8s.io/v1alpha4
networking:
  kubeProxyMode: $mode
YAML
  if [[ $IP_FAMILY == dual ]]; then
    printf '  ipFamily: dual\n  podSubnet: "%s,%s"\n  serviceSubnet: "%s,%s"\n' \
      "$POD_SUBNET" "$POD_SUBNET6" "$SERVICE_SUBNET" "$SERVICE_SUBNET6"
  else
    printf '  podSubnet: %s\n  serviceSubnet: %s\n' "$POD_SUBNET" "$SERVICE_SUBNET"
  fi
  [[ $KIND_IMAGES == local ]] && echo "  disableDefaultCNI: true"
  if [[ $host_v2 == no ]]; then cat <<'YAML'
kubeadmConfigPatches:
  - |
    kind: KubeletConfiguration
    failCgroupV1: false
YAML
  fi
  echo "nodes:"
  echo "  - role: control-plane"
  for _ in $(seq "$WORKERS"); do echo "  - role: worker"; done
} > "$cfg"
if kind get clusters 2>/dev/null | grep -qx "$CLUSTER"; then
  log "cluster $CLUSTER exists: reusing it"
else
  log "creating cluster $CLUSTER (proxy: $PROXY, $((WORKERS + 1)) nodes, $IP_FAMILY, images: $KIND_IMAGES)"
  kind create cluster --name "$CLUSTER" "${node_image[@]}" --config "$cfg" --wait 0s
fi
mapfile -t NODES < <(nodes)

if [[ $KIND_IMAGES == local ]]; then
  # Before CoreDNS first starts (its pods wait for the CNI below): answer the cluster's zones
  # and podman's search domain, forward nothing.
  kc -n kube-system create configmap coredns --from-file=Corefile=tools/kind/Corefile \
     --dry-run=client -o yaml | kc replace -f - >/dev/null
  # The node's resolver is podman's name server only (its upstream is the host's resolver).
  dns=$(podman network inspect "$KIND_NET" --format '{{range .Subnets}}{{.Gateway}} {{end}}' | awk '{print $1}')
  # Each node's podCIDR and InternalIP per family (IPv6: cidr6, ip6; empty in an IPv4 cluster).
  declare -A cidr ip cidr6 ip6
  for n in "${NODES[@]}"; do
    cidr[$n]="" ip[$n]="" cidr6[$n]="" ip6[$n]=""
    for a in $(kc get node "$n" -o jsonpath='{.spec.podCIDRs[*]}'); do
      if [[ $a == *:* ]]; then cidr6[$n]=$a; else cidr[$n]=$a; fi
    done
    for a in $(kc get node "$n" -o jsonpath='{.status.addresses[?(@.type=="InternalIP")].address}'); do
      if [[ $a == *:* ]]; then ip6[$n]=$a; else ip[$n]=$a; fi
    done
    [[ -n ${cidr[$n]} && -n ${ip[$n]} ]] || die "node $n has no podCIDR or InternalIP yet"
    [[ $IP_FAMILY == ipv4 || ( -n ${cidr6[$n]} && -n ${ip6[$n]} ) ]] ||
      die "node $n has no IPv6 podCIDR or InternalIP (podCIDRs: ${cidr[$n]} ${cidr6[$n]}, InternalIPs: ${ip[$n]} ${ip6[$n]})"
  done
  for n in "${NODES[@]}"; do
    in_node "$n" iptables -w -nL KPROXY-EGRESS >/dev/null || die "node $n has no egress guard (tools/kind/node/egress-guard.sh)"
    in_node "$n" sh -c "printf 'search dns.podman\nnameserver $dns\noptions ndots:1\n' > /etc/resolv.conf"
    in_node "$n" sh -euc '
      mountpoint -q /sys/fs/bpf || mount -t bpf bpf /sys/fs/bpf
      if [ ! -f /sys/fs/cgroup/cgroup.controllers ]; then
        # No cgroup v2 in the node (a hybrid or v1 host): mount the node cgroup namespace'"'"'s
        # own cgroup2 tree, outside /sys/fs/cgroup so that runc and the kubelet keep seeing
        # the layout they started with.
        mkdir -p '"$NODE_CGROUP2"'
        mountpoint -q '"$NODE_CGROUP2"' || mount -t cgroup2 cgroup2 '"$NODE_CGROUP2"'
      fi'
    peers=""
    for m in "${NODES[@]}"; do
      [[ $m == "$n" ]] && continue
      peers+="ip route replace ${cidr[$m]} via ${ip[$m]}; "
      [[ $IP_FAMILY == dual ]] && peers+="ip -6 route replace ${cidr6[$m]} via ${ip6[$m]}; "
    done
    in_node "$n" sh -euc "$peers
      iptables -w -t nat -C POSTROUTING -s $POD_SUBNET ! -d $POD_SUBNET -o eth0 -j MASQUERADE 2>/dev/null ||
        iptables -w -t nat -A POSTROUTING -s $POD_SUBNET ! -d $POD_SUBNET -o eth0 -j MASQUERADE"
    conf=(.)
    if [[ $IP_FAMILY == dual ]]; then
      # The guard reads the IPv6 pod range from its defaults (also at the node's next boot);
      # it runs again here, before this node has its CNI config, so before any pod of it.
      in_node "$n" sh -euc "
        sysctl -qw net.ipv6.conf.all.forwarding=1
        echo POD_CIDR6=$POD_SUBNET6 > /etc/default/kproxy-egress-guard
        /usr/local/bin/kproxy-egress-guard >/dev/null
        ip6tables -w -t nat -C POSTROUTING -s $POD_SUBNET6 ! -d $POD_SUBNET6 -o eth0 -j MASQUERADE 2>/dev/null ||
          ip6tables -w -t nat -A POSTROUTING -s $POD_SUBNET6 ! -d $POD_SUBNET6 -o eth0 -j MASQUERADE"
      # The CNI's second range: the node's IPv6 podCIDR, and the pods' IPv6 default route.
      conf=(--arg c6 "${cidr6[$n]}" '.plugins[0].ipam |= (.ranges += [[{subnet: $c6}]] | .routes += [{dst: "::/0"}])')
    fi
    sed "s#@POD_CIDR@#${cidr[$n]}#" tools/kind/cni.conflist |
      in_node "$n" sh -c 'jq "$@" > /etc/cni/net.d/10-kproxy-ptp.conflist' jq "${conf[@]}"
  done
fi
kc taint nodes "$CLUSTER-control-plane" node-role.kubernetes.io/control-plane:NoSchedule- >/dev/null 2>&1 || true
kc wait --for=condition=Ready node --all --timeout=180s >/dev/null

if [[ $PROXY == kproxy ]]; then
  # The image's own build reaches the package registries (pip, apt) through the host's
  # resolver: podman's config for the kind network, which names no upstream, is not for it.
  env -u CONTAINERS_CONF make -s image IMAGE="$IMAGE" >/dev/null
  archive=$(mktemp --suffix=.tar); trap 'rm -f "$cfg" "$archive"' EXIT
  if [[ $KIND_PROVIDER == podman ]]; then
    podman save -q -o "$archive" "$IMAGE"
  else
    # `make image` builds with podman; Docker's kind loads from Docker's store.
    podman save "$IMAGE" | docker load >/dev/null; docker save -o "$archive" "$IMAGE"
  fi
  kind load image-archive "$archive" --name "$CLUSTER" >/dev/null
  # The API server as the nodes reach it: the control-plane container's name resolves on the
  # kind network and is in the API server's certificate.
  helm upgrade --install kproxy-ebpf charts/kproxy-ebpf --kube-context "$CTX" --namespace "$NS" \
    --set image.repository="${IMAGE%:*}" --set image.tag="${IMAGE##*:}" \
    --set image.pullPolicy=Never \
    --set apiServer.host="$CLUSTER-control-plane" --set apiServer.port=6443 \
    "${cgroup_args[@]}" ${KPROXY_HELM_ARGS:-} >/dev/null
  kc -n "$NS" rollout status daemonset/kproxy-ebpf --timeout=180s
  # Ready is not synced: /healthz (kube-proxy's semantics, the readiness probe) answers 200
  # from the moment the agent sees its Node until 2 x syncPeriod passes without a sync, and a
  # fresh node's hooks attach only after the first sync. The helm test pod below may land on
  # any node: wait until every agent has synced once (its /healthz body then has "status").
  agents_synced 120
fi

# With Services working, the cluster's add-ons become ready.
kc -n kube-system wait --for=condition=Ready pod -l k8s-app=kube-dns --timeout=180s >/dev/null
if [[ $PROXY == kproxy ]]; then
  # ClusterIP: the chart's test pod reaches the API server through the `kubernetes` Service.
  # Not --logs: the hook policy deletes a passing test pod before helm reads its logs, and
  # helm then fails a passing test. A failing pod is kept, and its log is printed here.
  if ! helm test kproxy-ebpf --kube-context "$CTX" --namespace "$NS" --timeout 120s; then
    kc -n "$NS" logs kproxy-ebpf-test-clusterip >&2 || true
    die "helm test failed"
  fi
fi
hack/kind-check.sh
log "cluster $CLUSTER is up with ${PROXY/kproxy/kproxy-ebpf} (kubectl --context $CTX)"
}
main "$@"
exit
