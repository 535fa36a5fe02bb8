/* tc_lb.c: per-packet load balancing for traffic from outside the node (NodePort, ExternalIPs,
 * LoadBalancer IPs), at TC on the node's external devices.
 *
 * kp_from_outside (clsact ingress):
 *   - a packet to no address of a scope-EXT frontend and not to the SNAT address passes at
 *     once;
 *   - a reply to a flow this node SNATed (backend -> node address:SNAT port) is translated back
 *     (frontend -> client) and sent out by route, past the stack (its source is now local);
 *   - a TCP packet other than a client's SYN with no flow in kp_ct passes untouched: it is the
 *     middle of a connection this path did not start (kube-proxy's, which the kernel's
 *     conntrack keeps translating), so another backend could only reset it;
 *   - a packet to a scope-EXT frontend is load-balanced with lib/lb.h (the same lookup as the
 *     socket hooks), tracked in kp_ct and DNATed to the backend. A local backend gets the
 *     packet through the ordinary forwarding path with the client's address intact; a remote
 *     one (externalTrafficPolicy Cluster only: under Local the agent writes local backends
 *     only) also gets SNAT to the node address, with a source port from the configured range
 *     that no other flow to that backend uses, so its reply comes back here. A local one whose
 *     reply tuple another live flow holds (the client's one source port toward two frontends
 *     of that backend) gets its source port moved within that range, as Linux's NAT does.
 * kp_to_outside (clsact egress): a local backend's reply leaving for the client gets the
 *   frontend back as its source (and the client's port, if it was moved). Egress on the
 *   external device sees it after routing, so nothing is needed on the pod-facing devices.
 *   Packets from no local backend of an EXT frontend pass at once (kp_extbe).
 *
 * Verdicts: DROP (endpoints only elsewhere, eTP Local) drops; REJECT (no endpoint anywhere)
 * answers with an ICMP port unreachable, as kube-proxy's reject rule does.
 *
 * The per-packet ClusterIP path (`socketLB: false`), on the host side of each pod's veth:
 * kp_from_pod (ingress: what the pod sends) load-balances scope-SOCK frontends, the ones the
 * socket hooks serve otherwise, with the same lookup, conntrack and verdicts, and DNATs only:
 * the client keeps its address, so a backend on any node replies to it directly and the
 * reply meets kp_to_pod (egress toward the client pod), which puts the frontend back as its
 * source. One exception gets SNAT: a pod that reaches itself through a Service (hairpin),
 * whose reply would otherwise never leave it.
 *
 * A new flow from outside a LoadBalancer frontend's loadBalancerSourceRanges is dropped
 * first (lib/srcrange.h).
 */
#include <uapi/linux/bpf.h>
#include <uapi/linux/pkt_cls.h>
#include <uapi/linux/in.h>
#include "kproxy.h"
#include "lib/endian.h"
#include "lib/lb.h"
#include "lib/ct.h"
#include "lib/ct_pkt.h"
#include "lib/parse.h"
#include "lib/rewrite.h"
#include "lib/fib.h"
#include "lib/snat.h"
#include "lib/icmp_reply.h"
#include "lib/servicecidr.h"
#include "lib/srcrange.h"
#include "lib/icmp_err.h"

/* The affinity identity of a client from outside (kp_aff_key.client): its IPv4 address, or
 * an IPv6 address folded into 63 bits (the low 64 bits, the interface identifier, XORed with
 * the prefix), with KP_AFF_TC_CLIENT_BIT set. Two IPv6 clients share an affinity row only if
 * their folds collide, which two addresses of one /64 never do. */
static __always_inline __u64 kp_tc_client(const struct kp_ip *saddr)
{
	__u64 id;

	if (kp_ip_is4(saddr))
		id = saddr->w[3];
	else
		id = ((__u64)(saddr->w[0] ^ saddr->w[2]) << 32 | (saddr->w[1] ^ saddr->w[3])) &
		     ~(1ULL << KP_AFF_TC_CLIENT_BIT);
	return (1ULL << KP_AFF_TC_CLIENT_BIT) | id;
}

/* What a packet refused by kp_new_flow gets. */
enum kp_answer {
	KP_ANSWER_DROP,
	KP_ANSWER_PORT_UNREACH,         /* kp_reject */
	KP_ANSWER_HOST_UNREACH,
};

/* A fresh flow: choose the backend and record it (kp_ct and its reply tuple in kp_rnat).
 * Returns 1 with *v filled, 0 when the packet is no frontend's, or -1 when this packet is
 * refused: *answer says how. The caller sends the ICMP answer once this function's locals are
 * dead: its frame on top of theirs would not fit the stack. */
static __always_inline int kp_new_flow(struct kp_pkt *p, struct kp_ct_val *v,
				       const struct kp_snat_cfg *cfg, __u64 now, __u8 scope,
				       enum kp_answer *answer)
{
	struct kp_lb_req req = {};
	struct kp_lb_res res = {};
	struct kp_ct_key rkey = {};
	bool moved = false;
	bool snat;
	__u8 flags;

	kp_lb_request(&req, p->tuple.daddr, p->tuple.dport, p->tuple.proto, scope,
		      kp_tc_client(&p->tuple.saddr), 0, now);
	kp_lb_select(&req, &res, &p->tuple);
	if (res.verdict == KP_LB_NONE)
		return 0;
	/* Before the verdict: kube-proxy's firewall runs before its DNAT and no-endpoint reject. */
	if (!kp_srcrange_allows(&req.key, res.fe_flags, p->tuple.saddr)) {
		kp_count(KP_STAT_TC_SRC_DROP);
		kp_svc_refusal(res.svc_id, scope, KP_SVC_DENIED);
		*answer = KP_ANSWER_DROP;
		return -1;
	}
	if (res.verdict != KP_LB_FORWARD) {
		/* Refused: an ICMP port unreachable, as kube-proxy's reject rule. No endpoint in the
		 * Local set drops, but a pod client gets the socket path's EHOSTUNREACH at once. */
		if (kp_lb_refusal(&res, KP_LB_PATH_TC) == -ECONNREFUSED)
			*answer = KP_ANSWER_PORT_UNREACH;
		else if (scope == KP_SCOPE_SOCK)
			*answer = KP_ANSWER_HOST_UNREACH;
		else
			*answer = KP_ANSWER_DROP;
		return -1;
	}
	__builtin_memset(v, 0, sizeof(*v));
	v->be_addr = res.be.addr;         /* of the frontend's family (lib/lb.h kp_lb_slot) */
	v->be_port = res.be.port;
	v->backend_id = res.backend_id;
	v->svc_id = res.svc_id;
	flags = (scope == KP_SCOPE_SOCK ? KP_CT_F_POD : 0) | kp_flow_mark(res.fe_flags);
	snat = scope == KP_SCOPE_EXT ? !(res.be_flags & KP_BE_F_LOCAL)
				     : kp_ip_eq(&res.be.addr, &p->tuple.saddr);
	if (!snat) {
		kp_ct_reply_key(&p->tuple, v, &rkey);      /* v has no flags yet: backend -> client */
		moved = kp_reply_held(&rkey, &p->tuple, now);
	}
	/* A port-moved flow is SNATed to the client's own address: only its port changes. */
	if (snat || moved) {
		if (kp_snat_alloc(&p->tuple, v, cfg, snat ? &cfg->addr : &p->tuple.saddr, &rkey,
				  now) != 0) {
			kp_count(KP_STAT_TC_SNAT_FULL);
			*answer = KP_ANSWER_DROP;
			return -1;
		}
		flags |= KP_CT_F_SNAT;
		kp_count(snat ? KP_STAT_TC_SNAT : KP_STAT_TC_PORT_MOVED);
	}
	/* After kp_snat_alloc: a branch before its loop would have the verifier walk it twice. */
	if (kp_tcp_opens(p->tuple.proto, p->tcp_flags)) {
		v->isn = p->tcp_seq;       /* its replies are told from another connection's by it */
		flags |= KP_CT_F_ISN;
	}
	v->life = kp_ct_life(0, KP_CT_NEW, flags, false);   /* kp_ct_track sets the expiry */
	if (!(flags & KP_CT_F_SNAT)) {
		kp_ct_reply_key(&p->tuple, v, &rkey);
		kp_rnat.update(&rkey, &p->tuple);
	}
	kp_count(KP_STAT_TC_FORWARD);
	kp_svc_conn(res.svc_id, scope);
	return 1;
}

/* What kp_new_flow decided for a refused packet, sent: the packet's TC verdict. */
static __always_inline int kp_answer(struct __sk_buff *skb, const struct kp_pkt *p,
				     enum kp_answer answer)
{
	if (answer == KP_ANSWER_PORT_UNREACH)
		return kp_reject(skb, p);
	if (answer == KP_ANSWER_HOST_UNREACH)
		return kp_icmp_unreach(skb, p, KP_UNREACH_HOST);
	return TC_ACT_SHOT;
}

/* The reply of a tracked flow (tuple = backend -> client, SNAT address or client's moved
 * port): rewrites it to frontend -> client. at_snat: the ingress hook, which serves replies
 * to the node's SNAT address; the egress hooks serve those to the client itself, its port
 * moved or not. Returns 1 when translated, 0 when the packet is no reply we know. */
static __always_inline int kp_reply(struct __sk_buff *skb, struct kp_pkt *p, bool at_snat)
{
	struct kp_ct_key orig;
	struct kp_ct_key *o;
	struct kp_ct_val v;
	struct kp_ct_val *row;
	__u64 now;
	bool nat;

	o = kp_rnat.lookup(&p->tuple);
	if (!o)
		return 0;
	orig = *o;
	row = kp_ct.lookup(&orig);
	if (!row)
		return 0;
	v = *row;
	nat = kp_ct_flags(v.life) & KP_CT_F_SNAT;
	if ((nat ? !kp_ip_eq(&v.nat_addr, &p->tuple.daddr) || v.nat_port != p->tuple.dport
		 : at_snat) ||
	    !kp_ip_eq(&v.be_addr, &p->tuple.saddr) || v.be_port != p->tuple.sport)
		return 0;     /* a stale row: the flow it names has moved to another port */
	now = bpf_ktime_get_ns();
	if (kp_reply_is_another(p, &v, now)) {
		/* The new connection owns the tuple now, so its later packets skip the flow too. A
		 * SNAT row stays: kp_snat_alloc decides when its port is free. */
		if (!nat)
			kp_rnat.delete(&p->tuple);
		return 0;
	}
	/* From the frontend; to the client, who is already the destination without NAT. */
	if (nat ? kp_rewrite(skb, p, &orig.daddr, orig.dport, &orig.saddr, orig.sport) < 0
		: kp_rewrite(skb, p, &orig.daddr, orig.dport, &p->tuple.daddr, p->tuple.dport) < 0)
		return -1;
	kp_ct_track(&orig, row, &v, p->tcp_flags, true, now);
	kp_count(KP_STAT_TC_REPLY);
	kp_svc_packet(v.svc_id, kp_ct_flags(v.life) & KP_CT_F_POD ? KP_SCOPE_SOCK : KP_SCOPE_EXT,
		      true, skb->len);
	return 1;
}

/* A pod's packet to an address that is no frontend gets the socket path's ServiceCIDR verdict
 * (lib/servicecidr.h) as an ICMP error, or passes untouched. */
static __always_inline int kp_pod_unmatched(struct __sk_buff *skb, const struct kp_pkt *p)
{
	int err = kp_servicecidr_unmatched(p->tuple.daddr);

	if (err == 0)
		return TC_ACT_OK;
	return kp_icmp_unreach(skb, p, err == -ECONNREFUSED ? KP_UNREACH_PORT : KP_UNREACH_HOST);
}

/* kp_ingress's filter, once the packet's addresses are read. From outside, a packet can be ours
 * only if it is sent to an address of some scope-EXT frontend (kp_extaddr, which the agent
 * writes before the frontend's slot 0 and deletes after it) or to the SNAT address. Any other,
 * such as pod-to-pod traffic between nodes, leaves after these two lookups in small maps
 * instead of three in the large conntrack and service maps (kp_from_outside per such packet:
 * 650-900 ns before, ~200 ns after, with the parse split around it; docs/design/north-south.md).
 * Returns false when the packet's verdict is settled here (*verdict: it passes, or is an ICMP
 * error about a flow), true once its ports are parsed. */
static __always_inline bool kp_ingress_filter(struct __sk_buff *skb, __u8 scope,
					      struct kp_pkt *p, enum kp_l3_kind kind, bool to_snat,
					      int *verdict)
{
	*verdict = TC_ACT_OK;
	if (scope == KP_SCOPE_EXT && !to_snat && !kp_extaddr.lookup(&p->tuple.daddr))
		return false;
	if (kind == KP_L3_ICMP_ERR) {
		if (scope == KP_SCOPE_EXT)
			*verdict = kp_icmp_err(skb, p);
		return false;
	}
	return kp_parse_l4(skb, p) >= 0;
}

/* A translated packet whose source is now an address of this node, sent by route (lib/fib.h):
 * the packet's TC verdict. */
static __always_inline int kp_send_by_route(struct __sk_buff *skb, const struct kp_pkt *p)
{
	if (kp_redirect(skb, p) < 0) {
		kp_count(KP_STAT_TC_FIB_FAIL);
		return TC_ACT_SHOT;
	}
	return TC_ACT_REDIRECT;
}

/* The ingress of both TC paths: kp_from_outside (scope EXT, external devices) and kp_from_pod
 * (scope SOCK, pod devices; see the file comment). In order: the filter, a SNAT flow's reply,
 * the flow's backend (kept, or chosen anew), and the rewrite toward it. The SNAT address test
 * and the last rewrite stay here: as helpers of their own they changed the compiled code. */
static __always_inline int kp_ingress(struct __sk_buff *skb, __u8 scope)
{
	struct kp_pkt p = {};
	struct kp_ct_val v;
	struct kp_ct_val *row;
	struct kp_snat_cfg cfg;
	enum kp_l3_kind kind;
	__u64 now;
	bool to_snat;
	int verdict;
	int ret;
	enum kp_answer answer = KP_ANSWER_DROP;   /* what kp_new_flow refuses a packet with */

	kind = kp_parse_l3(skb, &p);
	if (kind == KP_L3_OTHER)
		return TC_ACT_OK;
	cfg = kp_snat_config(p.family);
	to_snat = !kp_ip_is_zero(&cfg.addr) && kp_ip_eq(&cfg.addr, &p.tuple.daddr);
	if (!kp_ingress_filter(skb, scope, &p, kind, to_snat, &verdict))
		return verdict;
	/* Only a packet to the SNAT address and a port of its range can be a SNAT flow's reply. */
	ret = to_snat && kp_snat_port(&cfg, p.tuple.dport) ? kp_reply(skb, &p, true) : 0;
	if (ret != 0)
		return ret < 0 ? TC_ACT_SHOT : kp_send_by_route(skb, &p);

	now = bpf_ktime_get_ns();
	/* p.tuple is the flow's original tuple until the rewrite below. */
	row = kp_ct_find_usable(&p, &v, now);
	if (!row) {
		/* Mid-stream TCP of no flow of ours: untouched (lib/ct_pkt.h kp_ct_may_open). */
		if (!kp_ct_may_open(&p)) {
			if (kp_ct_frontend(&p, scope)) {
				kp_count(KP_STAT_TC_MIDSTREAM);
				return TC_ACT_OK;
			}
			return scope == KP_SCOPE_SOCK ? kp_pod_unmatched(skb, &p) : TC_ACT_OK;
		}
		ret = kp_new_flow(&p, &v, &cfg, now, scope, &answer);
		if (ret == 0)
			return scope == KP_SCOPE_SOCK ? kp_pod_unmatched(skb, &p) : TC_ACT_OK;
		if (ret < 0)
			return kp_answer(skb, &p, answer);
	}
	kp_ct_track(&p.tuple, row, &v, p.tcp_flags, false, now);
	kp_svc_packet(v.svc_id, scope, false, skb->len);

	/* SNAT for a remote EXT backend, or a pod's hairpin (it must see the node as its peer,
	 * or it would answer itself directly). */
	if (!(kp_ct_flags(v.life) & KP_CT_F_SNAT)) {
		if (kp_rewrite(skb, &p, &p.tuple.saddr, p.tuple.sport, &v.be_addr, v.be_port) < 0)
			return TC_ACT_SHOT;
		return TC_ACT_OK;    /* routing takes it to the backend (a pod's: local or not) */
	}
	if (kp_rewrite(skb, &p, &v.nat_addr, v.nat_port, &v.be_addr, v.be_port) < 0)
		return TC_ACT_SHOT;
	/* The client's port moved (kp_new_flow): still the client's address, routed as above */
	if (!kp_ip_eq(&v.nat_addr, &cfg.addr))
		return TC_ACT_OK;
	return kp_send_by_route(skb, &p);
}

int kp_from_outside(struct __sk_buff *skb)
{
	return kp_ingress(skb, KP_SCOPE_EXT);
}

/* The egress of both TC paths: a reply of a flow without SNAT gets its frontend back. On the
 * external devices such a reply can only come from a local backend of a scope-EXT frontend
 * (kp_extbe, held by the writer like kp_extaddr): anything else leaves after that lookup. */
static __always_inline int kp_egress(struct __sk_buff *skb, bool ext)
{
	struct kp_pkt p = {};

	if (kp_parse_l3(skb, &p) != KP_L3_PORTS ||
	    (ext && !kp_extbe.lookup(&p.tuple.saddr)) ||
	    kp_parse_l4(skb, &p) < 0)
		return TC_ACT_OK;
	return kp_reply(skb, &p, false) < 0 ? TC_ACT_SHOT : TC_ACT_OK;
}

int kp_to_outside(struct __sk_buff *skb)
{
	return kp_egress(skb, true);
}

/* A pod's packet (clsact ingress of its host-side veth): the reply of a hairpin flow goes back
 * to the pod; a packet of a tracked flow, or the first of a new one to a scope-SOCK frontend,
 * is DNATed to its backend and left to routing. */
int kp_from_pod(struct __sk_buff *skb)
{
	return kp_ingress(skb, KP_SCOPE_SOCK);
}

/* Toward a pod (clsact egress of its host-side veth): the reply of a ClusterIP flow it opened
 * gets the frontend back as its source, wherever its backend runs. A program of its own (the
 * same body as kp_to_outside) so the agent tells the two paths' filters apart by name. */
int kp_to_pod(struct __sk_buff *skb)
{
	return kp_egress(skb, false);
}
