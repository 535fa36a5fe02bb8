/* lib/stats.h: the programs' own counters (per-CPU array, summed by the agent and the CLI), and
 * the per-Service ones (kproxy.h, kp_svc_stat). */
#ifndef KPROXY_LIB_STATS_H
#define KPROXY_LIB_STATS_H

#include "maps.h"

static __always_inline void kp_count(__u32 idx)
{
	__u64 *v = kp_stats.lookup(&idx);

	if (v)
		*v += 1;
}

/* This CPU's counters of service port svc_id for frontends of `scope` (enum kp_scope), its
 * row created by the first event (from kp_svczero's zeroes). NULL for id 0 or a full map: the
 * event goes uncounted there, and the programs' verdicts never depend on it. Per-CPU values
 * need no atomic add. */
static __always_inline struct kp_svc_stat *kp_svc_stat(__u32 svc_id, __u8 scope)
{
	struct kp_svcstat_key key = {};
	struct kp_svc_stat *st;
	struct kp_svc_stat *zero;
	__u32 first = 0;

	if (!svc_id)
		return NULL;
	key.svc_id = svc_id;
	key.scope = scope;
	st = kp_svcstat.lookup(&key);
	if (st)
		return st;
	zero = kp_svczero.lookup(&first);
	if (!zero)
		return NULL;
	kp_svcstat.insert(&key, zero);
	return kp_svcstat.lookup(&key);
}

static __always_inline void kp_svc_conn(__u32 svc_id, __u8 scope)
{
	struct kp_svc_stat *st = kp_svc_stat(svc_id, scope);

	if (st)
		st->conns += 1;
}

/* A TC packet of a flow, toward the backend or a reply back from it. */
static __always_inline void kp_svc_packet(__u32 svc_id, __u8 scope, bool reply, __u32 len)
{
	struct kp_svc_stat *st = kp_svc_stat(svc_id, scope);

	if (!st)
		return;
	if (reply) {
		st->reply_packets += 1;
		st->reply_bytes += len;
	} else {
		st->packets += 1;
		st->bytes += len;
	}
}

enum kp_svc_refusal { KP_SVC_REFUSED, KP_SVC_DROPPED, KP_SVC_DENIED };

static __always_inline void kp_svc_refusal(__u32 svc_id, __u8 scope, enum kp_svc_refusal why)
{
	struct kp_svc_stat *st = kp_svc_stat(svc_id, scope);

	if (!st)
		return;
	if (why == KP_SVC_DROPPED)
		st->dropped += 1;
	else if (why == KP_SVC_DENIED)
		st->denied += 1;
	else
		st->refused += 1;
}

#endif
