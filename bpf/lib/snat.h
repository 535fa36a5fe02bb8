/* lib/snat.h: SNAT for the TC path: the configured address and port range (kp_tccfg), and
 * the search for a source port no other flow to the backend uses (kp_rnat holds the reply
 * tuples, so a port is taken by inserting its row), including the reuse of ended flows' ports.
 */
#ifndef KPROXY_LIB_SNAT_H
#define KPROXY_LIB_SNAT_H

#include <uapi/linux/in.h>
#include "../kproxy.h"
#include "endian.h"
#include "ip.h"
#include "maps.h"
#include "stats.h"
#include "ct.h"

/* What one packet needs of kp_tccfg: the SNAT address of its family (zero: none configured)
 * and the port range. Field by field off the row: the agent rewrites it whole, and an old
 * address with new ports (or the reverse) is a valid configuration too. Kept small, as the
 * packet's 40-byte tuples leave little of the 512-byte stack. */
struct kp_snat_cfg {
	struct kp_ip addr;
	__u16 port_min;
	__u16 port_max;
	__u16 ncpus;
};

static __always_inline struct kp_snat_cfg kp_snat_config(__u8 family)
{
	struct kp_snat_cfg cfg = {};
	struct kp_tc_cfg *c;
	__u32 zero = 0;

	c = kp_tccfg.lookup(&zero);
	if (c) {
		cfg.addr = family == 6 ? c->snat_addr6 : c->snat_addr4;
		cfg.port_min = c->port_min;
		cfg.port_max = c->port_max;
		cfg.ncpus = c->ncpus;
	}
	return cfg;
}

/* Whether the SNAT reply tuple rkey, which kp_rnat maps to the flow `orig`, may be given to a
 * new flow: the flow no longer owns it (its row is gone, or names another SNAT port or
 * backend: it was reopened), it has expired, or its connection has ended with no state left on
 * the backend that a new SYN on the same tuple could meet. That is a RST (the backend's socket
 * is gone), or FINs both ways with the client's first and the client's ACK of the backend's
 * FIN passed: the backend closed second, so it went through LAST_ACK to CLOSED and holds no
 * TIME_WAIT (before that ACK it is still in LAST_ACK, where a new SYN on the tuple gets a
 * challenge ACK and the client's connect waits for its 1 s retransmit), KP_SNAT_REUSE_S ago at
 * least. When the backend closed first it holds the tuple in TIME_WAIT (60 s in Linux), where
 * a SYN whose sequence number and timestamp do not move past the old connection's is answered
 * with an ACK for that one: the client resets it and retransmits a second later. Such a port
 * waits for the row to expire (KP_CT_TCP_CLOSING_S, the kernel's conntrack time_wait, during
 * which conntrack keeps a tuple taken too). */
static __always_inline bool kp_rnat_reusable(const struct kp_ct_key *rkey,
					     const struct kp_ct_key *orig, __u64 now)
{
	struct kp_ct_val *row = kp_ct.lookup((struct kp_ct_key *)orig);
	struct kp_ct_val v;
	__u8 flags;
	__u8 state;

	if (!row)
		return true;
	v = *row;
	flags = kp_ct_flags(v.life);
	state = kp_ct_state(v.life);
	if (!(flags & KP_CT_F_SNAT) || !kp_ip_eq(&v.nat_addr, &rkey->daddr) ||
	    v.nat_port != rkey->dport || !kp_ip_eq(&v.be_addr, &rkey->saddr) ||
	    v.be_port != rkey->sport || now > kp_ct_expires(v.life))
		return true;
	if (orig->proto != IPPROTO_TCP)
		return false;
	if (state != KP_CT_CLOSED &&
	    (flags & (KP_CT_F_FIN_ORIG | KP_CT_F_FIN_REPLY | KP_CT_F_REPLY_FIRST |
		      KP_CT_F_LAST_ACK)) !=
		    (KP_CT_F_FIN_ORIG | KP_CT_F_FIN_REPLY | KP_CT_F_LAST_ACK))
		return false;
	/* Ended, but its last packet may not have reached the backend yet: it passed this node
	 * when the row was last written (expires = then + the state's lifetime). Packets of one
	 * tuple sent from two CPUs can be handled in parallel at the backend; a SYN that meets the
	 * socket the ACK (or RST) is closing at that moment is dropped without an answer (seen in
	 * the lab: ACK and SYN 2 us apart, the connect timed out). */
	return now + kp_ct_lifetime(orig->proto, state) >=
	       kp_ct_expires(v.life) + KP_SNAT_REUSE_S * KP_NSEC_PER_SEC;
}

/* Reserves a SNAT source port toward be:port: the reply tuple (backend -> addr:port) must be
 * unique, so a port whose kp_rnat key is free is taken with BPF_NOEXIST. addr is the node's
 * SNAT address, or the client's own for a flow whose reply tuple another flow holds (only
 * its port is moved then: kp_new_flow). A taken key whose
 * flow has ended (kp_rnat_reusable) is taken over by rewriting its row whole; only CPU c does
 * that, and only for the ports min + c + k * ncpus (its slice), so two new flows never take
 * over the same row (programs on one CPU do not interleave). Without this, every flow would
 * hold its port until the LRU map evicted the row: after a few thousand connections to one
 * backend the range is full of ended flows and new SYNs are dropped (KP_STAT_TC_SNAT_FULL).
 * Each of the KP_SNAT_TRIES rounds tries a port of this CPU's slice (free or reusable) and a
 * port anywhere in the range (free only), from random starts. Returns 0 and sets v->nat_*. */
static __always_inline int kp_snat_alloc(struct kp_ct_key *orig, struct kp_ct_val *v,
					 const struct kp_snat_cfg *cfg, const struct kp_ip *addr,
					 struct kp_ct_key *rkey, __u64 now)
{
	struct kp_ct_key held;
	struct kp_ct_key *o;
	__u32 span = (__u32)cfg->port_max - cfg->port_min + 1;
	__u32 ncpus = cfg->ncpus;
	__u32 cpu = bpf_get_smp_processor_id();
	__u32 slots = ncpus && cpu < ncpus && cpu < span ? (span - cpu + ncpus - 1) / ncpus : 0;
	__u32 own = bpf_get_prandom_u32();
	__u32 any = bpf_get_prandom_u32();
	__u32 off;
	int i;

	if (kp_ip_is_zero(addr) || cfg->port_max < cfg->port_min)
		return -1;
	rkey->saddr = v->be_addr;
	rkey->sport = v->be_port;
	rkey->daddr = *addr;
	rkey->proto = orig->proto;
	for (i = 0; i < KP_SNAT_TRIES; i++) {
		if (slots) {
			off = cpu + ncpus * ((own + i) % slots);
			rkey->dport = kp_htons(cfg->port_min + off);
			if (kp_rnat.insert(rkey, orig) == 0)
				goto taken;
			o = kp_rnat.lookup(rkey);
			if (o) {
				held = *o;
				if (kp_rnat_reusable(rkey, &held, now) &&
				    kp_rnat.update(rkey, orig) == 0) {
					kp_count(KP_STAT_TC_SNAT_REUSE);
					goto taken;
				}
			}
		}
		rkey->dport = kp_htons(cfg->port_min + (any + i) % span);
		if (kp_rnat.insert(rkey, orig) == 0)
			goto taken;
	}
	return -1;
taken:
	v->nat_addr = *addr;
	v->nat_port = rkey->dport;
	return 0;
}

/* Whether the reply tuple rkey (backend -> client) of a new flow without SNAT is another live
 * flow's: the client used one source port toward two frontends that lead to one backend (two
 * NodePorts of a Service, say; a client may, as the destinations differ). The two connections
 * would be one to the backend. Linux's NAT moves the second one's source port then (nf_nat's
 * null binding takes a unique tuple: kube-proxy's connections both work); kp_new_flow does the
 * same. The flow that holds rkey has the same client tuple and another frontend; it holds it
 * until it expires or is reset (a FIN leaves the tuple in the backend's TIME_WAIT). */
static __always_inline bool kp_reply_held(const struct kp_ct_key *rkey,
					  const struct kp_ct_key *orig, __u64 now)
{
	struct kp_ct_key *o = kp_rnat.lookup((struct kp_ct_key *)rkey);
	struct kp_ct_key held;
	struct kp_ct_val *row;
	struct kp_ct_val v;

	if (!o)
		return false;
	held = *o;
	if (kp_ip_eq(&held.daddr, &orig->daddr) && held.dport == orig->dport)
		return false;           /* this very flow, opened anew */
	row = kp_ct.lookup(&held);
	if (!row)
		return false;
	v = *row;
	return !(kp_ct_flags(v.life) & KP_CT_F_SNAT) && kp_ip_eq(&v.be_addr, &rkey->saddr) &&
	       v.be_port == rkey->sport && now <= kp_ct_expires(v.life) &&
	       kp_ct_state(v.life) != KP_CT_CLOSED;
}

/* Whether a packet to the SNAT address can be the reply of a SNAT flow (a remote EXT
 * backend's, or a pod's hairpin): its destination port is one kp_snat_alloc gives out. A
 * request to a NodePort on the same address (30000-32767 by default, below the range) skips
 * that kp_rnat lookup. */
static __always_inline bool kp_snat_port(const struct kp_snat_cfg *cfg, __be16 dport)
{
	__u16 port = kp_ntohs(dport);

	return port >= cfg->port_min && port <= cfg->port_max;
}

#endif
