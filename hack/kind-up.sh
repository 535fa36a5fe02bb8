#!/usr/bin/env bash
# `make kind-up`: a kind cluster with kube-proxy disabled and kproxy-ebpf installed by its chart.
#   1. kind create cluster (hack/kind-config.yaml: networking.kubeProxyMode none)
#   2. build the image (make image) and `kind load` it into every node
#   3. mount bpffs on each node if missing (pins must outlive the agent container)
#   4. helm install with the API server's own address (the kubernetes Service's ClusterIP does
#      not work before the agent runs), wait for the rollout
#   5. check a ClusterIP (helm test: a pod reaches the API server through `kubernetes`) and a
#      NodePort (a Service of type NodePort on 30080, from a node)
# Needs kind, kubectl, helm and a container engine kind supports (Docker, or podman with
# KIND_EXPERIMENTAL_PROVIDER=podman). Not runnable on the development machine (no Docker
# engine, no registry for kind's node image): see README "Install on kind".
set -euo pipefail
cd "$(dirname "$0")/.."
CLUSTER=${CLUSTER:-kproxy}
IMAGE=${IMAGE:-localhost/kproxy-ebpf:$(sed -n 's/^version = "\(.*\)"/\1/p' pyproject.toml)}
NS=kube-system
for tool in kind kubectl helm; do
  command -v "$tool" >/dev/null || { echo "kind-up: $tool not found on PATH" >&2; exit 1; }
done
engine=${KIND_EXPERIMENTAL_PROVIDER:-docker}

kind create cluster --name "$CLUSTER" --config hack/kind-config.yaml --wait 0s
ctx=kind-$CLUSTER

make image IMAGE="$IMAGE"
if [[ $engine == podman ]]; then
  archive=$(mktemp --suffix=.tar); trap 'rm -f "$archive"' EXIT
  podman save -o "$archive" "$IMAGE"
  kind load image-archive "$archive" --name "$CLUSTER"
else
  # `make image` builds with podman; hand the image to Docker first.
  podman save "$IMAGE" | docker load
  kind load docker-image "$IMAGE" --name "$CLUSTER"
fi

for node in $(kind get nodes --name "$CLUSTER"); do
  "$engine" exec "$node" sh -c \
    'mountpoint -q /sys/fs/bpf || mount -t bpf bpf /sys/fs/bpf'
done

# The API server as the nodes reach it: the control-plane container's name resolves on kind's
# network and is in the API server certificate.
api_host=$CLUSTER-control-plane
helm upgrade --install kproxy-ebpf charts/kproxy-ebpf --kube-context "$ctx" --namespace "$NS" \
  --set image.repository="${IMAGE%:*}" --set image.tag="${IMAGE##*:}" \
  --set image.pullPolicy=Never \
  --set apiServer.host="$api_host" --set apiServer.port=6443
kubectl --context "$ctx" -n "$NS" rollout status daemonset/kproxy-ebpf --timeout=180s

# With services working, the cluster's own add-ons (CoreDNS) become ready.
kubectl --context "$ctx" -n kube-system rollout status deployment/coredns --timeout=180s

# ClusterIP: the chart's helm test pod reaches the API server through the kubernetes Service.
helm test kproxy-ebpf --kube-context "$ctx" --namespace "$NS" --logs

# NodePort: a Service of type NodePort, reached from a node's own network namespace (the
# socket hooks serve processes on the node and in pods). From outside the nodes (the host's
# 127.0.0.1:30080 mapping) it needs the TC datapath: reported, required only with
# KIND_REQUIRE_EXTERNAL_NODEPORT=1.
kubectl --context "$ctx" create deployment kproxy-echo --image="$IMAGE" --replicas=2 \
  -- /opt/kproxy-ebpf/venv/bin/python -m http.server 8080 --directory /opt/kproxy-ebpf
kubectl --context "$ctx" create service nodeport kproxy-echo --tcp=80:8080 --node-port=30080
kubectl --context "$ctx" rollout status deployment/kproxy-echo --timeout=120s
worker=$CLUSTER-worker
node_ip=$(kubectl --context "$ctx" get node "$worker" \
  -o jsonpath='{.status.addresses[?(@.type=="InternalIP")].address}')
"$engine" exec "$worker" curl -fsS --max-time 5 -o /dev/null "http://$node_ip:30080/"
echo "kind-up: NodePort $node_ip:30080 answers from $worker"
if curl -fsS --max-time 5 -o /dev/null http://127.0.0.1:30080/; then
  echo "kind-up: NodePort 127.0.0.1:30080 answers from outside the nodes"
elif [[ ${KIND_REQUIRE_EXTERNAL_NODEPORT:-0} == 1 ]]; then
  echo "kind-up: NodePort 127.0.0.1:30080 does not answer from outside" >&2; exit 1
else
  echo "kind-up: NodePort from outside the nodes needs the TC datapath (not in this version)" >&2
fi
echo "kind-up: cluster $CLUSTER is up with kproxy-ebpf (kubectl --context $ctx)"
