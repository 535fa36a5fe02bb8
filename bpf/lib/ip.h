/* lib/ip.h: struct kp_ip (kproxy.h), the family-neutral address of every service-side row.
 *
 * An IPv4 address is held IPv4-mapped (::ffff:a.b.c.d, RFC 4291 2.5.5.2): words 0 and 1 zero,
 * word 2 0x0000ffff in network order, word 3 the IPv4 address. Word-wise helpers, so a
 * program copies and compares an address in four 32-bit operations the verifier sees as such.
 */
#ifndef KPROXY_LIB_IP_H
#define KPROXY_LIB_IP_H

#include "../kproxy.h"
#include "endian.h"

static __always_inline struct kp_ip kp_ip_from4(__be32 addr)
{
	struct kp_ip ip = { .w = { 0, 0, kp_htonl(0x0000ffff), addr } };

	return ip;
}

static __always_inline bool kp_ip_is4(const struct kp_ip *ip)
{
	return ip->w[0] == 0 && ip->w[1] == 0 && ip->w[2] == kp_htonl(0x0000ffff);
}

/* kp_aff_key.family of an address: 4 or 6. */
static __always_inline __u8 kp_ip_family(const struct kp_ip *ip)
{
	return kp_ip_is4(ip) ? 4 : 6;
}

static __always_inline bool kp_ip_eq(const struct kp_ip *a, const struct kp_ip *b)
{
	return a->w[0] == b->w[0] && a->w[1] == b->w[1] && a->w[2] == b->w[2] &&
	       a->w[3] == b->w[3];
}

static __always_inline bool kp_ip_is_zero(const struct kp_ip *ip)
{
	return !(ip->w[0] | ip->w[1] | ip->w[2] | ip->w[3]);
}

#endif
