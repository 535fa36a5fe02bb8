/* lib/lb.h: service lookup and backend selection, shared by every program type.
 *
 * Context-free: the caller fills a struct kp_lb_req (frontend, affinity client, random numbers,
 * clock) and gets a kp_lb_res with the verdict and a stack copy of the backend row, so the
 * socket hooks, the TC path and BPF_PROG_TEST_RUN tests (bpf/tests/lb_run.c, driven by
 * tests/datapath/test_lb_run.py) run the same code.
 *
 * No torn reads: every row is copied to the stack once and only the copy is used. Backend rows
 * are never rewritten (a backend id names one address for its whole life) and the agent frees
 * an id only after no slot names it, so a slot's backend_id and the backend it names always
 * belong together. Slot 0 is rewritten in place, so a reader may see the count of a shrink
 * that already deleted the slot it picked: that miss reads slot 0 again once (the writer's
 * order guarantees the second read is complete) and, if the slot still misses, refuses
 * rather than let the connect go to a service address nobody answers.
 */
#ifndef KPROXY_LIB_LB_H
#define KPROXY_LIB_LB_H

#include <uapi/linux/errno.h>
#include "ip.h"
#include "maglev.h"
#include "maps.h"
#include "sched.h"
#include "stats.h"

/* Which program family asks: its verdicts go to its own counters (enum kp_stat). */
enum kp_lb_path {
	KP_LB_PATH_SOCK,        /* the socket hooks (sock_lb.c) */
	KP_LB_PATH_TC,          /* the per-packet paths (tc_lb.c) */
};

/* Fills a zeroed request for frontend (addr, port, proto, scope): a random number per attempt,
 * the affinity client, the unconnected-UDP flow (0: not one) and the clock. */
static __always_inline void kp_lb_request(struct kp_lb_req *req, struct kp_ip addr, __be16 port,
					  __u8 proto, __u8 scope, __u64 client, __u64 flow,
					  __u64 now)
{
	req->key.addr = addr;
	req->key.port = port;
	req->key.proto = proto;
	req->key.scope = scope;
	req->rnd[0] = bpf_get_prandom_u32();
	req->rnd[1] = bpf_get_prandom_u32();
	req->client = client;
	req->flow = flow;
	req->now = now;
}

/* A verdict that refuses the frontend (DROP, REJECT, MISS): counted on the path's counter and
 * the service port's (kp_svc_stat), and returned as what the client is told: -EHOSTUNREACH
 * (endpoints exist, none in the Local set) or -ECONNREFUSED (none at all, or a slot that
 * vanished twice under the lookup: refused rather than sent to a service address nobody
 * answers). */
static __always_inline int kp_lb_refusal(const struct kp_lb_res *res, enum kp_lb_path path)
{
	bool tc = path == KP_LB_PATH_TC;
	__u8 verdict = res->verdict;

	if (verdict == KP_LB_DROP) {
		kp_count(tc ? KP_STAT_TC_DROP : KP_STAT_DROP);
		kp_svc_refusal(res->svc_id, res->scope, KP_SVC_DROPPED);
		return -EHOSTUNREACH;
	}
	kp_svc_refusal(res->svc_id, res->scope, KP_SVC_REFUSED);
	if (verdict == KP_LB_REJECT)
		kp_count(tc ? KP_STAT_TC_REJECT : KP_STAT_REJECT);
	else
		kp_count(tc ? KP_STAT_TC_MISS : KP_STAT_BACKEND_MISS);
	return -ECONNREFUSED;
}

/* Copies slot `slot` of the frontend and the backend it names into res. 0 on success. A
 * backend of the other family counts as missing: the agent never writes one, and a socket of
 * one family must never be sent to an address of the other. */
static __always_inline int kp_lb_slot(struct kp_svc_key *key, __u16 slot, struct kp_lb_res *res)
{
	struct kp_svc_val *row;
	struct kp_svc_val copy;
	struct kp_backend *b;
	__u32 id;

	key->slot = slot;
	row = kp_svc.lookup(key);
	if (!row)
		return -1;
	copy = *row;
	id = copy.backend_id;
	b = kp_be.lookup(&id);
	if (!b)
		return -1;
	res->be = *b;
	if (kp_ip_is4(&res->be.addr) != kp_ip_is4(&key->addr))
		return -1;
	res->backend_id = id;
	res->be_flags = copy.be_flags;
	return 0;
}

static __always_inline struct kp_aff_val *kp_aff_lookup(struct kp_aff_key *akey)
{
	return akey->type == KP_AFF_CLIENT ? kp_aff.lookup(akey) : kp_flow.lookup(akey);
}

static __always_inline void kp_aff_store(struct kp_aff_key *akey, struct kp_aff_val *val)
{
	if (akey->type == KP_AFF_CLIENT)
		kp_aff.update(akey, val);
	else
		kp_flow.update(akey, val);
}

/* Keeps an affinity or flow row alive; written only when KP_TOUCH_MS has passed, so a busy
 * client does not rewrite its row on every send. */
static __always_inline void kp_aff_touch(struct kp_aff_key *akey, struct kp_aff_val *val,
					 __u64 now)
{
	if (now - val->last_used < KP_TOUCH_MS * KP_NSEC_PER_MS)
		return;
	val->last_used = now;
	kp_aff_store(akey, val);
}

/* The backend an affinity row names, if it is fresh and its slot still holds it. */
static __always_inline int kp_lb_from_affinity(struct kp_svc_key *key, __u16 count,
					       const struct kp_aff_val *aff, __u64 timeout_ns,
					       __u64 now, struct kp_lb_res *res)
{
	struct kp_lb_res got = {};

	if (now - aff->last_used > timeout_ns || aff->slot == 0 || aff->slot > count)
		return -1;
	if (kp_lb_slot(key, aff->slot, &got) != 0 || got.backend_id != aff->backend_id)
		return -1;
	res->be = got.be;
	res->backend_id = got.backend_id;
	res->be_flags = got.be_flags;
	res->slot = aff->slot;
	return 0;
}

/* Fills akey for the affinity that applies to this frontend; returns its timeout in ns, or 0
 * when none applies. ClientIP affinity wins; an unconnected UDP socket otherwise sticks to its
 * backend for the life of a conntrack UDP flow, as it would through kube-proxy. */
static __always_inline __u64 kp_lb_affinity_key(const struct kp_lb_req *req,
						const struct kp_svc_val *svc,
						struct kp_aff_key *akey)
{
	akey->svc_id = svc->svc_id;
	akey->family = kp_ip_family(&req->key.addr);
	if (svc->affinity_timeout) {
		akey->client = req->client;
		akey->type = KP_AFF_CLIENT;
		return (__u64)svc->affinity_timeout * KP_NSEC_PER_SEC;
	}
	if (req->flow) {
		akey->client = req->flow;
		akey->type = KP_AFF_SOCKET;
		return (__u64)KP_UDP_FLOW_TIMEOUT_S * KP_NSEC_PER_SEC;
	}
	return 0;
}

/* The slot a fresh pick takes: by the frontend's scheduler when slot 0 names one
 * (lib/sched.h; a least-conn frontend's backend_id names its kp_lcrow row, not a table), by
 * its Maglev table when it has one and the caller named the flow (its hash,
 * lib/maglev.h, computed only then), at random otherwise. 0: the slot or table row read
 * vanished or belongs to another version (retry). */
static __always_inline __u16 kp_lb_pick(const struct kp_svc_key *fe, const struct kp_svc_val *svc,
					__u32 rnd, const struct kp_ct_key *flow, __u32 *conn_ix)
{
	__u16 slot;

	if (svc->fe_flags & KP_FE_F_ROUND_ROBIN)
		return kp_rr_pick(fe, svc->count, rnd);
	if (svc->fe_flags & KP_FE_F_LEAST_CONN)
		return kp_lc_pick(fe, svc, rnd, conn_ix);	/* backend_id: its kp_lcrow row */
	if (!svc->backend_id || !flow)
		return (rnd % svc->count) + 1;
	slot = kp_maglev_slot(svc->backend_id, svc->maglev_size, kp_flow_hash(flow));
	return slot <= svc->count ? slot : 0;
}

/* One attempt: read slot 0, then reuse the affinity backend or pick a slot (kp_lb_pick).
 * Returns 1 when res holds a final verdict, 0 when the picked slot vanished (retry). */
static __always_inline int kp_lb_attempt(const struct kp_lb_req *req, struct kp_lb_res *res,
					 __u32 rnd, const struct kp_ct_key *flow, int first)
{
	/* Locals in the narrowest scope: the TC programs' stack is full, and clang shares the
	 * slots of variables whose scopes do not overlap. */
	struct kp_svc_key key = req->key;
	struct kp_aff_key akey = {};
	struct kp_aff_val *row;
	struct kp_svc_val svc;
	struct kp_svc_val *head;
	__u64 timeout_ns;

	key.slot = 0;
	head = kp_svc.lookup(&key);
	if (!head) {
		/* Gone between two attempts means deleted: as untranslated as a moment later. */
		res->verdict = KP_LB_NONE;
		return 1;
	}
	svc = *head;
	res->svc_id = svc.svc_id;
	res->fe_flags = svc.fe_flags;
	if (svc.action == KP_ACTION_DROP) {
		res->verdict = KP_LB_DROP;
		return 1;
	}
	if (svc.action != KP_ACTION_FORWARD || svc.count == 0) {
		res->verdict = KP_LB_REJECT;
		return 1;
	}
	timeout_ns = kp_lb_affinity_key(req, &svc, &akey);
	if (timeout_ns && first) {
		row = kp_aff_lookup(&akey);
		if (row) {
			struct kp_aff_val aff = *row;

			if (kp_lb_from_affinity(&key, svc.count, &aff, timeout_ns, req->now, res) == 0) {
				kp_aff_touch(&akey, &aff, req->now);
				res->affinity_hit = 1;
				res->verdict = KP_LB_FORWARD;
				return 1;
			}
		}
	}
	res->conn_ix = 0;
	res->slot = kp_lb_pick(&key, &svc, rnd, flow, &res->conn_ix);
	if (res->slot == 0 || kp_lb_slot(&key, res->slot, res) != 0)
		return 0;
	if (timeout_ns) {
		struct kp_aff_val fresh = {};

		fresh.last_used = req->now;
		fresh.backend_id = res->backend_id;
		fresh.slot = res->slot;
		/* An unconnected UDP socket's flow counts for least-conn like a TC flow. */
		if (akey.type == KP_AFF_SOCKET && (svc.fe_flags & KP_FE_F_LEAST_CONN))
			fresh.flags = KP_AFF_F_COUNTED;
		kp_aff_store(&akey, &fresh);
		if (fresh.flags & KP_AFF_F_COUNTED)
			kp_conns_flow_open(res->backend_id);
	}
	res->verdict = KP_LB_FORWARD;
	return 1;
}

/* Chooses a backend for req->key; see the file comment for the consistency argument. `flow`
 * is the packet's tuple, for a frontend with a Maglev table (the TC path; the socket path's
 * frontends have none and pass NULL). An argument rather than a field of the request: the TC
 * programs' stack has no room to spare. */
static __always_inline void kp_lb_select(const struct kp_lb_req *req, struct kp_lb_res *res,
					 const struct kp_ct_key *flow)
{
	res->scope = req->key.scope;
	res->attempts = 1;
	if (kp_lb_attempt(req, res, req->rnd[0], flow, 1))
		goto out;
	kp_count(KP_STAT_RETRY);
	res->attempts = 2;
	res->affinity_hit = 0;
	if (kp_lb_attempt(req, res, req->rnd[1], flow, 0))
		goto out;
	res->verdict = KP_LB_MISS;
out:
	if (res->affinity_hit)
		kp_count(KP_STAT_AFFINITY_HIT);
}

#endif
