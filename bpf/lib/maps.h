/* lib/maps.h: the pinned maps, declared once for every program that includes it.
 * bcc opens a map already pinned at the path (a restarted agent adopts it, entries and all)
 * and creates and pins it otherwise. KP_PIN_DIR is the agent's bpffs directory. */
#ifndef KPROXY_LIB_MAPS_H
#define KPROXY_LIB_MAPS_H

#include "../kproxy.h"

#ifndef KP_PIN_DIR
#error "KP_PIN_DIR must name the bpffs directory for the pinned maps"
#endif

#define KP_PIN(name) KP_PIN_DIR "/" #name

BPF_TABLE_PINNED("hash", struct kp_svc4_key, struct kp_svc_val, kp_svc4_v1,
		 KP_SVC4_SIZE, KP_PIN(kp_svc4_v1));
BPF_TABLE_PINNED("hash", __u32, struct kp_backend4, kp_be4_v1,
		 KP_BE4_SIZE, KP_PIN(kp_be4_v1));
BPF_TABLE_PINNED("lru_hash", struct kp_sknat4_key, struct kp_sknat4_val, kp_sknat4_v1,
		 KP_SKNAT4_SIZE, KP_PIN(kp_sknat4_v1));
BPF_TABLE_PINNED("lru_hash", struct kp_aff_key, struct kp_aff_val, kp_aff_v1,
		 KP_AFF_SIZE, KP_PIN(kp_aff_v1));
BPF_TABLE_PINNED("lru_hash", struct kp_aff_key, struct kp_aff_val, kp_flow_v1,
		 KP_FLOW_SIZE, KP_PIN(kp_flow_v1));
BPF_TABLE_PINNED("hash", __u32, struct kp_svc_meta, kp_meta_v1,
		 KP_META_SIZE, KP_PIN(kp_meta_v1));
BPF_TABLE_PINNED("percpu_array", __u32, __u64, kp_stats_v1,
		 KP_STAT_MAX, KP_PIN(kp_stats_v1));
BPF_TABLE_PINNED("hash", __be32, struct kp_cip4_val, kp_cip4_v1,
		 KP_CIP4_SIZE, KP_PIN(kp_cip4_v1));
/* An LPM trie must be created without preallocation. */
BPF_TABLE_PINNED("lpm_trie", struct kp_cidr4_key, __u32, kp_svccidr4_v1,
		 KP_SVCCIDR4_SIZE, KP_PIN(kp_svccidr4_v1), BPF_F_NO_PREALLOC);

#endif
