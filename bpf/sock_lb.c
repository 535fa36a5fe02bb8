/* sock_lb.c: socket-level load balancing for Services (cgroup sock_addr hooks).
 *
 * connect and sendmsg rewrite the destination of a socket aimed at a service frontend to one of
 * its backends before the first packet exists, so established flows cost nothing per packet and
 * need no NAT conntrack. recvmsg and getpeername undo it for the application: a UDP reply
 * appears to come from the service address and getpeername() names the service, as with
 * kube-proxy's DNAT. The choice itself is lib/lb.h's, shared with every other program.
 *
 * The *4 and *6 programs are one code path over struct kp_ip (lib/ip.h): the *4 ones map their
 * IPv4 address, the *6 ones pass theirs as is. So an IPv4 Service reached through an AF_INET6
 * socket as an IPv4-mapped address (::ffff:10.96.0.10, what Java and other dual-stack clients
 * do; the kernel runs only the IPv6 hooks for those, and kube-proxy, which sees plain IPv4
 * packets, serves them too) is simply its frontend's key, and gets an IPv4-mapped backend.
 *
 * Compiled by bcc; KP_PIN_DIR (the agent's bpffs directory) and the map sizes come in as -D.
 */
#include <uapi/linux/bpf.h>
#include <uapi/linux/in.h>
#include <uapi/linux/errno.h>
#include "kproxy.h"
#include "lib/endian.h"
#include "lib/ip.h"
#include "lib/lb.h"
#include "lib/servicecidr.h"
#include "lib/sockconn.h"
#include "lib/srcrange.h"

#define SYS_REJECT  0
#define SYS_PROCEED 1

/* A TCP socket's service address goes to its own storage (kproxy.h, kp_sksvc_val). connect
 * runs for an unconnected socket only and getpeername for a connected one, so the row is never
 * read while it is written. False without memory for it: the LRU row below is written. */
static __always_inline bool sock_remember_tcp(struct bpf_sock_addr *ctx,
					     const struct kp_lb_res *res,
					     const struct kp_ip *addr, __be16 port)
{
	struct bpf_sock *sk = ctx->sk;
	struct kp_sksvc_val *row;

	if (!sk)
		return false;
	row = kp_sksvc.sk_storage_get(sk, 0, BPF_SK_STORAGE_GET_F_CREATE);
	if (!row)
		return false;
	row->be_addr = res->be.addr;
	row->be_port = res->be.port;
	row->addr = *addr;
	row->port = port;
	return true;             /* row->conn stays: kept over a new connect (lib/sockconn.h) */
}

/* The service address sock_remember_tcp stored for (*addr, *port), if any, into them. */
static __always_inline bool sock_recall_tcp(struct bpf_sock_addr *ctx, struct kp_ip *addr,
					    __be16 *port)
{
	struct kp_sksvc_val *row;
	struct kp_sksvc_val v;

	if (!ctx->sk)
		return false;
	row = kp_sksvc.sk_storage_get(ctx->sk, 0, 0);
	if (!row)
		return false;
	v = *row;
	if (!kp_ip_eq(&v.be_addr, addr) || v.be_port != *port)
		return false;
	*addr = v.addr;
	*port = v.port;
	return true;
}

/* Remembers which service address the socket meant, for recvmsg/getpeername. Written only
 * when it changes: an unconnected UDP client (every DNS query) sends through here each time. */
static __always_inline void sock_remember(struct bpf_sock_addr *ctx, const struct kp_lb_res *res,
					  const struct kp_ip *addr, __be16 port)
{
	struct kp_sknat_key rkey = {};
	struct kp_sknat_val rval = {};
	struct kp_sknat_val old;
	struct kp_sknat_val *row;

	if (ctx->protocol == IPPROTO_TCP && sock_remember_tcp(ctx, res, addr, port))
		return;
	rkey.cookie = bpf_get_socket_cookie(ctx);
	rkey.addr = res->be.addr;
	rkey.port = res->be.port;
	row = kp_sknat.lookup(&rkey);
	if (row) {
		old = *row;
		if (kp_ip_eq(&old.addr, addr) && old.port == port && old.svc_id == res->svc_id)
			return;
	}
	rval.addr = *addr;
	rval.port = port;
	rval.svc_id = res->svc_id;
	kp_sknat.update(&rkey, &rval);
}

/* Notes that a socket of network namespace `netns` is connected to the chosen backend
 * (kp_skwhere), for the agent's stale-socket search. A connected socket only: an unconnected
 * UDP socket picks its backend anew for every flow. Written when the row is missing or
 * KP_WHERE_REFRESH_MS old, so a client that connects all the time costs one lookup per
 * connect, and two containers of a pod connecting by turns do not rewrite it each time. */
static __always_inline void sock_note_where(const struct kp_lb_res *res, bool v6, __u64 netns,
					    __u64 now)
{
	struct kp_skwhere_key key = {};
	struct kp_skwhere_val val = {};
	struct kp_skwhere_val old;
	struct kp_skwhere_val *row;

	key.addr = res->be.addr;
	key.port = res->be.port;
	key.proto = res->be.proto;
	key.family = v6 ? 6 : 4;
	key.netns = netns;
	row = kp_skwhere.lookup(&key);
	if (row) {
		old = *row;
		if (now - old.last < KP_WHERE_REFRESH_MS * 1000000ULL)
			return;
	}
	val.cgroup = bpf_get_current_cgroup_id();
	val.last = now;
	kp_skwhere.update(&key, &val);
}

/* The address the socket's traffic to frontend fe leaves from: the one it asks for (a sendmsg
 * with IP_PKTINFO) or is bound to (also a UDP socket connected before, which the kernel bound to
 * its route's source), else the one the agent learnt for its network namespace (kp_nssrc; the
 * route picks an unbound socket's source only after this hook). False when none is known. */
static __always_inline bool sock_source(struct bpf_sock_addr *ctx, bool v6, bool unconnected_udp,
					const struct kp_svc_key *fe, struct kp_ip *src)
{
	struct kp_nssrc_key key = {};
	struct bpf_sock *sk = ctx->sk;
	struct kp_ip *row;

	if (unconnected_udp && !v6 && ctx->msg_src_ip4) {
		*src = kp_ip_from4(ctx->msg_src_ip4);
		return true;
	}
	if (unconnected_udp && v6) {
		src->w[0] = ctx->msg_src_ip6[0];
		src->w[1] = ctx->msg_src_ip6[1];
		src->w[2] = ctx->msg_src_ip6[2];
		src->w[3] = ctx->msg_src_ip6[3];
		if (!kp_ip_is_zero(src))
			return true;
	}
	if (sk && !v6 && sk->src_ip4) {
		*src = kp_ip_from4(sk->src_ip4);
		return true;
	}
	if (sk && v6) {
		src->w[0] = sk->src_ip6[0];
		src->w[1] = sk->src_ip6[1];
		src->w[2] = sk->src_ip6[2];
		src->w[3] = sk->src_ip6[3];
		if (!kp_ip_is_zero(src))
			return true;
	}
	key.netns = bpf_get_netns_cookie(ctx);
	key.family = kp_ip_family(&fe->addr);
	row = kp_nssrc.lookup(&key);
	if (!row)
		return false;
	*src = *row;
	return true;
}

/* loadBalancerSourceRanges for a socket (lib/srcrange.h): 0 when the source may use fe, else
 * -EPERM, what a node's own client gets from a netfilter drop in OUTPUT. A namespace the agent
 * has not learnt yet is refused (fail closed) and noted in kp_nsmiss, which wakes the agent. */
static __always_inline int sock_source_allows(struct bpf_sock_addr *ctx, bool v6,
					      bool unconnected_udp, const struct kp_svc_key *fe,
					      const struct kp_lb_res *res)
{
	__u8 fe_flags = res->fe_flags;
	struct kp_ip src;
	__u64 netns, now;

	if (!(fe_flags & KP_FE_F_SRC_RANGES))
		return 0;
	if (!sock_source(ctx, v6, unconnected_udp, fe, &src)) {
		netns = bpf_get_netns_cookie(ctx);
		if (!kp_nsmiss.lookup(&netns)) {
			now = bpf_ktime_get_ns();
			kp_nsmiss.update(&netns, &now);
		}
		kp_count(KP_STAT_SRC_UNKNOWN);
		kp_svc_refusal(res->svc_id, KP_SCOPE_SOCK, KP_SVC_DENIED);
		return -EPERM;
	}
	if (!kp_srcrange_allows(fe, fe_flags, src)) {
		kp_count(KP_STAT_SRC_DENY);
		kp_svc_refusal(res->svc_id, KP_SCOPE_SOCK, KP_SVC_DENIED);
		return -EPERM;
	}
	return 0;
}

/* Translates (*addr, *port) if it is a service frontend. Returns 1 when translated, 0 when it
 * is no service (the socket proceeds untouched), or a negative errno to report. */
static __always_inline int sock_xlate_fwd(struct bpf_sock_addr *ctx, bool v6, struct kp_ip *addr,
					  __be16 *port, bool unconnected_udp)
{
	struct kp_lb_req req = {};
	struct kp_lb_res res = {};
	struct kp_svc_stat *st;
	int err;

	kp_lb_request(&req, *addr, *port, (__u8)ctx->protocol, KP_SCOPE_SOCK,
		      bpf_get_netns_cookie(ctx), unconnected_udp ? bpf_get_socket_cookie(ctx) : 0,
		      bpf_ktime_get_ns());
	kp_lb_select(&req, &res, NULL);
	if (res.verdict == KP_LB_NONE)
		return kp_servicecidr_unmatched(req.key.addr);
	/* Before the verdict, as on the TC path: kube-proxy's firewall runs before its reject. */
	err = sock_source_allows(ctx, v6, unconnected_udp, &req.key, &res);
	if (err)
		return err;
	if (res.verdict != KP_LB_FORWARD)
		return kp_lb_refusal(&res, KP_LB_PATH_SOCK);
	sock_remember(ctx, &res, addr, *port);
	if (!unconnected_udp) {
		sock_note_where(&res, v6, req.client, req.now);
		kp_sock_count(ctx, res.fe_flags & KP_FE_F_LEAST_CONN ? res.backend_id : 0,
			      res.conn_ix);
	}
	*addr = res.be.addr;
	*port = res.be.port;
	kp_count(KP_STAT_FORWARD);
	/* One counter row lookup per forward: an unconnected UDP socket's datagram is a packet
	 * (a socket hook sees no bytes), a new flow of it (no flow row reused), like every
	 * connect(), a connection. */
	st = kp_svc_stat(res.svc_id, KP_SCOPE_SOCK);
	if (st) {
		st->packets += unconnected_udp;
		st->conns += !unconnected_udp || !res.affinity_hit;
	}
	return 1;
}

/* The service address a translated socket meant, for a (backend addr, port) it sees; a UDP
 * reply also keeps the socket's flow row alive, as a reply refreshes a conntrack entry. */
static __always_inline bool sock_xlate_rev(struct bpf_sock_addr *ctx, struct kp_ip *addr,
					   __be16 *port)
{
	struct kp_sknat_key rkey = {};
	struct kp_sknat_val rval;
	struct kp_sknat_val *row;
	struct kp_aff_key akey = {};
	struct kp_aff_val flow;
	struct kp_aff_val *frow;

	if (ctx->protocol == IPPROTO_TCP && sock_recall_tcp(ctx, addr, port)) {
		kp_count(KP_STAT_REVNAT);
		return true;
	}
	/* UDP, and TCP sockets connected before the agent stored them this way. */
	rkey.cookie = bpf_get_socket_cookie(ctx);
	rkey.addr = *addr;
	rkey.port = *port;
	row = kp_sknat.lookup(&rkey);
	if (!row)
		return false;
	rval = *row;
	akey.client = rkey.cookie;
	akey.svc_id = rval.svc_id;
	akey.type = KP_AFF_SOCKET;
	akey.family = kp_ip_family(&rval.addr);
	frow = kp_flow.lookup(&akey);
	if (frow) {
		flow = *frow;
		kp_aff_touch(&akey, &flow, bpf_ktime_get_ns());
	}
	*addr = rval.addr;
	*port = rval.port;
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

/* The socket's address as a kp_ip, and back: the only difference between the families. */
static __always_inline struct kp_ip sock_addr(const struct bpf_sock_addr *ctx, bool v6)
{
	struct kp_ip ip;

	if (!v6)
		return kp_ip_from4(ctx->user_ip4);
	ip.w[0] = ctx->user_ip6[0];
	ip.w[1] = ctx->user_ip6[1];
	ip.w[2] = ctx->user_ip6[2];
	ip.w[3] = ctx->user_ip6[3];
	return ip;
}

static __always_inline void sock_set_addr(struct bpf_sock_addr *ctx, bool v6,
					  const struct kp_ip *ip, __be16 port)
{
	if (v6) {
		ctx->user_ip6[0] = ip->w[0];
		ctx->user_ip6[1] = ip->w[1];
		ctx->user_ip6[2] = ip->w[2];
		ctx->user_ip6[3] = ip->w[3];
	} else {
		ctx->user_ip4 = ip->w[3];
	}
	ctx->user_port = (__u32)port;
}

static __always_inline int sock_fwd(struct bpf_sock_addr *ctx, bool v6, bool unconnected_udp)
{
	struct kp_ip addr = sock_addr(ctx, v6);
	__be16 port = (__be16)ctx->user_port;
	int ret = sock_xlate_fwd(ctx, v6, &addr, &port, unconnected_udp);

	if (ret > 0)
		sock_set_addr(ctx, v6, &addr, port);
	return sock_verdict(ret);
}

static __always_inline int sock_rev(struct bpf_sock_addr *ctx, bool v6)
{
	struct kp_ip addr = sock_addr(ctx, v6);
	__be16 port = (__be16)ctx->user_port;

	if (sock_xlate_rev(ctx, &addr, &port))
		sock_set_addr(ctx, v6, &addr, port);
	return SYS_PROCEED;
}

/* A socket's close (cgroup inet_sock_release, both families): the connection it counted for
 * least-conn ends. Runs once per socket, when its last file reference goes. */
int kp_release(struct bpf_sock *sk)
{
	kp_sock_uncount(sk);
	return SYS_PROCEED;
}

int kp_connect4(struct bpf_sock_addr *ctx)     { return sock_fwd(ctx, false, false); }
int kp_sendmsg4(struct bpf_sock_addr *ctx)     { return sock_fwd(ctx, false, true); }
int kp_recvmsg4(struct bpf_sock_addr *ctx)     { return sock_rev(ctx, false); }
int kp_getpeername4(struct bpf_sock_addr *ctx) { return sock_rev(ctx, false); }
int kp_connect6(struct bpf_sock_addr *ctx)     { return sock_fwd(ctx, true, false); }
int kp_sendmsg6(struct bpf_sock_addr *ctx)     { return sock_fwd(ctx, true, true); }
int kp_recvmsg6(struct bpf_sock_addr *ctx)     { return sock_rev(ctx, true); }
int kp_getpeername6(struct bpf_sock_addr *ctx) { return sock_rev(ctx, true); }
