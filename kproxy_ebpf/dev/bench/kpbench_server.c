/* kpbench-server: the backend of the benchmark, run inside a lab pod.
 *
 * Request port: every byte 'k' a client sends is answered with "<name>\n" on the same
 * connection (keepalive requests); a byte 'c' is answered the same way and then the server
 * closes (one request per connection, the server closes first, as HTTP/1.0 does: the
 * TIME_WAIT lands on the server and the client never runs out of ephemeral ports).
 * Sink port: everything read is discarded (bulk throughput).
 * UDP on the request port: a datagram starting with 'u' is answered with its first 24 bytes
 * (the client's timestamp and sequence number) followed by "<name>\n".
 *
 * One epoll loop per thread over SO_REUSEPORT listeners, so the server is never the
 * bottleneck of a single client process. Plain C, no dependencies.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <unistd.h>

#define MAX_EVENTS 256
#define TAG_REQ_LISTEN 1u
#define TAG_SINK_LISTEN 2u
#define TAG_UDP 3u
#define UDP_HDR_LEN 24

static char reply[128];
static size_t reply_len;
static int req_port = 8080, sink_port = 8081, threads = 1;

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

static void serve_request(int fd)
{
	char buf[4096];
	ssize_t n = read(fd, buf, sizeof(buf));

	if (n == 0 || (n < 0 && errno != EAGAIN && errno != EINTR)) {
		close(fd); /* closing removes it from the epoll set */
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
			else if ((d >> 32) & 1)
				serve_sink(fd);
			else
				serve_request(fd);
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
		else {
			fprintf(stderr, "usage: %s --name N [--port P] [--sink-port S] [--threads T] [--cpu C]\n", argv[0]);
			return 2;
		}
	}
	if (cpu >= 0) {
		cpu_set_t set;

		CPU_ZERO(&set);
		CPU_SET(cpu, &set);
		sched_setaffinity(0, sizeof(set), &set);
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
