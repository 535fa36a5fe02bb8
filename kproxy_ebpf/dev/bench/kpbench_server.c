/* kpbench-server: the backend of the benchmark, run inside a lab pod.
 *
 * Request port: every byte 'k' a client sends is answered with "<name>\n" on the same
 * connection (keepalive requests); a byte 'c' is answered the same way and then the server
 * closes (one request per connection, the server closes first, as HTTP/1.0 does: the
 * TIME_WAIT lands on the server and the client never runs out of ephemeral ports).
 * Sink port: everything read is discarded (bulk throughput).
 * UDP on the request port: a datagram starting with 'u' is answered with its first 24 bytes
 * (the client's timestamp and sequence number) followed by "<name>\n".
 * --delay-us D (the scheduler bench's slow backend): the request port behaves like a backend
 * with one worker that takes D microseconds per request. Requests wait in arrival order and
 * each reply leaves D after the previous one did (or after its request came, if the worker
 * was idle), so a backend that gets more than 1/D requests a second builds a queue. The
 * waiting costs no CPU: a timerfd fires at the next reply's time. Needs --threads 1.
 *
 * One epoll loop per thread over SO_REUSEPORT listeners, so the server is never the
 * bottleneck of a single client process. Plain C, no dependencies.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <sys/timerfd.h>
#include <time.h>
#include <unistd.h>

#define MAX_EVENTS 256
#define TAG_REQ_LISTEN 1u
#define TAG_SINK_LISTEN 2u
#define TAG_UDP 3u
#define TAG_TIMER 4u
#define QUEUE_LEN 65536u /* requests waiting for the slow worker; more are refused */
#define UDP_HDR_LEN 24

static char reply[128];
static size_t reply_len;
static int req_port = 8080, sink_port = 8081, threads = 1;

/* --delay-us: the one worker's queue, a ring of (connection, requests, close after) in the
 * order the replies are due; the fd is out of the epoll set while it waits, so a client's
 * close cannot free its number for another connection before the reply is written. */
struct delayed {
	uint64_t due_ns;
	int fd, count, close_after;
};
static uint64_t delay_ns, busy_until_ns;
static struct delayed queue[QUEUE_LEN];
static unsigned q_head, q_tail;
static int timer_fd = -1;

static uint64_t mono_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static void arm_timer(void)
{
	struct itimerspec it = {0};

	if (q_head != q_tail) {
		uint64_t due = queue[q_head % QUEUE_LEN].due_ns;

		it.it_value.tv_sec = (time_t)(due / 1000000000ull);
		it.it_value.tv_nsec = (long)(due % 1000000000ull);
	}
	timerfd_settime(timer_fd, TFD_TIMER_ABSTIME, &it, NULL); /* zero: disarmed */
}

/* A socket bound to every address of both families ([::], IPv4 clients arriving
 * IPv4-mapped), or of IPv4 alone where the pod has no IPv6. */
static int any_socket(int type, int port)
{
	struct sockaddr_in6 sa6 = {.sin6_family = AF_INET6, .sin6_port = htons(port)};
	struct sockaddr_in sa4 = {.sin_family = AF_INET, .sin_port = htons(port)};
	int fd = socket(AF_INET6, type, 0), one = 1, zero = 0;

	if (fd >= 0) {
		setsockopt(fd, IPPROTO_IPV6, IPV6_V6ONLY, &zero, sizeof(zero));
		setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
		setsockopt(fd, SOL_SOCKET, SO_REUSEPORT, &one, sizeof(one));
		if (bind(fd, (struct sockaddr *)&sa6, sizeof(sa6)) == 0)
			return fd;
		close(fd);
	}
	fd = socket(AF_INET, type, 0);
	if (fd < 0)
		return -1;
	setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
	setsockopt(fd, SOL_SOCKET, SO_REUSEPORT, &one, sizeof(one));
	if (bind(fd, (struct sockaddr *)&sa4, sizeof(sa4)) < 0) {
		close(fd);
		return -1;
	}
	return fd;
}

static int listener(int port)
{
	int fd = any_socket(SOCK_STREAM | SOCK_NONBLOCK, port);

	if (fd < 0 || listen(fd, 4096) < 0) {
		perror("bind/listen");
		exit(1);
	}
	return fd;
}

static int udp_socket(int port)
{
	int fd = any_socket(SOCK_DGRAM | SOCK_NONBLOCK, port);

	if (fd < 0) {
		perror("bind udp");
		exit(1);
	}
	return fd;
}

static void serve_udp(int fd)
{
	unsigned char buf[2048];

	for (;;) {
		struct sockaddr_storage from;
		socklen_t flen = sizeof(from);
		ssize_t n = recvfrom(fd, buf, sizeof(buf), 0, (struct sockaddr *)&from, &flen);

		if (n < 0)
			return; /* EAGAIN: drained */
		if (n < UDP_HDR_LEN || buf[0] != 'u')
			continue;
		memcpy(buf + UDP_HDR_LEN, reply, reply_len);
		sendto(fd, buf, UDP_HDR_LEN + reply_len, 0, (struct sockaddr *)&from, flen);
	}
}

/* epoll data: listeners carry their tag in bits 48.., connections their fd and a sink bit
 * (bit 32). */
static uint64_t conn_data(int fd, int sink) { return ((uint64_t)sink << 32) | (uint32_t)fd; }

static void accept_all(int ep, int lfd, int sink)
{
	for (;;) {
		int fd = accept4(lfd, NULL, NULL, SOCK_NONBLOCK);
		struct epoll_event ev = {.events = EPOLLIN};

		if (fd < 0)
			return; /* EAGAIN: drained; anything else: the next event retries */
		if (!sink) {
			int one = 1;
			setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
		}
		ev.data.u64 = conn_data(fd, sink);
		if (epoll_ctl(ep, EPOLL_CTL_ADD, fd, &ev) < 0)
			close(fd);
	}
}

/* Queues the requests of one read for the slow worker (--delay-us). */
static void enqueue(int ep, int fd, const char *buf, ssize_t n)
{
	struct delayed d = {.fd = fd};
	uint64_t now = mono_ns();

	for (ssize_t i = 0; i < n; i++)
		if (buf[i] == 'k' || buf[i] == 'c') {
			d.count++;
			if (buf[i] == 'c') {
				d.close_after = 1;
				break;
			}
		}
	if (!d.count)
		return;
	if (q_tail - q_head >= QUEUE_LEN) {
		close(fd);
		return;
	}
	busy_until_ns = (busy_until_ns > now ? busy_until_ns : now) + d.count * delay_ns;
	d.due_ns = busy_until_ns;
	epoll_ctl(ep, EPOLL_CTL_DEL, fd, NULL);
	queue[q_tail++ % QUEUE_LEN] = d;
	if (q_tail - q_head == 1)
		arm_timer();
}

/* The timer fired: writes every reply that is due, puts keepalive connections back. */
static void reply_due(int ep)
{
	uint64_t expirations, now = mono_ns();

	if (read(timer_fd, &expirations, sizeof(expirations)) < 0 && errno != EAGAIN)
		return;
	while (q_head != q_tail && queue[q_head % QUEUE_LEN].due_ns <= now) {
		struct delayed d = queue[q_head++ % QUEUE_LEN];
		struct epoll_event ev = {.events = EPOLLIN, .data.u64 = (uint32_t)d.fd};
		int ok = 1;

		for (int i = 0; i < d.count && ok; i++)
			ok = write(d.fd, reply, reply_len) == (ssize_t)reply_len;
		if (!ok || d.close_after || epoll_ctl(ep, EPOLL_CTL_ADD, d.fd, &ev) < 0)
			close(d.fd);
	}
	arm_timer();
}

static void serve_request(int ep, int fd)
{
	char buf[4096];
	ssize_t n = read(fd, buf, sizeof(buf));

	if (n == 0 || (n < 0 && errno != EAGAIN && errno != EINTR)) {
		close(fd); /* closing removes it from the epoll set */
		return;
	}
	if (delay_ns) {
		if (n > 0)
			enqueue(ep, fd, buf, n);
		return;
	}
	for (ssize_t i = 0; i < n; i++) {
		if (buf[i] != 'k' && buf[i] != 'c')
			continue;
		/* A reply is a few bytes on a connection that has one request in flight: a short
		 * write means a client that does not read, which is dropped. */
		if (write(fd, reply, reply_len) != (ssize_t)reply_len || buf[i] == 'c') {
			close(fd);
			return;
		}
	}
}

static void serve_sink(int fd)
{
	static __thread char buf[1 << 17];

	for (;;) {
		ssize_t n = read(fd, buf, sizeof(buf));

		if (n > 0)
			continue;
		if (n == 0 || (errno != EAGAIN && errno != EINTR))
			close(fd);
		return;
	}
}

static void *loop(void *arg)
{
	int ep = epoll_create1(0), rl = listener(req_port), sl = listener(sink_port);
	int ul = udp_socket(req_port);
	struct epoll_event ev = {.events = EPOLLIN}, evs[MAX_EVENTS];

	(void)arg;
	ev.data.u64 = (uint64_t)TAG_REQ_LISTEN << 48 | (uint32_t)rl;
	epoll_ctl(ep, EPOLL_CTL_ADD, rl, &ev);
	ev.data.u64 = (uint64_t)TAG_SINK_LISTEN << 48 | (uint32_t)sl;
	epoll_ctl(ep, EPOLL_CTL_ADD, sl, &ev);
	ev.data.u64 = (uint64_t)TAG_UDP << 48 | (uint32_t)ul;
	epoll_ctl(ep, EPOLL_CTL_ADD, ul, &ev);
	if (delay_ns) {
		timer_fd = timerfd_create(CLOCK_MONOTONIC, TFD_NONBLOCK);
		ev.data.u64 = (uint64_t)TAG_TIMER << 48 | (uint32_t)timer_fd;
		epoll_ctl(ep, EPOLL_CTL_ADD, timer_fd, &ev);
	}
	for (;;) {
		int n = epoll_wait(ep, evs, MAX_EVENTS, -1);

		for (int i = 0; i < n; i++) {
			uint64_t d = evs[i].data.u64;
			int fd = (int)(uint32_t)d;

			if (d >> 48 == TAG_REQ_LISTEN)
				accept_all(ep, fd, 0);
			else if (d >> 48 == TAG_SINK_LISTEN)
				accept_all(ep, fd, 1);
			else if (d >> 48 == TAG_UDP)
				serve_udp(fd);
			else if (d >> 48 == TAG_TIMER)
				reply_due(ep);
			else if ((d >> 32) & 1)
				serve_sink(fd);
			else
				serve_request(ep, fd);
		}
	}
	return NULL;
}

int main(int argc, char **argv)
{
	const char *name = "kpbench";
	int cpu = -1;

	for (int i = 1; i + 1 < argc; i += 2) {
		if (!strcmp(argv[i], "--name"))
			name = argv[i + 1];
		else if (!strcmp(argv[i], "--port"))
			req_port = atoi(argv[i + 1]);
		else if (!strcmp(argv[i], "--sink-port"))
			sink_port = atoi(argv[i + 1]);
		else if (!strcmp(argv[i], "--threads"))
			threads = atoi(argv[i + 1]);
		else if (!strcmp(argv[i], "--cpu"))
			cpu = atoi(argv[i + 1]);
		else if (!strcmp(argv[i], "--delay-us"))
			delay_ns = strtoull(argv[i + 1], NULL, 10) * 1000ull;
		else {
			fprintf(stderr, "usage: %s --name N [--port P] [--sink-port S] [--threads T] [--cpu C] "
				"[--delay-us D]\n", argv[0]);
			return 2;
		}
	}
	if (cpu >= 0) {
		cpu_set_t set;

		CPU_ZERO(&set);
		CPU_SET(cpu, &set);
		sched_setaffinity(0, sizeof(set), &set);
	}
	if (delay_ns && threads != 1) {
		fprintf(stderr, "--delay-us needs --threads 1 (one worker)\n");
		return 2;
	}
	signal(SIGPIPE, SIG_IGN);
	reply_len = (size_t)snprintf(reply, sizeof(reply), "%s\n", name);
	if (reply_len >= sizeof(reply))
		reply_len = sizeof(reply) - 1;
	for (int t = 1; t < threads; t++) {
		pthread_t th;

		pthread_create(&th, NULL, loop, NULL);
	}
	loop(NULL);
	return 0;
}
