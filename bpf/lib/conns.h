/* lib/conns.h: least connection's counters (kproxy.h struct kp_conns, kp_connload): where a
 * backend's is, what it holds, and the tag a socket counted on one keeps. The socket hooks count sockets
 * (sock_lb.c), the TC path flows (lib/flowcount.h), the scan reads them (lib/sched.h).
 */
#ifndef KPROXY_LIB_CONNS_H
#define KPROXY_LIB_CONNS_H

#include "maps.h"

/* What a socket remembers of the counter it is counted on: the kp_conns index in the low 16
 * bits, the gen it had then in the high 16 (a gen is never 0, so neither is a tag). */
static __always_inline __u32 kp_conn_tag(__u32 ix, __u32 gen)
{
	return (gen << 16) | (ix & 0xffff);
}

/* Adds d to the load of the counter at ix (sockets plus open flows: what the scan reads). */
static __always_inline void kp_conns_add(__u32 ix, __s64 d)
{
	__s64 *load = kp_connload.lookup(&ix);

	if (load)
		__sync_fetch_and_add(load, d);
}

/* Takes back one socket from the counter `tag` names, if the index still has that gen (else
 * it went to another backend since: nothing to take back from). */
static __always_inline void kp_conn_untag(__u32 tag)
{
	__u32 ix = tag & 0xffff;
	struct kp_conns *c = kp_conns.lookup(&ix);

	if (c && c->gen == tag >> 16)
		kp_conns_add(ix, -1);
}

/* A backend's least-conn counter and its index in kp_conns (*ix), or NULL when the agent
 * gave it none (no least-conn frontend names it) or is handing its index to another. */
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

/* kp_conns_row, trying first the index a least-conn pick read (kp_lb_res.conn_ix): the row
 * is in cache from the scan, and no hashed lookup is needed when it is the backend's. */
static __always_inline struct kp_conns *kp_conns_at(__u32 backend_id, __u32 hint, __u32 *ix)
{
	struct kp_conns *c = hint ? kp_conns.lookup(&hint) : NULL;

	if (c && c->backend_id == backend_id) {
		*ix = hint;
		return c;
	}
	return kp_conns_row(backend_id, ix);
}

/* A new flow of a least-conn frontend to backend_id (the TC path's, an unconnected UDP
 * socket's): flows_open + 1 and its load + 1, if the agent gave the backend a counter. */
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

/* A backend's connections as least-conn compares them: its load (sockets plus flows open and
 * not ended), less the agent's repair of ends no packet showed (kp_flowfix, lib/flowcount.h).
 * Two arrays of 8-byte rows: the counters of a frontend's backends, given indexes together,
 * share cache lines. */
static __always_inline __s64 kp_conns_load(__u32 ix)
{
	__s64 *load = kp_connload.lookup(&ix);
	__s64 *fix = kp_flowfix.lookup(&ix);

	return (load ? *load : 0) - (fix ? *fix : 0);
}

#endif
