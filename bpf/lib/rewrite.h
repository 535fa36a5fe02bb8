/* lib/rewrite.h: address and port rewriting for the TC path, IPv4 and IPv6, TCP/UDP.
 *
 * Rewrites go through bpf_l4_csum_replace (and for IPv4 bpf_l3_csum_replace: IPv6 has no header
 * checksum), which update the TCP/UDP checksum incrementally (the address is part of its pseudo
 * header); an IPv4 UDP checksum of 0 (none) stays 0 (BPF_F_MARK_MANGLED_0; IPv6 UDP always has
 * one, RFC 8200 8.1).
 */
#ifndef KPROXY_LIB_REWRITE_H
#define KPROXY_LIB_REWRITE_H

#include <uapi/linux/if_ether.h>
#include <uapi/linux/ip.h>
#include <uapi/linux/ipv6.h>
#include <uapi/linux/in.h>
#include "ip.h"
#include "csum.h"
#include "parse.h"

static __always_inline __u32 kp_l4_csum_off(const struct kp_pkt *p)
{
	return p->l4_off + (p->tuple.proto == IPPROTO_TCP ? 16 : 6);
}

static __always_inline __u64 kp_l4_flags(const struct kp_pkt *p)
{
	return p->tuple.proto == IPPROTO_UDP ? BPF_F_MARK_MANGLED_0 : 0;
}

/* Where an IP header of `family` at l3_off holds its source (dst = false) or destination. */
static __always_inline __u32 kp_addr_off(__u8 family, __u32 l3_off, bool dst)
{
	if (family == 6)
		return l3_off + (dst ? offsetof(struct ipv6hdr, daddr) : offsetof(struct ipv6hdr, saddr));
	return l3_off + (dst ? offsetof(struct iphdr, daddr) : offsetof(struct iphdr, saddr));
}

/* Stores address `to` at off (4 bytes of IPv4, 16 of IPv6); the checksums are the caller's. */
static __always_inline int kp_put_addr(struct __sk_buff *skb, __u8 family, __u32 off,
				       const struct kp_ip *to)
{
	if (family == 4)
		return bpf_skb_store_bytes(skb, off, (void *)&to->w[3], sizeof(__be32), 0);
	return bpf_skb_store_bytes(skb, off, (void *)to->w, sizeof(*to), 0);
}

/* Stores address `to` (4 bytes of IPv4, 16 of IPv6) at off in place of `from`, and tells the
 * checksum at csum_off (csum_flags: BPF_F_PSEUDO_HDR when the address is in that checksum's
 * pseudo header, not its data): an ICMP error's quote and outer address (lib/icmp_err.h). */
static __always_inline int kp_store_addr(struct __sk_buff *skb, __u8 family, __u32 off,
					 const struct kp_ip *from, const struct kp_ip *to,
					 __u32 csum_off, __u64 csum_flags)
{
	__u32 diff = kp_csum_fold32(kp_addr_diff(family, from, to));

	return bpf_l4_csum_replace(skb, csum_off, 0, diff, csum_flags) < 0 ||
	       kp_put_addr(skb, family, off, to) < 0 ? -1 : 0;
}

/* Rewrites the packet's tuple to saddr:sport -> daddr:dport, checksums included, in as few
 * helper calls as the change needs: one checksum update for both addresses (the IPv4 header's
 * and the L4 pseudo header's, from one difference) and one for both ports, as one 32-bit word
 * (each helper call costs ~20-30 ns per packet here; docs/measurements.md "One rewrite per packet").
 * The ports' update is apart from the addresses': they are the L4 header's data, not its
 * pseudo header, which the kernel treats differently (CHECKSUM_PARTIAL, CHECKSUM_COMPLETE). */
static __always_inline int kp_rewrite(struct __sk_buff *skb, struct kp_pkt *p,
				      const struct kp_ip *saddr, __be16 sport,
				      const struct kp_ip *daddr, __be16 dport)
{
	bool new_src = !kp_ip_eq(&p->tuple.saddr, saddr);
	bool new_dst = !kp_ip_eq(&p->tuple.daddr, daddr);
	__u32 csum_off = kp_l4_csum_off(p);
	__u64 flags = kp_l4_flags(p);
	__be16 ports[2] = {sport, dport};
	__u32 old_ports;
	__u32 diff;

	if (new_src || new_dst) {
		diff = kp_csum_fold32(kp_addr_diff(p->family, &p->tuple.saddr, saddr) +
				      kp_addr_diff(p->family, &p->tuple.daddr, daddr));
		if (bpf_l4_csum_replace(skb, csum_off, 0, diff, BPF_F_PSEUDO_HDR | flags) < 0 ||
		    (p->family == 4 &&
		     bpf_l3_csum_replace(skb, ETH_HLEN + offsetof(struct iphdr, check), 0, diff,
					 0) < 0) ||
		    (new_src && kp_put_addr(skb, p->family, kp_addr_off(p->family, ETH_HLEN, false),
					    saddr) < 0) ||
		    (new_dst && kp_put_addr(skb, p->family, kp_addr_off(p->family, ETH_HLEN, true),
					    daddr) < 0))
			return -1;
		p->tuple.saddr = *saddr;
		p->tuple.daddr = *daddr;
	}
	if (p->tuple.sport != sport || p->tuple.dport != dport) {
		__builtin_memcpy(&old_ports, &p->tuple.sport, sizeof(old_ports));
		if (bpf_l4_csum_replace(skb, csum_off, old_ports, *(__u32 *)ports,
					sizeof(__u32) | flags) < 0 ||
		    bpf_skb_store_bytes(skb, p->l4_off, ports, sizeof(ports), 0) < 0)
			return -1;
		p->tuple.sport = sport;
		p->tuple.dport = dport;
	}
	return 0;
}

#endif
