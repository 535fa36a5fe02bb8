#!/usr/bin/env bash
# The checks `make kind-up` ends with, on a running cluster (CLUSTER, PROXY as for kind-up):
#   - a pod resolves a Service by name through CoreDNS and gets its ClusterIP, which answers;
#     the same pod reaches the API server by the `kubernetes` Service's name;
#   - the Service's NodePort answers on every node from a client container on the kind
#     network: outside every node, never from the host's own network namespace;
#   - the egress guards' drop counters (every node's and the host side's), printed;
#   - IP_FAMILY=dual: the Service is dual-stack, the pod also resolves its IPv6 ClusterIP
#     (AAAA) and gets an answer there, and the NodePort answers from outside on every node's
#     IPv6 InternalIP too.
# Leaves nothing behind (the check's namespace is deleted).
set -euo pipefail
. "$(dirname "$0")/kind-lib.sh"
# The whole script is read before it runs (a function called on the last line): a checkout
# that changes this file while a cluster comes up cannot make bash run half of each version.
main() {
IMAGE=${IMAGE:-localhost/kproxy-ebpf:$(sed -n 's/^version = "\(.*\)"/\1/p' pyproject.toml)}
NS=kproxy-check
PY=/opt/kproxy-ebpf/venv/bin/python
NODEPORT=30080
net=$([[ $KIND_PROVIDER == podman ]] && echo "$KIND_NET" || echo kind)
trap 'kc delete namespace "$NS" --wait=false >/dev/null 2>&1 || true' EXIT

# The agent image carries Python: the echo server and the clients need nothing else.
if ! in_node "$CLUSTER-control-plane" ctr -n k8s.io images ls -q | grep -qx "$IMAGE"; then
  archive=$(mktemp --suffix=.tar)
  podman save -q -o "$archive" "$IMAGE" && kind load image-archive "$archive" --name "$CLUSTER" >/dev/null
  rm -f "$archive"
fi
kc create namespace "$NS" >/dev/null 2>&1 || true
# On a dual-stack cluster the server listens on both families (`::`, not IPv6-only).
bind=(); [[ $IP_FAMILY == dual ]] && bind=(--bind ::)
kc -n "$NS" create deployment echo --image="$IMAGE" --replicas=2 --port=8080 \
   -- "$PY" -m http.server 8080 --directory /opt/kproxy-ebpf "${bind[@]}" >/dev/null
kc -n "$NS" patch deployment echo --type=json \
   -p '[{"op":"add","path":"/spec/template/spec/containers/0/imagePullPolicy","value":"Never"}]' >/dev/null
kc -n "$NS" create service nodeport echo --tcp=80:8080 --node-port=$NODEPORT >/dev/null
if [[ $IP_FAMILY == dual ]]; then
  kc -n "$NS" patch service echo -p '{"spec":{"ipFamilyPolicy":"RequireDualStack"}}' >/dev/null
fi
kc -n "$NS" rollout status deployment/echo --timeout=120s >/dev/null
cip=$(kc -n "$NS" get service echo -o jsonpath='{.spec.clusterIP}')
cip6=""
if [[ $IP_FAMILY == dual ]]; then
  cip6=$(kc -n "$NS" get service echo -o jsonpath='{.spec.clusterIPs[*]}' | tr ' ' '\n' | grep -m1 : ||
         die "the dual-stack Service has no IPv6 ClusterIP")
fi

# From a pod: DNS through CoreDNS's ClusterIP, then the ClusterIP itself, then the API server.
kc -n "$NS" run dns --image="$IMAGE" --image-pull-policy=Never --restart=Never --command -- \
  "$PY" -c "
import socket, ssl, sys, time, urllib.request
name = 'echo.$NS.svc.cluster.local'
for attempt in range(30):
    try:
        addr = socket.gethostbyname(name)
        with urllib.request.urlopen(f'http://{name}/', timeout=3) as r:
            print(f'{name} -> {addr}: HTTP {r.status}')
        if '$cip6':
            addr6 = socket.getaddrinfo(name, 80, socket.AF_INET6)[0][4][0]
            with urllib.request.urlopen(f'http://[{addr6}]/', timeout=3) as r:
                print(f'{name} -> {addr6}: HTTP {r.status}')
            if addr6 != '$cip6':
                sys.exit(2)
        ctx = ssl.create_default_context(); ctx.check_hostname = False; ctx.verify_mode = ssl.CERT_NONE
        with urllib.request.urlopen('https://kubernetes.default.svc/version', timeout=3, context=ctx) as r:
            print(f'kubernetes.default.svc: HTTP {r.status}')
        sys.exit(0 if addr == '$cip' else 2)
    except OSError as e:
        print(f'attempt {attempt + 1}: {e}', flush=True); time.sleep(1)
sys.exit(1)
" >/dev/null
kc -n "$NS" wait --for=jsonpath='{.status.phase}'=Succeeded pod/dns --timeout=90s >/dev/null || {
  kc -n "$NS" logs dns >&2 || true; die "ClusterIP by name through CoreDNS failed"; }
log "ClusterIP: $(kc -n "$NS" logs dns | tr '\n' ';')"

# From outside the nodes: a container on the kind network, to each node's address (both
# families' on a dual-stack cluster).
for n in $(nodes); do
  addrs=$(kc get node "$n" -o jsonpath='{.status.addresses[?(@.type=="InternalIP")].address}' | tr ' ' '\n')
  hosts=$(grep -vm1 : <<<"$addrs")
  if [[ $IP_FAMILY == dual ]]; then
    hosts+=" [$(grep -m1 : <<<"$addrs" || die "node $n has no IPv6 InternalIP")]"
  fi
  for host in $hosts; do
    "${ENGINE[@]}" run --rm --network "$net" --pull=never --entrypoint "$PY" "$IMAGE" -c "
import sys, time, urllib.request
for attempt in range(20):
    try:
        with urllib.request.urlopen('http://$host:$NODEPORT/', timeout=3) as r:
            sys.exit(0 if r.status == 200 else 1)
    except OSError as e:
        print(f'attempt {attempt + 1}: {e}', file=sys.stderr, flush=True); time.sleep(1)
sys.exit(1)
" || die "NodePort $host:$NODEPORT ($n) does not answer from outside the nodes"
    log "NodePort: $host:$NODEPORT ($n) answers from a container on the kind network"
  done
done

if [[ $KIND_IMAGES == local ]]; then log "egress guard drops (packets): $(hack/kind-guard.sh)"; fi
}
main "$@"
exit
