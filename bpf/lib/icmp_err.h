/* lib/icmp_err.h: ICMP and ICMPv6 errors about a flow from outside, passed on to its backend.
 *
 * A router between this node and the client that cannot forward a reply (too big for its next
 * link above all: an IPv6 router never fragments, RFC 8200 section 5, and Linux TCP sets DF in
 * IPv4 too) answers the reply's source, which kp_reply made the frontend. The error arrives
 * here addressed to the frontend and quotes (frontend -> client), but the socket that must
 * learn of it (lower its path MTU, or fail) is the backend's, and the node holds no socket
 * for the flow: without this the error dies here and the connection stalls on segments that
 * never fit. So the error is rewritten as the backend would have got it about its own packet:
 * the quote's source becomes the backend (a SNAT flow's quoted destination the SNAT address
 * and port), the outer destination the backend, and routing takes it there. The kernel's
 * conntrack does the same for kube-proxy's NAT (nf_nat_icmp_reply_translation,
 * nf_nat_icmpv6_reply_translation).
 *
 * Only the errors (destination unreachable, packet too big, time exceeded, parameter
 * problem) about a TCP or UDP flow kp_ct tracks: echo, neighbour discovery and every other
 * message pass untouched. The quoted L4 checksum is left as it is: the receiver does not check
 * it (Linux tcp_v4_err, tcp_v6_err and the UDP handlers read the ports only).
 */
#ifndef KPROXY_LIB_ICMP_ERR_H
#define KPROXY_LIB_ICMP_ERR_H

#include <uapi/linux/ip.h>
#include <uapi/linux/ipv6.h>
#include <uapi/linux/icmp.h>
#include <uapi/linux/icmpv6.h>
#include <uapi/linux/pkt_cls.h>
#include "ct.h"
#include "parse.h"
#include "rewrite.h"
#include "stats.h"

/* The packet an error quotes. */
struct kp_quote {
	__u32 l3_off;               /* its IP header */
	__u32 l4_off;               /* its ports */
	struct kp_ct_key tuple;     /* as it was sent */
};

static __always_inline bool kp_icmp_is_error(__u8 family, __u8 type)
{
	if (family == 6)
		return type == ICMPV6_DEST_UNREACH || type == ICMPV6_PKT_TOOBIG ||
		       type == ICMPV6_TIME_EXCEED || type == ICMPV6_PARAMPROB;
	return type == ICMP_DEST_UNREACH || type == ICMP_TIME_EXCEEDED ||
	       type == ICMP_PARAMETERPROB;
}

/* Reads the quote of an ICMP(v6) error at p->l4_off: 0, or -1 when the message is no error or
 * quotes no TCP or UDP packet this parser reads (IPv4 options, IPv6 extension headers). */
static __always_inline int kp_quote_parse(struct __sk_buff *skb, const struct kp_pkt *p,
					  struct kp_quote *q)
{
	struct ipv6hdr ip6;
	struct iphdr ip;
	__be16 ports[2];
	__u8 type;
	__u8 proto;

	if (bpf_skb_load_bytes(skb, p->l4_off, &type, sizeof(type)) < 0 ||
	    !kp_icmp_is_error(p->family, type))
		return -1;
	q->l3_off = p->l4_off + KP_ICMP_HLEN;
	if (p->family == 6) {
		if (bpf_skb_load_bytes(skb, q->l3_off, &ip6, sizeof(ip6)) < 0 || ip6.version != 6)
			return -1;
		proto = ip6.nexthdr;
		q->l4_off = q->l3_off + KP_IP6_HLEN;
		__builtin_memcpy(q->tuple.saddr.w, &ip6.saddr, sizeof(q->tuple.saddr));
		__builtin_memcpy(q->tuple.daddr.w, &ip6.daddr, sizeof(q->tuple.daddr));
	} else {
		if (bpf_skb_load_bytes(skb, q->l3_off, &ip, sizeof(ip)) < 0 || ip.version != 4 ||
		    ip.ihl != 5)
			return -1;
		proto = ip.protocol;
		q->l4_off = q->l3_off + sizeof(ip);
		q->tuple.saddr = kp_ip_from4(ip.saddr);
		q->tuple.daddr = kp_ip_from4(ip.daddr);
	}
	if ((proto != IPPROTO_TCP && proto != IPPROTO_UDP) ||
	    bpf_skb_load_bytes(skb, q->l4_off, ports, sizeof(ports)) < 0)
		return -1;
	q->tuple.proto = proto;
	q->tuple.sport = ports[0];
	q->tuple.dport = ports[1];
	return 0;
}

/* Rewrites the quote's source (dst = false) or destination address and port. The ICMP(v6)
 * checksum covers the quote as data. An IPv4 quote's own header checksum is updated with its
 * address, and the two changes cancel in the ICMP checksum (a header with a valid checksum
 * sums to zero, RFC 1071), so only its ports are told to the ICMP checksum. */
static __always_inline int kp_quote_set(struct __sk_buff *skb, const struct kp_pkt *p,
					struct kp_quote *q, bool dst, const struct kp_ip *addr,
					__be16 port)
{
	struct kp_ip *old_addr = dst ? &q->tuple.daddr : &q->tuple.saddr;
	__be16 *old_port = dst ? &q->tuple.dport : &q->tuple.sport;
	__u32 csum_off = p->l4_off + offsetof(struct icmphdr, checksum);
	__u32 aoff = kp_addr_off(p->family, q->l3_off, dst);

	if (p->family == 6) {
		if (kp_store_addr(skb, 6, aoff, old_addr, addr, csum_off, 0) < 0)
			return -1;
	} else if (bpf_l3_csum_replace(skb, q->l3_off + offsetof(struct iphdr, check),
				       old_addr->w[3], addr->w[3], sizeof(__be32)) < 0 ||
		   bpf_skb_store_bytes(skb, aoff, (void *)&addr->w[3], sizeof(__be32), 0) < 0) {
		return -1;
	}
	if (bpf_l4_csum_replace(skb, csum_off, *old_port, port, sizeof(port)) < 0 ||
	    bpf_skb_store_bytes(skb, q->l4_off + (dst ? 2 : 0), &port, sizeof(port), 0) < 0)
		return -1;
	*old_addr = *addr;
	*old_port = port;
	return 0;
}

/* An ICMP(v6) message to a frontend address (kp_ingress checked that): an error about a
 * tracked flow's reply goes on to the flow's backend; anything else passes untouched. */
static __always_inline int kp_icmp_err(struct __sk_buff *skb, struct kp_pkt *p)
{
	struct kp_quote q = {};
	struct kp_ct_key orig = {};
	struct kp_ct_val *row;
	struct kp_ct_val v;
	__u32 csum_off = p->l4_off + offsetof(struct icmphdr, checksum);
	__u32 daddr_off = kp_addr_off(p->family, ETH_HLEN, true);

	if (kp_quote_parse(skb, p, &q) < 0 || !kp_ip_eq(&q.tuple.saddr, &p->tuple.daddr))
		return TC_ACT_OK;
	/* The quote is a reply (frontend -> client): its flow is keyed client -> frontend. */
	orig.saddr = q.tuple.daddr;
	orig.daddr = q.tuple.saddr;
	orig.sport = q.tuple.dport;
	orig.dport = q.tuple.sport;
	orig.proto = q.tuple.proto;
	row = kp_ct.lookup(&orig);
	if (!row)
		return TC_ACT_OK;
	v = *row;
	if (kp_quote_set(skb, p, &q, false, &v.be_addr, v.be_port) < 0 ||
	    ((kp_ct_flags(v.life) & KP_CT_F_SNAT) &&
	     kp_quote_set(skb, p, &q, true, &v.nat_addr, v.nat_port) < 0))
		return TC_ACT_SHOT;
	/* The outer destination: in the ICMPv6 checksum's pseudo header, in IPv4's header
	 * checksum only. */
	if (p->family == 6) {
		if (kp_store_addr(skb, 6, daddr_off, &p->tuple.daddr, &v.be_addr, csum_off,
				  BPF_F_PSEUDO_HDR) < 0)
			return TC_ACT_SHOT;
	} else if (bpf_l3_csum_replace(skb, ETH_HLEN + offsetof(struct iphdr, check),
				       p->tuple.daddr.w[3], v.be_addr.w[3], sizeof(__be32)) < 0 ||
		   bpf_skb_store_bytes(skb, daddr_off, &v.be_addr.w[3], sizeof(__be32), 0) < 0) {
		return TC_ACT_SHOT;
	}
	kp_count(KP_STAT_TC_ICMP_ERR);
	return TC_ACT_OK;         /* routed to the backend: its source is no address of ours */
}

#endif
