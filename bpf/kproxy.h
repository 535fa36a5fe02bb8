/* kproxy.h: the one definition of every map key, value, flag and constant shared by the BPF
 * programs and the agent. kproxy_ebpf/datapath/layout.py mirrors it; tests/unit/test_layout.py
 * compiles this header for the BPF target and checks every size and field offset against the
 * mirror through BTF, and the agent checks the loaded maps again at start.
 *
 * Rules: byte order is in the types (__be* are network order), padding is written out (bcc
 * passes no sizes to the kernel, so a mirror that is one byte short corrupts memory silently),
 * and a map's layout change bumps its version suffix (_v1) so a new agent never misreads a map
 * pinned by an older one.
 *
 * IPv4 now: keys and values that carry an address have a "4" in their name; the IPv6 twins
 * will be separate maps (as in Cilium and Calico) sharing kp_svc_val, kp_aff_* and kp_svc_meta.
 */
#ifndef KPROXY_H
#define KPROXY_H

#include <linux/types.h>

/* Pin file and kernel map names (a map name is at most 15 characters). */
#define KP_MAP_SVC4    kp_svc4_v1
#define KP_MAP_BE4     kp_be4_v1
#define KP_MAP_SKNAT4  kp_sknat4_v1
#define KP_MAP_AFF     kp_aff_v1
#define KP_MAP_FLOW    kp_flow_v1
#define KP_MAP_META    kp_meta_v1
#define KP_MAP_STATS   kp_stats_v1
#define KP_MAP_SVCCIDR4 kp_svccidr4_v1
#define KP_MAP_CIP4     kp_cip4_v1

/* Default map sizes; the agent passes its configured sizes with -D at compile time. */
#ifndef KP_SVC4_SIZE
#define KP_SVC4_SIZE   65536
#endif
#ifndef KP_BE4_SIZE
#define KP_BE4_SIZE    65536
#endif
#ifndef KP_SKNAT4_SIZE
#define KP_SKNAT4_SIZE 65536
#endif
#ifndef KP_AFF_SIZE
#define KP_AFF_SIZE    65536
#endif
#ifndef KP_FLOW_SIZE
#define KP_FLOW_SIZE   65536
#endif
#ifndef KP_META_SIZE
#define KP_META_SIZE   16384
#endif
#ifndef KP_SVCCIDR4_SIZE
#define KP_SVCCIDR4_SIZE 256
#endif
#ifndef KP_CIP4_SIZE
#define KP_CIP4_SIZE   65536
#endif

/* How long an unconnected UDP socket keeps the backend it was given for a service, like the
 * kernel's conntrack entry for a UDP flow through kube-proxy (nf_conntrack_udp_timeout, 30 s);
 * sends and replies both refresh it. */
#ifndef KP_UDP_FLOW_TIMEOUT_S
#define KP_UDP_FLOW_TIMEOUT_S 30
#endif

/* kp_svc4_key.scope: which traffic a service row serves. */
#define KP_SCOPE_SOCK  0   /* connects/sends from sockets on this node (cgroup hooks) */
#define KP_SCOPE_EXT   1   /* packets from outside the node (TC; reserved) */

/* kp_svc_val.action (slot 0). */
#define KP_ACTION_FORWARD 0
#define KP_ACTION_REJECT  1   /* no usable endpoint anywhere: ECONNREFUSED at once */
#define KP_ACTION_DROP    2   /* endpoints exist, none in the Local set: EHOSTUNREACH */

/* kp_svc_val.kind (slot 0): what the frontend is, for the CLI and the TC path. */
#define KP_KIND_CLUSTER_IP    1
#define KP_KIND_NODE_PORT     2
#define KP_KIND_EXTERNAL_IP   3
#define KP_KIND_LOAD_BALANCER 4

/* kp_backend4.flags: the endpoint's state, for the CLI (the datapath uses every slot). */
#define KP_BE_F_LOCAL       0x01   /* runs on this node */
#define KP_BE_F_TERMINATING 0x02
#define KP_BE_F_NOT_READY   0x04   /* serving but not ready: a terminating fallback */

/* kp_aff_key.type */
#define KP_AFF_CLIENT 0   /* sessionAffinity ClientIP (kp_aff_v1): client = netns cookie */
#define KP_AFF_SOCKET 1   /* unconnected UDP flow (kp_flow_v1): client = socket cookie */

/* Index into the per-CPU counter array kp_stats. */
#define KP_STAT_FORWARD      0   /* a connect/sendmsg translated to a backend */
#define KP_STAT_REJECT       1   /* refused: no usable endpoint */
#define KP_STAT_DROP         2   /* no endpoint in the Local set */
#define KP_STAT_BACKEND_MISS 3   /* a slot or backend row missing: should never happen */
#define KP_STAT_AFFINITY_HIT 4   /* affinity (or a UDP flow) reused its backend */
#define KP_STAT_REVNAT       5   /* a reply source or peer name rewritten back to the VIP */
#define KP_STAT_CIP_REJECT   6   /* refused: an allocated ClusterIP, a port it does not have */
#define KP_STAT_CIDR_DROP    7   /* unallocated address inside a ServiceCIDR: EHOSTUNREACH */
#define KP_STAT_MAX          8

/* Service rows: slot 0 describes the frontend, slots 1..count name its backends.
 * A frontend is (address, port, protocol, scope): the same port on TCP and UDP are two rows. */
struct kp_svc4_key {
	__be32 addr;      /* frontend address */
	__be16 port;      /* frontend port */
	__u8   proto;     /* IPPROTO_TCP, IPPROTO_UDP, IPPROTO_SCTP */
	__u8   scope;     /* KP_SCOPE_* */
	__u16  slot;      /* 0: the frontend row; 1..count: a backend slot */
	__u8   pad[2];
};

struct kp_svc_val {
	__u32 backend_id;       /* slot > 0: key into the backend map */
	__u32 svc_id;           /* slot 0: service-port id (affinity key, kp_svc_meta key) */
	__u32 affinity_timeout; /* slot 0: seconds of ClientIP affinity, 0 = none */
	__u16 count;            /* slot 0: number of backend slots */
	__u8  action;           /* slot 0: KP_ACTION_* */
	__u8  kind;             /* slot 0: KP_KIND_* */
};

/* Backends, keyed by a __u32 id allocated by the agent (0 is never used). */
struct kp_backend4 {
	__be32 addr;
	__be16 port;
	__u8   proto;
	__u8   flags;     /* KP_BE_F_* */
};

/* Reverse translation for the socket path: which service address a socket meant when the
 * connect/sendmsg hook sent it to a backend. Read by recvmsg4 (UDP reply source) and
 * getpeername4. LRU: entries of closed sockets age out. */
struct kp_sknat4_key {
	__u64  cookie;    /* socket cookie */
	__be32 addr;      /* backend address */
	__be16 port;      /* backend port */
	__u8   pad[2];
};

struct kp_sknat4_val {
	__be32 addr;      /* service address */
	__be16 port;      /* service port */
	__u8   pad[2];
	__u32  svc_id;
};

/* Session affinity (kp_aff_v1) and unconnected-UDP flows (kp_flow_v1): two LRU maps of the
 * same layout, so a burst of short-lived DNS sockets never evicts a client's affinity. */
struct kp_aff_key {
	__u64 client;     /* netns cookie (KP_AFF_CLIENT) or socket cookie (KP_AFF_SOCKET) */
	__u32 svc_id;
	__u8  type;       /* KP_AFF_* */
	__u8  pad[3];
};

struct kp_aff_val {
	__u64 last_used;  /* bpf_ktime_get_ns() of the last use */
	__u32 backend_id;
	__u16 slot;       /* the slot that held backend_id when chosen: checked on reuse, so a
	                   * backend that left the service is never picked from affinity */
	__u8  pad[2];
};

/* Names for the CLI, keyed by svc_id; never read by the programs. */
struct kp_svc_meta {
	char  namespace[64];
	char  name[64];
	char  port_name[16];
	__u8  proto;
	__u8  pad[7];
};

/* Addresses that matched no frontend (lib/servicecidr.h), kube-proxy nftables' cluster-ips
 * set and service-CIDR rule. kp_cip4_v1: allocated ClusterIP (__be32) -> what it gets;
 * kp_svccidr4_v1 (LPM trie): the ServiceCIDRs, an address inside one fails at once. */
#define KP_CIP_REJECT 1   /* a ClusterIP we program, on a port the Service does not have */
#define KP_CIP_PASS   2   /* a ClusterIP of a Service another proxy owns: left untouched */

struct kp_cip4_val {
	__u8 action;      /* KP_CIP_* */
	__u8 pad[3];
};

struct kp_cidr4_key {
	__u32  prefixlen; /* LPM trie key: prefix length in bits, then the address */
	__be32 addr;
};

_Static_assert(sizeof(struct kp_svc4_key) == 12, "kp_svc4_key");
_Static_assert(sizeof(struct kp_svc_val) == 16, "kp_svc_val");
_Static_assert(sizeof(struct kp_backend4) == 8, "kp_backend4");
_Static_assert(sizeof(struct kp_sknat4_key) == 16, "kp_sknat4_key");
_Static_assert(sizeof(struct kp_sknat4_val) == 12, "kp_sknat4_val");
_Static_assert(sizeof(struct kp_aff_key) == 16, "kp_aff_key");
_Static_assert(sizeof(struct kp_aff_val) == 16, "kp_aff_val");
_Static_assert(sizeof(struct kp_svc_meta) == 152, "kp_svc_meta");
_Static_assert(sizeof(struct kp_cip4_val) == 4, "kp_cip4_val");
_Static_assert(sizeof(struct kp_cidr4_key) == 8, "kp_cidr4_key");

#endif /* KPROXY_H */
