"""The TC path's established TCP flows handed to the kernel's conntrack, with their NAT, before
its programs detach (an agent leaving its node, `kproxy-ebpf cleanup`).

A flow the TC path translated (NodePort, ExternalIPs, LB IPs from outside; the per-packet
ClusterIP path) has its NAT only in kp_ct. Once the programs are gone, its next segment
reaches netfilter as client -> frontend; kube-proxy, back on the node, would balance it as a
new connection and the backend would reset it. Written into conntrack first (ctnetlink, here
through the `conntrack` tool), the segment meets an established entry that applies the same
DNAT (and SNAT, for a remote backend) and no rule is consulted.

How each entry is written (measured: tools/probes/ct_inject.sh): the original tuple is the
flow's (client -> frontend), the reply tuple given is its plain inverse, and the NAT comes from
--dst-nat/--src-nat, so that the kernel's NAT setup computes the translated reply tuple and
sets the NAT status bits (a reply tuple given already translated makes that setup a no-op).
netfilter may hold the flow's translated halves as entries of their own (client -> backend
and frontend -> client: the stack saw them after the TC path's DNAT and reverse DNAT; SNAT
address -> backend); their
tuples clash with the one written, so they are deleted first. Until the programs detach, a
segment may meet that clash and be dropped: TCP sends it again, by then to the new entry.

IPv4 only (an IPv6 flow is counted as skipped); UDP is not written (a query is answered or
retried; a UDP flow's next datagram is balanced anew by whoever serves).
"""
from __future__ import annotations

import shutil
import socket
import subprocess
from collections.abc import Mapping

from ..maps import layout as L

_TCP = socket.IPPROTO_TCP

TIMEOUT_S = 3600        # an hour to be used (each packet extends it as any conntrack entry)
TRIES = 5


def argv_for(client: tuple[str, int], frontend: tuple[str, int], backend: tuple[str, int],
             snat: tuple[str, int] | None) -> tuple[list[list[str]], list[str]]:
    """The `conntrack` arguments: the deletions of the flow's translated halves, then the
    creation of the entry with its NAT."""
    (c, cp), (f, fp), (b, bp) = client, frontend, backend
    deletes = [["-D", "-p", "tcp", "-s", c, "-d", b, "--sport", str(cp), "--dport", str(bp)],
               ["-D", "-p", "tcp", "-s", f, "-d", c, "--sport", str(fp), "--dport", str(cp)]]
    if snat is not None:      # the SNATed half, should the stack have seen it
        deletes.append(["-D", "-p", "tcp", "-s", snat[0], "-d", b, "--sport", str(snat[1]),
                        "--dport", str(bp)])
    create = ["-I", "-p", "tcp", "-s", c, "-d", f, "--sport", str(cp), "--dport", str(fp),
              "-r", f, "-q", c, "--reply-port-src", str(fp), "--reply-port-dst", str(cp),
              "--dst-nat", f"{b}:{bp}"]
    # The source as it is when there is no SNAT: given, not left to a null binding, which
    # would pick another client port if netfilter's client -> backend entry came back in the
    # meantime (measured: the backend saw a port it did not know and reset the connection).
    src = snat if snat is not None else client
    create += ["--src-nat", f"{src[0]}:{src[1]}"]
    create += ["--state", "ESTABLISHED", "-u", "SEEN_REPLY,ASSURED", "-t", str(TIMEOUT_S)]
    return deletes, create


def flows(maps: Mapping[str, object]) -> tuple[list[tuple], int]:
    """(client, frontend, backend, snat or None) of every established TCP flow in kp_ct, and
    how many established TCP flows were skipped (IPv6)."""
    out: list[tuple] = []
    skipped = 0
    ct = maps.get("ct")
    if ct is None:
        return out, 0
    for key, val in ct.items():                              # type: ignore[attr-defined]
        if key.proto != _TCP or val.state != L.const("KP_CT_ESTABLISHED"):
            continue
        addrs = [L.ip_str(a) for a in (key.saddr, key.daddr, val.be_addr, val.nat_addr)]
        if any(":" in a for a in addrs[:3]):
            skipped += 1
            continue
        snat = (addrs[3], L.port_host(val.nat_port)) if val.flags & L.CT_F_SNAT else None
        out.append(((addrs[0], L.port_host(key.sport)), (addrs[1], L.port_host(key.dport)),
                    (addrs[2], L.port_host(val.be_port)), snat))
    return out, skipped


def handoff(maps: Mapping[str, object]) -> tuple[int, list[str]]:
    """Writes the flows into this network namespace's conntrack; (written, problems)."""
    tool = shutil.which("conntrack")
    found, skipped = flows(maps)
    problems = [f"{skipped} IPv6 TCP flows of the TC path not handed to conntrack"] if skipped else []
    if not found:
        return 0, problems
    if tool is None:
        return 0, problems + [f"conntrack not found: {len(found)} TCP flows of the TC path "
                              "end when its programs detach"]
    written = 0
    for flow in found:
        deletes, create = argv_for(*flow)
        for _ in range(TRIES):
            # A segment the TC path translates between the deletion and the creation makes
            # netfilter's entry of the flow anew: the creation then fails (exists); again.
            for d in deletes:
                subprocess.run([tool, *d], capture_output=True)
            r = subprocess.run([tool, *create], capture_output=True, text=True)
            if r.returncode == 0 or "exists" not in r.stderr:
                break
        if r.returncode == 0:
            written += 1
        else:
            problems.append(f"conntrack -I {flow[0][0]}:{flow[0][1]} -> {flow[1][0]}:{flow[1][1]}: "
                            f"{r.stderr.strip()}")
    return written, problems
