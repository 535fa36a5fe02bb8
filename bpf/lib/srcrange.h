/* lib/srcrange.h: loadBalancerSourceRanges, for packets from outside the node (tc_lb.c) and for
 * sockets on it (sock_lb.c, which finds the source with sock_source first).
 *
 * kube-proxy (v1.36 pkg/proxy/nftables/proxier.go, chain firewall-check, jumped to with
 * "ct state new" from filter prerouting and output before DNAT, so for pods and the node's own
 * processes as well) drops a NEW connection to an LB ingress IP frontend whose source is in
 * none of the Service's ranges; NodePorts, ExternalIPs and the
 * ClusterIP are not filtered, and a flow already tracked keeps going after a range change.
 * The agent writes the ranges (plus the LB IPs themselves when a range holds the node's IP,
 * kube-proxy's allowFromNode) into kp_srcrange and sets KP_FE_F_SRC_RANGES in the frontend's
 * slot 0, so a frontend without ranges costs no trie lookup.
 *
 * bcc rewrites map operations only in the main source (datapath/source.py inlines this file).
 */
#ifndef KPROXY_LIB_SRCRANGE_H
#define KPROXY_LIB_SRCRANGE_H

#include "maps.h"

/* The trie key that finds a range of frontend fe holding saddr (a whole address). */
static __always_inline struct kp_srcrange_key kp_srcrange_key(const struct kp_svc_key *fe,
							      struct kp_ip saddr)
{
	struct kp_srcrange_key key = {
		.prefixlen = KP_SRCRANGE_FE_BITS + 128, .fe_addr = fe->addr, .fe_port = fe->port,
		.proto = fe->proto, .scope = fe->scope,
		.saddr = saddr,
	};

	return key;
}

/* Whether a new flow from saddr may use frontend fe (the rows of fe's own scope), given its
 * slot 0's fe_flags. */
static __always_inline bool kp_srcrange_allows(const struct kp_svc_key *fe, __u8 fe_flags,
					       struct kp_ip saddr)
{
	struct kp_srcrange_key key;

	if (!(fe_flags & KP_FE_F_SRC_RANGES))
		return true;
	key = kp_srcrange_key(fe, saddr);
	return kp_srcrange.lookup(&key) != NULL;
}

#endif
