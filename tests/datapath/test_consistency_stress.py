"""No torn reads under churn: clients connect through a Service while the writer flips
endpoint readiness and replaces backends as fast as it can.

After every connection the client checks what the socket hooks told it: getpeername() must
name the service (recvmsg, for the UDP exchanges, must give the reply the service's source),
and the backend that answered must be one the service held while that connection was being
made (the union of the sets programmed between the last apply completed before the connect
and the last apply begun before the answer). A reverse-NAT row that names another backend
than the one the socket was sent to, or a backend id read half-rewritten, shows up as a
mismatch. The issue asks for at least 20,000 connections with none. It runs once per
ClusterIP path (dplab.LB_PATHS): on the per-packet path the backend is chosen when the SYN
passes kp_from_pod, inside the same window, and the reply's source must be the service's.
"""
from __future__ import annotations

import bisect
import random
import subprocess
import threading
import time

import pytest

from .dplab import LB_PATHS, endpoints, service

pytestmark = [pytest.mark.root, pytest.mark.parametrize("lb_path", LB_PATHS, indirect=True)]

VIP = "10.96.0.77"
HTTP, HTTP_EP = ("http", "TCP", 80), ("http", "TCP", 8080)
DNS, DNS_EP = ("dns", "UDP", 53), ("dns", "UDP", 5353)
BACKENDS = ["a1", "a2", "b1", "b2"]
CLIENTS = 2
PER_CLIENT = 10_000

CLIENT = f"""
import socket, sys, time
mono = time.monotonic
for i in range({PER_CLIENT}):
    t0 = mono()
    s = socket.create_connection(('{VIP}', 80), timeout=5)
    peer = s.getpeername()
    pod = s.recv(200).decode().split()[0]
    s.close()
    print(t0, mono(), 'T', '%s:%d' % peer, pod)
    if i % 10 == 0:
        t0 = mono()
        u = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        u.settimeout(5)
        u.sendto(b'x', ('{VIP}', 53))
        data, src = u.recvfrom(200)
        u.close()
        print(t0, mono(), 'U', '%s:%d' % src, data.decode().split()[0])
"""


def _client(lab) -> subprocess.Popen:
    """The client in the client pod's cgroup and netns: a shell joins the cgroup, then
    nsenter enters the netns (no preexec_fn while the churn thread runs)."""
    t = lab.target("client")
    script = (f'echo $$ > {t.cgroup}/cgroup.procs && '
              f'exec nsenter --net=/run/netns/{t.netns} python3 -c "$0"')
    return subprocess.Popen(["sh", "-c", script, CLIENT], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)


def _states(rnd: random.Random, lab):
    """A random endpoint set: some pods ready, some serving-terminating, some gone."""
    ready = rnd.sample(BACKENDS, rnd.randint(0, 4))
    rest = [p for p in BACKENDS if p not in ready]
    draining = rnd.sample(rest, rnd.randint(1 if not ready else 0, len(rest)))
    slices = [endpoints(lab, "stress", ready, HTTP_EP, DNS_EP, slice_name="stress-r")] if ready else []
    if draining:
        slices.append(endpoints(lab, "stress", draining, HTTP_EP, DNS_EP, ready=False,
                                serving=True, terminating=True, slice_name="stress-t"))
    # kube-proxy: ready endpoints if any, else the serving-terminating ones.
    return slices, set(ready) if ready else set(draining)


def test_no_mismatch_over_20000_connections_under_churn(lab, node1):
    svc = service("stress", VIP, HTTP, DNS)
    history: list[tuple[float, float, set[str]]] = []     # (apply begun, apply done, set)
    rnd = random.Random(7)
    slices, used = _states(rnd, lab)
    t0 = time.monotonic()
    node1.program(svc, *slices)
    history.append((t0, time.monotonic(), used))

    stop = threading.Event()
    errors: list[BaseException] = []

    def churn() -> None:
        try:
            while not stop.is_set():
                slices, used = _states(rnd, lab)
                begun = time.monotonic()
                node1.program(svc, *slices)
                history.append((begun, time.monotonic(), used))
        except BaseException as exc:  # noqa: BLE001 - any failure of the thread is surfaced by the main one
            errors.append(exc)

    writer = threading.Thread(target=churn, name="churn")
    procs = [_client(lab) for _ in range(CLIENTS)]
    writer.start()
    try:
        outputs = []
        for p in procs:
            out, err = p.communicate(timeout=600)
            assert p.returncode == 0, err
            outputs.append(out)
    finally:
        stop.set()
        writer.join()
        for p in procs:
            p.kill()
            p.wait()
    assert not errors, errors

    lines = [line.split() for out in outputs for line in out.splitlines() if line.strip()]
    tcp = [x for x in lines if x[2] == "T"]
    assert len(tcp) == CLIENTS * PER_CLIENT, "every client finished every connection"
    assert len(history) > 50, "the writer churned while the clients ran"
    # One writer thread: the applies' begin and end times both only grow, so bisect finds
    # them (a scan per connection is quadratic, and minutes when the clients run long).
    begun = [h[0] for h in history]
    done = [h[1] for h in history]
    mismatches = []
    for start, end, kind, peer, pod in ((float(a), float(b), k, p, q) for a, b, k, p, q in lines):
        want_peer = f"{VIP}:{80 if kind == 'T' else 53}"
        # States that may have been visible: from the last apply finished before the start
        # to the last apply begun before the answer.
        first = max(bisect.bisect_right(done, start) - 1, 0)
        last = bisect.bisect_right(begun, end) - 1
        allowed = set().union(*(history[i][2] for i in range(first, last + 1)))
        if peer != want_peer or pod not in allowed:
            mismatches.append((kind, peer, pod, sorted(allowed)))
    assert not mismatches, f"{len(mismatches)} of {len(lines)}: {mismatches[:10]}"
