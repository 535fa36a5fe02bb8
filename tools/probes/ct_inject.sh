#!/bin/bash
# Can a TCP connection whose NAT lived outside netfilter (the TC path's kp_ct) be handed to the
# kernel's conntrack with that NAT, so that it survives once kube-proxy's rules are back and the
# TC programs are gone? (docs/migrate.md, "The way back".) Three network namespaces (client,
# node, backend; kproxy-ctx-*; no route out), an echo server on two ports of the backend:
#  1. a stand-in translator (nftables DNAT node:30080 -> backend:8080 + masquerade) carries a
#     connection that sends a line every 100 ms for 6 s;
#  2. after 2 s the translator's rules and its conntrack entry go (its state is lost, as kp_ct's
#     is when the TC programs detach) and "kube-proxy's" rules take their place
#     (node:30080 -> backend:8081, another server: a rebalanced segment is reset);
#  3. VARIANT=inject: at once `conntrack -I` writes the flow with its NAT: the original tuple,
#     the reply tuple as the plain inverse of it (a reply tuple given already translated makes
#     the kernel's NAT setup a no-op: no DNAT/SNAT status bit, measured) and --dst-nat/--src-nat.
# Prints one line per run: OK <messages> or BROKEN <messages> <reason>. (A segment that falls
# between step 2's delete and step 3's insert is rebalanced: the probe's own gap; the agent
# would write the entries before its programs detach.)
# Usage (root): tools/probes/ct_inject.sh none|inject [RUNS]
set -u
V=${1:?none or inject}; RUNS=${2:-1}
C=kproxy-ctx-cli N=kproxy-ctx-node B=kproxy-ctx-be
T=$(mktemp -d)
cleanup() {
  for n in $C $N $B; do ip netns pids $n 2>/dev/null | xargs -r kill 2>/dev/null; done
  sleep 0.2; for n in $C $N $B; do ip netns del $n 2>/dev/null; done; rm -rf "$T"
}
trap cleanup EXIT
cat > "$T/echo.py" <<'PY'
import socket, sys, threading
s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(("0.0.0.0", int(sys.argv[1]))); s.listen()
def serve(c):
    with c:
        c.sendall(sys.argv[2].encode() + b"\n")
        for _ in c.makefile("rb"):
            c.sendall(sys.argv[2].encode() + b"\n")
while True:
    threading.Thread(target=serve, args=(s.accept()[0],), daemon=True).start()
PY
cat > "$T/client.py" <<'PY'
import socket, sys, time
s = socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=2)
f = s.makefile("rb"); first = f.readline().split()[0]; n = 0; end = time.time() + 6
try:
    while time.time() < end:
        s.sendall(b"ping\n"); a = f.readline().split()
        if not a or a[0] != first:
            raise ConnectionError(f"answer {a} instead of {first}")
        n += 1; time.sleep(0.1)
    print("OK", n)
except OSError as e:
    print("BROKEN", n, type(e).__name__)
PY
one_run() {
  for n in $C $N $B; do ip netns add $n; ip -n $n link set lo up; done
  ip link add kpctx-c netns $C type veth peer name kpctx-cn netns $N
  ip link add kpctx-b netns $B type veth peer name kpctx-bn netns $N
  ip -n $C addr add 10.251.0.2/24 dev kpctx-c; ip -n $N addr add 10.251.0.1/24 dev kpctx-cn
  ip -n $N addr add 10.251.1.1/24 dev kpctx-bn; ip -n $B addr add 10.251.1.2/24 dev kpctx-b
  for l in "$C kpctx-c" "$N kpctx-cn" "$N kpctx-bn" "$B kpctx-b"; do set -- $l; ip -n $1 link set $2 up; done
  ip netns exec $N sysctl -qw net.ipv4.ip_forward=1
  ip netns exec $B python3 "$T/echo.py" 8080 be-a & ip netns exec $B python3 "$T/echo.py" 8081 be-b &
  sleep 0.5
  ip netns exec $N nft -f - <<NFT
table ip tr {
 chain pre { type nat hook prerouting priority dstnat; tcp dport 30080 dnat to 10.251.1.2:8080; }
 chain post { type nat hook postrouting priority srcnat; ip daddr 10.251.1.2 masquerade; }
}
NFT
  ip netns exec $C python3 "$T/client.py" 10.251.0.1 30080 > "$T/out" & local cl=$!
  sleep 2
  local line sport nport
  line=$(ip netns exec $N conntrack -L -p tcp --orig-port-dst 30080 2>/dev/null | head -1)
  sport=$(sed -n 's/.*sport=\([0-9]*\) dport=30080.*/\1/p' <<<"$line")
  nport=$(awk '{for(i=1;i<=NF;i++) if($i ~ /^dport=/) d=$i} END{sub("dport=","",d); print d}' <<<"$line")
  ip netns exec $N nft -f - <<NFT
delete table ip tr
table ip kp {
 chain pre { type nat hook prerouting priority dstnat; tcp dport 30080 dnat to 10.251.1.2:8081; }
 chain post { type nat hook postrouting priority srcnat; ip daddr 10.251.1.2 masquerade; }
}
NFT
  ip netns exec $N conntrack -D -p tcp --orig-port-dst 30080 >/dev/null 2>&1
  if [[ $V == inject ]]; then
    ip netns exec $N conntrack -I -p tcp -s 10.251.0.2 -d 10.251.0.1 --sport "$sport" --dport 30080 \
      -r 10.251.0.1 -q 10.251.0.2 --reply-port-src 30080 --reply-port-dst "$sport" \
      --dst-nat 10.251.1.2:8080 --src-nat "10.251.1.1:$nport" \
      --state ESTABLISHED -u SEEN_REPLY,ASSURED -t 300 >/dev/null 2>&1 || echo "conntrack -I failed"
  fi
  wait $cl
  cat "$T/out"
  for n in $C $N $B; do ip netns pids $n | xargs -r kill 2>/dev/null; done; sleep 0.2
  for n in $C $N $B; do ip netns del $n; done
}
for _ in $(seq "$RUNS"); do one_run; done
