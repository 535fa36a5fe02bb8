/* sock_lb.c: socket-level load balancing for Services (cgroup sock_addr hooks).
 *
 * connect and sendmsg rewrite the destination of a socket aimed at a service frontend to one of
 * its backends before the first packet exists, so established flows cost nothing per packet and
 * need no NAT conntrack. recvmsg and getpeername undo it for the application: a UDP reply
 * appears to come from the service address and getpeername() names the service, as with
 * kube-proxy's DNAT.
 *
 * The *6 programs serve IPv4 Services reached through AF_INET6 sockets as IPv4-mapped
 * addresses (::ffff:10.96.0.10, what Java and other dual-stack clients do): the kernel runs only
 * the IPv6 hooks for those, and kube-proxy, which sees plain IPv4 packets, serves them too.
 *
 * Compiled by bcc; KP_PIN_DIR (the agent's bpffs directory) and the map sizes come in as -D.
 */
#include <uapi/linux/bpf.h>
#include <uapi/linux/in.h>
#include <uapi/linux/errno.h>
#include "kproxy.h"
#include "lib/maps.h"
#include "lib/servicecidr.h"

#define SYS_REJECT  0
#define SYS_PROCEED 1
#define KP_NSEC_PER_SEC 1000000000ULL
/* 0x0000ffff in network byte order, read as a __u32 on this (little-endian) host. */
#define KP_V4MAPPED_WORD 0xffff0000U

static __always_inline void kp_count(__u32 idx)
{
	__u64 *v = kp_stats_v1.lookup(&idx);

	if (v)
		*v += 1;
}

/* Reuses the backend an affinity row names if it is still fresh and still in the service:
 * the row remembers the slot the backend held, and that slot must still hold it. */
static __always_inline struct kp_backend4 *
sock_affinity_backend(struct kp_svc4_key *key, __u16 count, struct kp_aff_val *aff,
		      __u64 timeout_ns, __u64 now)
{
	struct kp_svc_val *slot;

	if (now - aff->last_used > timeout_ns || aff->slot == 0 || aff->slot > count)
		return NULL;
	key->slot = aff->slot;
	slot = kp_svc4_v1.lookup(key);
	if (!slot || slot->backend_id != aff->backend_id)
		return NULL;
	return kp_be4_v1.lookup(&aff->backend_id);
}

/* A uniformly random slot of the service. NULL only if the writer removed the slot or its
 * backend between our read of the count and this lookup (a shrink racing with us). */
static __always_inline struct kp_backend4 *
sock_random_backend(struct kp_svc4_key *key, __u16 count, __u32 *backend_id)
{
	struct kp_svc_val *slot;

	key->slot = (bpf_get_prandom_u32() % count) + 1;
	slot = kp_svc4_v1.lookup(key);
	if (!slot)
		return NULL;
	*backend_id = slot->backend_id;
	return kp_be4_v1.lookup(backend_id);
}

/* Picks a backend for one service row (a copy on our stack: the map element itself may be
 * recycled by a concurrent update): from the affinity or flow row when one applies, else at
 * random; a chosen backend refreshes (or creates) that row. */
static __always_inline struct kp_backend4 *
sock_select_backend(struct bpf_sock_addr *ctx, struct kp_svc4_key *key,
		    const struct kp_svc_val *svc, bool unconnected_udp)
{
	struct kp_aff_key akey = {};
	struct kp_aff_val fresh = {};
	struct kp_aff_val *aff;
	struct kp_backend4 *be;
	__u32 backend_id = 0;
	__u64 timeout_s, now;

	/* ClientIP affinity wins; an unconnected UDP socket otherwise sticks to its backend
	 * for the life of a conntrack UDP flow, as it would through kube-proxy. */
	if (svc->affinity_timeout) {
		akey.client = bpf_get_netns_cookie(ctx);
		akey.type = KP_AFF_CLIENT;
		timeout_s = svc->affinity_timeout;
	} else if (unconnected_udp) {
		akey.client = bpf_get_socket_cookie(ctx);
		akey.type = KP_AFF_SOCKET;
		timeout_s = KP_UDP_FLOW_TIMEOUT_S;
	} else {
		return sock_random_backend(key, svc->count, &backend_id);
	}
	akey.svc_id = svc->svc_id;
	now = bpf_ktime_get_ns();
	aff = akey.type == KP_AFF_CLIENT ? kp_aff_v1.lookup(&akey) : kp_flow_v1.lookup(&akey);
	if (aff) {
		be = sock_affinity_backend(key, svc->count, aff, timeout_s * KP_NSEC_PER_SEC, now);
		if (be) {
			aff->last_used = now;
			kp_count(KP_STAT_AFFINITY_HIT);
			return be;
		}
	}
	be = sock_random_backend(key, svc->count, &backend_id);
	if (be) {
		fresh.last_used = now;
		fresh.backend_id = backend_id;
		fresh.slot = key->slot;
		if (akey.type == KP_AFF_CLIENT)
			kp_aff_v1.update(&akey, &fresh);
		else
			kp_flow_v1.update(&akey, &fresh);
	}
	return be;
}

/* An address no frontend matched: refused, unreachable or untouched (lib/servicecidr.h). */
static __always_inline int sock_unmatched(__be32 addr)
{
	struct kp_cidr4_key ckey = kp_servicecidr_key(addr);
	struct kp_cip4_val *cip = kp_cip4_v1.lookup(&addr);
	int err = kp_servicecidr_verdict(cip, cip ? NULL : kp_svccidr4_v1.lookup(&ckey));

	if (err)
		kp_count(err == -ECONNREFUSED ? KP_STAT_CIP_REJECT : KP_STAT_CIDR_DROP);
	return err;
}

/* Translates (*addr, *port) if it is a service frontend. Returns 1 when translated, 0 when it
 * is no service (the socket proceeds untouched), or a negative errno to report. */
static __always_inline int sock_xlate_fwd(struct bpf_sock_addr *ctx, __be32 *addr,
					  __be16 *port, bool unconnected_udp)
{
	struct kp_svc4_key key = {};
	struct kp_sknat4_key rkey = {};
	struct kp_sknat4_val rval = {};
	struct kp_svc_val svc, *row;
	struct kp_backend4 *be;
	int attempt;

	key.addr = *addr;
	key.port = *port;
	key.proto = (__u8)ctx->protocol;
	key.scope = KP_SCOPE_SOCK;
	be = NULL;
	/* A miss can only be a shrink racing with us; the second read of slot 0 sees it done. */
	for (attempt = 0; attempt < 2 && !be; attempt++) {
		key.slot = 0;
		row = kp_svc4_v1.lookup(&key);
		if (!row)
			return sock_unmatched(key.addr);
		svc = *row;
		if (svc.action == KP_ACTION_DROP) {
			kp_count(KP_STAT_DROP);
			return -EHOSTUNREACH;
		}
		if (svc.action == KP_ACTION_REJECT || svc.count == 0) {
			kp_count(KP_STAT_REJECT);
			return -ECONNREFUSED;
		}
		be = sock_select_backend(ctx, &key, &svc, unconnected_udp);
	}
	if (!be) {
		/* Fail fast rather than send the connect to a service address nobody answers. */
		kp_count(KP_STAT_BACKEND_MISS);
		return -ECONNREFUSED;
	}

	rkey.cookie = bpf_get_socket_cookie(ctx);
	rkey.addr = be->addr;
	rkey.port = be->port;
	rval.addr = *addr;
	rval.port = *port;
	rval.svc_id = svc.svc_id;
	kp_sknat4_v1.update(&rkey, &rval);

	*addr = be->addr;
	*port = be->port;
	kp_count(KP_STAT_FORWARD);
	return 1;
}

/* The service address a translated socket meant, for a (backend addr, port) it sees; a UDP
 * reply also keeps the socket's flow row alive, as a reply refreshes a conntrack entry. */
static __always_inline bool sock_xlate_rev(struct bpf_sock_addr *ctx, __be32 *addr,
					   __be16 *port)
{
	struct kp_sknat4_key rkey = {};
	struct kp_sknat4_val *rval;
	struct kp_aff_key akey = {};
	struct kp_aff_val *flow;

	rkey.cookie = bpf_get_socket_cookie(ctx);
	rkey.addr = *addr;
	rkey.port = *port;
	rval = kp_sknat4_v1.lookup(&rkey);
	if (!rval)
		return false;
	akey.client = rkey.cookie;
	akey.svc_id = rval->svc_id;
	akey.type = KP_AFF_SOCKET;
	flow = kp_flow_v1.lookup(&akey);
	if (flow)
		flow->last_used = bpf_ktime_get_ns();
	*addr = rval->addr;
	*port = rval->port;
	kp_count(KP_STAT_REVNAT);
	return true;
}

/* A refusal must reach the caller as its own errno (ECONNREFUSED, not the EPERM a plain
 * SYS_REJECT gives): bpf_set_retval() sets it, and returning SYS_REJECT keeps it. */
static __always_inline int sock_verdict(int err)
{
	if (err >= 0)
		return SYS_PROCEED;
	bpf_set_retval(err);
	return SYS_REJECT;
}

static __always_inline int sock4_fwd(struct bpf_sock_addr *ctx, bool unconnected_udp)
{
	__be32 addr = ctx->user_ip4;
	__be16 port = (__be16)ctx->user_port;
	int ret = sock_xlate_fwd(ctx, &addr, &port, unconnected_udp);

	if (ret > 0) {
		ctx->user_ip4 = addr;
		ctx->user_port = (__u32)port;
	}
	return sock_verdict(ret);
}

static __always_inline int sock4_rev(struct bpf_sock_addr *ctx)
{
	__be32 addr = ctx->user_ip4;
	__be16 port = (__be16)ctx->user_port;

	if (sock_xlate_rev(ctx, &addr, &port)) {
		ctx->user_ip4 = addr;
		ctx->user_port = (__u32)port;
	}
	return SYS_PROCEED;
}

static __always_inline bool sock6_v4mapped(struct bpf_sock_addr *ctx)
{
	return ctx->user_ip6[0] == 0 && ctx->user_ip6[1] == 0 &&
	       ctx->user_ip6[2] == KP_V4MAPPED_WORD;
}

static __always_inline int sock6_fwd(struct bpf_sock_addr *ctx, bool unconnected_udp)
{
	__be32 addr;
	__be16 port;
	int ret;

	if (!sock6_v4mapped(ctx))
		return SYS_PROCEED;          /* IPv6 Services are not served yet */
	addr = ctx->user_ip6[3];
	port = (__be16)ctx->user_port;
	ret = sock_xlate_fwd(ctx, &addr, &port, unconnected_udp);
	if (ret > 0) {
		ctx->user_ip6[3] = addr;
		ctx->user_port = (__u32)port;
	}
	return sock_verdict(ret);
}

static __always_inline int sock6_rev(struct bpf_sock_addr *ctx)
{
	__be32 addr;
	__be16 port;

	if (!sock6_v4mapped(ctx))
		return SYS_PROCEED;
	addr = ctx->user_ip6[3];
	port = (__be16)ctx->user_port;
	if (sock_xlate_rev(ctx, &addr, &port)) {
		ctx->user_ip6[3] = addr;
		ctx->user_port = (__u32)port;
	}
	return SYS_PROCEED;
}

int kp_connect4(struct bpf_sock_addr *ctx)     { return sock4_fwd(ctx, false); }
int kp_sendmsg4(struct bpf_sock_addr *ctx)     { return sock4_fwd(ctx, true); }
int kp_recvmsg4(struct bpf_sock_addr *ctx)     { return sock4_rev(ctx); }
int kp_getpeername4(struct bpf_sock_addr *ctx) { return sock4_rev(ctx); }
int kp_connect6(struct bpf_sock_addr *ctx)     { return sock6_fwd(ctx, false); }
int kp_sendmsg6(struct bpf_sock_addr *ctx)     { return sock6_fwd(ctx, true); }
int kp_recvmsg6(struct bpf_sock_addr *ctx)     { return sock6_rev(ctx); }
int kp_getpeername6(struct bpf_sock_addr *ctx) { return sock6_rev(ctx); }
