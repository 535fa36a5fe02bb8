/* lib/nat.h: packet parsing and address/port rewriting for the TC path, IPv4 and IPv6,
 * TCP/UDP.
 *
 * One code path for both families: a packet's addresses are struct kp_ip (lib/ip.h, an IPv4
 * address IPv4-mapped) wherever they are held, and only the header offsets, the checksums and
 * the ICMP flavour depend on p->family. Rewrites go through bpf_l4_csum_replace (and for IPv4
 * bpf_l3_csum_replace: IPv6 has no header checksum), which update the TCP/UDP checksum
 * incrementally (the address is part of its pseudo header); an IPv4 UDP checksum of 0 (none)
 * stays 0 (BPF_F_MARK_MANGLED_0; IPv6 UDP always has one, RFC 8200 8.1).
 */
#ifndef KPROXY_LIB_NAT_H
#define KPROXY_LIB_NAT_H

#include <uapi/linux/if_ether.h>
#include <uapi/linux/ip.h>
#include <uapi/linux/ipv6.h>
#include <uapi/linux/icmp.h>
#include <uapi/linux/icmpv6.h>
#include <uapi/linux/in.h>
#include <uapi/linux/pkt_cls.h>
#include "../kproxy.h"
#include "endian.h"
#include "ip.h"
#include "maps.h"

#define KP_AF_INET   2
#define KP_AF_INET6 10
#define KP_IP_MF     0x2000
#define KP_IP_OFFSET 0x1fff
#define KP_IP6_HLEN  40

struct kp_pkt {
	struct kp_ct_key tuple;    /* as the packet is now: src -> dst */
	__u32 l4_off;
	__u8  family;              /* 4 or 6, as kp_ip_family */
	__u8  tcp_flags;
	__be32 tcp_seq;            /* TCP only */
	__be32 tcp_ack;
};

/* What kp_parse_l3 found. */
enum kp_l3_kind {
	KP_L3_OTHER = -1,          /* not ours to look at: passes untouched */
	KP_L3_PORTS = 0,           /* TCP or UDP with its ports at l4_off */
	KP_L3_ICMP_ERR = 1,        /* an ICMP(v6) message, maybe an error about a tracked flow */
};

/* The EtherType and the IPv4 header, read with one helper call. */
struct kp_l3 {
	__be16 proto;
	struct iphdr ip;
} __attribute__((packed));

static __always_inline enum kp_l3_kind kp_l3_proto(struct kp_pkt *p, __u8 proto, __u8 icmp)
{
	if (proto == IPPROTO_TCP || proto == IPPROTO_UDP) {
		p->tuple.proto = proto;
		return KP_L3_PORTS;
	}
	if (proto == icmp) {
		p->tuple.proto = proto;
		return KP_L3_ICMP_ERR;
	}
	return KP_L3_OTHER;
}

/* An IPv6 header right after the Ethernet one. Only a TCP, UDP or ICMPv6 header directly
 * after it is looked at: a packet with extension headers (a fragment's above all, whose later
 * pieces carry no ports) passes untouched, as IPv4 fragments after the first do. Neighbour
 * discovery is ICMPv6 too: kp_icmp_err lets every type but the four errors pass. */
static __always_inline enum kp_l3_kind kp_parse_ip6(struct __sk_buff *skb, struct kp_pkt *p)
{
	struct ipv6hdr ip6;

	if (bpf_skb_load_bytes(skb, ETH_HLEN, &ip6, sizeof(ip6)) < 0 || ip6.version != 6)
		return KP_L3_OTHER;
	p->family = 6;
	p->l4_off = ETH_HLEN + KP_IP6_HLEN;
	__builtin_memcpy(p->tuple.saddr.w, &ip6.saddr, sizeof(p->tuple.saddr));
	__builtin_memcpy(p->tuple.daddr.w, &ip6.daddr, sizeof(p->tuple.daddr));
	return kp_l3_proto(p, ip6.nexthdr, IPPROTO_ICMPV6);
}

/* The first half of parsing, enough for the TC filters (addresses): fills p's family,
 * addresses, protocol and L4 offset for a packet at the Ethernet header. IPv4 options are
 * fine; non-first fragments carry no ports and are left alone. Each bpf_skb_load_bytes is a
 * helper call, so an IPv4 packet takes two (an IPv6 one three): this one, and kp_parse_l4's,
 * which a packet the filters let pass never makes. */
static __always_inline enum kp_l3_kind kp_parse_l3(struct __sk_buff *skb, struct kp_pkt *p)
{
	struct kp_l3 h;

	if (bpf_skb_load_bytes(skb, offsetof(struct ethhdr, h_proto), &h, sizeof(h)) < 0)
		return KP_L3_OTHER;
	if (h.proto == kp_htons(ETH_P_IPV6))
		return kp_parse_ip6(skb, p);
	if (h.proto != kp_htons(ETH_P_IP) || h.ip.version != 4 || h.ip.ihl < 5)
		return KP_L3_OTHER;
	if (h.ip.frag_off & kp_htons(KP_IP_OFFSET))
		return KP_L3_OTHER;
	p->family = 4;
	p->l4_off = ETH_HLEN + h.ip.ihl * 4;
	p->tuple.saddr = kp_ip_from4(h.ip.saddr);
	p->tuple.daddr = kp_ip_from4(h.ip.daddr);
	return kp_l3_proto(p, h.ip.protocol, IPPROTO_ICMP);
}

/* The ports, and a TCP header's sequence and acknowledgement numbers and flags (its byte 13):
 * 14 bytes of TCP, 4 of UDP. */
static __always_inline int kp_parse_l4(struct __sk_buff *skb, struct kp_pkt *p)
{
	__u8 l4[14];

	if (p->tuple.proto == IPPROTO_TCP) {
		if (bpf_skb_load_bytes(skb, p->l4_off, l4, 14) < 0)
			return -1;
		p->tcp_flags = l4[13];
		__builtin_memcpy(&p->tcp_seq, l4 + 4, sizeof(p->tcp_seq));
		__builtin_memcpy(&p->tcp_ack, l4 + 8, sizeof(p->tcp_ack));
	} else {
		if (bpf_skb_load_bytes(skb, p->l4_off, l4, 4) < 0)
			return -1;
		p->tcp_flags = 0;
	}
	__builtin_memcpy(&p->tuple.sport, l4, sizeof(p->tuple.sport));
	__builtin_memcpy(&p->tuple.dport, l4 + 2, sizeof(p->tuple.dport));
	return 0;
}

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
 * (each helper call costs ~20-30 ns per packet here; docs/measurements.md, "One rewrite per
 * packet").
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

/* The kernel's signature (ifindex, params, plen, flags): bcc 0.26 declares three arguments,
 * which would leave the fourth register unset. */
static long (*kp_redirect_neigh)(__u32 ifindex, void *params, int plen, __u64 flags) =
	(void *)BPF_FUNC_redirect_neigh;

/* Sends a rewritten packet straight to the device the route names. Needed whenever the new
 * source is an address of this node (SNAT, or a reply now coming from a NodePort): handed to
 * the stack at ingress such a packet would be dropped as a martian (local source). */
static __always_inline int kp_redirect(struct __sk_buff *skb, const struct kp_pkt *p)
{
	struct bpf_fib_lookup fib = {};
	int rc;

	fib.l4_protocol = p->tuple.proto;
	fib.sport = p->tuple.sport;
	fib.dport = p->tuple.dport;
	if (p->family == 6) {
		fib.family = KP_AF_INET6;
		__builtin_memcpy(fib.ipv6_src, p->tuple.saddr.w, sizeof(fib.ipv6_src));
		__builtin_memcpy(fib.ipv6_dst, p->tuple.daddr.w, sizeof(fib.ipv6_dst));
	} else {
		fib.family = KP_AF_INET;
		fib.ipv4_src = p->tuple.saddr.w[3];
		fib.ipv4_dst = p->tuple.daddr.w[3];
	}
	fib.ifindex = skb->ingress_ifindex ? skb->ingress_ifindex : skb->ifindex;
	rc = bpf_fib_lookup(skb, &fib, sizeof(fib), 0);
	if (rc != BPF_FIB_LKUP_RET_SUCCESS && rc != BPF_FIB_LKUP_RET_NO_NEIGH)
		return -1;
	return kp_redirect_neigh(fib.ifindex, NULL, 0, 0);
}

static __always_inline __u16 kp_csum_fold(__u64 sum)
{
	sum = (sum & 0xffff) + (sum >> 16);
	sum = (sum & 0xffff) + (sum >> 16);
	sum = (sum & 0xffff) + (sum >> 16);
	return (__u16)~sum;
}

/* Which destination unreachable a refused packet gets. */
enum kp_unreach {
	KP_UNREACH_PORT,        /* ECONNREFUSED: ICMP port unreachable, ICMPv6 code 4 */
	KP_UNREACH_HOST,        /* EHOSTUNREACH: ICMP host unreachable, ICMPv6 address
				 * unreachable (code 3; Linux icmpv6_err_convert) */
};

/* An ICMP destination unreachable built in place of the packet and sent back out of the
 * device it came in on: [eth][ip][icmp][orig ip][8 bytes of L4], from the address the client
 * asked (so its socket matches the quote). Packets with IPv4 options are dropped instead (the
 * quoted header must be the 20-byte one here; an IPv6 one is always 40). */
struct kp_icmp_frame {
	struct iphdr   ip;
	struct icmphdr icmp;
	__u8           quote[sizeof(struct iphdr) + 8];
};

struct kp_icmp6_frame {
	struct ipv6hdr  ip6;
	struct icmp6hdr icmp;
	__u8            quote[KP_IP6_HLEN + 8];
};

/* The ICMPv6 pseudo header's length and next-header words (RFC 8200 8.1); its addresses are
 * the frame's own, summed in place. */
struct kp_icmp6_pseudo {
	__be32 len;
	__be32 nexthdr;
};

static __always_inline int kp_icmp4_unreach(struct __sk_buff *skb, const struct kp_pkt *p,
					    enum kp_unreach why, struct ethhdr *eth)
{
	struct kp_icmp_frame f = {};

	if (p->l4_off != ETH_HLEN + sizeof(struct iphdr) ||
	    bpf_skb_load_bytes(skb, ETH_HLEN, f.quote, sizeof(f.quote)) < 0)
		return TC_ACT_SHOT;
	f.ip.version = 4;
	f.ip.ihl = 5;
	f.ip.tot_len = kp_htons(sizeof(f));
	f.ip.ttl = 64;
	f.ip.protocol = IPPROTO_ICMP;
	f.ip.saddr = p->tuple.daddr.w[3];
	f.ip.daddr = p->tuple.saddr.w[3];
	f.ip.check = kp_csum_fold(bpf_csum_diff(NULL, 0, (__be32 *)&f.ip, sizeof(f.ip), 0));
	f.icmp.type = ICMP_DEST_UNREACH;
	f.icmp.code = why == KP_UNREACH_PORT ? ICMP_PORT_UNREACH : ICMP_HOST_UNREACH;
	f.icmp.checksum = kp_csum_fold(bpf_csum_diff(NULL, 0, (__be32 *)&f.icmp,
						     sizeof(f) - sizeof(f.ip), 0));
	if (bpf_skb_change_tail(skb, ETH_HLEN + sizeof(f), 0) < 0 ||
	    bpf_skb_store_bytes(skb, 0, eth, sizeof(*eth), 0) < 0 ||
	    bpf_skb_store_bytes(skb, ETH_HLEN, &f, sizeof(f), 0) < 0)
		return TC_ACT_SHOT;
	return bpf_redirect(skb->ifindex, 0);
}

/* In kp_scratch: the frame and its pseudo header, 104 bytes the stack has no room for. */
struct kp_icmp6_room {
	struct kp_icmp6_frame f;
	struct kp_icmp6_pseudo ph;
};

_Static_assert(sizeof(struct kp_icmp6_room) <= sizeof(struct kp_scratch), "kp_icmp6_room");

static __always_inline int kp_icmp6_unreach(struct __sk_buff *skb, const struct kp_pkt *p,
					    enum kp_unreach why, struct ethhdr *eth)
{
	struct kp_icmp6_room *r;
	struct kp_icmp6_frame *f;
	__u32 zero = 0;
	__s64 sum;

	r = (struct kp_icmp6_room *)kp_scratch.lookup(&zero);
	if (!r)
		return TC_ACT_SHOT;
	f = &r->f;
	__builtin_memset(r, 0, sizeof(*r));
	if (bpf_skb_load_bytes(skb, ETH_HLEN, f->quote, sizeof(f->quote)) < 0)
		return TC_ACT_SHOT;
	f->ip6.version = 6;
	f->ip6.payload_len = kp_htons(sizeof(*f) - sizeof(f->ip6));
	f->ip6.nexthdr = IPPROTO_ICMPV6;
	f->ip6.hop_limit = 64;
	__builtin_memcpy(&f->ip6.saddr, p->tuple.daddr.w, sizeof(f->ip6.saddr));
	__builtin_memcpy(&f->ip6.daddr, p->tuple.saddr.w, sizeof(f->ip6.daddr));
	f->icmp.icmp6_type = ICMPV6_DEST_UNREACH;
	f->icmp.icmp6_code = why == KP_UNREACH_PORT ? ICMPV6_PORT_UNREACH : ICMPV6_ADDR_UNREACH;
	r->ph.len = kp_htonl(sizeof(*f) - sizeof(f->ip6));
	r->ph.nexthdr = kp_htonl(IPPROTO_ICMPV6);
	sum = bpf_csum_diff(NULL, 0, (__be32 *)&f->ip6.saddr, 2 * sizeof(f->ip6.saddr), 0);
	sum = bpf_csum_diff(NULL, 0, (__be32 *)&r->ph, sizeof(r->ph), sum);
	sum = bpf_csum_diff(NULL, 0, (__be32 *)&f->icmp, sizeof(*f) - sizeof(f->ip6), sum);
	f->icmp.icmp6_cksum = kp_csum_fold(sum);
	if (bpf_skb_change_tail(skb, ETH_HLEN + sizeof(*f), 0) < 0 ||
	    bpf_skb_store_bytes(skb, 0, eth, sizeof(*eth), 0) < 0 ||
	    bpf_skb_store_bytes(skb, ETH_HLEN, f, sizeof(*f), 0) < 0)
		return TC_ACT_SHOT;
	return bpf_redirect(skb->ifindex, 0);
}

static __always_inline int kp_icmp_unreach(struct __sk_buff *skb, const struct kp_pkt *p,
					   enum kp_unreach why)
{
	struct ethhdr eth;
	__u8 mac[ETH_ALEN];

	if (bpf_skb_load_bytes(skb, 0, &eth, sizeof(eth)) < 0)
		return TC_ACT_SHOT;
	__builtin_memcpy(mac, eth.h_source, ETH_ALEN);
	__builtin_memcpy(eth.h_source, eth.h_dest, ETH_ALEN);
	__builtin_memcpy(eth.h_dest, mac, ETH_ALEN);
	return p->family == 6 ? kp_icmp6_unreach(skb, p, why, &eth)
			      : kp_icmp4_unreach(skb, p, why, &eth);
}

/* The port unreachable kube-proxy's REJECT sends (nftables `reject`, ICMPv6 port unreachable
 * in an IPv6 table): the client's connect() or recv() fails at once with ECONNREFUSED. */
static __always_inline int kp_reject(struct __sk_buff *skb, const struct kp_pkt *p)
{
	return kp_icmp_unreach(skb, p, KP_UNREACH_PORT);
}

#endif
