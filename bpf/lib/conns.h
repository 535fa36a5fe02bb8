/* lib/conns.h: least connection's counters (kproxy.h kp_connload, struct kp_conns): where a
 * backend's is, what it holds, and the tag a socket counted on one keeps. The socket hooks
 * count sockets (lib/sockconn.h), the TC path flows (lib/flowcount.h), the scan reads them
 * (lib/sched.h).
 */
#ifndef KPROXY_LIB_CONNS_H
#define KPROXY_LIB_CONNS_H

#include "maps.h"

/* What a socket remembers of the counter it is counted on: the index in the low 16 bits, the
 * gen it had then in the high 16 (a gen is never 0, so neither is a tag). */
static __always_inline __u32 kp_conn_tag(__u32 ix, __u64 word)
{
	return ((__u32)(word >> KP_LOAD_GEN_SHIFT) << 16) | (ix & 0xffff);
}

/* A kp_connload word's count (sockets plus flows open and not ended). */
static __always_inline __s64 kp_load_count(__u64 word)
{
	return (__s64)(word & KP_LOAD_COUNT) - (__s64)KP_LOAD_BIAS;
}

/* Adds d to the count of the counter at ix. */
static __always_inline void kp_conns_add(__u32 ix, __s64 d)
{
	__u64 *word = kp_connload.lookup(&ix);

	if (word)
		__sync_fetch_and_add(word, d);
}

/* Counts one socket on the counter `tag` names; returns the tag of what it was counted on:
 * the gen the add met, which is the tag's unless the agent handed the index to another
 * backend since the caller read it (then the socket is that holder's to take back, and is). */
static __always_inline __u32 kp_conn_count(__u32 tag)
{
	__u32 ix = tag & 0xffff;
	__u64 *word = kp_connload.lookup(&ix);

	return word ? kp_conn_tag(ix, __sync_fetch_and_add(word, 1)) : 0;
}

/* Takes back one socket from the counter `tag` names, if the index still has that gen (else
 * it went to another backend since: nothing to take back from). The gen is read, and then
 * checked again in what the subtraction met: a new holder's word written in between gets its
 * count back at once. */
static __always_inline void kp_conn_untag(__u32 tag)
{
	__u32 ix = tag & 0xffff;
	__u64 *word = kp_connload.lookup(&ix);

	if (!word || *word >> KP_LOAD_GEN_SHIFT != tag >> 16)
		return;
	if (__sync_fetch_and_add(word, -1) >> KP_LOAD_GEN_SHIFT != tag >> 16)
		__sync_fetch_and_add(word, 1);
}

/* A backend's least-conn counter and its index (*ix), or NULL when the agent gave it none (no
 * least-conn frontend names it) or is handing its index to another. */
static __always_inline struct kp_conns *kp_conns_row(__u32 backend_id, __u32 *ix)
{
	__u32 *at = kp_connix.lookup(&backend_id);
	struct kp_conns *c;
	__u32 i;

	if (!at)
		return NULL;
	i = *at;
	c = kp_conns.lookup(&i);
	if (!c || c->backend_id != backend_id)
		return NULL;
	*ix = i;
	return c;
}

/* The tag to count a socket connected to backend_id on (0: none). `hint` is the index a
 * least-conn pick chose (kp_lb_res.conn_ix): its word is in cache from the scan, and taking
 * it reads nothing else. That index is the one the frontend's row (kp_lcrow or kp_lcids)
 * names for the chosen slot; should the slot rows be of a newer version than that row, the socket is counted
 * on the backend the row named, and its release takes back from that same counter, so
 * nothing drifts. Without a hint (an affinity hit): the backend's own counter, through
 * kp_connix. */
static __always_inline __u32 kp_conns_tag(__u32 backend_id, __u32 hint)
{
	__u64 *word;
	__u32 ix = hint;

	if (!hint && !kp_conns_row(backend_id, &ix))
		return 0;
	word = kp_connload.lookup(&ix);
	if (!word || !(*word >> KP_LOAD_GEN_SHIFT))
		return 0;       /* an index the agent has not handed out */
	return kp_conn_tag(ix, *word);
}

/* A new flow of a least-conn frontend to backend_id (the TC path's, an unconnected UDP
 * socket's): flows_open + 1 and its count + 1, if the agent gave the backend a counter. */
static __always_inline void kp_conns_flow_open(__u32 backend_id)
{
	struct kp_conns *row;
	__u32 ix;

	row = kp_conns_row(backend_id, &ix);
	if (row) {
		__sync_fetch_and_add(&row->flows_open, 1);
		kp_conns_add(ix, 1);
	}
}

/* A backend's connections as least-conn compares them: its count (sockets plus flows open
 * and not ended), less the agent's repair of ends no packet showed (kp_flowfix,
 * lib/flowcount.h), read only for a count above zero: a repair takes out flows that ended
 * unseen (its rare fix below zero, a done counted on a flow never opened, is one connection
 * fewer on a backend with none). Each array has 8-byte rows: the counters of a frontend's
 * backends, given indexes together, share cache lines. */
static __always_inline __s64 kp_conns_load(__u32 ix)
{
	__u64 *word = kp_connload.lookup(&ix);
	__s64 n = word ? kp_load_count(*word) : 0;
	__s64 *fix;

	if (n <= 0)
		return 0;
	fix = kp_flowfix.lookup(&ix);
	return n - (fix ? *fix : 0);
}

#endif
