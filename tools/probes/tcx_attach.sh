#!/bin/bash
# Does attaching a tcx link (tc.py's way since issue 45) drop what the device sends at that
# instant, as creating a clsact qdisc does (clsact_graft.sh)? Same setup: two network namespaces
# (kproxy-tcxp-*; a veth pair, no route out), a UDP echo server in one; the other sends 4,000
# numbered datagrams (one per 0.2 ms) and counts the answers. VARIANT=tcx: 0.4 s in, a program
# that passes everything (r0 = TC_ACT_OK) goes on the server side's egress, then ingress, as tcx
# links put first (BPF_F_BEFORE, as tcx.attach does); they go again when the run ends.
# VARIANT=none: nothing. Prints per run: <variant> lost <n> of 4000.
# Measured 2026-12-07 (kernel 6.18, 20 runs, twice; clsact_graft.sh qdisc right after each):
# tcx lost 0 in 20 runs both times; qdisc lost 1-5 in 4 of 20, then 1-13 in 8 of 20.
# Usage (root): tools/probes/tcx_attach.sh none|tcx [RUNS]
set -u
V=${1:?none or tcx}; RUNS=${2:-5}
ROOT=$(cd "$(dirname "$0")/../.." && pwd); PY=${PY:-$ROOT/.venv/bin/python}
A=kproxy-tcxp-cli B=kproxy-tcxp-srv
cleanup() {
  for n in $A $B; do ip netns pids $n 2>/dev/null | xargs -r kill 2>/dev/null; done
  sleep 0.2; for n in $A $B; do ip netns del $n 2>/dev/null; done
  rm -f "/tmp/kproxy-tcxp.$$"
}
trap cleanup EXIT
ip netns add $A && ip netns add $B || exit 1
ip link add kptcxp0 netns $A type veth peer name kptcxp1 netns $B
ip -n $A addr add 192.0.2.1/24 dev kptcxp0; ip -n $B addr add 192.0.2.2/24 dev kptcxp1
for n in $A $B; do ip -n $n link set lo up; done
ip -n $A link set kptcxp0 up; ip -n $B link set kptcxp1 up
ip netns exec $B python3 -c '
import socket
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM); s.bind(("192.0.2.2", 9000))
while True:
    d, a = s.recvfrom(100); s.sendto(d, a)' &
sleep 0.5
for i in $(seq "$RUNS"); do
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
t.join(); print(n - len(got))' > "/tmp/kproxy-tcxp.$$" & p=$!
  sleep 0.4
  h=
  if [[ $V == tcx ]]; then
    # held until the sender is done (about 2 s): the links go when their fds close
    (cd "$ROOT" && ip netns exec $B "$PY" -c '
import socket, struct, time
from kproxy_ebpf.datapath.load import libbpf, tcx
ok = struct.pack("<BBhi", 0xb7, 0, 0, 0) + struct.pack("<BBhi", 0x95, 0, 0, 0)
prog = libbpf.prog_load(3, "kp_probe", "GPL", ok)
index = socket.if_nametoindex("kptcxp1")
links = [libbpf.link_create(prog, index, t, libbpf.F_BEFORE)
         for t in (libbpf.ATTACH_TCX_EGRESS, libbpf.ATTACH_TCX_INGRESS)]
assert all(tcx.programs(index, w)[0][0] == "kp_probe" for w in tcx.DIRECTIONS)
time.sleep(2.5)') & h=$!
  fi
  wait $p; [[ -n $h ]] && wait $h
  echo "$V lost $(cat "/tmp/kproxy-tcxp.$$") of 4000"
done
