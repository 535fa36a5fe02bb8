/* lib/ct_pkt.h: what one parsed packet (lib/parse.h) means for its tracked flow (lib/ct.h):
 * whether the flow may keep its backend, or is load-balanced anew, or is no flow of ours (a
 * TCP packet in the middle of a connection the TC path did not start), and whether a packet
 * on the flow's reply tuple is the flow's or another connection's.
 */
#ifndef KPROXY_LIB_CT_PKT_H
#define KPROXY_LIB_CT_PKT_H

#include <uapi/linux/in.h>
#include "../kproxy.h"
#include "ip.h"
#include "maps.h"
#include "stats.h"
#include "ct.h"
#include "parse.h"

/* Whether a tracked flow may keep its backend: not expired, not a new connection on an ended
 * one, and the backend id still names the flow's backend (an id is freed only once no service
 * uses it, but a freed id may name another backend later, so the address is compared; the
 * agent also purges UDP entries of removed backends). A TCP connection is the exception: like
 * a connect() the socket path translated once, it keeps its backend until it ends, as under
 * kube-proxy, whose conntrack cleanup clears UDP entries only (pkg/proxy/conntrack/
 * cleanup.go, v1.36): a pod that stops being ready still answers the connections it has, and
 * another backend could only answer a mid-stream packet with a RST. */
static __always_inline bool kp_ct_usable(const struct kp_pkt *p, const struct kp_ct_val *v,
					 __u64 now)
{
	__u32 id = v->backend_id;
	struct kp_backend *b;
	struct kp_backend be;

	if (now > kp_ct_expires(v->life) ||
	    kp_ct_reopens(p->tuple.proto, p->tcp_flags, p->tcp_seq, v))
		return false;
	if (p->tuple.proto == IPPROTO_TCP && !(p->tcp_flags & KP_TCP_SYN))
		return true;
	b = kp_be.lookup(&id);
	if (!b)
		return false;
	be = *b;
	return kp_ip_eq(&be.addr, &v->be_addr) && be.port == v->be_port;
}

/* Whether a packet without a usable flow may open one: any UDP packet (nothing tells its
 * first from a later one), but of TCP only a client's SYN. Any other TCP packet belongs to a
 * connection the TC path did not start, or no longer tracks: kube-proxy's netfilter DNAT
 * before the agent attached (the kernel's conntrack keeps translating it after kube-proxy's
 * rules are gone, as long as the packet reaches the stack untouched), or a flow whose row
 * expired or was purged. Load-balancing it sent it to a backend that knows no such connection
 * and answers with a RST; untouched, netfilter's conntrack carries a flow it NATed, and
 * anything else meets the same RST or silence it would have met anyway. */
static __always_inline bool kp_ct_may_open(const struct kp_pkt *p)
{
	return p->tuple.proto != IPPROTO_TCP || kp_tcp_opens(p->tuple.proto, p->tcp_flags);
}

/* Whether the packet's destination is a frontend of the scope (its slot 0): only then is a
 * passed mid-stream packet counted (KP_STAT_TC_MIDSTREAM), and not given a pod's ServiceCIDR
 * verdict (an ICMP error about an established connection to a real Service). */
static __always_inline bool kp_ct_frontend(const struct kp_pkt *p, __u8 scope)
{
	struct kp_svc_key key = {};

	key.addr = p->tuple.daddr;
	key.port = p->tuple.dport;
	key.proto = p->tuple.proto;
	key.scope = scope;
	return kp_svc.lookup(&key) != NULL;
}

/* Drops the reply row of a flow that is load-balanced anew. A SNAT flow's row stays: its port
 * may already serve another flow (kp_snat_alloc reuses ended flows' ports), and once this one
 * is rewritten the row no longer matches it, so kp_rnat_reusable frees it. */
static __always_inline void kp_ct_forget(const struct kp_ct_key *orig,
					 const struct kp_ct_val *v)
{
	struct kp_ct_key rkey = {};

	if (kp_ct_flags(v->life) & KP_CT_F_SNAT)
		return;
	kp_ct_reply_key(orig, v, &rkey);
	kp_rnat.delete(&rkey);
}

/* The flow of a packet in its original direction (p->tuple: client -> frontend), copied to *v:
 * its row when the flow may keep its backend, NULL when there is none or the flow must be
 * load-balanced anew or left alone (kp_ct_may_open; its reply row is forgotten then). */
static __always_inline struct kp_ct_val *kp_ct_find_usable(struct kp_pkt *p,
							    struct kp_ct_val *v, __u64 now)
{
	struct kp_ct_val *row = kp_ct.lookup(&p->tuple);

	if (row) {
		*v = *row;
		if (!kp_ct_usable(p, v, now)) {
			if (kp_ct_may_open(p)) {
				kp_count(KP_STAT_TC_CT_EXPIRED);
				kp_flow_replaced(row, v->life, v->backend_id, now);
			}
			kp_ct_forget(&p->tuple, v);
			row = NULL;
		}
	}
	return row;
}

/* Whether a packet on a flow's reply tuple belongs to another connection: the flow has
 * expired (the kernel's conntrack would have dropped it), or the packet answers another
 * client SYN than the flow's. A client that reuses its source port toward the backend
 * directly makes exactly that tuple: the kernel picks ephemeral ports per destination, so
 * within an ended flow's 120 s it happens as soon as a client connects at some rate (the
 * benchmark's crr to pod IPs right after one through the Service stalled on it), and it may
 * meet a flow never answered too. A flow opened by a SYN knows the client's ISN: a SYN-ACK,
 * or the first reply at all (a SYN-ACK or a RST refusing it), is the flow's only if it
 * acknowledges that SYN. A flow without (opened mid-stream, or carried over from kp_ct4_v1)
 * falls back to the flow's state: a SYN-ACK after the flow was answered and has ended is
 * another connection's; on a live flow it is the backend repeating itself, and a flow's first
 * reply is its own (a reopened flow's row is fresh, and a late FIN or RST of the connection
 * before it, overtaken by the new SYN on another CPU, may have marked it ended already). */
static __always_inline bool kp_reply_is_another(const struct kp_pkt *p,
						const struct kp_ct_val *v, __u64 now)
{
	__u64 life = v->life;

	if (now > kp_ct_expires(life))
		return true;
	if (p->tuple.proto != IPPROTO_TCP)
		return false;
	if (kp_ct_flags(life) & KP_CT_F_ISN) {
		if ((p->tcp_flags & KP_TCP_SYN) ||
		    (!kp_ct_seen_reply(life) && (p->tcp_flags & KP_TCP_ACK)))
			return !kp_ct_acks_syn(v, p->tcp_ack);
		return false;
	}
	return (p->tcp_flags & KP_TCP_SYN) && kp_ct_state(life) >= KP_CT_CLOSING &&
	       kp_ct_seen_reply(life);
}

#endif
