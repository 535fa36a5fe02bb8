/* kproxy.h: the one definition of every map, key, value, flag and constant shared by the BPF
 * programs and the agent, and of the constants only the programs use (packet formats, units).
 *
 * Nothing here is written twice. bpf/lib/maps.h expands KP_MAPS into the map declarations of
 * every program; tools/layoutgen.py (`make layout`) compiles this header for the BPF target and
 * reads the structs and enums back from the BTF (sizes, offsets, byte order from the __be
 * typedefs, every enumerator) and the map table from the preprocessor, into the generated
 * kproxy_ebpf/datapath/maps/kproxy_h.py that the Python side builds its ctypes types from.
 * tests/unit/datapath/test_layout.py regenerates it and fails if the committed copy is stale, and the
 * agent compares the result with bcc's compiled view and each pinned map before it writes.
 *
 * Rules: byte order is in the types (__be* are network order), padding is written out (bcc
 * passes no sizes to the kernel), and a layout change bumps the map's version in KP_MAPS: the
 * pin name carries it (kp_svc_v3), so a new agent never misreads a map an older one pinned.
 *
 * Consistency rule (see docs/architecture.md, "No torn reads"): a row the programs read is
 * either never rewritten (backend rows: an id names one address for its whole life) or carries
 * only fields whose old and new values are both valid (slot rows); programs copy each row to
 * the stack once and work on the copy.
 */
#ifndef KPROXY_H
#define KPROXY_H

#include <linux/types.h>

/* ---- Constants (enums, so that they reach the BTF and Python reads them from there) ---- */

enum kp_scope {                 /* kp_svc_key.scope: which traffic a service row serves */
	KP_SCOPE_SOCK = 0,      /* connects/sends from sockets on this node (cgroup hooks) */
	KP_SCOPE_EXT  = 1,      /* packets from outside the node (tc_lb.c) */
};

enum kp_action {                /* kp_svc_val.action (slot 0) */
	KP_ACTION_FORWARD = 0,
	KP_ACTION_REJECT  = 1,  /* no usable endpoint anywhere: ECONNREFUSED at once */
	KP_ACTION_DROP    = 2,  /* endpoints exist, none in the Local set: EHOSTUNREACH */
};

enum kp_kind {                  /* kp_svc_val.kind (slot 0): for the CLI and the TC path */
	KP_KIND_CLUSTER_IP    = 1,
	KP_KIND_NODE_PORT     = 2,
	KP_KIND_EXTERNAL_IP   = 3,
	KP_KIND_LOAD_BALANCER = 4,
};

enum kp_be_flags {              /* kp_svc_val.be_flags (slot > 0): the endpoint's state as this
				 * frontend uses it, for the CLI (the datapath uses every slot;
				 * the TC path reads KP_BE_F_LOCAL: a remote backend gets SNAT) */
	KP_BE_F_LOCAL       = 0x01, /* runs on this node */
	KP_BE_F_TERMINATING = 0x02,
	KP_BE_F_NOT_READY   = 0x04, /* serving but not ready: a terminating fallback */
};

enum kp_fe_flags {              /* kp_svc_val.fe_flags (slot 0): what else applies to a frontend */
	KP_FE_F_SRC_RANGES  = 0x01, /* loadBalancerSourceRanges: the source must match a kp_srcrange
				     * row of this frontend (lib/srcrange.h); rows land before the
				     * flag is set and go only after it is cleared */
	/* How a new connection picks its slot (kproxy-ebpf.io/lb-algorithm, lib/sched.h). Neither
	 * flag: at random, or by the Maglev table slot 0's backend_id names. Programs older than
	 * these flags read them as "at random", which is what an older agent's rows meant. */
	KP_FE_F_ROUND_ROBIN = 0x02, /* the slot after the last one taken (the frontend's kp_rr) */
	KP_FE_F_LEAST_CONN  = 0x04, /* the slot whose backend has the fewest kp_conns on this node */
};

enum kp_aff_type {              /* kp_aff_key.type */
	KP_AFF_CLIENT = 0,      /* sessionAffinity ClientIP (kp_aff): client = netns cookie */
	KP_AFF_SOCKET = 1,      /* unconnected UDP flow (kp_flow): client = socket cookie */
};

enum kp_aff_client {            /* kp_aff_key.client of a TC client (tc_lb.c) */
	/* Its address with this bit set: never a netns cookie of the socket path (a counter
	 * from 1), so the two kinds of client share kp_aff without meeting. */
	KP_AFF_TC_CLIENT_BIT = 63,
};

enum kp_stat {                  /* index into the per-CPU counter array kp_stats */
	KP_STAT_FORWARD      = 0, /* a connect/sendmsg translated to a backend */
	KP_STAT_REJECT       = 1, /* refused: no usable endpoint */
	KP_STAT_DROP         = 2, /* no endpoint in the Local set */
	KP_STAT_BACKEND_MISS = 3, /* a slot or backend row missing after a retry */
	KP_STAT_AFFINITY_HIT = 4, /* affinity (or a UDP flow) reused its backend */
	KP_STAT_REVNAT       = 5, /* a reply source or peer name rewritten back to the VIP */
	KP_STAT_RETRY        = 6, /* a lookup raced a writer and read slot 0 again */
	KP_STAT_CIP_REJECT   = 7, /* refused: an allocated ClusterIP, a port it does not have */
	KP_STAT_CIDR_DROP    = 8, /* unallocated address inside a ServiceCIDR: EHOSTUNREACH */
	/* The TC path (tc_lb.c), in the same array: one counter mechanism for every program. */
	KP_STAT_TC_FORWARD    = 9,  /* a new flow translated to a backend */
	KP_STAT_TC_SNAT       = 10, /* ... with SNAT (remote backend) */
	KP_STAT_TC_REPLY      = 11, /* a reply translated back */
	KP_STAT_TC_DROP       = 12, /* no endpoint in the Local set */
	KP_STAT_TC_REJECT     = 13, /* no usable endpoint: answered with an ICMP port unreachable */
	KP_STAT_TC_SNAT_FULL  = 14, /* no free SNAT port after KP_SNAT_TRIES attempts: dropped */
	KP_STAT_TC_CT_EXPIRED = 15, /* a packet that may open a flow found its entry unusable
				     * (expired, ended, backend gone): load-balanced anew */
	KP_STAT_TC_FIB_FAIL   = 16, /* no route for a translated packet: dropped */
	KP_STAT_TC_MISS       = 17, /* a slot or backend vanished twice under the lookup */
	KP_STAT_TC_SRC_DROP   = 18, /* a new flow from outside loadBalancerSourceRanges: dropped */
	KP_STAT_TC_SNAT_REUSE = 19, /* a new flow took the SNAT port of an ended one */
	KP_STAT_TC_ICMP_ERR   = 20, /* an ICMP(v6) error about a flow sent on to its backend */
	/* loadBalancerSourceRanges on the socket path (sock_lb.c sock_source_allows) */
	KP_STAT_SRC_DENY      = 21, /* a connect/sendmsg from outside the ranges: EPERM */
	KP_STAT_SRC_UNKNOWN   = 22, /* ... from a netns whose address the agent has not learnt yet:
				     * EPERM (fail closed), the netns noted in kp_nsmiss */
	KP_STAT_RR_NO_CURSOR  = 23, /* a round-robin frontend without its kp_rr row: picked at
				     * random (the agent writes the row right after slot 0) */
	KP_STAT_CONN_UNCOUNTED = 24, /* a connected socket least-conn could not count (no memory
				      * for its kp_skconn storage, or its backend has no counter) */
	KP_STAT_TC_MIDSTREAM  = 25, /* a TCP packet but a SYN to a frontend, of no flow the TC path
				     * tracks: passed untouched (a flow it did not start) */
	KP_STAT_LC_NO_IDS     = 26, /* a least-conn frontend without a row (kp_lcrow or kp_lcids)
				     * for its count of slots: picked at random */
	KP_STAT_TC_PORT_MOVED = 27, /* a new flow's reply tuple was another live flow's: the
				     * client's source port moved (tc_lb.c kp_new_flow) */
	KP_STAT_MAX           = 32,
};

enum kp_cip_action {            /* kp_cip_val.action (lib/servicecidr.h) */
	KP_CIP_REJECT = 1,      /* a ClusterIP we program, on a port the Service does not have */
	KP_CIP_PASS   = 2,      /* a ClusterIP of a Service another proxy owns: left untouched */
};

enum kp_meta_flags {            /* kp_svc_meta.flags: the Service's traffic policies */
	KP_META_F_ETP_LOCAL = 0x01, /* externalTrafficPolicy: Local */
	KP_META_F_ITP_LOCAL = 0x02, /* internalTrafficPolicy: Local */
};

enum kp_traffic_distribution {  /* kp_svc_meta.traffic_distribution */
	KP_TD_NONE             = 0,
	KP_TD_PREFER_CLOSE     = 1,
	KP_TD_PREFER_SAME_ZONE = 2,
	KP_TD_PREFER_SAME_NODE = 3,
	KP_TD_OTHER            = 255, /* a value this version does not know */
};

enum kp_tunables {
	/* How long an unconnected UDP socket keeps the backend it was given for a service, like
	 * the kernel's conntrack entry for a UDP flow through kube-proxy
	 * (nf_conntrack_udp_timeout, 30 s); sends and replies both refresh it. */
	KP_UDP_FLOW_TIMEOUT_S = 30,
	/* An affinity or flow row's last_used is rewritten only once it is this old: the hot path
	 * writes when something changes, not on every packet of a busy client. */
	KP_TOUCH_MS = 100,
	KP_NAME_LEN = 64,
	KP_PORT_NAME_LEN = 16,
	/* A kp_skwhere row's last connect is rewritten only once it is this old: a client that
	 * connects often writes once a second, not on every connect. */
	KP_WHERE_REFRESH_MS = 1000,
	/* Slots a least-conn pick compares (lib/sched.h): all of a frontend with this many
	 * backends or fewer, else this many in a row from a random one, so a connect's cost
	 * stays bounded however large the Service. */
	KP_LC_SCAN = 32,
	/* Backends a least-conn frontend's kp_lcids row names: one with more is picked at random
	 * (the agent writes no row; kp_stat lc_no_ids counts the picks). */
	KP_LC_IDS = 1024,
	/* Backends a kp_lcrow row names: a least-conn frontend with at most this many is read
	 * from its 64-byte array row, one with more from its kp_lcids row. */
	KP_LC_ROW = 15,
	/* A kp_connload word: the gen (the agent's random tag for this holding of the index,
	 * 1..0xffff) in its top 16 bits, and the count plus a bias of half the rest below
	 * (KP_LOAD_BIAS), so that an add of -1 to a count of 0 never borrows from the gen. */
	KP_LOAD_GEN_SHIFT = 48,
};

enum kp_maglev {                /* Maglev tables (lib/maglev.h, kproxy_ebpf/model/maglev.py) */
	/* Slots per kp_maglev row: a 960-byte value, which with the hash map's element header,
	 * its key and the allocator's link fills a 1 KiB allocation exactly. */
	KP_MAGLEV_ROW  = 478,
	KP_MAGLEV_MAX  = 65521, /* the largest table: the largest prime a __u16 holds */
	KP_MAGLEV_SEED = 0x6b70726f, /* the flow hash's seed: the same on every node */
};

/* ---- The programs' own constants: packet formats and time units -----------------------------
 * #defines, not enums: the agent never reads them, so they stay out of the BTF and of the
 * generated table, and each keeps its C type (KP_NSEC_PER_SEC is an unsigned long long). */
#define KP_NSEC_PER_SEC 1000000000ULL
#define KP_NSEC_PER_MS  1000000ULL

#define KP_TCP_FIN 0x01         /* TCP header flags (its byte 13) */
#define KP_TCP_SYN 0x02
#define KP_TCP_RST 0x04
#define KP_TCP_ACK 0x10

#define KP_AF_INET   2          /* bpf_fib_lookup's families (AF_INET, AF_INET6) */
#define KP_AF_INET6 10
#define KP_IP_MF     0x2000     /* IPv4 frag_off, host order: more fragments, and the offset */
#define KP_IP_OFFSET 0x1fff
#define KP_IP6_HLEN  40         /* the fixed IPv6 header */
#define KP_ICMP_HLEN 8          /* type, code, checksum and 4 bytes: ICMP and ICMPv6 alike */

/* ---- Keys and values ---------------------------------------------------------------------- */

/* An address of either family, as every service-side row holds it: an IPv6 address as is, an
 * IPv4 address IPv4-mapped (::ffff:a.b.c.d, RFC 4291 2.5.5.2). One key type for both families
 * means one lookup path for both (lib/ip.h), and the *6 socket hooks meet an IPv4 Service
 * reached through an AF_INET6 socket as exactly the key of that Service, and the TC path's
 * conntrack (kp_ct) tracks flows of both families in one table. */
struct kp_ip {
	__be32 w[4];
};

/* Service rows: slot 0 describes the frontend, slots 1..count name its backends.
 * A frontend is (address, port, protocol, scope): the same port on TCP and UDP are two rows,
 * and a dual-stack Service has one frontend per ClusterIP. Its backends are of its family. */
struct kp_svc_key {
	struct kp_ip addr; /* frontend address */
	__be16 port;      /* frontend port */
	__u8   proto;     /* IPPROTO_TCP, IPPROTO_UDP, IPPROTO_SCTP */
	__u8   scope;     /* enum kp_scope */
	__u16  slot;      /* 0: the frontend row; 1..count: a backend slot */
	__u8   pad[2];
};

struct kp_svc_val {
	__u32 backend_id;       /* slot > 0: key into the backend map; slot 0: the frontend's
				 * Maglev table (kp_maglev_key.table), 0 = none: pick at random;
				 * slot 0 of a least-conn frontend (which has no table): its
				 * kp_lcrow row, 0 = none (its kp_lcids row). Slot 0 always held
				 * 0 here, so older rows mean "random" (or "kp_lcids") */
	__u32 svc_id;           /* slot 0: service-port id (affinity key, kp_svc_meta key) */
	__u32 affinity_timeout; /* slot 0: seconds of ClientIP affinity, 0 = none */
	__u16 count;            /* slot 0: number of backend slots */
	__u8  action;           /* slot 0: enum kp_action */
	__u8  kind;             /* slot 0: enum kp_kind */
	__u8  be_flags;         /* slot > 0: enum kp_be_flags (tc_lb.c reads KP_BE_F_LOCAL) */
	__u8  fe_flags;         /* slot 0: enum kp_fe_flags. Was padding, always written 0, which
				 * reads as "no flag": rows of an older agent mean what they say,
				 * so this field needed no version bump */
	__u16 maglev_size;      /* slot 0 with a Maglev table: its entries (a prime); was
				 * padding, always 0, as fe_flags */
};

/* Backends, keyed by a __u32 id allocated by the agent (0 is never used). Written once when
 * the id is allocated and never modified: a backend whose address changes is another id. */
struct kp_backend {
	struct kp_ip addr;
	__be16 port;
	__u8   proto;
	__u8   pad;
};

/* Reverse translation for the socket path: which service address a socket meant when the
 * connect/sendmsg hook sent it to a backend. Read by recvmsg4/6 (UDP reply source) and
 * getpeername4/6. LRU: entries of closed sockets age out. */
struct kp_sknat_key {
	__u64  cookie;    /* socket cookie */
	struct kp_ip addr; /* backend address */
	__be16 port;      /* backend port */
	__u8   pad[6];
};

struct kp_sknat_val {
	struct kp_ip addr; /* service address */
	__be16 port;      /* service port */
	__u8   pad[2];
	__u32  svc_id;
};

/* The same for a TCP socket, in its own storage (kp_sksvc, BPF_MAP_TYPE_SK_STORAGE): written
 * once by connect, freed with the socket. An LRU row would be evicted by other sockets' rows
 * once the map is full, and that eviction was ~40 % of connect4's cost under churn. */
struct kp_sksvc_val {
	struct kp_ip be_addr; /* backend address the socket was sent to */
	struct kp_ip addr; /* service address */
	__be16 be_port;   /* backend port */
	__be16 port;      /* service port */
	__u32  conn;      /* least-conn: the kp_conn_tag the socket is counted on, 0: none. Was
			   * svc_id, which no program read: an older agent's value has gen 0 */
};

/* Where the sockets connected to a backend live (kp_skwhere, LRU): one row per backend and
 * network namespace that a connect() sent a socket from, with the cgroup of the process that
 * connected. The agent's stale-socket search starts here, so a backend that leaves costs a
 * look into the namespaces that hold sockets to it, and nothing when none does
 * (datapath/sock_where.py). The programs only write it. */
struct kp_skwhere_key {
	struct kp_ip addr; /* backend address */
	__be16 port;      /* backend port */
	__u8   proto;
	__u8   family;    /* the socket's: 4 (AF_INET) or 6 (AF_INET6, an IPv4 backend mapped) */
	__u8   pad[4];
	__u64  netns;     /* bpf_get_netns_cookie() of the socket */
};

struct kp_skwhere_val {
	__u64 cgroup;     /* cgroup v2 id of the process that connected (its socket's, nearly
			   * always; the agent re-checks with the socket's own) */
	__u64 last;       /* bpf_ktime_get_ns() of a recent connect (KP_WHERE_REFRESH_MS) */
};

/* Session affinity (kp_aff) and unconnected-UDP flows (kp_flow): two LRU maps of the same
 * layout, so a burst of short-lived DNS sockets never evicts a client's affinity. */
struct kp_aff_key {
	__u64 client;     /* netns cookie (KP_AFF_CLIENT) or socket cookie (KP_AFF_SOCKET) */
	__u32 svc_id;     /* the service port's, which both families' frontends share ... */
	__u8  type;       /* enum kp_aff_type */
	__u8  family;     /* ... so the frontend's family (4, 6) keeps their affinities apart,
			   * as kube-proxy's per-family proxiers do */
	__u8  pad[2];
};

struct kp_aff_val {
	__u64 last_used;  /* bpf_ktime_get_ns() of the last use (KP_TOUCH_MS granularity) */
	__u32 backend_id;
	__u16 slot;       /* the slot that held backend_id when chosen: checked on reuse, so a
	                   * backend that left the service is never picked from affinity */
	__u8  flags;      /* enum kp_aff_flags (was padding, always 0: no flag) */
	__u8  pad;
};

enum kp_aff_flags {
	/* A kp_flow row (an unconnected UDP socket's flow) of a least-conn frontend: counted in
	 * its backend's flows_open when made; it ends by expiry only, which the agent's repair
	 * counts (datapath/flows/flow_fix.py), as for the TC path's flows. */
	KP_AFF_F_COUNTED = 0x01,
};

/* Round robin (lib/sched.h): a frontend's cursor in kp_rr, keyed by its slot-0 kp_svc_key.
 * connect takes next with one atomic fetch-and-add, so connects on every CPU share one
 * rotation; the agent writes the row, with the position the rotation goes on from, after each
 * slot 0 that changes the frontend's backends. */
struct kp_rr_val {
	__u64 next;       /* the next pick takes slot next % count + 1 */
};

/* Least connection (lib/sched.h): a backend's connections on this node, at the index the
 * agent gave the backend when a least-conn frontend first named it (kp_connix: backend id ->
 * index) in three arrays (read without hashing, once per slot a pick compares):
 * kp_connload, what the scan compares and the holder's gen in one word (KP_LOAD_*), alone in
 * its row so that ten backends' counts are two cache lines (as one 32-byte row each they were
 * five or six, seldom still in cache at the next connect: the cost the bench measured per
 * backend compared) and a connect reads nothing else of the counter; kp_conns,
 * who holds the index and its flows; kp_flowfix, the agent's repair.
 * The agent writes the gen (with a count of 0) and backend_id when it hands the index out,
 * before any row names it; the programs only add. A socket remembers the index and gen it
 * counted on (kp_conn_tag: in the storage a TCP connect makes anyway, kp_sksvc, so counting
 * allocates nothing more; a UDP socket's in kp_skconn), so its release takes back only from
 * the counter it added to, not from a later holder of the index. The TC path's flows also
 * count in two counters that only grow, so that a close missed (expiry, LRU eviction, a row
 * overwritten) is repaired by the agent from the conntrack table (kp_flowfix,
 * lib/flowcount.h) instead of accumulating. */
#define KP_LOAD_BIAS  (1ULL << (KP_LOAD_GEN_SHIFT - 1))
#define KP_LOAD_COUNT ((1ULL << KP_LOAD_GEN_SHIFT) - 1)

struct kp_conns {
	__u32 backend_id; /* the holder: checked by kp_conns_row, so a stale index counts nowhere */
	__u32 pad;
	__u64 flows_open; /* TC flows of least-conn frontends opened to it (KP_CT_F_COUNTED) */
	__u64 flows_done; /* ... of those, ended: FIN/RST, or re-balanced before they expired */
};

/* Least connection's view of a frontend (kp_lcids, keyed by its slot-0 kp_svc_key): the
 * counters of slots 1..count's backends, so that the scan reads one row, not a kp_svc row
 * and a hashed counter per slot.
 * Written whole by the agent after each slot 0 that changes the frontend's slots (a hash
 * without preallocation: a reader holds the old row or the new, never a mix). A row of
 * another version only makes one pick less good: the pick is a slot number, and every slot
 * names a backend of the frontend. */
struct kp_lc_ids {
	__u32 count;      /* entries below */
	__u32 conn[KP_LC_IDS];  /* slot i's backend's kp_conns index at conn[i - 1] */
};

/* The same for a frontend of at most KP_LC_ROW backends, in an array (kp_lcrow) at the row
 * its slot 0's backend_id names: an array lookup the verifier inlines and one cache line,
 * where the hashed kp_lcids row costs a jhash and two or three lines. count comes last so
 * that the scan's index, masked with 15, stays inside the value. Rows are never rewritten
 * under a reader: each such frontend owns two rows and the agent writes the new version into
 * the one its slot 0 does not name, before the slot 0 that names it. */
struct kp_lc_row {
	__u32 conn[KP_LC_ROW];  /* slot i's backend's kp_conns index at conn[i - 1] */
	__u32 count;
};

/* Which backend a connected socket is counted on (kp_skconn, BPF_MAP_TYPE_SK_STORAGE): set
 * by connect, cleared by the release hook, so each socket adds and takes away exactly once,
 * and a socket connected again moves its count. */
struct kp_skconn_val {
	__u32 conn;       /* the kp_conn_tag a connected UDP socket is counted on, 0: none */
	__u32 pad;
};

/* Names and policies for the CLI, keyed by svc_id; never read by the programs. */
struct kp_svc_meta {
	char  namespace[KP_NAME_LEN];
	char  name[KP_NAME_LEN];
	char  port_name[KP_PORT_NAME_LEN];
	__u8  proto;
	__u8  flags;                  /* enum kp_meta_flags */
	__u16 health_check_node_port;
	__u8  source_ranges;          /* how many loadBalancerSourceRanges (capped at 255) */
	__u8  traffic_distribution;   /* enum kp_traffic_distribution */
	__u8  pad[2];
};

/* Per-Service counters (kp_svcstat, a per-CPU hash keyed by svc_id and the frontends' scope;
 * lib/stats.h): what the datapath did for each service port, for the node's own sockets
 * (ClusterIP, and the other frontends reached from the node) apart from packets from outside
 * (NodePort, ExternalIP, LB IP), summed over CPUs by the agent for its metrics (per service
 * port) and `services -o wide` (per scope). The first event of a service port creates its row
 * (from kp_svczero: a zero struct this size on the TC programs' stack would not fit beside
 * their tuples); the agent deletes it when it frees the svc_id (svc_counters.py), and sweeps
 * rows of ids it does not hold, so an id handed out again starts from zero. Counters only: no program reads them
 * to decide anything. A new kp_meta (layout bump or resize) hands the ids out afresh, so this
 * map is made anew with it (datapath/resize.py TOGETHER). */
struct kp_svcstat_key {
	__u32 svc_id;
	__u8  scope;      /* enum kp_scope of the frontend that carried it */
	__u8  pad[3];
};

struct kp_svc_stat {
	__u64 conns;        /* connections balanced: a connect(), an unconnected UDP socket's
			     * new flow, a new TC flow */
	__u64 packets;      /* toward the backends: an unconnected UDP socket's datagrams (the
			     * socket path sees no others), every TC packet of a flow */
	__u64 bytes;        /* ... their bytes, TC only (a socket hook sees no payload) */
	__u64 reply_packets; /* TC: replies translated back to the frontend */
	__u64 reply_bytes;
	__u64 refused;      /* no usable endpoint (or one that vanished): ECONNREFUSED, ICMP
			     * port unreachable */
	__u64 dropped;      /* no endpoint in the Local set: EHOSTUNREACH, or dropped */
	__u64 denied;       /* outside loadBalancerSourceRanges (or from a netns not learnt yet) */
};

/* Addresses that matched no frontend (lib/servicecidr.h), kube-proxy nftables' cluster-ips
 * set and service-CIDR rule: kp_cip maps an allocated ClusterIP to what it gets; kp_svccidr
 * (LPM trie) holds the ServiceCIDRs of both families (an IPv4 one as its IPv4-mapped prefix,
 * 96 + its length), and an address inside one fails at once. */
struct kp_cip_val {
	__u8 action;      /* enum kp_cip_action */
	__u8 pad[3];
};

struct kp_cidr_key {
	__u32  prefixlen; /* LPM trie key: prefix length in bits, then the address */
	struct kp_ip addr;
};

/* loadBalancerSourceRanges (lib/srcrange.h): an LPM trie keyed by the frontend (the
 * KP_SRCRANGE_FE_BITS that a row always matches in full) and then the source prefix, so one
 * lookup with prefixlen KP_SRCRANGE_FE_BITS + 32 (a whole source address) answers "is this
 * source inside one of this frontend's ranges". */
enum kp_srcrange_bits {
	KP_SRCRANGE_FE_BITS = 160,  /* fe_addr, fe_port, proto, scope: the key's frontend part */
};

struct kp_srcrange_key {
	__u32  prefixlen; /* KP_SRCRANGE_FE_BITS + the range's prefix length (an IPv4 range's
			   * IPv4-mapped: 96 + its length) */
	struct kp_ip fe_addr; /* the frontend (an LB ingress IP), its port and protocol */
	__be16 fe_port;
	__u8   proto;
	__u8   scope;   /* enum kp_scope: the socket path's LB frontend and the TC path's have the
			 * same ranges but are written and removed each on its own */
	struct kp_ip saddr; /* the range's network address */
};

/* Where a socket path client's connections come from (sock_lb.c sock_source_allows): for a
 * source-range check a socket that is not bound has no source address yet (the route picks it
 * after connect), so the agent writes the address each network namespace sends from
 * (netns_sources.py: its route's preferred source), keyed by the namespace's cookie. */
struct kp_nssrc_key {
	__u64 netns;      /* bpf_get_netns_cookie() */
	__u8  family;     /* 4 or 6: the frontend's family */
	__u8  pad[7];
};

/* Maglev tables (Eisenbud et al., NSDI 2016) of scope-EXT frontends: entry i of a table names
 * the slot whose backend a flow hashing to i goes to. The agent builds each table from the
 * backends' addresses alone (kproxy_ebpf/model/maglev.py), so every node with the same backends
 * picks the same one for a flow: ECMP in front of the nodes may send its packets to any.
 * A table is written once under a new id, before the slot 0 that names it, and deleted after
 * the slot 0 that stopped naming it; a reader checks a row's tag after its read, because a
 * freed element can be taken at once by another table's row. */
struct kp_maglev_key {
	__u32 table;      /* the table's id (slot 0's backend_id) */
	__u32 row;        /* entries row * KP_MAGLEV_ROW .. + KP_MAGLEV_ROW - 1 */
};

struct kp_maglev_row {
	__u32 table;      /* the key's table: a reader that finds another took a recycled row */
	__u16 slot[KP_MAGLEV_ROW];  /* slot numbers 1..count of the frontend's slot 0 */
};

/* ---- The lookup interface of lib/lb.h (a request and its answer) ----------------------------
 * Context-free so every program type shares it; tests pass these through BPF_PROG_TEST_RUN. */
enum kp_lb_verdict {
	KP_LB_NONE    = 0,      /* not a service frontend: leave the packet or socket alone */
	KP_LB_FORWARD = 1,      /* res.be holds the chosen backend */
	KP_LB_REJECT  = 2,      /* no usable endpoint: refuse at once */
	KP_LB_DROP    = 3,      /* no endpoint in the Local set */
	KP_LB_MISS    = 4,      /* a slot or backend vanished twice under us: refuse, never leak */
};

struct kp_lb_req {
	struct kp_svc_key key;  /* the frontend (slot ignored) */
	__u32 rnd[2];           /* one random number per attempt */
	__u64 client;           /* ClientIP affinity: the client's identity (netns cookie) */
	__u64 flow;             /* unconnected UDP: the socket cookie; 0 = not such a flow */
	__u64 now;              /* bpf_ktime_get_ns() */
};

struct kp_lb_res {
	struct kp_backend be;   /* a copy of the chosen backend row */
	__u32 backend_id;
	__u32 svc_id;
	__u16 slot;
	__u8  verdict;          /* enum kp_lb_verdict */
	__u8  attempts;         /* reads of slot 0: 2 means a writer raced the first */
	__u8  affinity_hit;
	__u8  be_flags;         /* the slot's enum kp_be_flags (TC: KP_BE_F_LOCAL decides SNAT) */
	__u8  fe_flags;         /* slot 0's enum kp_fe_flags, from the same copy as the verdict */
	__u8  scope;            /* the request's enum kp_scope (which counters the event is on) */
	__u32 conn_ix;          /* least-conn: the kp_conns index the pick read for the slot, 0:
				 * none (another algorithm, affinity); checked before counting */
};

_Static_assert(sizeof(struct kp_ip) == 16, "kp_ip");
_Static_assert(sizeof(struct kp_svc_key) == 24, "kp_svc_key");
_Static_assert(sizeof(struct kp_svc_val) == 20, "kp_svc_val");
_Static_assert(sizeof(struct kp_backend) == 20, "kp_backend");
_Static_assert(sizeof(struct kp_sknat_key) == 32, "kp_sknat_key");
_Static_assert(sizeof(struct kp_sknat_val) == 24, "kp_sknat_val");
_Static_assert(sizeof(struct kp_sksvc_val) == 40, "kp_sksvc_val");
_Static_assert(sizeof(struct kp_skwhere_key) == 32, "kp_skwhere_key");
_Static_assert(sizeof(struct kp_skwhere_val) == 16, "kp_skwhere_val");
_Static_assert(sizeof(struct kp_svcstat_key) == 8, "kp_svcstat_key");
_Static_assert(sizeof(struct kp_aff_key) == 16, "kp_aff_key");
_Static_assert(sizeof(struct kp_aff_val) == 16, "kp_aff_val");
_Static_assert(sizeof(struct kp_svc_meta) == 152, "kp_svc_meta");
_Static_assert(sizeof(struct kp_rr_val) == 8, "kp_rr_val");
_Static_assert(sizeof(struct kp_conns) == 24, "kp_conns");
_Static_assert(sizeof(struct kp_skconn_val) == 8, "kp_skconn_val");
_Static_assert((KP_LC_IDS & (KP_LC_IDS - 1)) == 0, "KP_LC_IDS: a power of two (lib/sched.h masks)");
_Static_assert(sizeof(struct kp_lc_row) == 64, "kp_lc_row: one cache line");
_Static_assert(((KP_LC_ROW + 1) & KP_LC_ROW) == 0, "KP_LC_ROW: 2^n - 1 (lib/sched.h masks)");
_Static_assert(sizeof(struct kp_svc_stat) == 64, "kp_svc_stat");
_Static_assert(sizeof(struct kp_cip_val) == 4, "kp_cip_val");
_Static_assert(sizeof(struct kp_cidr_key) == 20, "kp_cidr_key");
_Static_assert(sizeof(struct kp_srcrange_key) == 40, "kp_srcrange_key");
_Static_assert(sizeof(struct kp_nssrc_key) == 16, "kp_nssrc_key");
_Static_assert(sizeof(struct kp_maglev_key) == 8, "kp_maglev_key");
_Static_assert(sizeof(struct kp_maglev_row) == 960, "kp_maglev_row");
_Static_assert(KP_SRCRANGE_FE_BITS == 8 * (__builtin_offsetof(struct kp_srcrange_key, saddr) -
					  __builtin_offsetof(struct kp_srcrange_key, fe_addr)),
	       "KP_SRCRANGE_FE_BITS: the bits between prefixlen and saddr");
_Static_assert(sizeof(struct kp_lb_req) == 56, "kp_lb_req");
_Static_assert(sizeof(struct kp_lb_res) == 40, "kp_lb_res");

/* ---- North-south (TC): connection tracking and NAT ---------------------------------------
 * A flow from outside the node is tracked by its original tuple (client -> frontend) in kp_ct,
 * and its reply tuple (backend -> client, or backend -> SNAT address:port when the backend is on
 * another node) maps back to that original tuple in kp_rnat. Both are LRU maps written only by
 * the programs; the agent reads them for `ct list` and deletes entries of removed backends. */
enum kp_ct_state {              /* kp_ct_val.life, bits KP_CT_LIFE_STATE_SHIFT.. */
	KP_CT_NEW         = 0,  /* TCP: SYN seen, no reply yet; UDP: no reply yet */
	KP_CT_ESTABLISHED = 1,  /* TCP: a reply seen; UDP: seen both ways ("stream") */
	KP_CT_CLOSING     = 2,  /* TCP: FIN seen in either direction */
	KP_CT_CLOSED      = 3,  /* TCP: RST seen */
};

enum kp_ct_flags {              /* kp_ct_val.life, bits 0-7 */
	KP_CT_F_SNAT = 0x01,    /* source rewritten to nat_addr:nat_port (a remote backend) */
	KP_CT_F_POD  = 0x02,    /* opened by a pod of this node: the per-packet ClusterIP path */
	/* TCP closes, for kp_snat_alloc's reuse of an ended flow's SNAT port (lib/snat.h). */
	KP_CT_F_FIN_ORIG   = 0x04,  /* the client sent a FIN */
	KP_CT_F_FIN_REPLY  = 0x08,  /* the backend sent a FIN */
	KP_CT_F_REPLY_FIRST = 0x10, /* ... before the client did: the backend holds a TIME_WAIT */
	KP_CT_F_LAST_ACK   = 0x20,  /* the client ACKed the backend's FIN (client first) */
	KP_CT_F_ISN        = 0x40,  /* TCP: isn holds the client's initial sequence number */
	/* A least-conn frontend's flow, counted in its backend's kp_conns.flows_open; its end is
	 * counted once (flows_done) by the CPU that moves it to CLOSING/CLOSED or clears this. */
	KP_CT_F_COUNTED    = 0x80,
};

enum kp_ct_timeouts {           /* seconds; references are the kernel's nf_conntrack defaults */
	KP_CT_TCP_NEW_S     = 120,   /* nf_conntrack_tcp_timeout_syn_sent */
	/* Established: the kernel keeps 5 days, which in an LRU map only means idle entries
	 * crowd out live ones. 6 h (Cilium's default lifetime for TCP) outlives every keepalive
	 * default (2 h) yet frees a dead client's entry the same day. */
	KP_CT_TCP_EST_S     = 21600,
	KP_CT_TCP_CLOSING_S = 120,   /* nf_conntrack_tcp_timeout_fin_wait / time_wait */
	KP_CT_TCP_CLOSED_S  = 10,    /* nf_conntrack_tcp_timeout_close */
	KP_CT_UDP_S         = 30,    /* nf_conntrack_udp_timeout */
	KP_CT_UDP_STREAM_S  = 120,   /* nf_conntrack_udp_timeout_stream */
	KP_CT_REFRESH_S     = 1,     /* an entry's expiry is rewritten at most once a second */
	/* Source ports tried before a flow counts as exhausted. Only a flow whose first tries
	 * meet taken ports pays for more. 8 dropped a SYN now and then once one backend got
	 * ~1,000 new flows a second from one node (M9's crr on a faster machine, issue 9): about
	 * that many ports of a CPU's slice are within their KP_SNAT_REUSE_S, so random tries hit
	 * them half the time (0.5^8 per flow). Kernel NAT tries up to 128
	 * (nf_nat_l4proto_unique_tuple). */
	KP_SNAT_TRIES       = 32,
	/* An ended flow's SNAT port is given to a new flow only this long after the flow's last
	 * packet (its RST, or the client's ACK of the backend's FIN) passed: that packet must reach
	 * the backend first (lib/snat.h kp_rnat_reusable). Linux's tcp_tw_reuse waits 1 s too
	 * before it reuses a TIME_WAIT tuple for a new connection (tcp_twsk_unique). */
	KP_SNAT_REUSE_S     = 1,
};


struct kp_ct_key {              /* a direction of a flow: src -> dst, either family */
	struct kp_ip saddr;     /* lib/ip.h: an IPv4 packet's addresses IPv4-mapped */
	struct kp_ip daddr;
	__be16 sport;
	__be16 dport;
	__u8   proto;
	__u8   pad[3];
};

/* What a packet may change in a tracked flow, packed into one word (kp_ct_val.life) so that
 * a program changes it in place with one compare-and-swap and a reader on another CPU loads
 * it whole. Rewriting the row through the LRU map instead takes a new element and frees the
 * old one on every state change (docs/design/north-south.md, "Conntrack in place"). */
enum kp_ct_life {
	KP_CT_LIFE_FLAGS       = 0xff,   /* bits 0-7: enum kp_ct_flags */
	KP_CT_LIFE_STATE_SHIFT = 8,      /* bits 8-11: enum kp_ct_state */
	KP_CT_LIFE_STATE       = 0xf,
	KP_CT_LIFE_SEEN_REPLY  = 0x1000, /* bit 12: the backend has answered */
	/* bits 16-63: the bpf_ktime_get_ns() deadline with its low 16 bits cleared (it may come
	 * ~65 us early, nothing here is that fine) */
	KP_CT_LIFE_TIME_SHIFT  = 16,
	/* compare-and-swap rounds of kp_ct_track: a lost one means another CPU changed the flow
	 * at that instant (both directions of a close), and the next applies this packet to that */
	KP_CT_SWAP_TRIES       = 3,
	/* A SYN's data (TCP Fast Open) is at most one segment: a reply acknowledging up to this
	 * much past the ISN acknowledges the flow's SYN (lib/ct.h kp_ct_acks_syn) */
	KP_CT_SYN_DATA_MAX     = 65535,
};

struct kp_ct_val {              /* keyed by the original tuple (client -> frontend) */
	__u64  life;            /* enum kp_ct_life: expiry, state, flags, seen-reply */
	/* The rest is written once, with the row (a flow re-balanced gets a new row). */
	struct kp_ip be_addr;   /* the backend chosen (the flow's family) */
	struct kp_ip nat_addr;  /* KP_CT_F_SNAT: the source the backend sees */
	__be16 be_port;
	__be16 nat_port;
	__u32  backend_id;      /* checked on reuse: a removed backend gets the flow re-balanced */
	__u32  svc_id;
	__be32 isn;             /* KP_CT_F_ISN: the sequence number of the client's SYN */
};

struct kp_tc_cfg {              /* kp_tccfg[0]: written by the agent before it attaches TC */
	/* The node addresses remote backends see, one per family (zero: none, no SNAT in
	 * that family); snat_addr4 IPv4-mapped like every kp_ip. */
	struct kp_ip snat_addr4;
	struct kp_ip snat_addr6;
	__u16  port_min;        /* SNAT source ports, host order, inclusive (both families) */
	__u16  port_max;
	__u16  ncpus;           /* possible CPUs: CPU c reuses the ports min + c + k * ncpus */
	__u16  pad;
};

/* Per-CPU room for what does not fit the TC programs' 512-byte stack beside their 40-byte
 * tuples: the ICMPv6 error lib/icmp_reply.h builds (kp_icmp6_unreach). A program uses it
 * between two helper calls of one packet; programs on one CPU do not interleave. Never read by
 * the agent. */
struct kp_scratch {
	__u8 bytes[128];
};

_Static_assert(sizeof(struct kp_ct_key) == 40, "kp_ct_key");
_Static_assert(sizeof(struct kp_scratch) == 128, "kp_scratch");
_Static_assert(sizeof(struct kp_ct_val) == 56, "kp_ct_val");
_Static_assert(sizeof(struct kp_tc_cfg) == 40, "kp_tc_cfg");

/* ---- Maps ----------------------------------------------------------------------------------
 * X(id, name, version, type, key, value, size, flags): `name` is the identifier the programs
 * use, name_v<version> the pin (and the name the CLI shows), `size` the -D knob whose default is
 * below (the agent passes its configured sizes), `flags` the map_flags at creation. */
#define KP_NO_PREALLOC 1   /* BPF_F_NO_PREALLOC: LPM tries and socket storage require it */
#define KP_MAPS(X)                                                                            \
	X(svc,         kp_svc,      3, hash,         struct kp_svc_key,    struct kp_svc_val,    KP_SVC_SIZE,      0) \
	X(backend,     kp_be,       3, hash,         __u32,                struct kp_backend,    KP_BE_SIZE,       0) \
	X(sknat,       kp_sknat,    2, lru_hash,     struct kp_sknat_key,  struct kp_sknat_val,  KP_SKNAT_SIZE,    0) \
	X(sksvc,       kp_sksvc,    2, sk_storage,   int,                  struct kp_sksvc_val,  KP_SKSVC_SIZE,    KP_NO_PREALLOC) \
	X(skwhere,     kp_skwhere,  1, lru_hash,     struct kp_skwhere_key, struct kp_skwhere_val, KP_SKWHERE_SIZE, 0) \
	X(affinity,    kp_aff,      2, lru_hash,     struct kp_aff_key,    struct kp_aff_val,    KP_AFF_SIZE,      0) \
	X(flow,        kp_flow,     2, lru_hash,     struct kp_aff_key,    struct kp_aff_val,    KP_FLOW_SIZE,     0) \
	X(meta,        kp_meta,     2, hash,         __u32,                struct kp_svc_meta,   KP_META_SIZE,     0) \
	X(stats,       kp_stats,    3, percpu_array, __u32,                __u64,                KP_STAT_MAX,      0) \
	X(scratch,     kp_scratch,  1, percpu_array, __u32,                struct kp_scratch,    1,                0) \
	X(clusterip,   kp_cip,      2, hash,         struct kp_ip,         struct kp_cip_val,    KP_CIP_SIZE,      0) \
	X(servicecidr, kp_svccidr,  2, lpm_trie,     struct kp_cidr_key,   __u32,                KP_SVCCIDR_SIZE,  KP_NO_PREALLOC) \
	X(ct,          kp_ct,       3, lru_hash,     struct kp_ct_key,     struct kp_ct_val,     KP_CT_SIZE,       0) \
	X(rnat,        kp_rnat,     2, lru_hash,     struct kp_ct_key,     struct kp_ct_key,     KP_RNAT_SIZE,     0) \
	X(tccfg,       kp_tccfg,    3, array,        __u32,                struct kp_tc_cfg,     1,                0) \
	X(srcrange,    kp_srcrange, 3, lpm_trie,     struct kp_srcrange_key, __u32,              KP_SRCRANGE_SIZE, KP_NO_PREALLOC) \
	X(extaddr,     kp_extaddr,  2, hash,         struct kp_ip,         __u32,                KP_EXTADDR_SIZE,  0) \
	X(extbe,       kp_extbe,    2, hash,         struct kp_ip,         __u32,                KP_EXTBE_SIZE,    0) \
	X(nssrc,       kp_nssrc,    1, hash,         struct kp_nssrc_key,  struct kp_ip,         KP_NSSRC_SIZE,    0) \
	X(nsmiss,      kp_nsmiss,   1, lru_hash,     __u64,                __u64,                KP_NSMISS_SIZE,   0) \
	X(svcstat,     kp_svcstat,  2, percpu_hash,  struct kp_svcstat_key, struct kp_svc_stat, KP_SVCSTAT_SIZE,  KP_NO_PREALLOC) \
	X(svczero,     kp_svczero,  1, array,        __u32,                struct kp_svc_stat,   1,                0) \
	X(maglev,      kp_maglev,   1, hash,         struct kp_maglev_key, struct kp_maglev_row, KP_MAGLEV_SIZE,   KP_NO_PREALLOC) \
	X(rr,          kp_rr,       1, hash,         struct kp_svc_key,    struct kp_rr_val,     KP_RR_SIZE,       0) \
	X(conns,       kp_conns,    3, array,        __u32,                struct kp_conns,      KP_CONNS_SIZE,    0) \
	X(connload,    kp_connload, 1, array,        __u32,                __u64,                KP_CONNS_SIZE,    0) \
	X(connix,      kp_connix,   1, hash,         __u32,                __u32,                KP_CONNS_SIZE,    0) \
	X(flowfix,     kp_flowfix,  1, array,        __u32,                __s64,                KP_CONNS_SIZE,    0) \
	X(skconn,      kp_skconn,   1, sk_storage,   int,                  struct kp_skconn_val, KP_SKCONN_SIZE,   KP_NO_PREALLOC) \
	X(lcids,       kp_lcids,    1, hash,         struct kp_svc_key,    struct kp_lc_ids,     KP_LCIDS_SIZE,    KP_NO_PREALLOC) \
	X(lcrow,       kp_lcrow,    1, array,        __u32,                struct kp_lc_row,     KP_LCROW_SIZE,    0)

#ifndef KP_SVC_SIZE
#define KP_SVC_SIZE   262144  /* frontends plus one row per backend slot (10k x 10: 110k) */
#endif
#ifndef KP_BE_SIZE
#define KP_BE_SIZE    131072  /* distinct backends (10k x 10: 100k) */
#endif
#ifndef KP_SKNAT_SIZE
#define KP_SKNAT_SIZE 65536   /* reverse translation per UDP socket and backend (LRU) */
#endif
#ifndef KP_SKSVC_SIZE
#define KP_SKSVC_SIZE 0       /* socket storage: no size, one row per socket, freed with it */
#endif
#ifndef KP_SKWHERE_SIZE
#define KP_SKWHERE_SIZE 65536 /* (backend, client network namespace) pairs with a connected
			       * socket (LRU) */
#endif
#ifndef KP_AFF_SIZE
#define KP_AFF_SIZE    65536   /* ClientIP affinity (LRU) */
#endif
#ifndef KP_FLOW_SIZE
#define KP_FLOW_SIZE   65536   /* unconnected-UDP flows (LRU) */
#endif
#ifndef KP_CT_SIZE
#define KP_CT_SIZE     131072  /* TC connection tracking, one row per flow (LRU) */
#endif
#ifndef KP_RNAT_SIZE
#define KP_RNAT_SIZE   131072  /* TC reply tuple -> original tuple (LRU) */
#endif
#ifndef KP_META_SIZE
#define KP_META_SIZE   16384   /* service-port names for the CLI */
#endif
#ifndef KP_CIP_SIZE
#define KP_CIP_SIZE   65536   /* allocated ClusterIPs (ours and other proxies') */
#endif
#ifndef KP_EXTADDR_SIZE
#define KP_EXTADDR_SIZE 16384 /* addresses of scope-EXT frontends: node IPs, external and LB IPs */
#endif
#ifndef KP_EXTBE_SIZE
#define KP_EXTBE_SIZE 16384   /* local backends of scope-EXT frontends (their replies' sources) */
#endif
#ifndef KP_SRCRANGE_SIZE
#define KP_SRCRANGE_SIZE 16384 /* loadBalancerSourceRanges rows: one per (LB frontend, range) */
#endif
#ifndef KP_NSSRC_SIZE
#define KP_NSSRC_SIZE 8192    /* network namespaces of this node's clients, per family */
#endif
#ifndef KP_NSMISS_SIZE
#define KP_NSMISS_SIZE 256    /* netns cookie -> when a source-range check met it unknown (LRU) */
#endif
#ifndef KP_SVCSTAT_SIZE
#define KP_SVCSTAT_SIZE 16384 /* per-Service counters: a row per service port that saw traffic
			       * (allocated as used: 64 bytes per row and possible CPU) */
#endif
#ifndef KP_MAGLEV_SIZE
#define KP_MAGLEV_SIZE 16384  /* Maglev table rows (allocated as used, ~1 KiB each): a table of
			       * 16381 entries takes 35, and a changed table is written beside
			       * the old before the old goes */
#endif
#ifndef KP_RR_SIZE
#define KP_RR_SIZE    16384   /* round-robin cursors: one per frontend that uses one */
#endif
#ifndef KP_CONNS_SIZE
#define KP_CONNS_SIZE 65536   /* least-conn counters: one per backend a least-conn frontend has
			       * named (index 0 unused; at most 65536: kp_conn_tag's 16 bits) */
#endif
_Static_assert(KP_CONNS_SIZE <= 65536, "KP_CONNS_SIZE: kp_conn_tag holds the index in 16 bits");
#ifndef KP_LCIDS_SIZE
#define KP_LCIDS_SIZE 16384   /* least-conn frontends' rows of backend ids (4 KiB each, as used) */
#endif
#ifndef KP_LCROW_SIZE
#define KP_LCROW_SIZE 32768   /* least-conn frontends' rows of up to KP_LC_ROW backends: two per
			       * frontend (row 0 unused), 64 bytes each: 2 MiB */
#endif
#ifndef KP_SKCONN_SIZE
#define KP_SKCONN_SIZE 0      /* socket storage: no size, one row per connected socket */
#endif
#ifndef KP_SVCCIDR_SIZE
#define KP_SVCCIDR_SIZE 256   /* ServiceCIDR ranges */
#endif

/* Enums that reach the BTF through tools/layoutgen.py's anchor struct (a type no variable
 * uses is not emitted). */
#define KP_ENUMS(X) X(kp_scope) X(kp_action) X(kp_kind) X(kp_be_flags) X(kp_aff_type) \
	X(kp_stat) X(kp_tunables) X(kp_lb_verdict) X(kp_meta_flags) X(kp_traffic_distribution) \
	X(kp_cip_action) X(kp_ct_state) X(kp_ct_flags) X(kp_ct_life) X(kp_ct_timeouts) \
	X(kp_fe_flags) X(kp_aff_client) X(kp_srcrange_bits) X(kp_maglev) X(kp_aff_flags)

/* Structs that are no map's key or value but cross the kernel boundary (test runs). */
#define KP_EXTRA_STRUCTS(X) X(kp_lb_req) X(kp_lb_res)

#endif /* KPROXY_H */
