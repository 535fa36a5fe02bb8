/* lib/csum.h: one's-complement checksum arithmetic done in the program, without a helper call
 * (lib/rewrite.h, lib/icmp_reply.h).
 */
#ifndef KPROXY_LIB_CSUM_H
#define KPROXY_LIB_CSUM_H

#include "../kproxy.h"

/* The one's-complement difference a checksum sees when address `from` becomes `to` (what
 * bpf_csum_diff computes, here without a helper call): the sum of the new words and of the
 * old ones inverted, folded to 32 bits. An IPv4 address is its last word (the rest of an
 * IPv4-mapped address is the same on both sides and cancels out). */
static __always_inline __u64 kp_addr_diff(__u8 family, const struct kp_ip *from,
					  const struct kp_ip *to)
{
	__u64 sum = (__u32)~from->w[3] + (__u64)to->w[3];

	if (family == 6)
		sum += (__u32)~from->w[0] + (__u64)to->w[0] + (__u32)~from->w[1] + (__u64)to->w[1] +
		       (__u32)~from->w[2] + (__u64)to->w[2];
	return sum;
}

static __always_inline __u32 kp_csum_fold32(__u64 sum)
{
	sum = (sum & 0xffffffff) + (sum >> 32);
	sum = (sum & 0xffffffff) + (sum >> 32);
	return (__u32)sum;
}

static __always_inline __u16 kp_csum_fold(__u64 sum)
{
	sum = (sum & 0xffff) + (sum >> 16);
	sum = (sum & 0xffff) + (sum >> 16);
	sum = (sum & 0xffff) + (sum >> 16);
	return (__u16)~sum;
}

#endif
