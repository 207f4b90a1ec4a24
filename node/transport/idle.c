/*
 * node/transport/idle.c: connections to our fabric port that never sent a
 * byte (docs/transport.md, "Idle connections").
 *
 * libfabric 1.17's tcp provider accepts every TCP connection to the
 * listening port and then waits, with no deadline, for the connection
 * request of its own protocol; until that arrives ofi_rxm (and so we) never
 * hear of the connection: no event, no handle, no call that lists or
 * closes it. So they are found from outside: once a second the progress
 * thread looks at this process's own sockets (/proc/self/fd), keeps the
 * TCP ones whose local port is the fabric port and that are connected
 * (accepted: dialled connections have another local port; the kernel's
 * /proc/self/net/tcp names them by inode, so no other descriptor is
 * touched), and asks the kernel (TCP_INFO) how many bytes each has
 * received and how long ago.
 * One that is established and has received nothing at all is silent; a
 * peer's real connection sends libfabric's request at once, so a silent
 * connection older than idle_conn_ms is a stranger's, and it is shut down
 * (shutdown(2), not close: the descriptor stays libfabric's). libfabric
 * then reads EOF, which is exactly what it sees when a client hangs up,
 * and closes the socket and frees its state itself on its next pass.
 *
 * Why this is safe: only libfabric creates and closes these sockets, and
 * with FI_THREAD_DOMAIN and manual progress it runs only inside our calls
 * on this very thread, so a descriptor found here cannot be closed and
 * reused by libfabric before the shutdown. Other threads of the process
 * never hold a connected TCP socket whose local port is the fabric port.
 *
 * Not seen: connections that completed libfabric's request and then went
 * silent (they received bytes), and other providers than tcp.
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
#include <unistd.h>
#include <linux/tcp.h>

#include "base/log.h"
#include "node/transport/internal.h"

/* tcpi_state of an established connection (the kernel's TCP_ESTABLISHED,
 * which no user-space header exports next to linux/tcp.h). */
#define IDLE_TCP_ESTABLISHED 1

/* One warning line at most this often, with what was closed since. */
#define IDLE_WARN_EVERY_MS 10000u

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

/* How long ago an established TCP connection that has received no byte
 * at all was set up (ms), or -1 for any other socket. */
static long silent_for_ms(int fd)
{
    struct tcp_info ti;
    socklen_t len = sizeof(ti);
    memset(&ti, 0, sizeof(ti));
    if (getsockopt(fd, IPPROTO_TCP, TCP_INFO, &ti, &len) != 0 ||
        len < offsetof(struct tcp_info, tcpi_bytes_received) + sizeof(ti.tcpi_bytes_received))
        return -1;
    if (ti.tcpi_state != IDLE_TCP_ESTABLISHED || ti.tcpi_bytes_received != 0)
        return -1;
    return (long)ti.tcpi_last_data_recv; /* since the handshake, as none came */
}

struct idle_pass {
    unsigned silent;  /* silent, younger than the deadline: left alone */
    unsigned closed;  /* silent past the deadline: shut down */
    char first[INET6_ADDRSTRLEN + 16]; /* the first one closed */
};

/* The inodes of the established TCP connections whose local port is
 * `port`, from the kernel's table for this network namespace (/proc/self/
 * net/tcp and tcp6: "sl local rem st ... inode", addresses as hex
 * IP:PORT, state 01 = established). Sorted; *n of them, or -1. */
static long *fabric_inodes(unsigned port, size_t *n)
{
    static const char *const tables[] = {"/proc/self/net/tcp", "/proc/self/net/tcp6"};
    long *v = NULL;
    size_t cap = 0;
    *n = 0;
    for (size_t k = 0; k < sizeof(tables) / sizeof(tables[0]); k++) {
        FILE *f = fopen(tables[k], "re");
        if (!f)
            continue;
        char line[512];
        if (!fgets(line, sizeof(line), f)) { /* the header */
            fclose(f);
            continue;
        }
        while (fgets(line, sizeof(line), f)) {
            char local[64], rem[64];
            unsigned st, lport;
            unsigned long inode;
            /* sl local rem st tx:rx tr:when retrnsmt uid timeout inode */
            if (sscanf(line, " %*s %63s %63s %x %*s %*s %*s %*s %*s %lu", local, rem, &st,
                       &inode) != 4)
                continue;
            const char *colon = strrchr(local, ':');
            if (!colon || sscanf(colon + 1, "%x", &lport) != 1 || lport != port ||
                st != IDLE_TCP_ESTABLISHED || !inode)
                continue;
            if (*n == cap) {
                cap = cap ? 2 * cap : 16;
                long *nv = realloc(v, cap * sizeof(*v));
                if (!nv) {
                    fclose(f);
                    free(v);
                    *n = 0;
                    return NULL;
                }
                v = nv;
            }
            v[(*n)++] = (long)inode;
        }
        fclose(f);
    }
    return v;
}

static int has_inode(const long *v, size_t n, long inode)
{
    for (size_t i = 0; i < n; i++)
        if (v[i] == inode)
            return 1;
    return 0;
}

/* One look at this process's sockets on `port`. The kernel's table names
 * the connections on our port first, and only descriptors whose link in
 * /proc/self/fd is one of those sockets are touched: the other
 * descriptors belong to other threads (another endpoint in the same
 * process, the status server, files), which may close them at any time,
 * so this thread makes no call on them at all. */
static void idle_pass_run(unsigned port, uint32_t deadline_ms, struct idle_pass *ps)
{
    size_t n_ino = 0;
    long *ino = fabric_inodes(port, &n_ino);
    if (!n_ino) {
        free(ino);
        return;
    }
    DIR *d = opendir("/proc/self/fd");
    if (!d) {
        free(ino);
        return;
    }
    const int dfd = dirfd(d);
    struct dirent *e;
    while ((e = readdir(d))) {
        char *end, link[64];
        const long fd = strtol(e->d_name, &end, 10);
        if (*end || end == e->d_name || fd == dfd)
            continue;
        const ssize_t ll = readlinkat(dfd, e->d_name, link, sizeof(link) - 1);
        long inode;
        if (ll <= 0)
            continue;
        link[ll] = '\0';
        if (sscanf(link, "socket:[%ld]", &inode) != 1 || !has_inode(ino, n_ino, inode))
            continue;
        char peer[INET6_ADDRSTRLEN + 16];
        long age;
        if (conn_port((int)fd, peer, sizeof(peer)) != port || (age = silent_for_ms((int)fd)) < 0)
            continue;
        if (age < (long)deadline_ms) {
            ps->silent++;
            continue;
        }
        /* libfabric sees EOF on its next pass and closes it, as when a
         * client hangs up (see the file's comment). */
        if (shutdown((int)fd, SHUT_RDWR) != 0)
            continue;
        if (ps->closed++ == 0)
            snprintf(ps->first, sizeof(ps->first), "%s", peer);
    }
    closedir(d);
    free(ino);
}

void fab_idle_scan(tp_fab *t, uint64_t now)
{
    const unsigned port = t->listen_port ? (unsigned)strtoul(t->listen_port, NULL, 10) : 0;
    if (!port || !t->idle_scan)
        return;
    struct idle_pass ps = {0};
    idle_pass_run(port, t->o.idle_conn_ms, &ps);
    atomic_store_explicit(&t->st.idle_conns, ps.silent, memory_order_relaxed);
    atomic_fetch_add_explicit(&t->st.idle_closed, ps.closed, memory_order_relaxed);
    t->idle_unwarned += ps.closed;
    if (ps.closed && !t->idle_first[0])
        snprintf(t->idle_first, sizeof(t->idle_first), "%s", ps.first);
    if (t->idle_unwarned && now - t->idle_warned_ms >= IDLE_WARN_EVERY_MS) {
        ds_warn(COMP, "closed %u connection%s to the fabric port %u that sent nothing for %u s "
                "(the first from %s)", t->idle_unwarned, t->idle_unwarned == 1 ? "" : "s", port,
                t->o.idle_conn_ms / 1000, t->idle_first);
        t->idle_warned_ms = now;
        t->idle_unwarned = 0;
        t->idle_first[0] = 0;
    }
}
