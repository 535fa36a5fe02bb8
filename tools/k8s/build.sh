#!/usr/bin/env bash
# Builds Kubernetes binaries from the Go module proxy (no GitHub, no images) into a versioned
# cache directory outside the repository, so CI on the same machine reuses them. Prints the bin
# directory on its last line.
#   build.sh        the lab's control plane: kube-apiserver, kube-controller-manager, kube-proxy,
#                   kubectl, etcd, helm
#   build.sh kind   also what a kind node and Kubernetes' e2e suite need: kubelet, kubeadm,
#                   kube-scheduler, pause, CoreDNS, kind, agnhost, regression-issue-74839,
#                   e2e.test and ginkgo (a cold build adds 20-30 minutes on 2 cores)
#
# Why a wrapper module: k8s.io/kubernetes requires its staging modules at v0.0.0 and redirects
# them with replace directives, which only count in the main module; `go install ...@v` cannot
# work. The wrapper replaces each staging module with its published v0.<minor>.<patch>.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=versions.env
. "$here/versions.env"
CACHE=${KPROXY_CACHE:-/var/cache/kproxy-ebpf}
OUT=$CACHE/k8s/k8s-$K8S_VERSION-etcd-$ETCD_VERSION-helm-$HELM_VERSION/bin
WORK=$CACHE/k8s/work
export GOTOOLCHAIN=local CGO_ENABLED=0 GOFLAGS=-trimpath
export GOMODCACHE=${GOMODCACHE:-$CACHE/go/mod} GOCACHE=${GOCACHE:-$CACHE/go/build}
mkdir -p "$OUT" "$WORK"
# Two builds at once (CI and a developer on one machine) would clobber the work directory.
exec 9>"$CACHE/k8s/.build.lock"
flock 9
SET=${1:-lab}
[[ $SET == lab || $SET == kind ]] || { echo "usage: build.sh [kind]" >&2; exit 2; }
log() { echo "tools/k8s: [+${SECONDS}s] $*" >&2; }  # steps with the time since the start
have() { for b; do [[ -x $OUT/$b ]] || return 1; done; }
# go mod download -json prints a JSON object; read one field with python (always present here).
field() { python3 -c 'import json,sys; d=json.load(sys.stdin); print(d.get(sys.argv[1]) or (d.get("Origin") or {}).get(sys.argv[1]) or "")' "$1"; }

# The wrapper module for k8s.io/kubernetes, made once per run; LD holds the version stamps.
KUBE_MOD=""
LD=()
kube_module() {
  [[ -n $KUBE_MOD ]] && return
  local minor=${K8S_VERSION#v1.}; minor=${minor%%.*}
  local staging=v0.${K8S_VERSION#v1.}
  local dl gomod commit godebug now p
  dl=$(cd / && go mod download -json "k8s.io/kubernetes@$K8S_VERSION")
  gomod=$(field GoMod <<<"$dl"); commit=$(field Hash <<<"$dl")
  KUBE_SRC=$(field Dir <<<"$dl")
  # Derive the staging list from the exact upstream go.mod: a missing replace breaks the build.
  mapfile -t mods < <(sed -n 's#^[[:space:]]*\(k8s\.io/[A-Za-z0-9._-]*\)[[:space:]]*=>[[:space:]]*\./staging/.*#\1#p' "$gomod")
  (( ${#mods[@]} > 20 )) || { log "could not parse the staging list from $gomod"; exit 1; }
  # godebug only applies in the main module: copy upstream's so binaries keep its GODEBUG defaults.
  godebug=$(sed -n 's/^godebug[[:space:]]\{1,\}default=\(go1\.[0-9]\{1,\}\).*/\1/p' "$gomod")
  KUBE_MOD=$WORK/k8s-$K8S_VERSION; rm -rf "$KUBE_MOD"; mkdir -p "$KUBE_MOD"
  { printf 'module example.invalid/k8sbin\n\ngo 1.26.0\n\n'
    [[ -n $godebug ]] && printf 'godebug default=%s\n\n' "$godebug"
    printf 'replace (\n'
    for m in "${mods[@]}"; do printf '\t%s => %s %s\n' "$m" "$m" "$staging"; done
    printf ')\n'
  } > "$KUBE_MOD/go.mod"
  log "resolving k8s.io/kubernetes@$K8S_VERSION (${#mods[@]} staging modules at $staging)"
  LD=(-s -w); now=$(date -u +%Y-%m-%dT%H:%M:%SZ)
  # Stamp the release so /version reports it (helm reads .Capabilities.KubeVersion from there).
  for p in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
    LD+=(-X "$p.gitVersion=$K8S_VERSION" -X "$p.gitMajor=1" -X "$p.gitMinor=$minor"
         -X "$p.gitTreeState=clean" -X "$p.buildDate=$now")
    if [[ -n $commit ]]; then LD+=(-X "$p.gitCommit=$commit"); fi
  done
}

# build_kube PKG...: packages of k8s.io/kubernetes (cmd/kubelet, test/images/agnhost, ...).
build_kube() {
  kube_module
  local pkgs=("${@/#/k8s.io/kubernetes/}")
  (cd "$KUBE_MOD" && go get -tool "${pkgs[@]/%/@$K8S_VERSION}")
  log "building ${pkgs[*]##*/} (a cold build takes 10-30 minutes on 2 cores)"
  (cd "$KUBE_MOD" && go build -tags=selinux,notest -ldflags="${LD[*]}" -o "$OUT/" "${pkgs[@]}")
}

# Kubernetes' e2e suite as one test binary, and the ginkgo runner of the version it requires.
# -mod=mod: the e2e packages import modules (k8s.io/sample-apiserver, ...) that no tool of the
# wrapper pulled in, so go.sum is completed on the way.
build_e2e() {
  kube_module
  local gv
  gv=$(sed -n 's#^[[:space:]]*github.com/onsi/ginkgo/v2 \(v[0-9.]*\).*#\1#p' "$KUBE_SRC/go.mod" | sed -n 1p)
  log "building e2e.test and ginkgo $gv (about 10 minutes with a warm module cache)"
  (cd "$KUBE_MOD" && go get -tool "k8s.io/kubernetes/test/e2e@$K8S_VERSION" \
                                    "github.com/onsi/ginkgo/v2/ginkgo@$gv" \
      && go build -o "$OUT/" github.com/onsi/ginkgo/v2/ginkgo \
      && go test -c -mod=mod -ldflags="${LD[*]}" -o "$OUT/e2e.test" k8s.io/kubernetes/test/e2e)
}

# The pause container of the version kubeadm asks for: one static C file of the k8s module.
build_pause() {
  kube_module
  local v
  v=$(sed -n 's/^[[:space:]]*PauseVersion = "\(.*\)"/\1/p' "$KUBE_SRC/cmd/kubeadm/app/constants/constants.go")
  log "building pause $v"
  "${CC:-cc}" -Os -static -Wall -DVERSION="$v" -o "$OUT/pause" "$KUBE_SRC/build/pause/linux/pause.c"
  strip "$OUT/pause"
}

# kind and CoreDNS are modules of their own: go install at the pinned version, named with it.
build_go_install() {  # NAME MODULE VERSION
  BUILT=1
  local tmp=$WORK/gobin-$1
  log "building $1 $3"
  rm -rf "$tmp"; (cd / && GOBIN=$tmp go install -ldflags="-s -w" "$2@$3")
  mv "$tmp/$1" "$OUT/$1-$3"; rm -rf "$tmp"; ln -sfn "$1-$3" "$OUT/$1"
}

check_coredns_pin() {
  kube_module
  local want
  want=$(sed -n 's/^[[:space:]]*CoreDNSVersion = "\(.*\)"/\1/p' "$KUBE_SRC/cmd/kubeadm/app/constants/constants.go")
  [[ $want == "$COREDNS_VERSION" ]] || {
    log "COREDNS_VERSION=$COREDNS_VERSION but kubeadm $K8S_VERSION deploys CoreDNS $want: set it in versions.env"; exit 1; }
}

build_etcd() {
  BUILT=1
  local e=$WORK/etcd-$ETCD_VERSION sha
  rm -rf "$e"; mkdir -p "$e"; cd "$e"
  # etcd's server/go.mod has replace directives too, so it also needs a wrapper module.
  printf 'module example.invalid/etcdbin\n\ngo 1.26.0\n' > go.mod
  go get -tool "go.etcd.io/etcd/server/v3@$ETCD_VERSION"
  sha=$(cd / && go mod download -json "go.etcd.io/etcd/server/v3@$ETCD_VERSION" | field Hash)
  log "building etcd $ETCD_VERSION"
  go build -ldflags="-s -w${sha:+ -X go.etcd.io/etcd/api/v3/version.GitSHA=${sha:0:7}}" -o "$OUT/etcd" go.etcd.io/etcd/server/v3
}

build_helm() {
  BUILT=1
  local hgomod hmin
  hgomod=$(cd / && go mod download -json "helm.sh/helm/v3@$HELM_VERSION" | field GoMod)
  hmin=$(sed -n 's#^[[:space:]]*k8s\.io/client-go v0\.\([0-9]\{1,\}\)\..*#\1#p' "$hgomod" | sed -n 1p)
  # The Makefile's ldflags: without them `helm template` assumes Kubernetes 1.20.
  local v=helm.sh/helm/v3
  log "building helm $HELM_VERSION"
  (cd / && GOBIN=$OUT go install -ldflags="-s -w -X $v/internal/version.version=$HELM_VERSION \
    -X $v/internal/version.gitTreeState=clean \
    -X $v/pkg/chartutil.k8sVersionMajor=1 -X $v/pkg/chartutil.k8sVersionMinor=$hmin \
    -X $v/pkg/lint/rules.k8sVersionMajor=1 -X $v/pkg/lint/rules.k8sVersionMinor=$hmin" \
    "$v/cmd/helm@$HELM_VERSION")
}

have etcd || build_etcd
have helm || build_helm
have kube-apiserver kube-controller-manager kube-proxy kubectl ||
  build_kube cmd/kube-apiserver cmd/kube-controller-manager cmd/kube-proxy cmd/kubectl
if [[ $SET == kind ]]; then
  have kubelet kubeadm kube-scheduler || build_kube cmd/kubelet cmd/kubeadm cmd/kube-scheduler
  have agnhost regression-issue-74839 ||
    build_kube test/images/agnhost test/images/regression-issue-74839
  have pause || build_pause
  have "kind-$KIND_VERSION" || build_go_install kind sigs.k8s.io/kind "$KIND_VERSION"
  have "coredns-$COREDNS_VERSION" ||
    { check_coredns_pin; build_go_install coredns github.com/coredns/coredns "$COREDNS_VERSION"; }
  have e2e.test ginkgo || build_e2e
fi
if [[ -n $KUBE_MOD || -n ${BUILT:-} ]]; then
  "$OUT/kube-apiserver" --version >&2
  # Not `| head -1`: under pipefail, etcd's SIGPIPE when head exits early fails the script (141).
  "$OUT/etcd" --version | sed -n 1p >&2
  "$OUT/helm" version --short >&2
fi
echo "$OUT"
