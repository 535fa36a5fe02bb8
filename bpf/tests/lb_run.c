/* tests/lb_run.c: lib/lb.h under BPF_PROG_TEST_RUN, for tests/datapath/test_lb_run.py.
 *
 * A tc program (the type whose test runs carry data in and out): the "packet" is an Ethernet
 * header's worth of padding, then a struct kp_lb_req the test wrote, then room for the struct
 * kp_lb_res this program writes back. So the lookup, the slot-0 retry, affinity and a backend
 * miss are exercised on real maps and the real verifier, with the test choosing the random
 * numbers and the clock, and no socket anywhere.
 *
 * kp_lb_run_flow does the same for a flow from outside: a struct kp_ct_key (the packet's
 * tuple) before the request, hashed as tc_lb.c hashes it (lib/maglev.h), so a test drives
 * Maglev tables with real tuples; the result is followed by the hash.
 */
#include <uapi/linux/bpf.h>
#include <uapi/linux/pkt_cls.h>
#include "../kproxy.h"
#include "../lib/lb.h"

#define KP_RUN_OFF 14   /* test runs of tc programs need at least an Ethernet header */

int kp_lb_run(struct __sk_buff *skb)
{
	struct kp_lb_req req = {};
	struct kp_lb_res res = {};

	if (bpf_skb_load_bytes(skb, KP_RUN_OFF, &req, sizeof(req)) < 0)
		return TC_ACT_SHOT;
	kp_lb_select(&req, &res, NULL);
	if (bpf_skb_store_bytes(skb, KP_RUN_OFF + sizeof(req), &res, sizeof(res), 0) < 0)
		return TC_ACT_SHOT;
	return TC_ACT_OK;
}

int kp_lb_run_flow(struct __sk_buff *skb)
{
	struct kp_ct_key tuple = {};
	struct kp_lb_req req = {};
	struct kp_lb_res res = {};
	__u32 off = KP_RUN_OFF + sizeof(tuple);
	__u32 hash;

	if (bpf_skb_load_bytes(skb, KP_RUN_OFF, &tuple, sizeof(tuple)) < 0 ||
	    bpf_skb_load_bytes(skb, off, &req, sizeof(req)) < 0)
		return TC_ACT_SHOT;
	hash = kp_flow_hash(&tuple);
	kp_lb_select(&req, &res, &tuple);
	off += sizeof(req);
	if (bpf_skb_store_bytes(skb, off, &res, sizeof(res), 0) < 0 ||
	    bpf_skb_store_bytes(skb, off + sizeof(res), &hash, sizeof(hash), 0) < 0)
		return TC_ACT_SHOT;
	return TC_ACT_OK;
}
