/* lib/nat.h: packet parsing and address/port rewriting for the TC path (IPv4, TCP/UDP).
 *
 * Rewrites go through bpf_l3_csum_replace / bpf_l4_csum_replace, which update the IP header
 * checksum and the TCP/UDP checksum incrementally (the address is part of the L4 pseudo
 * header); a UDP checksum of 0 (none) stays 0 (BPF_F_MARK_MANGLED_0).
 */
#ifndef KPROXY_LIB_NAT_H
#define KPROXY_LIB_NAT_H

#include <uapi/linux/if_ether.h>
#include <uapi/linux/ip.h>
#include <uapi/linux/icmp.h>
#include <uapi/linux/in.h>
#include <uapi/linux/pkt_cls.h>
#include "../kproxy.h"
#include "endian.h"

#define KP_AF_INET 2
#define KP_IP_MF     0x2000
#define KP_IP_OFFSET 0x1fff

struct kp_pkt {
	struct kp_ct4_key tuple;   /* as the packet is now: src -> dst */
	__u32 l4_off;
	__u8  tcp_flags;
	__be32 tcp_seq;            /* TCP only */
	__be32 tcp_ack;
};

/* The EtherType and the IPv4 header, read with one helper call. */
struct kp_l3 {
	__be16 proto;
	struct iphdr ip;
} __attribute__((packed));

/* The first half of parsing, enough for the TC filters (addresses): fills p's addresses,
 * protocol and L4 offset for an IPv4 TCP/UDP packet at the Ethernet header; -1 for anything
 * else (other protocols; IP options are fine, non-first fragments carry no ports and are left
 * alone). Each bpf_skb_load_bytes is a helper call, so a packet takes two: this one, and
 * kp_parse_l4's, which a packet the filters let pass never makes. */
static __always_inline int kp_parse_l3(struct __sk_buff *skb, struct kp_pkt *p)
{
	struct kp_l3 h;

	if (bpf_skb_load_bytes(skb, offsetof(struct ethhdr, h_proto), &h, sizeof(h)) < 0 ||
	    h.proto != kp_htons(ETH_P_IP) || h.ip.version != 4 || h.ip.ihl < 5)
		return -1;
	if (h.ip.protocol != IPPROTO_TCP && h.ip.protocol != IPPROTO_UDP)
		return -1;
	if (h.ip.frag_off & kp_htons(KP_IP_OFFSET))
		return -1;
	p->l4_off = ETH_HLEN + h.ip.ihl * 4;
	p->tuple.saddr = h.ip.saddr;
	p->tuple.daddr = h.ip.daddr;
	p->tuple.proto = h.ip.protocol;
	return 0;
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

/* Rewrites the source (dst = false) or destination address and port, checksums included. */
static __always_inline int kp_rewrite(struct __sk_buff *skb, struct kp_pkt *p, bool dst,
				      __be32 addr, __be16 port)
{
	__be32 old_addr = dst ? p->tuple.daddr : p->tuple.saddr;
	__be16 old_port = dst ? p->tuple.dport : p->tuple.sport;
	__u32 aoff = ETH_HLEN + (dst ? offsetof(struct iphdr, daddr) : offsetof(struct iphdr, saddr));
	__u32 poff = p->l4_off + (dst ? 2 : 0);

	if (old_addr != addr) {
		if (bpf_l4_csum_replace(skb, kp_l4_csum_off(p), old_addr, addr,
					BPF_F_PSEUDO_HDR | sizeof(addr) | kp_l4_flags(p)) < 0 ||
		    bpf_l3_csum_replace(skb, ETH_HLEN + offsetof(struct iphdr, check), old_addr, addr,
					sizeof(addr)) < 0 ||
		    bpf_skb_store_bytes(skb, aoff, &addr, sizeof(addr), 0) < 0)
			return -1;
	}
	if (old_port != port) {
		if (bpf_l4_csum_replace(skb, kp_l4_csum_off(p), old_port, port,
					sizeof(port) | kp_l4_flags(p)) < 0 ||
		    bpf_skb_store_bytes(skb, poff, &port, sizeof(port), 0) < 0)
			return -1;
	}
	if (dst) {
		p->tuple.daddr = addr;
		p->tuple.dport = port;
	} else {
		p->tuple.saddr = addr;
		p->tuple.sport = port;
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

	fib.family = KP_AF_INET;
	fib.l4_protocol = p->tuple.proto;
	fib.sport = p->tuple.sport;
	fib.dport = p->tuple.dport;
	fib.ipv4_src = p->tuple.saddr;
	fib.ipv4_dst = p->tuple.daddr;
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

/* An ICMP destination unreachable with `code`, built in place of the packet and sent back out
 * of the device it came in on: [eth][ip][icmp][orig ip][8 bytes], from the address the client
 * asked (so its socket matches the quote). Packets with IP options are dropped instead (the
 * quoted header must be the 20-byte one here). */
struct kp_icmp_frame {
	struct iphdr   ip;
	struct icmphdr icmp;
	__u8           quote[28];   /* the original IP header and the first 8 bytes of L4 */
};

static __always_inline int kp_icmp_unreach(struct __sk_buff *skb, const struct kp_pkt *p,
					   __u8 code)
{
	struct kp_icmp_frame f = {};
	struct ethhdr eth;
	__u8 mac[ETH_ALEN];
	__u32 len = ETH_HLEN + sizeof(f);

	if (p->l4_off != ETH_HLEN + sizeof(struct iphdr))
		return TC_ACT_SHOT;
	if (bpf_skb_load_bytes(skb, 0, &eth, sizeof(eth)) < 0 ||
	    bpf_skb_load_bytes(skb, ETH_HLEN, f.quote, sizeof(f.quote)) < 0)
		return TC_ACT_SHOT;
	__builtin_memcpy(mac, eth.h_source, ETH_ALEN);
	__builtin_memcpy(eth.h_source, eth.h_dest, ETH_ALEN);
	__builtin_memcpy(eth.h_dest, mac, ETH_ALEN);
	f.ip.version = 4;
	f.ip.ihl = 5;
	f.ip.tot_len = kp_htons(sizeof(f));
	f.ip.ttl = 64;
	f.ip.protocol = IPPROTO_ICMP;
	f.ip.saddr = p->tuple.daddr;
	f.ip.daddr = p->tuple.saddr;
	f.ip.check = kp_csum_fold(bpf_csum_diff(NULL, 0, (__be32 *)&f.ip, sizeof(f.ip), 0));
	f.icmp.type = ICMP_DEST_UNREACH;
	f.icmp.code = code;
	f.icmp.checksum = kp_csum_fold(bpf_csum_diff(NULL, 0, (__be32 *)&f.icmp,
						     sizeof(f) - sizeof(f.ip), 0));
	if (bpf_skb_change_tail(skb, len, 0) < 0 ||
	    bpf_skb_store_bytes(skb, 0, &eth, sizeof(eth), 0) < 0 ||
	    bpf_skb_store_bytes(skb, ETH_HLEN, &f, sizeof(f), 0) < 0)
		return TC_ACT_SHOT;
	return bpf_redirect(skb->ifindex, 0);
}

/* The port unreachable kube-proxy's REJECT sends (nftables `reject`): the client's connect()
 * or recv() fails at once with ECONNREFUSED. */
static __always_inline int kp_reject(struct __sk_buff *skb, const struct kp_pkt *p)
{
	return kp_icmp_unreach(skb, p, ICMP_PORT_UNREACH);
}

#endif
