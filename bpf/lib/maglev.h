/* lib/maglev.h: the flow hash and the Maglev table lookup of scope-EXT frontends.
 *
 * The hash takes the client's address and port, the frontend's port and the protocol, each
 * word in host order of its network value, so every node (of either byte order) computes the
 * same number for a flow; the frontend's address is left out, so a flow that an ECMP router
 * sends to another node's NodePort address meets the same entry there too.
 * kproxy_ebpf/model/maglev.py flow_hash is the same function (tests/datapath/test_maglev_run.py runs both).
 */
#ifndef KPROXY_LIB_MAGLEV_H
#define KPROXY_LIB_MAGLEV_H

#include "endian.h"
#include "maps.h"

static __always_inline __u32 kp_rotl32(__u32 x, int r)
{
	return (x << r) | (x >> (32 - r));
}

/* One 32-bit word into the hash (the block step of MurmurHash3's 32-bit variant). */
static __always_inline __u32 kp_hash_word(__u32 h, __u32 k)
{
	k *= 0xcc9e2d51;
	k = kp_rotl32(k, 15);
	k *= 0x1b873593;
	h ^= k;
	h = kp_rotl32(h, 13);
	return h * 5 + 0xe6546b64;
}

/* The flow's hash: the client side of its tuple (struct kp_ct_key, either family). */
static __always_inline __u32 kp_flow_hash(const struct kp_ct_key *t)
{
	__u32 h = KP_MAGLEV_SEED;

	h = kp_hash_word(h, kp_ntohl(t->saddr.w[0]));
	h = kp_hash_word(h, kp_ntohl(t->saddr.w[1]));
	h = kp_hash_word(h, kp_ntohl(t->saddr.w[2]));
	h = kp_hash_word(h, kp_ntohl(t->saddr.w[3]));
	h = kp_hash_word(h, (__u32)kp_ntohs(t->sport) << 16 | kp_ntohs(t->dport));
	h = kp_hash_word(h, t->proto);
	/* the finaliser: every input bit reaches every output bit */
	h ^= 24;
	h ^= h >> 16;
	h *= 0x85ebca6b;
	h ^= h >> 13;
	h *= 0xc2b2ae35;
	h ^= h >> 16;
	return h;
}

/* The slot that entry hash % size of table names, or 0 when the row is missing or was
 * taken by another table under the read (the caller reads slot 0 again, as for a vanished
 * slot). Rows are never rewritten in place: a changed table is another id. */
static __always_inline __u16 kp_maglev_slot(__u32 table, __u16 size, __u32 hash)
{
	struct kp_maglev_key key = {};
	struct kp_maglev_row *row;
	__u64 off;      /* 64 bits: a 32-bit one is checked in a zero-extended copy */
	__u32 idx;
	__u16 slot;

	if (size == 0)
		return 0;
	idx = hash % size;
	key.table = table;
	key.row = idx / KP_MAGLEV_ROW;
	off = idx % KP_MAGLEV_ROW;
	/* For the verifier, which does not bound a modulo: the empty asm before keeps clang from
	 * proving the check redundant, the one after makes the access use the register checked. */
	asm volatile("" : "+r"(off));
	if (off >= KP_MAGLEV_ROW)
		return 0;
	asm volatile("" : "+r"(off));
	row = kp_maglev.lookup(&key);
	if (!row)
		return 0;
	slot = row->slot[off];
	/* The tag after the entry: a row recycled under us shows another table's tag. (A
	 * compiler barrier: x86-64 does not reorder a load with an earlier load.) */
	asm volatile("" ::: "memory");
	if (row->table != table)
		return 0;
	return slot;
}

#endif
