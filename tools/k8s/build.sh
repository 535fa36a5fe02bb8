#!/usr/bin/env bash
# Builds kube-apiserver, kube-controller-manager, kube-proxy, kubectl, etcd and helm from the Go
# module proxy (no GitHub, no images) into a versioned cache directory outside the repository,
# so CI on the same machine reuses them. Prints the bin directory on its last line.
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
log() { echo "tools/k8s: $*" >&2; }
have() { for b; do [[ -x $OUT/$b ]] || return 1; done; }
# go mod download -json prints a JSON object; read one field with python (always present here).
field() { python3 -c 'import json,sys; d=json.load(sys.stdin); print(d.get(sys.argv[1]) or (d.get("Origin") or {}).get(sys.argv[1]) or "")' "$1"; }

build_kube() {
  local minor=${K8S_VERSION#v1.}; minor=${minor%%.*}
  local staging=v0.${K8S_VERSION#v1.}
  local dl gomod commit godebug d
  dl=$(cd / && go mod download -json "k8s.io/kubernetes@$K8S_VERSION")
  gomod=$(field GoMod <<<"$dl"); commit=$(field Hash <<<"$dl")
  # Derive the staging list from the exact upstream go.mod: a missing replace breaks the build.
  mapfile -t mods < <(sed -n 's#^[[:space:]]*\(k8s\.io/[A-Za-z0-9._-]*\)[[:space:]]*=>[[:space:]]*\./staging/.*#\1#p' "$gomod")
  (( ${#mods[@]} > 20 )) || { log "could not parse the staging list from $gomod"; exit 1; }
  # godebug only applies in the main module: copy upstream's so binaries keep its GODEBUG defaults.
  godebug=$(sed -n 's/^godebug[[:space:]]\{1,\}default=\(go1\.[0-9]\{1,\}\).*/\1/p' "$gomod")
  d=$WORK/k8s-$K8S_VERSION; rm -rf "$d"; mkdir -p "$d"; cd "$d"
  { printf 'module example.invalid/k8sbin\n\ngo 1.26.0\n\n'
    [[ -n $godebug ]] && printf 'godebug default=%s\n\n' "$godebug"
    printf 'replace (\n'
    for m in "${mods[@]}"; do printf '\t%s => %s %s\n' "$m" "$m" "$staging"; done
    printf ')\n'
  } > go.mod
  local cmds=(kube-apiserver kube-controller-manager kube-proxy kubectl)
  cmds=("${cmds[@]/#/k8s.io/kubernetes/cmd/}")
  log "resolving k8s.io/kubernetes@$K8S_VERSION (${#mods[@]} staging modules at $staging)"
  go get -tool "${cmds[@]/%/@$K8S_VERSION}"
  local ld=(-s -w) now p
  now=$(date -u +%Y-%m-%dT%H:%M:%SZ)
  # Stamp the release so /version reports it (helm reads .Capabilities.KubeVersion from there).
  for p in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
    ld+=(-X "$p.gitVersion=$K8S_VERSION" -X "$p.gitMajor=1" -X "$p.gitMinor=$minor"
         -X "$p.gitTreeState=clean" -X "$p.buildDate=$now")
    [[ -n $commit ]] && ld+=(-X "$p.gitCommit=$commit")
  done
  log "building ${cmds[*]##*/} (a cold build takes 15-30 minutes on 2 cores)"
  go build -tags=selinux,notest -ldflags="${ld[*]}" -o "$OUT/" "${cmds[@]}"
}

build_etcd() {
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
have kube-apiserver kube-controller-manager kube-proxy kubectl || build_kube
"$OUT/kube-apiserver" --version >&2
# Not `| head -1`: under pipefail, etcd's SIGPIPE when head exits early fails the script (141).
"$OUT/etcd" --version | sed -n 1p >&2
"$OUT/helm" version --short >&2
echo "$OUT"
