/* lib/flowcount.h: least connection's count of the TC path's flows (issue 46).
 *
 * A flow of a least-conn frontend is marked KP_CT_F_COUNTED in its kp_ct row when the row is
 * made, and adds 1 to its backend's kp_conns.flows_open (and its load). Its end adds 1 to
 * flows_done (and takes 1 from the load), once:
 * on the CPU whose compare-and-swap of the row's life word moves it to CLOSING or CLOSED (a
 * FIN or RST), or clears the mark (the tuple re-balanced while the flow was live). Both
 * counters only grow, so no interleaving of CPUs makes them wrong; what they cannot see is a
 * flow that ends without a packet: expiry, LRU eviction, the agent's purge, or a row
 * overwritten before its mark was cleared. For those the agent keeps kp_flowfix[index] =
 * open - done - (counted rows live in kp_ct), recomputed from the table every few seconds
 * (datapath/flows/flow_fix.py), so a missed close is wrong for one period and never adds up.
 *
 * Other frontends pay a test of a bit of the row they already hold, nothing more.
 */
#ifndef KPROXY_LIB_FLOWCOUNT_H
#define KPROXY_LIB_FLOWCOUNT_H

#include "conns.h"

/* The mark a new flow's row gets: least-conn frontends' flows only. */
static __always_inline __u8 kp_flow_mark(__u8 fe_flags)
{
	return fe_flags & KP_FE_F_LEAST_CONN ? KP_CT_F_COUNTED : 0;
}

static __always_inline bool kp_flow_live(__u64 life)
{
	return (life & KP_CT_F_COUNTED) &&
	       ((life >> KP_CT_LIFE_STATE_SHIFT) & KP_CT_LIFE_STATE) < KP_CT_CLOSING;
}

static __always_inline void kp_flow_done(__u32 backend_id)
{
	__u32 ix;
	struct kp_conns *row = kp_conns_row(backend_id, &ix);

	if (row) {   /* none: the agent freed the id, there is nothing left to count in */
		__sync_fetch_and_add(&row->flows_done, 1);
		kp_conns_add(ix, -1);
	}
}

/* A new row's life word, written whole by the caller: a flow whose first packet already
 * ends it (a SYN with RST or FIN) is not counted at all. */
static __always_inline __u64 kp_flow_fresh(__u64 life)
{
	return kp_flow_live(life) ? life : life & ~(__u64)KP_CT_F_COUNTED;
}

/* After the new row is written: its open. */
static __always_inline void kp_flow_opened(__u64 life, __u32 backend_id)
{
	if (life & KP_CT_F_COUNTED)
		kp_conns_flow_open(backend_id);
}

/* After this CPU's compare-and-swap took the row's life from old to next: the flow's end,
 * counted by the one swap that crosses into CLOSING/CLOSED (states only move forward). */
static __always_inline void kp_flow_swapped(__u64 old, __u64 next, __u32 backend_id)
{
	if (kp_flow_live(old) && !kp_flow_live(next))
		kp_flow_done(backend_id);
}

/* A live flow's row about to be replaced by a new flow on its tuple (a reopen, a removed
 * backend): its end is counted by whichever CPU clears the mark. An expired row counts
 * nothing here: the agent's repair already took it out (it counts live rows only), and
 * counting it again would take it out twice. A lost swap leaves the end to the repair. */
static __always_inline void kp_flow_replaced(struct kp_ct_val *row, __u64 life, __u32 backend_id,
					     __u64 now)
{
	__u64 expires = life & ~((1ULL << KP_CT_LIFE_TIME_SHIFT) - 1);

	if (!kp_flow_live(life) || now > expires)
		return;
	if (__sync_val_compare_and_swap(&row->life, life, life & ~(__u64)KP_CT_F_COUNTED) == life)
		kp_flow_done(backend_id);
}

#endif
