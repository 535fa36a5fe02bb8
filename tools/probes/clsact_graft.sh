#!/bin/bash
# Does creating a clsact qdisc on a device drop what the device sends at that instant? (make
# migrate: failures at the moment an agent first attaches its TC programs beside kube-proxy;
# docs/migrate.md.) Two network namespaces (kproxy-cqg-*; a veth pair, no route out), a UDP echo
# server in one; the other sends 4,000 numbered datagrams (one per 0.2 ms) and counts the
# answers. VARIANT=qdisc: 0.4 s in, `tc qdisc add dev <server side> clsact` (deleted again
# before the next run); VARIANT=none: nothing. Prints per run: <variant> lost <n> of 4000.
# Measured 2026-12-07 (kernel 6.18, 20 runs each): none lost 0 in 20 runs; qdisc lost 1-3 in 8
# of 20 (the device is deactivated while the qdisc is grafted: qdisc_graft -> dev_deactivate).
# Usage (root): tools/probes/clsact_graft.sh none|qdisc [RUNS]
set -u
V=${1:?none or qdisc}; RUNS=${2:-5}
A=kproxy-cqg-cli B=kproxy-cqg-srv
cleanup() {
  for n in $A $B; do ip netns pids $n 2>/dev/null | xargs -r kill 2>/dev/null; done
  sleep 0.2; for n in $A $B; do ip netns del $n 2>/dev/null; done
}
trap cleanup EXIT
ip netns add $A && ip netns add $B || exit 1
ip link add kpcqg0 netns $A type veth peer name kpcqg1 netns $B
ip -n $A addr add 192.0.2.1/24 dev kpcqg0; ip -n $B addr add 192.0.2.2/24 dev kpcqg1
for n in $A $B; do ip -n $n link set lo up; done
ip -n $A link set kpcqg0 up; ip -n $B link set kpcqg1 up
ip netns exec $B python3 -c '
import socket
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM); s.bind(("192.0.2.2", 9000))
while True:
    d, a = s.recvfrom(100); s.sendto(d, a)' &
sleep 0.5
for i in $(seq "$RUNS"); do
  ip netns exec $B tc qdisc del dev kpcqg1 clsact 2>/dev/null
  ip netns exec $A python3 -c '
import socket, threading, time
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM); s.settimeout(0.5)
got, n = set(), 4000
def rx():
    try:
        while True:
            got.add(int(s.recv(100)))
    except OSError:
        pass
t = threading.Thread(target=rx); t.start()
for i in range(n):
    s.sendto(str(i).encode(), ("192.0.2.2", 9000)); time.sleep(0.0002)
t.join(); print(n - len(got))' > "/tmp/kproxy-cqg.$$" & p=$!
  sleep 0.4
  [[ $V == qdisc ]] && ip netns exec $B tc qdisc add dev kpcqg1 clsact
  wait $p
  echo "$V lost $(cat "/tmp/kproxy-cqg.$$") of 4000"
done
rm -f "/tmp/kproxy-cqg.$$"
