/* lib/ct.h: connection tracking for the TC path (kp_ct4 + kp_rnat4, both LRU).
 *
 * A flow is keyed by its original tuple (client -> frontend). kp_rnat4 maps the tuple its
 * replies carry (backend -> client, or backend -> SNAT address:port) back to that key, so one
 * lookup finds a reply's flow. Only the programs write these maps (the agent reads them and
 * deletes entries of removed backends); each row is copied to the stack once and written back
 * whole, never field by field, so a concurrent reader sees an old or a new row, not a mix.
 *
 * Timeouts follow the kernel's conntrack (kproxy.h enum kp_ct_timeouts); an entry's expiry is
 * rewritten at most once per KP_CT_REFRESH_S so a busy flow does not write on every packet.
 */
#ifndef KPROXY_LIB_CT_H
#define KPROXY_LIB_CT_H

#include <uapi/linux/in.h>
#include "maps.h"

#define KP_TCP_FIN 0x01
#define KP_TCP_SYN 0x02
#define KP_TCP_RST 0x04
#define KP_TCP_ACK 0x10

static __always_inline __u64 kp_ct_lifetime(__u8 proto, __u8 state)
{
	__u64 s;

	if (proto == IPPROTO_UDP)
		s = state == KP_CT_ESTABLISHED ? KP_CT_UDP_STREAM_S : KP_CT_UDP_S;
	else if (state == KP_CT_ESTABLISHED)
		s = KP_CT_TCP_EST_S;
	else if (state == KP_CT_CLOSING)
		s = KP_CT_TCP_CLOSING_S;
	else if (state == KP_CT_CLOSED)
		s = KP_CT_TCP_CLOSED_S;
	else
		s = KP_CT_TCP_NEW_S;
	return s * KP_NSEC_PER_SEC;
}

/* A client SYN on an entry whose connection has ended opens a new connection (as the kernel
 * treats a SYN in TIME_WAIT): the flow is load-balanced anew. */
static __always_inline bool kp_ct_reopens(__u8 proto, __u8 flags, const struct kp_ct4_val *v)
{
	return proto == IPPROTO_TCP && (flags & (KP_TCP_SYN | KP_TCP_ACK)) == KP_TCP_SYN &&
	       v->state >= KP_CT_CLOSING;
}

/* Advances *v for one packet (reply: from the backend) and writes the row back if its state
 * changed or its expiry moved by more than KP_CT_REFRESH_S. */
static __always_inline void kp_ct_track(struct kp_ct4_key *key, struct kp_ct4_val *v,
					__u8 tcp_flags, bool reply, __u64 now, bool fresh)
{
	__u8 state = v->state;
	__u8 flags = v->flags;
	__u64 expires;

	if (key->proto == IPPROTO_TCP) {
		if (tcp_flags & KP_TCP_RST)
			state = KP_CT_CLOSED;
		else if (tcp_flags & KP_TCP_FIN) {
			if (state < KP_CT_CLOSING)
				state = KP_CT_CLOSING;
			if (!reply)
				flags |= KP_CT_F_FIN_ORIG;
			else if (!(flags & KP_CT_F_FIN_REPLY))
				flags |= KP_CT_F_FIN_REPLY |
					 (flags & KP_CT_F_FIN_ORIG ? 0 : KP_CT_F_REPLY_FIRST);
		} else if (!reply && (tcp_flags & KP_TCP_ACK) &&
			   (flags & (KP_CT_F_FIN_ORIG | KP_CT_F_FIN_REPLY)) ==
				   (KP_CT_F_FIN_ORIG | KP_CT_F_FIN_REPLY)) {
			/* the client's ACK of the backend's FIN: the backend leaves LAST_ACK */
			flags |= KP_CT_F_LAST_ACK;
		} else if (reply && state == KP_CT_NEW)
			state = KP_CT_ESTABLISHED;
	} else if (reply && state == KP_CT_NEW) {
		state = KP_CT_ESTABLISHED;
	}
	expires = now + kp_ct_lifetime(key->proto, state);
	if (!fresh && state == v->state && flags == v->flags && (reply ? 1 : 0) <= v->seen_reply &&
	    expires - v->expires < KP_CT_REFRESH_S * KP_NSEC_PER_SEC)
		return;
	v->state = state;
	v->flags = flags;
	v->expires = expires;
	if (reply)
		v->seen_reply = 1;
	kp_ct4.update(key, v);
}

/* Whether the SNAT reply tuple rkey, which kp_rnat4 maps to the flow `orig`, may be given to a
 * new flow: the flow no longer owns it (its row is gone, or names another SNAT port or
 * backend: it was reopened), it has expired, or its connection has ended with no state left on
 * the backend that a new SYN on the same tuple could meet. That is a RST (the backend's socket
 * is gone), or FINs both ways with the client's first and the client's ACK of the backend's
 * FIN passed: the backend closed second, so it went through LAST_ACK to CLOSED and holds no
 * TIME_WAIT (before that ACK it is still in LAST_ACK, where a new SYN on the tuple gets a
 * challenge ACK and the client's connect waits for its 1 s retransmit), KP_SNAT_REUSE_S ago at
 * least. When the backend closed first it holds the tuple in TIME_WAIT (60 s in Linux), where a SYN whose sequence number and timestamp do not
 * move past the old connection's is answered with an ACK for that one: the client resets it and
 * retransmits a second later. Such a port waits for the row to expire (KP_CT_TCP_CLOSING_S, the
 * kernel's conntrack time_wait, during which conntrack keeps a tuple taken too). */
static __always_inline bool kp_rnat_reusable(const struct kp_ct4_key *rkey,
					     const struct kp_ct4_key *orig, __u64 now)
{
	struct kp_ct4_val *row = kp_ct4.lookup((struct kp_ct4_key *)orig);
	struct kp_ct4_val v;

	if (!row)
		return true;
	v = *row;
	if (!(v.flags & KP_CT_F_SNAT) || v.nat_addr != rkey->daddr || v.nat_port != rkey->dport ||
	    v.be_addr != rkey->saddr || v.be_port != rkey->sport || now > v.expires)
		return true;
	if (orig->proto != IPPROTO_TCP)
		return false;
	if (v.state != KP_CT_CLOSED &&
	    (v.flags & (KP_CT_F_FIN_ORIG | KP_CT_F_FIN_REPLY | KP_CT_F_REPLY_FIRST |
			KP_CT_F_LAST_ACK)) !=
		    (KP_CT_F_FIN_ORIG | KP_CT_F_FIN_REPLY | KP_CT_F_LAST_ACK))
		return false;
	/* Ended, but its last packet may not have reached the backend yet: it passed this node
	 * when the row was last written (expires = then + the state's lifetime). Packets of one
	 * tuple sent from two CPUs can be handled in parallel at the backend; a SYN that meets the
	 * socket the ACK (or RST) is closing at that moment is dropped without an answer (seen in
	 * the lab: ACK and SYN 2 us apart, the connect timed out). */
	return now + kp_ct_lifetime(orig->proto, v.state) >=
	       v.expires + KP_SNAT_REUSE_S * KP_NSEC_PER_SEC;
}

/* The reply tuple of a flow: what the backend sends back. */
static __always_inline void kp_ct_reply_key(const struct kp_ct4_key *orig,
					    const struct kp_ct4_val *v, struct kp_ct4_key *out)
{
	out->saddr = v->be_addr;
	out->sport = v->be_port;
	out->proto = orig->proto;
	if (v->flags & KP_CT_F_SNAT) {
		out->daddr = v->nat_addr;
		out->dport = v->nat_port;
	} else {
		out->daddr = orig->saddr;
		out->dport = orig->sport;
	}
}

#endif
