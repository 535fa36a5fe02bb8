/* lib/stats.h: the programs' own counters (per-CPU array, summed by the agent and the CLI). */
#ifndef KPROXY_LIB_STATS_H
#define KPROXY_LIB_STATS_H

#include "maps.h"

static __always_inline void kp_count(__u32 idx)
{
	__u64 *v = kp_stats.lookup(&idx);

	if (v)
		*v += 1;
}

#endif
