/*
 * node/transport/idle.c: connections to our fabric port that never sent a
 * byte (docs/transport.md, "Idle connections").
 *
 * libfabric 1.17's tcp provider accepts every TCP connection to the
 * listening port and then waits, with no deadline, for the connection
 * request of its own protocol; until that arrives ofi_rxm (and so we) never
 * hear of the connection: no event, no handle, no call that lists or
 * closes it. So such connections are counted from outside: once a second
 * the progress thread looks at this process's own sockets
 * (/proc/self/fd), keeps the TCP ones whose local port is the fabric port
 * and that are connected (accepted, not the listener), and asks the kernel
 * (TCP_INFO) how many bytes each has received and how long ago it last
 * received any. One that is established, has received nothing at all, and
 * is older than idle_conn_ms is idle. A connection that sent libfabric's
 * connection request and then nothing is not seen here (it has received
 * bytes); nor are connections of other processes.
 *
 * It only reads: the sockets are libfabric's, and closing or shutting one
 * down behind its back is not ours to do (docs/transport.md says why).
 * The fd numbers are read while other threads may open and close files:
 * an fd that changed meanwhile fails one of the checks or is counted once
 * wrongly, for one second.
 */
#include "config.h"

#include <arpa/inet.h>
#include <dirent.h>
#include <errno.h>
#include <inttypes.h>
#include <netinet/in.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <linux/tcp.h>

#include "base/log.h"
#include "node/transport/internal.h"

/* tcpi_state of an established connection (the kernel's TCP_ESTABLISHED,
 * which no user-space header exports next to linux/tcp.h). */
#define IDLE_TCP_ESTABLISHED 1

/* A warning at most this often while idle connections stay. */
#define IDLE_WARN_EVERY_MS 60000u

/* The local port of a connected TCP socket, 0 for anything else; the peer's
 * address as text in peer. */
static unsigned conn_port(int fd, char *peer, size_t cap)
{
    struct sockaddr_storage a, b;
    socklen_t al = sizeof(a), bl = sizeof(b);
    if (getsockname(fd, (struct sockaddr *)&a, &al) != 0 ||
        getpeername(fd, (struct sockaddr *)&b, &bl) != 0)
        return 0;
    char ip[INET6_ADDRSTRLEN] = "?";
    if (a.ss_family == AF_INET && b.ss_family == AF_INET) {
        const struct sockaddr_in *p = (const struct sockaddr_in *)&b;
        inet_ntop(AF_INET, &p->sin_addr, ip, sizeof(ip));
        snprintf(peer, cap, "%s:%u", ip, ntohs(p->sin_port));
        return ntohs(((const struct sockaddr_in *)&a)->sin_port);
    }
    if (a.ss_family == AF_INET6 && b.ss_family == AF_INET6) {
        const struct sockaddr_in6 *p = (const struct sockaddr_in6 *)&b;
        inet_ntop(AF_INET6, &p->sin6_addr, ip, sizeof(ip));
        snprintf(peer, cap, "[%s]:%u", ip, ntohs(p->sin6_port));
        return ntohs(((const struct sockaddr_in6 *)&a)->sin6_port);
    }
    return 0;
}

/* 1 when fd is an established TCP connection that has received no byte for
 * at least min_ms since it was set up. */
static int never_sent(int fd, uint32_t min_ms)
{
    struct tcp_info ti;
    socklen_t len = sizeof(ti);
    memset(&ti, 0, sizeof(ti));
    if (getsockopt(fd, IPPROTO_TCP, TCP_INFO, &ti, &len) != 0 ||
        len < offsetof(struct tcp_info, tcpi_bytes_received) + sizeof(ti.tcpi_bytes_received))
        return 0;
    return ti.tcpi_state == IDLE_TCP_ESTABLISHED && ti.tcpi_bytes_received == 0 &&
           ti.tcpi_last_data_recv >= min_ms;
}

/* Count the idle connections on `port`; the first one's peer in first. */
static unsigned count_idle(unsigned port, uint32_t min_ms, char *first, size_t cap)
{
    DIR *d = opendir("/proc/self/fd");
    if (!d)
        return 0;
    const int dfd = dirfd(d);
    unsigned n = 0;
    struct dirent *e;
    while ((e = readdir(d))) {
        char *end;
        const long fd = strtol(e->d_name, &end, 10);
        struct stat st;
        if (*end || end == e->d_name || fd == dfd || fstat((int)fd, &st) != 0 ||
            !S_ISSOCK(st.st_mode))
            continue;
        char peer[INET6_ADDRSTRLEN + 16];
        if (conn_port((int)fd, peer, sizeof(peer)) != port || !never_sent((int)fd, min_ms))
            continue;
        if (n++ == 0)
            snprintf(first, cap, "%s", peer);
    }
    closedir(d);
    return n;
}

void fab_idle_scan(tp_fab *t, uint64_t now)
{
    const unsigned port = t->listen_port ? (unsigned)strtoul(t->listen_port, NULL, 10) : 0;
    if (!port || !t->idle_scan)
        return;
    char first[INET6_ADDRSTRLEN + 16] = "";
    const unsigned n = count_idle(port, t->o.idle_conn_ms, first, sizeof(first));
    atomic_store_explicit(&t->st.idle_conns, n, memory_order_relaxed);
    if (n && (n > t->idle_warned_n || now - t->idle_warned_ms >= IDLE_WARN_EVERY_MS)) {
        ds_warn(COMP, "%u connection%s to the fabric port %u sent nothing for %u s or more "
                "(first from %s); libfabric holds them open and offers no way to close them",
                n, n == 1 ? "" : "s", port, t->o.idle_conn_ms / 1000, first);
        t->idle_warned_ms = now;
        t->idle_warned_n = n;
    }
    if (!n)
        t->idle_warned_n = 0;
}
