/* lib/fib.h: a rewritten packet sent by route (bpf_fib_lookup) straight to its device, past
 * the stack.
 */
#ifndef KPROXY_LIB_FIB_H
#define KPROXY_LIB_FIB_H

#include "../kproxy.h"
#include "parse.h"

/* The kernel's signature (ifindex, params, plen, flags): bcc 0.26 declares three arguments,
 * which would leave the fourth register unset. */
static long (*kp_redirect_neigh)(__u32 ifindex, void *params, int plen, __u64 flags) =
	(void *)BPF_FUNC_redirect_neigh;

/* Sends a rewritten packet straight to the device the route names. Needed whenever the new
 * source is an address of this node (SNAT, or a reply now coming from a NodePort): handed to
 * the stack at ingress such a packet would be dropped as a martian (local source). */
static __always_inline int kp_redirect(struct __sk_buff *skb, const struct kp_pkt *p)
{
	struct bpf_fib_lookup fib = {};
	int rc;

	fib.l4_protocol = p->tuple.proto;
	fib.sport = p->tuple.sport;
	fib.dport = p->tuple.dport;
	if (p->family == 6) {
		fib.family = KP_AF_INET6;
		__builtin_memcpy(fib.ipv6_src, p->tuple.saddr.w, sizeof(fib.ipv6_src));
		__builtin_memcpy(fib.ipv6_dst, p->tuple.daddr.w, sizeof(fib.ipv6_dst));
	} else {
		fib.family = KP_AF_INET;
		fib.ipv4_src = p->tuple.saddr.w[3];
		fib.ipv4_dst = p->tuple.daddr.w[3];
	}
	fib.ifindex = skb->ingress_ifindex ? skb->ingress_ifindex : skb->ifindex;
	rc = bpf_fib_lookup(skb, &fib, sizeof(fib), 0);
	if (rc != BPF_FIB_LKUP_RET_SUCCESS && rc != BPF_FIB_LKUP_RET_NO_NEIGH)
		return -1;
	return kp_redirect_neigh(fib.ifindex, NULL, 0, 0);
}

#endif
