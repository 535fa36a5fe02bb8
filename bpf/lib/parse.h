/* lib/parse.h: packet parsing for the TC path, IPv4 and IPv6, TCP/UDP and ICMP(v6): a packet
 * read into struct kp_pkt, its tuple as conntrack and the service lookup take it.
 *
 * One code path for both families: a packet's addresses are struct kp_ip (lib/ip.h, an IPv4
 * address IPv4-mapped) wherever they are held, and only the header offsets, the checksums and
 * the ICMP flavour depend on p->family.
 */
#ifndef KPROXY_LIB_PARSE_H
#define KPROXY_LIB_PARSE_H

#include <uapi/linux/if_ether.h>
#include <uapi/linux/ip.h>
#include <uapi/linux/ipv6.h>
#include <uapi/linux/in.h>
#include "../kproxy.h"
#include "endian.h"
#include "ip.h"

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

#endif
