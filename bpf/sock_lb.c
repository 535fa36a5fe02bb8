/* sock_lb.c: socket-level load balancing for Services (cgroup sock_addr hooks).
 *
 * connect4 and sendmsg4 rewrite the destination of a socket aimed at a service frontend to one
 * of its backends before the first packet exists, so established flows cost nothing per packet
 * and need no NAT conntrack. recvmsg4 and getpeername4 undo it for the application: a UDP reply
 * appears to come from the service address and getpeername() names the service, as with
 * kube-proxy's DNAT.
 *
 * Compiled by bcc; KP_PIN_DIR (the agent's bpffs directory) and the map sizes come in as -D.
 */
#include <uapi/linux/bpf.h>
#include <uapi/linux/in.h>
#include <uapi/linux/errno.h>
#include "kproxy.h"
#include "lib/maps.h"

#define SYS_REJECT  0
#define SYS_PROCEED 1
#define KP_NSEC_PER_SEC 1000000000ULL

static __always_inline void kp_count(__u32 idx)
{
	__u64 *v = kp_stats_v1.lookup(&idx);

	if (v)
		*v += 1;
}

/* Reuses the backend an affinity row names if it is still fresh and still in the service:
 * the row remembers the slot the backend held, and that slot must still hold it. */
static __always_inline struct kp_backend4 *
sock4_affinity_backend(struct kp_svc4_key *key, const struct kp_svc_val *svc,
		       struct kp_aff_val *aff, __u64 timeout_ns, __u64 now)
{
	struct kp_svc_val *slot;

	if (now - aff->last_used > timeout_ns || aff->slot == 0 || aff->slot > svc->count)
		return NULL;
	key->slot = aff->slot;
	slot = kp_svc4_v1.lookup(key);
	if (!slot || slot->backend_id != aff->backend_id)
		return NULL;
	return kp_be4_v1.lookup(&aff->backend_id);
}

/* Picks a backend: from the affinity row when one applies, else uniformly at random. */
static __always_inline struct kp_backend4 *
sock4_select_backend(struct bpf_sock_addr *ctx, struct kp_svc4_key *key,
		     const struct kp_svc_val *svc, __u8 aff_type, __u64 timeout_s)
{
	struct kp_aff_key akey = {};
	struct kp_aff_val *aff = NULL;
	struct kp_aff_val fresh = {};
	struct kp_backend4 *be;
	struct kp_svc_val *slot;
	__u64 now = 0;

	if (timeout_s) {
		akey.client = aff_type == KP_AFF_CLIENT ? bpf_get_netns_cookie(ctx)
							: bpf_get_socket_cookie(ctx);
		akey.svc_id = svc->svc_id;
		akey.type = aff_type;
		now = bpf_ktime_get_ns();
		aff = kp_aff_v1.lookup(&akey);
		if (aff) {
			be = sock4_affinity_backend(key, svc, aff, timeout_s * KP_NSEC_PER_SEC, now);
			if (be) {
				aff->last_used = now;
				kp_count(KP_STAT_AFFINITY_HIT);
				return be;
			}
		}
	}

	key->slot = (bpf_get_prandom_u32() % svc->count) + 1;
	slot = kp_svc4_v1.lookup(key);
	if (!slot)
		return NULL;
	be = kp_be4_v1.lookup(&slot->backend_id);
	if (be && timeout_s) {
		fresh.last_used = now;
		fresh.backend_id = slot->backend_id;
		fresh.slot = key->slot;
		kp_aff_v1.update(&akey, &fresh);
	}
	return be;
}

/* Translates ctx's destination if it is a service frontend. Returns 0 when the socket may
 * proceed (translated or not a service) or a negative errno for the caller to report. */
static __always_inline int sock4_xlate_fwd(struct bpf_sock_addr *ctx, bool unconnected_udp)
{
	struct kp_svc4_key key = {};
	struct kp_sknat4_key rkey = {};
	struct kp_sknat4_val rval = {};
	struct kp_svc_val *svc;
	struct kp_backend4 *be;
	__u64 timeout_s;
	__u8 aff_type;

	key.addr = ctx->user_ip4;
	key.port = (__be16)ctx->user_port;
	key.proto = (__u8)ctx->protocol;
	key.scope = KP_SCOPE_SOCK;
	svc = kp_svc4_v1.lookup(&key);
	if (!svc)
		return 0;
	if (svc->action == KP_ACTION_REJECT || svc->count == 0) {
		/* A DROP row always has a count of 0, so test for it first. */
		if (svc->action == KP_ACTION_DROP) {
			kp_count(KP_STAT_DROP);
			return -EHOSTUNREACH;
		}
		kp_count(KP_STAT_REJECT);
		return -ECONNREFUSED;
	}

	/* ClientIP affinity wins; an unconnected UDP socket otherwise sticks to its backend
	 * for the life of a conntrack UDP flow, as it would through kube-proxy. */
	if (svc->affinity_timeout) {
		aff_type = KP_AFF_CLIENT;
		timeout_s = svc->affinity_timeout;
	} else if (unconnected_udp) {
		aff_type = KP_AFF_SOCKET;
		timeout_s = KP_UDP_FLOW_TIMEOUT_S;
	} else {
		aff_type = KP_AFF_CLIENT;
		timeout_s = 0;
	}
	be = sock4_select_backend(ctx, &key, svc, aff_type, timeout_s);
	if (!be) {
		/* The writer fills slots before it raises count, so this is a bug: let the
		 * socket go on untranslated rather than fail it. */
		kp_count(KP_STAT_BACKEND_MISS);
		return 0;
	}

	rkey.cookie = bpf_get_socket_cookie(ctx);
	rkey.addr = be->addr;
	rkey.port = be->port;
	rval.addr = ctx->user_ip4;
	rval.port = (__be16)ctx->user_port;
	rval.svc_id = svc->svc_id;
	kp_sknat4_v1.update(&rkey, &rval);

	ctx->user_ip4 = be->addr;
	ctx->user_port = (__u32)be->port;
	kp_count(KP_STAT_FORWARD);
	return 0;
}

/* Shows the service address instead of the backend's to the application. */
static __always_inline void sock4_xlate_rev(struct bpf_sock_addr *ctx)
{
	struct kp_sknat4_key rkey = {};
	struct kp_sknat4_val *rval;

	rkey.cookie = bpf_get_socket_cookie(ctx);
	rkey.addr = ctx->user_ip4;
	rkey.port = (__be16)ctx->user_port;
	rval = kp_sknat4_v1.lookup(&rkey);
	if (!rval)
		return;
	ctx->user_ip4 = rval->addr;
	ctx->user_port = (__u32)rval->port;
	kp_count(KP_STAT_REVNAT);
}

/* A refusal must reach the caller as its own errno (ECONNREFUSED, not the EPERM a plain
 * SYS_REJECT gives): bpf_set_retval() sets it, and returning SYS_REJECT keeps it. */
static __always_inline int sock4_verdict(int err)
{
	if (!err)
		return SYS_PROCEED;
	bpf_set_retval(err);
	return SYS_REJECT;
}

int kp_connect4(struct bpf_sock_addr *ctx)
{
	return sock4_verdict(sock4_xlate_fwd(ctx, false));
}

int kp_sendmsg4(struct bpf_sock_addr *ctx)
{
	return sock4_verdict(sock4_xlate_fwd(ctx, true));
}

int kp_recvmsg4(struct bpf_sock_addr *ctx)
{
	sock4_xlate_rev(ctx);
	return SYS_PROCEED;
}

int kp_getpeername4(struct bpf_sock_addr *ctx)
{
	sock4_xlate_rev(ctx);
	return SYS_PROCEED;
}
