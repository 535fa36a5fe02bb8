/* lib/ct.h: connection tracking for the TC path (kp_ct + kp_rnat, both LRU), both families
 * in one table: a tuple's addresses are struct kp_ip (lib/ip.h).
 *
 * A flow is keyed by its original tuple (client -> frontend). kp_rnat maps the tuple its
 * replies carry (backend -> client, or backend -> SNAT address:port) back to that key, so one
 * lookup finds a reply's flow. Only the programs write these maps (the agent reads them and
 * deletes entries of removed backends). A new or re-balanced flow's row is written whole
 * through the map; after that only its `life` word changes (expiry, state, flags), in place
 * with one compare-and-swap, so a concurrent reader sees an old or a new row, not a mix. Once,
 * when a TCP flow ends, its row is written whole again (kp_ct_track): see kp_ct_ended.
 *
 * Timeouts follow the kernel's conntrack (kproxy.h enum kp_ct_timeouts); an entry's expiry is
 * rewritten at most once per KP_CT_REFRESH_S so a busy flow does not write on every packet.
 */
#ifndef KPROXY_LIB_CT_H
#define KPROXY_LIB_CT_H

#include <uapi/linux/in.h>
#include "ip.h"
#include "maps.h"
#include "endian.h"
#include "flowcount.h"

/* kp_ct_val.life, field by field (kproxy.h enum kp_ct_life). */
static __always_inline __u64 kp_ct_expires(__u64 life)
{
	return life & ~((1ULL << KP_CT_LIFE_TIME_SHIFT) - 1);
}

static __always_inline __u8 kp_ct_state(__u64 life)
{
	return (life >> KP_CT_LIFE_STATE_SHIFT) & KP_CT_LIFE_STATE;
}

static __always_inline __u8 kp_ct_flags(__u64 life)
{
	return life & KP_CT_LIFE_FLAGS;
}

static __always_inline bool kp_ct_seen_reply(__u64 life)
{
	return life & KP_CT_LIFE_SEEN_REPLY;
}

static __always_inline __u64 kp_ct_life(__u64 expires, __u8 state, __u8 flags, bool seen_reply)
{
	return kp_ct_expires(expires) | (__u64)(state & KP_CT_LIFE_STATE) << KP_CT_LIFE_STATE_SHIFT |
	       (seen_reply ? KP_CT_LIFE_SEEN_REPLY : 0) | flags;
}

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

/* A client's SYN: the first packet of a TCP connection (a SYN-ACK is the backend's). */
static __always_inline bool kp_tcp_opens(__u8 proto, __u8 tcp_flags)
{
	return proto == IPPROTO_TCP && (tcp_flags & (KP_TCP_SYN | KP_TCP_ACK)) == KP_TCP_SYN;
}

/* A client SYN opens a new connection on an entry whose connection has ended (as the kernel
 * treats a SYN in TIME_WAIT), and on one never answered when its sequence number is not the
 * recorded ISN (a retransmitted SYN keeps it; the client gave that attempt up): the flow is
 * load-balanced anew. */
static __always_inline bool kp_ct_reopens(__u8 proto, __u8 tcp_flags, __be32 seq,
					  const struct kp_ct_val *v)
{
	__u8 state = kp_ct_state(v->life);

	if (!kp_tcp_opens(proto, tcp_flags))
		return false;
	return state >= KP_CT_CLOSING ||
	       (state == KP_CT_NEW && (kp_ct_flags(v->life) & KP_CT_F_ISN) && seq != v->isn);
}

/* Whether a TCP reply's acknowledgement number acknowledges the flow's SYN: ISN + 1, or a
 * little more when the SYN carried data that the backend took (TCP Fast Open). */
static __always_inline bool kp_ct_acks_syn(const struct kp_ct_val *v, __be32 ack)
{
	return (__u32)(kp_ntohl(ack) - kp_ntohl(v->isn) - 1) <= KP_CT_SYN_DATA_MAX;
}

/* What a flow's life word becomes after one packet (reply: from the backend). Unchanged when
 * neither state nor flags move and the expiry would move by less than KP_CT_REFRESH_S (a fresh
 * row always gets its expiry). */
static __always_inline __u64 kp_ct_next(__u8 proto, __u64 life, __u8 tcp_flags, bool reply,
					__u64 now, bool fresh)
{
	__u8 state = kp_ct_state(life);
	__u8 flags = kp_ct_flags(life);
	__u64 expires;
	__u64 next;

	if (proto == IPPROTO_TCP) {
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
	expires = now + kp_ct_lifetime(proto, state);
	next = kp_ct_life(expires, state, flags, kp_ct_seen_reply(life) || reply);
	/* Only the expiry differs (the word's low bits hold everything else): a refresh. */
	if (!fresh && !((next ^ life) & ((1ULL << KP_CT_LIFE_TIME_SHIFT) - 1)) &&
	    expires - kp_ct_expires(life) < KP_CT_REFRESH_S * KP_NSEC_PER_SEC)
		return life;
	return next;
}

/* Whether a TCP flow has ended: reset, or a FIN seen both ways (what may follow is the last
 * ACK and retransmissions). kp_ct_track then writes its row whole once more, as a new element
 * no lookup has marked: rows that only ever changed in place all stayed marked, and the LRU's
 * refills of free elements, which sort marked ones out under the list's lock, raised the TC
 * paths' connect p99 by ~20 us (docs/design/north-south.md "Conntrack in place"). */
static __always_inline bool kp_ct_ended(__u64 life)
{
	return kp_ct_state(life) == KP_CT_CLOSED ||
	       (kp_ct_flags(life) & (KP_CT_F_FIN_ORIG | KP_CT_F_FIN_REPLY)) ==
		       (KP_CT_F_FIN_ORIG | KP_CT_F_FIN_REPLY);
}

/* Tracks one packet of the flow `key` in *v. row NULL: a new or re-balanced flow, whose row
 * (v, filled by the caller) is written whole. Otherwise row is the map's element v was copied
 * from, and only its life word changes, in place: compared with the copy's and swapped, so
 * that two CPUs tracking the two directions of one flow at once (the FINs of a close) both
 * count; a lost round applies this packet on top of what the other CPU wrote. The swap that
 * ends a TCP flow is followed by a whole write of the same row (kp_ct_ended). A least-conn
 * flow's open and end are counted here (lib/flowcount.h). */
static __always_inline void kp_ct_track(struct kp_ct_key *key, struct kp_ct_val *row,
					struct kp_ct_val *v, __u8 tcp_flags, bool reply, __u64 now)
{
	__u64 old = v->life;
	__u64 next;
	__u64 cur;
	int i;

	if (!row) {
		v->life = kp_flow_fresh(kp_ct_next(key->proto, old, tcp_flags, reply, now, true));
		if (kp_ct.update(key, v) == 0)
			kp_flow_opened(v->life, v->backend_id);
		return;
	}
#pragma unroll
	for (i = 0; i < KP_CT_SWAP_TRIES; i++) {
		next = kp_ct_next(key->proto, old, tcp_flags, reply, now, false);
		if (next == old)
			break;
		cur = __sync_val_compare_and_swap(&row->life, old, next);
		if (cur == old) {
			kp_flow_swapped(old, next, v->backend_id);
			/* Same content, new element; only while row is still key's element: a
			 * client's SYN may have re-balanced the tuple on another CPU since (its
			 * port is free at once after a RST). */
			if (!kp_ct_ended(old) && kp_ct_ended(next) && kp_ct.lookup(key) == row) {
				v->life = next;
				kp_ct.update(key, v);
			}
			break;
		}
		old = cur;
	}
	v->life = next;
}

/* The reply tuple of a flow: what the backend sends back. */
static __always_inline void kp_ct_reply_key(const struct kp_ct_key *orig,
					    const struct kp_ct_val *v, struct kp_ct_key *out)
{
	out->saddr = v->be_addr;
	out->sport = v->be_port;
	out->proto = orig->proto;
	if (kp_ct_flags(v->life) & KP_CT_F_SNAT) {
		out->daddr = v->nat_addr;
		out->dport = v->nat_port;
	} else {
		out->daddr = orig->saddr;
		out->dport = orig->sport;
	}
}

#endif
