/* lib/sockconn.h: least connection's count of the sockets the socket hooks connect
 * (sock_lb.c): at connect, on the counter of the backend chosen, and back at the socket's
 * release. The counters and the tag a socket keeps: lib/conns.h.
 */
#ifndef KPROXY_LIB_SOCKCONN_H
#define KPROXY_LIB_SOCKCONN_H

#include <uapi/linux/in.h>
#include "../kproxy.h"
#include "conns.h"
#include "maps.h"
#include "stats.h"

/* Moves the count of a socket whose storage holds *own to the counter `tag` names (its
 * kp_conn_tag; 0 when the socket is to be counted nowhere). */
static __always_inline void kp_sock_recount(__u32 *own, __u32 tag, __u32 backend_id)
{
	__u32 was = *own;

	if (was == tag && (tag || !backend_id))
		return;                 /* none, or connected again to the backend counted on */
	if (was)
		kp_conn_untag(was);
	*own = tag ? kp_conn_count(tag) : 0;
	if (!tag && backend_id)
		kp_count(KP_STAT_CONN_UNCOUNTED);
}

/* Counts a connected socket on its backend for least-conn: its own storage remembers which
 * counter (kp_conn_tag), so the release hook takes back exactly what connect added, and a
 * socket connected again (UDP, or the agent's reconnect of a stale one) moves its count. A
 * TCP socket keeps the tag in the storage sock_remember_tcp made at this connect (nothing to
 * allocate), a UDP one in kp_skconn. Only a least-conn frontend's sockets are counted
 * (backend_id 0 for the others: a socket counted before takes its count back): a UDP
 * socket's storage for every connect of every Service would cost each one an allocation no
 * other algorithm needs. */
static __always_inline void kp_sock_count(struct bpf_sock_addr *ctx, __u32 backend_id,
					    __u32 conn_ix)
{
	struct bpf_sock *sk = ctx->sk;
	struct kp_sksvc_val *tcp;
	struct kp_skconn_val *udp;
	__u32 tag;

	if (!sk)
		return;
	tag = backend_id ? kp_conns_tag(backend_id, conn_ix) : 0;
	if (sk->protocol == IPPROTO_TCP) {
		tcp = kp_sksvc.sk_storage_get(sk, 0, 0);
		if (tcp) {
			kp_sock_recount(&tcp->conn, tag, backend_id);
			return;
		}
	} else {
		udp = kp_skconn.sk_storage_get(sk, 0, backend_id ? BPF_SK_STORAGE_GET_F_CREATE : 0);
		if (udp) {
			kp_sock_recount(&udp->conn, tag, backend_id);
			return;
		}
	}
	if (backend_id)
		kp_count(KP_STAT_CONN_UNCOUNTED);
}

/* The release of a socket: what it was counted on, taken back. */
static __always_inline void kp_sock_uncount(struct bpf_sock *sk)
{
	struct kp_sksvc_val *tcp;
	struct kp_skconn_val *udp;

	if (sk->protocol == IPPROTO_TCP) {
		tcp = kp_sksvc.sk_storage_get(sk, 0, 0);
		if (tcp && tcp->conn) {
			kp_conn_untag(tcp->conn);
			tcp->conn = 0;
		}
	} else {
		udp = kp_skconn.sk_storage_get(sk, 0, 0);
		if (udp && udp->conn) {
			kp_conn_untag(udp->conn);
			udp->conn = 0;
		}
	}
}

#endif
