/* lib/icmp_reply.h: the ICMP and ICMPv6 destination unreachable a refused packet gets, built
 * in place of the packet and sent back to the client (lib/icmp_err.h passes on the errors that
 * others send about a flow).
 */
#ifndef KPROXY_LIB_ICMP_REPLY_H
#define KPROXY_LIB_ICMP_REPLY_H

#include <uapi/linux/if_ether.h>
#include <uapi/linux/ip.h>
#include <uapi/linux/ipv6.h>
#include <uapi/linux/icmp.h>
#include <uapi/linux/icmpv6.h>
#include <uapi/linux/in.h>
#include <uapi/linux/pkt_cls.h>
#include "../kproxy.h"
#include "endian.h"
#include "maps.h"
#include "csum.h"
#include "parse.h"

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
