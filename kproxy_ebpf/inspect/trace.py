"""`kproxy-ebpf trace`: every lookup the datapath would make for one connect or packet, in
order, from what the kernel holds right now (the pinned maps), and why.

It follows lib/lb.h and its callers as iptables users follow KUBE-SERVICES -> KUBE-SVC ->
KUBE-SEP by hand: the frontend row (slot 0) of the scope asked for (the socket hooks for a
pod's or the node's own connect, the TC path for a packet from outside), the ServiceCIDR rows
when no frontend matches, the loadBalancerSourceRanges rows, the frontend's action, its slots
and their backends, the affinity row that would pin this client, and for the TC path the
conntrack rows of this client's flows. Where the datapath chooses at random (a new client's
slot), the candidates are listed, as `iptables -L` lists the statistic rules; a frontend with a
Maglev table chooses by the flow, and given the client's port, the trace names the entry and
the backend that flow gets (on every node with the same backends).

Read-only and decoded in Python; what it reads is what the programs read, through the same
keys (datapath/layout.py), so a row missing or stale shows as the programs would meet it.
"""
from __future__ import annotations

import enum
import ipaddress
import time
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field

from kproxy_ebpf.datapath.flows import conntrack
from kproxy_ebpf.datapath.maps import layout as L
from kproxy_ebpf.datapath.maps.pinned import PinnedMap
from kproxy_ebpf.model import maglev
from kproxy_ebpf.model.desired import Action, FrontendKind, Scope
from kproxy_ebpf.model.objects import Protocol, hostport

from . import trace_sched


class Verdict(enum.StrEnum):
    FORWARD = "forward"            # to a backend (chosen or one of the candidates)
    UNTOUCHED = "untouched"        # no frontend: the connect or packet goes on as it is
    REFUSED = "refused"            # ECONNREFUSED / ICMP port unreachable
    UNREACHABLE = "unreachable"    # EHOSTUNREACH (socket path) / dropped (from outside)
    DENIED = "denied"              # loadBalancerSourceRanges: EPERM / dropped


@dataclass
class Step:
    step: str                      # which lookup
    found: str                     # what the maps hold, in brief
    why: str = ""                  # the same in words (--explain)


@dataclass
class Trace:
    frontend: str
    scope: str
    source: str | None
    steps: list[Step] = field(default_factory=list)
    verdict: Verdict = Verdict.UNTOUCHED
    service: str | None = None
    candidates: list[str] = field(default_factory=list)   # backends a new client may get
    chosen: str | None = None                             # the one it gets, when determined

    def add(self, step: str, found: str, why: str = "") -> None:
        self.steps.append(Step(step, found, why))

    def to_json(self) -> dict:
        return asdict(self)


def _scope_text(scope: Scope) -> str:
    return ("socket hooks (a connect or send from a pod or the node)" if scope is Scope.SOCK
            else "TC (a packet from outside the node)")


def trace(maps: Mapping[str, PinnedMap], ip: str, port: int, proto: Protocol, scope: Scope,
          source: str | None = None, netns_cookie: int | None = None,
          now_ns: int | None = None, source_port: int | None = None) -> Trace:
    """The lookups for (ip, port, proto) in `scope`, from client `source` (an address; for the
    socket path its network namespace cookie, `netns_cookie`, keys ClientIP affinity; from
    outside, `source_port` names the flow a Maglev table picks by)."""
    now = time.clock_gettime_ns(time.CLOCK_MONOTONIC) if now_ns is None else now_ns
    t = Trace(frontend=f"{hostport(ip, port)}/{proto.value}", scope=scope.value, source=source)
    key = L.svc_key(ip, port, proto, 0, L.SCOPE_NUM[scope])
    head = maps["svc"].get(key)
    if head is None:
        _no_frontend(t, maps, ip, scope)
        return t
    meta = maps["meta"].get(L.U32(head.svc_id)) if "meta" in maps else None
    t.service = (f"{meta.namespace.decode()}/{meta.name.decode()}"
                 + (f":{meta.port_name.decode()}" if meta.port_name else "")) if meta else None
    kind = L.KIND_BY_NUM.get(head.kind)
    action = L.ACTION_BY_NUM.get(head.action)
    policy = L.policy_of((meta.flags, meta.health_check_node_port, meta.source_ranges,
                          meta.traffic_distribution)) if meta else {}
    t.add("frontend", f"{kind.value if kind else head.kind} of {t.service or '?'} (svc_id "
          f"{head.svc_id}): {head.count} slots, action {action.value if action else head.action}"
          + (f", ClientIP affinity {head.affinity_timeout}s" if head.affinity_timeout else ""),
          f"the {_scope_text(scope)} find {t.frontend} in kp_svc (slot 0)")
    if head.fe_flags & L.FE_F_SRC_RANGES and not _source_allowed(t, maps, key, scope, source):
        return t
    if action is not Action.FORWARD or head.count == 0:
        _refused(t, action, kind, policy, scope, head.count)
        return t
    slots = _slots(maps, key, head.count)
    t.candidates = [b for b, _, _ in slots if b]
    t.add("backends", ", ".join(f"{i}) {b or '<missing>'} ({state})"
                                for i, (b, state, _) in enumerate(slots, 1)),
          f"a new client gets one of these {head.count} slots {trace_sched.how(head)}")
    if not t.candidates:
        # lib/lb.h: every pick misses its slot twice (KP_LB_MISS), and is refused.
        t.verdict = Verdict.REFUSED
        t.add("slots", "none usable", "each pick meets a missing slot or backend, reads slot 0 "
              "again and is refused with " + ("ECONNREFUSED" if scope is Scope.SOCK
                                              else "an ICMP port unreachable"))
        return t
    t.verdict = Verdict.FORWARD
    if head.affinity_timeout:
        _affinity(t, maps, head, ip, scope, source, netns_cookie, slots, now)
    sched = trace_sched.next_pick(maps, key, head, slots) if t.chosen is None else None
    if sched is not None:
        step, found, why, picks = sched
        t.add(step, found, why)
        t.candidates = picks or t.candidates
        t.chosen = picks[0] if len(picks) == 1 else None
    elif head.backend_id and t.chosen is None:
        _maglev(t, maps, head, port, proto, source, source_port, slots)
    if scope is Scope.EXT and source and "ct" in maps:
        _flows(t, maps, source)
    if t.verdict is Verdict.FORWARD and t.chosen is None and len(t.candidates) == 1:
        t.chosen = t.candidates[0]
    return t


def _addr(m: PinnedMap, ip: str):
    """The key of a map keyed by a bare struct kp_ip."""
    return m.spec.key.from_buffer_copy(L.ip_bytes(ip))


def _no_frontend(t: Trace, maps: Mapping[str, PinnedMap], ip: str, scope: Scope) -> None:
    t.add("frontend", "none", f"no row for {t.frontend} in kp_svc ({scope.value} scope)")
    if scope is Scope.EXT and "extaddr" in maps:
        held = maps["extaddr"].get(_addr(maps["extaddr"], ip)) is not None
        t.add("tc filter", f"kp_extaddr {'holds' if held else 'does not hold'} {ip}",
              "a packet to an address no frontend from outside has goes on untouched")
        return
    cip = maps["clusterip"].get(_addr(maps["clusterip"], ip)) if "clusterip" in maps else None
    if cip is not None:
        if cip.action == L.const("KP_CIP_PASS"):
            t.add("servicecidr", "a ClusterIP of a Service another proxy serves",
                  "left untouched for that proxy (service.kubernetes.io/service-proxy-name)")
            return
        t.verdict = Verdict.REFUSED
        t.add("servicecidr", "an allocated ClusterIP without this port",
              "refused at once (ECONNREFUSED), as kube-proxy rejects it")
        return
    inside = ("servicecidr" in maps and maps["servicecidr"].get(
        L.CidrKey(prefixlen=128, addr=L.ip16(ip))) is not None)
    if inside:
        t.verdict = Verdict.UNREACHABLE
        t.add("servicecidr", "inside a ServiceCIDR, allocated to no Service",
              "fails at once with EHOSTUNREACH (kube-proxy drops it)")
    else:
        t.add("servicecidr", "outside every ServiceCIDR", "no Service address: untouched")


def _source_allowed(t: Trace, maps, key, scope: Scope, source: str | None) -> bool:
    ranges = [L.srcrange_of(k)[1] for k in maps["srcrange"].keys()
              if L.frontend_key(key) == L.srcrange_of(k)[0]] if "srcrange" in maps else []
    if source is None:
        t.add("source ranges", ", ".join(sorted(ranges)) or "(none)",
              "loadBalancerSourceRanges apply; give --from to judge a source")
        return True
    addr = ipaddress.ip_address(source)
    inside = [r for r in ranges if addr in ipaddress.ip_network(r)]
    if inside:
        t.add("source ranges", f"{source} inside {inside[0]}", "admitted by the ranges")
        return True
    t.verdict = Verdict.DENIED
    t.add("source ranges", f"{source} in none of {', '.join(sorted(ranges)) or '(none)'}",
          "loadBalancerSourceRanges: " + ("connect/send fails with EPERM" if scope is Scope.SOCK
                                          else "the packet is dropped"))
    return False


def _refused(t: Trace, action: Action | None, kind: FrontendKind | None, policy: dict,
             scope: Scope, count: int) -> None:
    if action is Action.DROP:
        t.verdict = Verdict.UNREACHABLE
        which = ("internalTrafficPolicy" if kind is FrontendKind.CLUSTER_IP
                 else "externalTrafficPolicy")
        how = ("connect/send fails with EHOSTUNREACH" if scope is Scope.SOCK
               else "the packet is dropped")
        t.add("action", "drop", f"{which} Local and no endpoint on this node (endpoints exist "
              f"on other nodes): {how}")
        return
    t.verdict = Verdict.REFUSED
    t.add("action", "reject" if action is Action.REJECT else f"forward with {count} slots",
          "no usable endpoint (none ready, none serving while terminating): refused with "
          + ("ECONNREFUSED" if scope is Scope.SOCK else "an ICMP port unreachable"))


def _slots(maps, key, count: int) -> list[tuple[str | None, str, int]]:
    """Per slot: its backend (None where lib/lb.h kp_lb_slot misses: no slot row, no backend
    row, or a backend of the other family), its state and its backend id."""
    out = []
    four = L.ip_is4(key.addr)
    for slot in range(1, count + 1):
        key.slot = slot
        row = maps["svc"].get(key)
        be = maps["backend"].get(L.U32(row.backend_id)) if row is not None else None
        if be is not None and L.ip_is4(be.addr) != four:
            be = None
        out.append((hostport(L.ip_str(be.addr), L.port_host(be.port)) if be else None,
                    L.backend_state(row.be_flags) if row is not None else "missing",
                    row.backend_id if row is not None else 0))
    key.slot = 0
    return out


def tc_client(source: str) -> int:
    """tc_lb.c kp_tc_client: the affinity identity of a client from outside."""
    raw = L.ip_bytes(source)
    bit = 1 << L.const("KP_AFF_TC_CLIENT_BIT")
    w = [int.from_bytes(raw[i:i + 4], "little") for i in range(0, 16, 4)]
    ident = w[3] if L.ip_is4(raw) else ((w[0] ^ w[2]) << 32 | (w[1] ^ w[3])) & ~bit
    return bit | ident


def _affinity(t: Trace, maps, head, ip: str, scope: Scope, source: str | None,
              netns_cookie: int | None, slots, now: int) -> None:
    client = tc_client(source) if scope is Scope.EXT and source else netns_cookie
    if client is None:
        t.add("affinity", "ClientIP", "give --from (and for pods, their address) to see the "
              "affinity row of one client")
        return
    akey = L.AffKey(client=client, svc_id=head.svc_id, type=L.const("KP_AFF_CLIENT"),
                    family=4 if L.ip_is4(L.ip_bytes(ip)) else 6)
    row = maps["affinity"].get(akey) if "affinity" in maps else None
    fresh = row is not None and now - row.last_used <= head.affinity_timeout * 10 ** 9
    # lib/lb.h kp_lb_from_affinity: fresh, its slot within the count, and that slot still
    # naming the backend the row remembers.
    if (row is None or not fresh or not 1 <= row.slot <= len(slots) or slots[row.slot - 1][0] is None
            or slots[row.slot - 1][2] != row.backend_id):
        t.add("affinity", "no fresh row for this client",
              "a new choice is made (and remembered for the affinity timeout)")
        return
    t.chosen = slots[row.slot - 1][0]
    age = (now - row.last_used) / 1e9
    t.add("affinity", f"slot {row.slot} -> {t.chosen}, used {age:.0f}s ago",
          "ClientIP affinity pins this client to that backend while the row is fresh")


def _maglev(t: Trace, maps, head, port: int, proto: Protocol, source: str | None,
            source_port: int | None, slots) -> None:
    """The entry of the frontend's Maglev table a flow from source:source_port takes."""
    table, size = head.backend_id, head.maglev_size
    if source is None or source_port is None:
        t.add("maglev", f"table {table}, {size} entries",
              "a new flow takes the slot of the entry its hash picks (client address and port, "
              "frontend port, protocol), the same on every node with these backends; give "
              "--from and --from-port to see one flow's")
        return
    h = maglev.flow_hash(source, source_port, port, L.PROTO_NUM[proto])
    if size == 0:       # lib/maglev.h kp_maglev_slot: no entry, as a missing row
        t.verdict = Verdict.REFUSED
        t.add("maglev", f"table {table} without a size",
              "the lookup reads slot 0 again, then refuses")
        return
    entry = h % size
    row_size = L.const("KP_MAGLEV_ROW")
    row = maps["maglev"].get(L.STRUCTS["kp_maglev_key"](table=table, row=entry // row_size)) \
        if "maglev" in maps else None
    slot = row.slot[entry % row_size] if row is not None and row.table == table else 0
    if not 1 <= slot <= len(slots) or slots[slot - 1][0] is None:
        t.verdict = Verdict.REFUSED
        t.add("maglev", f"table {table}: entry {entry} missing",
              "the lookup reads slot 0 again, then refuses (a table being replaced)")
        return
    t.chosen = slots[slot - 1][0]
    t.add("maglev", f"flow hash {h:#010x} -> entry {entry} of {size} -> slot {slot} -> "
          f"{t.chosen}", "every node with these backends sends this flow there")


def _flows(t: Trace, maps, source: str) -> None:
    mine = [e for e in conntrack.entries(maps) if e["frontend"] == t.frontend.rsplit("/", 1)[0]
            and e["client"].rsplit(":", 1)[0].strip("[]") == source
            and e["protocol"] == t.frontend.rsplit("/", 1)[1]]
    if not mine:
        t.add("conntrack", "no flow of this client", "a new flow is load-balanced")
        return
    latest = max(mine, key=lambda e: e["expires_in_seconds"])
    t.add("conntrack", "; ".join(f"{e['client']} -> {e['backend']} ({e['state']})"
                                 for e in mine[:5]),
          "a tracked flow keeps its backend; a new source port is load-balanced")
    if t.chosen is None and t.verdict is Verdict.FORWARD:
        t.chosen = latest["backend"]
