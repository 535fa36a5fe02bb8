/* lib/servicecidr.h: what a connect/sendmsg to an address that is no frontend gets.
 *
 * kube-proxy's nftables mode (v1.36 pkg/proxy/nftables/proxier.go, chain cluster-ips-check)
 * rejects new connections to an allocated ClusterIP on a port the Service does not have, and
 * drops those to any other address inside a ServiceCIDR. The agent fills kp_cip with the
 * ClusterIPs it programs (KP_CIP_REJECT) and those of Services another proxy owns (KP_CIP_PASS),
 * and kp_svccidr with the ServiceCIDRs of both families. An empty trie (no ServiceCIDR listed)
 * drops nothing.
 *
 * Used by the socket hooks (sock_lb.c) and the per-packet ClusterIP path (tc_lb.c,
 * kp_from_pod), so a client sees the same answer on either path.
 */
#ifndef KPROXY_LIB_SERVICECIDR_H
#define KPROXY_LIB_SERVICECIDR_H

#include <uapi/linux/errno.h>
#include "../kproxy.h"
#include "maps.h"
#include "stats.h"

/* The trie key that finds the ServiceCIDR holding addr (a whole address: 128 bits). */
static __always_inline struct kp_cidr_key kp_servicecidr_key(struct kp_ip addr)
{
	struct kp_cidr_key key = { .prefixlen = 128, .addr = addr };

	return key;
}

/* cip: addr's kp_cip row or NULL; in_cidr: its kp_svccidr match or NULL (looked up
 * only when cip is NULL). 0: not ours to judge (the socket proceeds untouched); else the
 * negative errno: ECONNREFUSED for a port an allocated ClusterIP does not have (kube-proxy:
 * reject), EHOSTUNREACH at once for an unallocated address of a ServiceCIDR (kube-proxy: drop,
 * where the client waits for its own timeout; see docs/design/semantics.md). */
static __always_inline int kp_servicecidr_verdict(const struct kp_cip_val *cip,
						  const void *in_cidr)
{
	if (cip)
		return cip->action == KP_CIP_PASS ? 0 : -ECONNREFUSED;
	return in_cidr ? -EHOSTUNREACH : 0;
}

/* What an address no frontend matched gets: 0 (untouched), -ECONNREFUSED or -EHOSTUNREACH;
 * counted. */
static __always_inline int kp_servicecidr_unmatched(struct kp_ip addr)
{
	struct kp_cidr_key ckey = kp_servicecidr_key(addr);
	struct kp_cip_val *cip = kp_cip.lookup(&addr);
	int err = kp_servicecidr_verdict(cip, cip ? NULL : kp_svccidr.lookup(&ckey));

	if (err)
		kp_count(err == -ECONNREFUSED ? KP_STAT_CIP_REJECT : KP_STAT_CIDR_DROP);
	return err;
}

#endif
