/* kpbench-client: the benchmark's load generator, run inside a lab pod's netns.
 *
 * A compiled client, because a Python loop costs tens of microseconds per connection and
 * would hide exactly what is measured (a connect4 hook or an iptables walk costs ns to us).
 *
 *   crr     connect, send 'c', read the one-line reply, close (RST); repeated for
 *           --duration seconds or --count transactions per thread (both: whichever comes
 *           first, so a proxy that stalls cannot hold a run for minutes). Records connect()
 *           latency (the SYN/SYN-ACK round trip plus whatever the proxy adds on the way) and
 *           the whole transaction, and counts which backend answered (its name).
 *   rr      one keepalive connection per thread, 1-byte request / one-line reply.
 *   stream  one connection per thread to the sink port, 128 KiB writes (bulk throughput).
 *   udp     one connected UDP socket per thread, 64-byte requests (a send timestamp and a
 *           sequence number inside), --window W of them in flight (default 1: pure request/
 *           response latency; more measures the forwarding rate without letting a queue
 *           anywhere overflow). The server echoes the first 24 bytes and its name; the
 *           latency comes from the echoed timestamp, so it is exact with any window.
 *   watch   reads commands on stdin: "expect NAME" repeats crr transactions until NAME
 *           answers ("expect *": any answer) and prints one JSON line with the wall-clock
 *           time (CLOCK_REALTIME, ns) at which the first matching connection started;
 *           "quit" ends. The caller compares it with the time of its API write.
 *
 * crr/rr/stream print one JSON object on stdout: counts, rate, errors by errno name,
 * latency percentiles (exact, from all samples) and a log-linear histogram.
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#define MAX_ADDRS 64
#define MAX_NAMES 64
#define MAX_ERRNO 256
#define NAME_LEN 64
#define HIST_SUB 8 /* sub-buckets per power of two: ~12% resolution */
#define HIST_BUCKETS (64 * HIST_SUB)

struct samples {
	uint64_t *v;
	size_t n, cap;
};

struct worker {
	pthread_t th;
	int idx;
	uint64_t ok, bytes;
	uint64_t errs[MAX_ERRNO];
	struct samples conn, txn;
	char names[MAX_NAMES][NAME_LEN];
	uint64_t name_counts[MAX_NAMES];
	int nnames;
};

static const char *mode;
/* Targets of either family: sockaddr_in6 is the larger, and each entry's own family says
 * which it holds. */
static union {
	struct sockaddr sa;
	struct sockaddr_in in4;
	struct sockaddr_in6 in6;
} addrs[MAX_ADDRS];
static int naddrs, threads = 1, cpu = -1, timeout_ms = 1000, interval_us, window = 1;
static double duration = 1.0;
static long count_per_thread;
static int duration_set;

static uint64_t now_ns(clockid_t clk)
{
	struct timespec ts;

	clock_gettime(clk, &ts);
	return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static void push(struct samples *s, uint64_t v)
{
	if (s->n == s->cap) {
		s->cap = s->cap ? s->cap * 2 : 65536;
		s->v = realloc(s->v, s->cap * sizeof(*s->v));
		if (!s->v) {
			perror("realloc");
			exit(1);
		}
	}
	s->v[s->n++] = v;
}

static void count_err(struct worker *w, int err)
{
	w->errs[err > 0 && err < MAX_ERRNO ? err : 0]++;
}

static void count_name(struct worker *w, const char *name, uint64_t n)
{
	for (int i = 0; i < w->nnames; i++)
		if (!strcmp(w->names[i], name)) {
			w->name_counts[i] += n;
			return;
		}
	if (w->nnames < MAX_NAMES) {
		snprintf(w->names[w->nnames], NAME_LEN, "%s", name);
		w->name_counts[w->nnames++] = n;
	}
}

static socklen_t addr_len(const struct sockaddr *sa)
{
	return sa->sa_family == AF_INET6 ? sizeof(struct sockaddr_in6) : sizeof(struct sockaddr_in);
}

static int tcp_socket(int family)
{
	int fd = socket(family, SOCK_STREAM, 0), one = 1;
	struct timeval tv = {.tv_sec = timeout_ms / 1000, .tv_usec = (timeout_ms % 1000) * 1000};

	if (fd < 0)
		return -1;
	/* connect() honours SO_SNDTIMEO; reads honour SO_RCVTIMEO (EAGAIN = timeout). */
	setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv));
	setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
	setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
	return fd;
}

/* Close with RST (SO_LINGER 0) once the reply is in: neither side keeps a TIME_WAIT (the
 * server closes too, and its FIN_WAIT ends at our RST) and conntrack drops the flow after
 * 10 s instead of 120. Thousands of short connections per second otherwise leave a server
 * TIME_WAIT per client port; a later SYN from that port whose sequence number comes from a
 * different hash (e.g. a ClusterIP instead of the pod IP after a mode switch) is refused by
 * it and retransmitted 1 s later, which would measure the previous run, not this one. */
static void abort_close(int fd)
{
	struct linger lg = {.l_onoff = 1, .l_linger = 0};

	setsockopt(fd, SOL_SOCKET, SO_LINGER, &lg, sizeof(lg));
	close(fd);
}

/* One connect/request/close transaction. Returns 0 and fills name on success, else an
 * errno. t0 gets the monotonic start, conn_ns the connect() latency. */
static int transaction(const struct sockaddr *to, char *name, uint64_t *conn_ns, uint64_t *t0)
{
	char buf[NAME_LEN + 8];
	size_t got = 0;
	int fd = tcp_socket(to->sa_family), err = 0;

	if (fd < 0)
		return errno;
	*t0 = now_ns(CLOCK_MONOTONIC);
	if (connect(fd, to, addr_len(to)) < 0) {
		err = errno == EINPROGRESS || errno == EAGAIN ? ETIMEDOUT : errno;
		close(fd);
		return err;
	}
	*conn_ns = now_ns(CLOCK_MONOTONIC) - *t0;
	if (write(fd, "c", 1) != 1) {
		err = errno;
		close(fd);
		return err ? err : EIO;
	}
	for (;;) {
		ssize_t n = read(fd, buf + got, sizeof(buf) - 1 - got);

		if (n > 0) {
			got += (size_t)n;
			if (got < sizeof(buf) - 1 && !memchr(buf, '\n', got))
				continue;
		} else if (n < 0) {
			err = errno == EAGAIN ? ETIMEDOUT : errno;
		}
		break;
	}
	abort_close(fd);
	if (err)
		return err;
	buf[got] = 0;
	if (!memchr(buf, '\n', got))
		return ENODATA; /* closed without a whole reply */
	buf[strcspn(buf, "\n")] = 0;
	snprintf(name, NAME_LEN, "%.*s", NAME_LEN - 1, buf);
	return 0;
}

/* Whether a loop goes on: --count transactions, --duration seconds, or both. */
static int more(long done, uint64_t deadline)
{
	if (count_per_thread && done >= count_per_thread)
		return 0;
	return (count_per_thread && !duration_set) || now_ns(CLOCK_MONOTONIC) < deadline;
}

static void *run_crr(void *arg)
{
	struct worker *w = arg;
	uint64_t deadline = now_ns(CLOCK_MONOTONIC) + (uint64_t)(duration * 1e9);
	long i = w->idx, done = 0;
	char name[NAME_LEN];

	while (more(done, deadline)) {
		uint64_t t0, c = 0;
		int err = transaction(&addrs[i++ % naddrs].sa, name, &c, &t0);

		done++;
		if (err) {
			count_err(w, err);
			continue;
		}
		push(&w->conn, c);
		push(&w->txn, now_ns(CLOCK_MONOTONIC) - t0);
		count_name(w, name, 1);
		w->ok++;
	}
	return NULL;
}

static void *run_rr(void *arg)
{
	struct worker *w = arg;
	uint64_t deadline = now_ns(CLOCK_MONOTONIC) + (uint64_t)(duration * 1e9);
	const struct sockaddr *to = &addrs[w->idx % naddrs].sa;
	int fd = tcp_socket(to->sa_family);
	char buf[NAME_LEN + 8];

	if (fd < 0 || connect(fd, to, addr_len(to)) < 0) {
		count_err(w, errno);
		return NULL;
	}
	while (more((long)w->ok, deadline)) {
		uint64_t t0 = now_ns(CLOCK_MONOTONIC);
		ssize_t n;

		if (write(fd, "k", 1) != 1) {
			count_err(w, errno);
			break;
		}
		n = read(fd, buf, sizeof(buf)); /* one short line per request */
		if (n <= 0) {
			count_err(w, n < 0 ? errno : ECONNRESET);
			break;
		}
		push(&w->txn, now_ns(CLOCK_MONOTONIC) - t0);
		w->ok++;
	}
	close(fd);
	return NULL;
}

static void *run_stream(void *arg)
{
	struct worker *w = arg;
	uint64_t deadline = now_ns(CLOCK_MONOTONIC) + (uint64_t)(duration * 1e9);
	static char buf[1 << 17];
	const struct sockaddr *to = &addrs[w->idx % naddrs].sa;
	int fd = tcp_socket(to->sa_family);

	if (fd < 0 || connect(fd, to, addr_len(to)) < 0) {
		count_err(w, errno);
		return NULL;
	}
	while (now_ns(CLOCK_MONOTONIC) < deadline) {
		ssize_t n = write(fd, buf, sizeof(buf));

		if (n <= 0) {
			if (n < 0 && errno == EAGAIN)
				continue; /* SO_SNDTIMEO expired on a full buffer: keep pushing */
			count_err(w, n < 0 ? errno : EPIPE);
			break;
		}
		w->bytes += (uint64_t)n;
	}
	w->ok = 1;
	close(fd);
	return NULL;
}

#define UDP_REQ_LEN 64
#define UDP_HDR_LEN 24 /* 'u', 7 bytes padding, send time (ns), sequence: echoed back */

static int udp_send(int fd, uint64_t seq)
{
	unsigned char req[UDP_REQ_LEN] = {'u'};
	uint64_t t = now_ns(CLOCK_MONOTONIC);

	memcpy(req + 8, &t, sizeof(t));
	memcpy(req + 16, &seq, sizeof(seq));
	return send(fd, req, sizeof(req), 0) == (ssize_t)sizeof(req) ? 0 : errno;
}

/* udp: keeps `window` requests in flight; a receive timeout counts as one error and starts
 * the window again (late replies are still counted when they come). */
static void *run_udp(void *arg)
{
	struct worker *w = arg;
	uint64_t deadline = now_ns(CLOCK_MONOTONIC) + (uint64_t)(duration * 1e9), seq = 0;
	struct timeval tv = {.tv_sec = timeout_ms / 1000, .tv_usec = (timeout_ms % 1000) * 1000};
	const struct sockaddr *to = &addrs[w->idx % naddrs].sa;
	int fd = socket(to->sa_family, SOCK_DGRAM, 0), inflight = 0, err;
	unsigned char buf[UDP_HDR_LEN + NAME_LEN + 8];

	if (fd < 0 || connect(fd, to, addr_len(to)) < 0) {
		count_err(w, errno);
		return NULL;
	}
	setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
	while (more((long)w->ok, deadline)) {
		ssize_t n;
		uint64_t t0;

		while (inflight < window) {
			if ((err = udp_send(fd, seq++))) {
				count_err(w, err);
				goto out; /* ECONNREFUSED (ICMP port unreachable) and the like */
			}
			inflight++;
		}
		n = recv(fd, buf, sizeof(buf) - 1, 0);
		if (n < 0) {
			if (errno != EAGAIN && errno != EINTR) {
				count_err(w, errno);
				goto out;
			}
			if (errno == EAGAIN) {
				count_err(w, ETIMEDOUT);
				inflight = 0;
			}
			continue;
		}
		if (inflight > 0)
			inflight--;
		if (n < UDP_HDR_LEN + 1 || buf[0] != 'u') {
			count_err(w, EBADMSG);
			continue;
		}
		memcpy(&t0, buf + 8, sizeof(t0));
		push(&w->txn, now_ns(CLOCK_MONOTONIC) - t0);
		buf[n] = 0;
		buf[UDP_HDR_LEN + strcspn((char *)buf + UDP_HDR_LEN, "\n")] = 0;
		count_name(w, (char *)buf + UDP_HDR_LEN, 1);
		w->ok++;
	}
out:
	close(fd);
	return NULL;
}

static int cmp_u64(const void *a, const void *b)
{
	uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;

	return x < y ? -1 : x > y;
}

static int hist_bucket(uint64_t v)
{
	int e;

	if (v < HIST_SUB)
		return (int)v;
	e = 63 - __builtin_clzll(v);
	return (e - 2) * HIST_SUB + (int)((v >> (e - 3)) & (HIST_SUB - 1));
}

static uint64_t hist_lower(int b)
{
	int e = b / HIST_SUB + 2, sub = b % HIST_SUB;

	if (b < HIST_SUB)
		return (uint64_t)b;
	return ((uint64_t)(HIST_SUB + sub)) << (e - 3);
}

static uint64_t pct(const struct samples *s, double p)
{
	size_t i;

	if (!s->n)
		return 0;
	/* nearest rank */
	i = (size_t)(p / 100.0 * (double)s->n + 0.999999);
	if (i < 1)
		i = 1;
	if (i > s->n)
		i = s->n;
	return s->v[i - 1];
}

static void print_dist(const char *key, struct samples *s)
{
	uint64_t hist[HIST_BUCKETS] = {0};
	long double sum = 0;
	int first = 1;

	qsort(s->v, s->n, sizeof(*s->v), cmp_u64);
	for (size_t i = 0; i < s->n; i++) {
		sum += s->v[i];
		hist[hist_bucket(s->v[i])]++;
	}
	printf("\"%s\":{\"count\":%zu,\"min\":%llu,\"p50\":%llu,\"p90\":%llu,\"p99\":%llu,"
	       "\"p999\":%llu,\"max\":%llu,\"mean\":%.1Lf,\"hist\":[",
	       key, s->n, (unsigned long long)(s->n ? s->v[0] : 0), (unsigned long long)pct(s, 50),
	       (unsigned long long)pct(s, 90), (unsigned long long)pct(s, 99),
	       (unsigned long long)pct(s, 99.9), (unsigned long long)(s->n ? s->v[s->n - 1] : 0),
	       s->n ? sum / s->n : 0.0L);
	for (int b = 0; b < HIST_BUCKETS; b++)
		if (hist[b]) {
			printf("%s[%llu,%llu]", first ? "" : ",", (unsigned long long)hist_lower(b),
			       (unsigned long long)hist[b]);
			first = 0;
		}
	printf("]}");
}

static void merge(struct samples *into, const struct samples *from)
{
	for (size_t i = 0; i < from->n; i++)
		push(into, from->v[i]);
}

static void report(struct worker *ws, double elapsed)
{
	struct samples conn = {0}, txn = {0};
	uint64_t ok = 0, bytes = 0, errs[MAX_ERRNO] = {0}, failed = 0;
	struct worker names = {0};
	int first = 1;

	for (int t = 0; t < threads; t++) {
		ok += ws[t].ok;
		bytes += ws[t].bytes;
		for (int e = 0; e < MAX_ERRNO; e++) {
			errs[e] += ws[t].errs[e];
			failed += ws[t].errs[e];
		}
		merge(&conn, &ws[t].conn);
		merge(&txn, &ws[t].txn);
		for (int i = 0; i < ws[t].nnames; i++)
			count_name(&names, ws[t].names[i], ws[t].name_counts[i]);
	}
	printf("{\"mode\":\"%s\",\"threads\":%d,\"elapsed_s\":%.6f,\"ok\":%llu,\"failed\":%llu,"
	       "\"rate\":%.1f,\"bytes\":%llu,\"gbit_s\":%.4f,\"errors\":{",
	       mode, threads, elapsed, (unsigned long long)ok, (unsigned long long)failed,
	       elapsed > 0 ? ok / elapsed : 0.0, (unsigned long long)bytes,
	       elapsed > 0 ? bytes * 8.0 / elapsed / 1e9 : 0.0);
	for (int e = 0; e < MAX_ERRNO; e++)
		if (errs[e]) {
			const char *n = e ? strerrorname_np(e) : NULL;

			printf("%s\"%s\":%llu", first ? "" : ",", n ? n : "OTHER", (unsigned long long)errs[e]);
			first = 0;
		}
	printf("},\"backends\":{");
	for (int i = 0; i < names.nnames; i++)
		printf("%s\"%s\":%llu", i ? "," : "", names.names[i], (unsigned long long)names.name_counts[i]);
	printf("},");
	print_dist("connect_ns", &conn);
	printf(",");
	print_dist("txn_ns", &txn);
	printf("}\n");
}

/* watch: one line of JSON per "expect" command. */
static int watch(void)
{
	char line[256], name[NAME_LEN];
	long i = 0;

	setvbuf(stdout, NULL, _IOLBF, 0);
	printf("{\"ready\":true}\n");
	while (fgets(line, sizeof(line), stdin)) {
		char want[NAME_LEN] = "";
		uint64_t start = now_ns(CLOCK_MONOTONIC), limit, attempts = 0, failures = 0;
		double max_wait = 0;
		int any, found = 0;

		line[strcspn(line, "\n")] = 0;
		if (!strcmp(line, "quit"))
			break;
		if (sscanf(line, "expect %63s %lf", want, &max_wait) < 1) {
			printf("{\"error\":\"bad command\"}\n");
			continue;
		}
		any = !strcmp(want, "*");
		limit = start + (uint64_t)((max_wait > 0 ? max_wait : 60.0) * 1e9);
		while (now_ns(CLOCK_MONOTONIC) < limit) {
			uint64_t t0, c, wall = now_ns(CLOCK_REALTIME);
			int err = transaction(&addrs[i++ % naddrs].sa, name, &c, &t0);

			attempts++;
			if (!err && (any || !strcmp(name, want))) {
				printf("{\"ok\":true,\"seen_realtime_ns\":%llu,\"name\":\"%s\","
				       "\"attempts\":%llu,\"failures\":%llu}\n",
				       (unsigned long long)wall, name, (unsigned long long)attempts,
				       (unsigned long long)failures);
				found = 1;
				break;
			}
			if (err)
				failures++;
			if (interval_us) {
				struct timespec ts = {.tv_sec = interval_us / 1000000,
						      .tv_nsec = (interval_us % 1000000) * 1000L};
				nanosleep(&ts, NULL);
			}
		}
		if (!found)
			printf("{\"ok\":false,\"attempts\":%llu,\"failures\":%llu}\n",
			       (unsigned long long)attempts, (unsigned long long)failures);
	}
	return 0;
}

static int parse_addrs(char *list, int port)
{
	for (char *tok = strtok(list, ","); tok; tok = strtok(NULL, ",")) {
		if (naddrs == MAX_ADDRS)
			return -1;
		if (inet_pton(AF_INET, tok, &addrs[naddrs].in4.sin_addr) == 1) {
			addrs[naddrs].in4.sin_family = AF_INET;
			addrs[naddrs].in4.sin_port = htons(port);
		} else if (inet_pton(AF_INET6, tok, &addrs[naddrs].in6.sin6_addr) == 1) {
			addrs[naddrs].in6.sin6_family = AF_INET6;
			addrs[naddrs].in6.sin6_port = htons(port);
		} else {
			return -1;
		}
		naddrs++;
	}
	return naddrs ? 0 : -1;
}

static void usage(const char *prog)
{
	fprintf(stderr, "usage: %s crr|rr|stream|udp|watch --addr A[,B..] --port P [--duration S] "
		"[--count N] [--threads T] [--timeout-ms MS] [--interval-us US] [--window W] [--cpu C]\n", prog);
	exit(2);
}

int main(int argc, char **argv)
{
	char *addr_list = NULL;
	int port = 0;
	struct worker *ws;
	void *(*fn)(void *);
	uint64_t t0;

	if (argc < 2)
		usage(argv[0]);
	mode = argv[1];
	for (int i = 2; i < argc; i++) {
		const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;

		if (!v)
			usage(argv[0]);
		if (!strcmp(a, "--addr"))
			addr_list = strdup(v);
		else if (!strcmp(a, "--port"))
			port = atoi(v);
		else if (!strcmp(a, "--duration"))
			duration = atof(v), duration_set = 1;
		else if (!strcmp(a, "--count"))
			count_per_thread = atol(v);
		else if (!strcmp(a, "--threads"))
			threads = atoi(v);
		else if (!strcmp(a, "--timeout-ms"))
			timeout_ms = atoi(v);
		else if (!strcmp(a, "--interval-us"))
			interval_us = atoi(v);
		else if (!strcmp(a, "--cpu"))
			cpu = atoi(v);
		else if (!strcmp(a, "--window"))
			window = atoi(v);
		else
			usage(argv[0]);
		i++;
	}
	if (!addr_list || port <= 0 || threads < 1 || window < 1 || parse_addrs(addr_list, port) < 0)
		usage(argv[0]);
	signal(SIGPIPE, SIG_IGN);
	if (cpu >= 0) {
		cpu_set_t set;

		CPU_ZERO(&set);
		CPU_SET(cpu, &set);
		sched_setaffinity(0, sizeof(set), &set);
	}
	if (!strcmp(mode, "watch"))
		return watch();
	if (!strcmp(mode, "crr"))
		fn = run_crr;
	else if (!strcmp(mode, "rr"))
		fn = run_rr;
	else if (!strcmp(mode, "stream"))
		fn = run_stream;
	else if (!strcmp(mode, "udp"))
		fn = run_udp;
	else
		usage(argv[0]);
	ws = calloc((size_t)threads, sizeof(*ws));
	if (!ws)
		return 1;
	t0 = now_ns(CLOCK_MONOTONIC);
	for (int t = 0; t < threads; t++) {
		ws[t].idx = t;
		pthread_create(&ws[t].th, NULL, fn, &ws[t]);
	}
	for (int t = 0; t < threads; t++)
		pthread_join(ws[t].th, NULL);
	report(ws, (now_ns(CLOCK_MONOTONIC) - t0) / 1e9);
	return 0;
}
