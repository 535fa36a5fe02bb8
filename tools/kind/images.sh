#!/usr/bin/env bash
# The kind path's images, made here from Debian's packages and tools/k8s/build.sh's binaries
# (kind's `build node-image` needs a registry and the docker CLI). podman's layer cache makes
# a second run take seconds.
#   images.sh node   the node image: kind's boot files, Debian's containerd/runc/CNI plugins,
#                    kubelet/kubeadm/kubectl, the egress guard, and kube-apiserver,
#                    kube-controller-manager, kube-scheduler, kube-proxy, etcd, CoreDNS and pause
#                    preloaded into containerd under the names kubeadm asks for. Prints its name.
#   images.sh e2e    the e2e suite's test images under the names tools/kind/e2e-repo-list.yaml
#                    gives them, and the runner image (e2e.test, ginkgo, kubectl). Prints the
#                    test images' names, then the runner's on the last line.
set -euo pipefail
cd "$(dirname "$0")/../.."
. tools/k8s/versions.env
WHAT=${1:?usage: images.sh node|e2e}
PODMAN=(podman --runtime runc)
NOFILE=$(ulimit -Hn)
# podman's default nproc (4194304), and even this host's hard limit, fail with EPERM here.
NPROC=32768
REPO=localhost/kproxy-kind
log() { echo "tools/kind: [+${SECONDS}s] $*" >&2; }  # steps with the time since the start

BIN=$(tools/k8s/build.sh kind | tail -1)
BASE=$(tools/image/base.sh)
TRIXIE=""
export GOMODCACHE=${GOMODCACHE:-${KPROXY_CACHE:-/var/cache/kproxy-ebpf}/go/mod} GOTOOLCHAIN=local
moddir() { (cd / && go mod download -json "$1") | python3 -c 'import json,sys; print(json.load(sys.stdin)["Dir"])'; }
KUBE_SRC=$(moddir "k8s.io/kubernetes@$K8S_VERSION")
# A Go string constant of kubeadm's (PauseVersion, DefaultEtcdVersion, ...).
kubeadm_const() { sed -n "s/^[[:space:]]*$1 = \"\\(.*\\)\"/\\1/p" "$KUBE_SRC/cmd/kubeadm/app/constants/constants.go"; }

ctx=$(mktemp -d /var/tmp/kproxy-kind-images.XXXXXX)
cid=""
cleanup() { [[ -n $cid ]] && "${PODMAN[@]}" rm -f "$cid" >/dev/null 2>&1; rm -rf "$ctx"; }
trap cleanup EXIT
mkdir -p "$ctx/bin" "$ctx/files"
# Hard links where the cache and the context share a file system; copies otherwise.
cp -lL "$BIN"/* "$ctx/bin/" 2>/dev/null || cp -L "$BIN"/* "$ctx/bin/"

build() {  # TARGET TAG [CONTAINERFILE]
  log "image $2"
  "${PODMAN[@]}" build --quiet --network host --pull=never --ulimit "nofile=$NOFILE:$NOFILE" \
      --build-arg "BASE_IMAGE=$BASE" --build-arg "KUBE_VERSION=$K8S_VERSION" \
      ${TRIXIE:+--build-arg "TRIXIE_IMAGE=$TRIXIE"} \
      ${1:+--target "$1"} -t "$2" -f "${3:-tools/kind/images/Containerfile}" "$ctx" >/dev/null
}

node_image() {
  local pause etcd
  pause=$(kubeadm_const PauseVersion); etcd=$(kubeadm_const DefaultEtcdVersion)
  # local name -> the name kubeadm (and containerd's sandbox_image) asks for
  local -A want=(
    [$REPO/kube-apiserver:$K8S_VERSION]=registry.k8s.io/kube-apiserver:$K8S_VERSION
    [$REPO/kube-controller-manager:$K8S_VERSION]=registry.k8s.io/kube-controller-manager:$K8S_VERSION
    [$REPO/kube-scheduler:$K8S_VERSION]=registry.k8s.io/kube-scheduler:$K8S_VERSION
    [$REPO/kube-proxy:$K8S_VERSION]=registry.k8s.io/kube-proxy:$K8S_VERSION
    [$REPO/etcd:$ETCD_VERSION]=registry.k8s.io/etcd:$etcd
    [$REPO/coredns:$COREDNS_VERSION]=registry.k8s.io/coredns/coredns:$COREDNS_VERSION
    [$REPO/pause:$pause]=registry.k8s.io/pause:$pause
  )
  local img target
  for img in "${!want[@]}"; do
    target=${img#"$REPO"/}; build "${target%%:*}" "$img"
  done
  # The node's own files: kind's boot files from its module, ours, the kubelet and friends.
  local kind_src
  kind_src=$(moddir "sigs.k8s.io/kind@$KIND_VERSION")/images/base/files
  cp -a "$kind_src" "$ctx/kind"; chmod -R u+w "$ctx/kind"
  cp tools/kind/node/* "$ctx/"
  sed -i "s/@PAUSE_VERSION@/$pause/" "$ctx/containerd.toml"
  build "" "$REPO/node-base:$K8S_VERSION" "$ctx/Containerfile"

  # The node image's tag names everything preloaded into it: a changed binary is a new node.
  local ids hash node
  ids=$("${PODMAN[@]}" image inspect --format '{{.Id}}' "$REPO/node-base:$K8S_VERSION" "${!want[@]}" | sort)
  hash=$(sha256sum <<<"$ids" | cut -c1-12)
  node=$REPO/node:$K8S_VERSION-$hash
  if ! "${PODMAN[@]}" image exists "$node"; then
    log "node $node: preloading ${#want[@]} images into containerd"
    "${PODMAN[@]}" save -q -m -o "$ctx/components.tar" "${!want[@]}"
    # containerd alone (not the node's systemd), as kind's own node-image build does; the
    # images are imported unpacked-on-demand (CRI unpacks when it first creates a container).
    cid=$("${PODMAN[@]}" run -d --privileged --ulimit "nofile=$NOFILE:$NOFILE" --ulimit "nproc=$NPROC:$NPROC" \
          -v "$ctx/components.tar:/components.tar:ro" --entrypoint /bin/bash \
          "$REPO/node-base:$K8S_VERSION" -c 'containerd >/tmp/containerd.log 2>&1 & wait')
    "${PODMAN[@]}" exec "$cid" bash -euc '
      for i in $(seq 50); do [[ -S /run/containerd/containerd.sock ]] && break; sleep 0.2; done
      ctr version >/dev/null
      ctr -n k8s.io images import --label=io.cri-containerd.pinned=pinned --all-platforms \
          --no-unpack --digests /components.tar >/dev/null'
    for img in "${!want[@]}"; do
      "${PODMAN[@]}" exec "$cid" ctr -n k8s.io images tag --force "$img" "${want[$img]}" >/dev/null
      "${PODMAN[@]}" exec "$cid" ctr -n k8s.io images rm "$img" >/dev/null
    done
    "${PODMAN[@]}" exec "$cid" rm -f /tmp/containerd.log
    # The container ends with containerd (its shell waits for it), cleanly shut down.
    "${PODMAN[@]}" exec "$cid" pkill -x containerd
    "${PODMAN[@]}" wait "$cid" >/dev/null
    "${PODMAN[@]}" commit -q --change 'ENTRYPOINT ["/usr/local/bin/entrypoint", "/sbin/init"]' \
        --change 'CMD []' "$cid" "$node" >/dev/null
    "${PODMAN[@]}" rm -f "$cid" >/dev/null; cid=""
    # Older nodes of this project are dead weight in the store.
    "${PODMAN[@]}" images --format '{{.Repository}}:{{.Tag}}' | grep "^$REPO/node:" | grep -vx "$node" \
      | xargs -r "${PODMAN[@]}" rmi >/dev/null 2>&1 || true
  fi
  echo "$node"
}

# e2e images: upstream's image ID -> our stage. The tags come from the suite's own manifest, so
# they follow K8S_VERSION.
e2e_images() {
  TRIXIE=$(SUITE=trixie tools/image/base.sh)
  local manifest=$KUBE_SRC/test/utils/image/manifest.go
  local -A stage=([Agnhost]=agnhost [AgnhostPrev]=agnhost [BusyBox]=busybox [Nginx]=nginx
                  [NginxNew]=nginx [GlibcDnsTesting]=glibc-dns-testing
                  [RegressionIssue74839]=regression-issue-74839 [Pause]=pause
                  [DistrolessIptables]=distroless-iptables)
  local -A registry
  while read -r key value; do registry[$key]=$value; done < <(
    sed -n 's/^\([A-Za-z0-9]*\): \(.*\)$/\1 \2/p' tools/kind/e2e-repo-list.yaml)
  mkdir -p "$ctx/files/porter"
  cp "$KUBE_SRC/test/images/agnhost/porter/localhost.crt" "$KUBE_SRC/test/images/agnhost/porter/localhost.key" "$ctx/files/porter/"
  local id line reg name tag key names=()
  for id in "${!stage[@]}"; do
    line=$(sed -n "s/^[[:space:]]*configs\\[$id\\] = Config{list\\.\\([A-Za-z0-9]*\\), \"\\([^\"]*\\)\", \"\\([^\"]*\\)\"}.*/\\1 \\2 \\3/p" "$manifest")
    read -r reg name tag <<<"$line"
    [[ -n $tag ]] || { log "image $id not found in $manifest"; exit 1; }
    key=${reg,}                       # PromoterE2eRegistry -> promoterE2eRegistry
    [[ -n ${registry[$key]:-} ]] || { log "no $key in tools/kind/e2e-repo-list.yaml"; exit 1; }
    build "${stage[$id]}" "${registry[$key]}/$name:$tag"
    names+=("${registry[$key]}/$name:$tag")
  done
  build e2e-runner "$REPO/e2e-runner:$K8S_VERSION"
  printf '%s\n' "${names[@]}" "$REPO/e2e-runner:$K8S_VERSION"
}

case $WHAT in
  node) node_image ;;
  e2e)  e2e_images ;;
  *) echo "usage: images.sh node|e2e" >&2; exit 2 ;;
esac
