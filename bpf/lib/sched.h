/* lib/sched.h: the schedulers IPVS had, for a frontend whose slot 0 asks for one
 * (kproxy-ebpf.io/lb-algorithm): round robin and least connection. Random and Maglev stay
 * in lib/lb.h's kp_lb_pick, which calls these.
 *
 * Round robin keeps one cursor per frontend (kp_rr) that every CPU advances with an atomic
 * fetch-and-add: n consecutive connects, on any CPUs, take n consecutive positions, so over
 * k x count of them each slot gets exactly k. A connect racing the agent's rewrite of a
 * frontend may pair the new count with the old cursor (the agent writes the cursor right
 * after slot 0): that one connect lands out of turn, the next follow the new rotation.
 *
 * Least connection reads each slot's backend's count (kp_connload less kp_flowfix): the
 * sockets connected to it from this node (counted by sock_lb.c from connect to close) and
 * the TC path's flows open to it (lib/conns.h kp_conns_load). It
 * takes the first slot with the fewest, starting from a random slot so that ties spread.
 */
#ifndef KPROXY_LIB_SCHED_H
#define KPROXY_LIB_SCHED_H

#include "maps.h"
#include "stats.h"
#include "conns.h"

/* The slot (1..count) after the frontend's last round-robin pick; at random when its cursor
 * is missing (not written yet), which is what the frontend did before it asked for one. */
static __always_inline __u16 kp_rr_pick(const struct kp_svc_key *fe, __u16 count, __u32 rnd)
{
	struct kp_svc_key key = *fe;
	struct kp_rr_val *row;
	__u64 n;

	key.slot = 0;
	row = kp_rr.lookup(&key);
	if (!row) {
		kp_count(KP_STAT_RR_NO_CURSOR);
		return (rnd % count) + 1;
	}
	n = __sync_fetch_and_add(&row->next, 1);
	return (n % count) + 1;
}

/* One step of a least-conn scan: s->best becomes slot if its backend has fewer connections
 * than s->least. Without a branch on the counts: the verifier then sees two paths per slot
 * (row there or not) that meet again, not a tree of comparisons it walks to every leaf. */
struct kp_lc_scan {
	__u64 best;             /* the slot, 0 until one was read */
	__s64 least;
};

static __always_inline void kp_lc_step(const __u32 *conn, __u32 mask, __u32 idx, __u16 slot,
				       struct kp_lc_scan *s)
{
	__s64 n, diff, take;
	__u32 ix;

	ix = conn[idx & mask];          /* idx < count <= the row's count; the mask keeps it
					 * inside the value for the verifier */
	n = kp_conns_load(ix);
	n &= ~(n >> 63);                /* below zero (a repair racing a close) as zero */
	diff = n - s->least;
	asm volatile("" : "+r"(diff));  /* so that clang keeps the sign test below as arithmetic */
	take = diff >> 63;              /* all ones when n < least */
	s->best = (s->best & ~take) | (slot & take);
	s->least = (s->least & ~take) | (n & take);
}

/* The slot whose backend has the fewest connections among up to KP_LC_SCAN slots from a
 * random one, read from the frontend's row of counters: the kp_lcrow row its slot 0 names
 * (an array lookup: at most KP_LC_ROW backends), else its kp_lcids row (one hashed lookup),
 * then the counters. Without a row for at least `count` slots (not written yet, a stale row
 * from before backends were added, more than KP_LC_IDS backends): at random. Unrolled by
 * hand: as a loop, clang folds its two bounds into one counter the verifier cannot bound. */
static __always_inline __u16 kp_lc_pick(const struct kp_svc_key *fe, const struct kp_svc_val *svc,
					__u32 rnd, __u32 *conn_ix)
{
	struct kp_lc_scan s = {0, 0x7fffffffffffffffLL};
	__u16 count = svc->count;
	__u16 first = rnd % count;
	const __u32 *conn;
	__u32 idx, mask;

	if (svc->backend_id) {
		__u32 at = svc->backend_id;
		struct kp_lc_row *row = kp_lcrow.lookup(&at);

		if (!row || row->count < count)
			goto none;
		conn = row->conn;
		mask = KP_LC_ROW;
	} else {
		struct kp_svc_key key = *fe;
		struct kp_lc_ids *ids;

		key.slot = 0;
		ids = kp_lcids.lookup(&key);
		if (!ids || ids->count < count)
			goto none;
		conn = ids->conn;
		mask = KP_LC_IDS - 1;
	}
#define KP_LC_STEP(i) \
	if ((i) >= count) \
		goto out; \
	idx = first + (i); \
	idx -= count & -(__u32)(idx >= count);  /* < 2 x count: a wrap without a division */ \
	kp_lc_step(conn, mask, idx, idx + 1, &s);
#define KP_LC_STEP8(i) KP_LC_STEP(i) KP_LC_STEP(i + 1) KP_LC_STEP(i + 2) KP_LC_STEP(i + 3) \
	KP_LC_STEP(i + 4) KP_LC_STEP(i + 5) KP_LC_STEP(i + 6) KP_LC_STEP(i + 7)
	KP_LC_STEP8(0) KP_LC_STEP8(8) KP_LC_STEP8(16) KP_LC_STEP8(24)
#undef KP_LC_STEP8
#undef KP_LC_STEP
	_Static_assert(KP_LC_SCAN == 32, "KP_LC_SCAN: the steps above");
out:
	/* The chosen slot's counter, as this row names it: the one the socket is counted on
	 * (lib/conns.h kp_conns_tag). */
	*conn_ix = s.best ? conn[(s.best - 1) & mask] : 0;
	return s.best;
none:
	kp_count(KP_STAT_LC_NO_IDS);
	return first + 1;
}

#endif
