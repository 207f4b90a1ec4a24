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
 * (accepted: dialled connections have another local port; the kernel
 * names them by inode, over sock_diag or in /proc/self/net/tcp, so no
 * other descriptor is touched), and asks the kernel (TCP_INFO) how many
 * bytes each has received and how long ago. A pass over the same
 * sockets as the last one, which found none silent, ends before asking
 * the kernel (idle_pass_run).
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
#include <linux/inet_diag.h>
#include <linux/netlink.h>
#include <linux/sock_diag.h>
#include <linux/tcp.h>

#include "base/log.h"
#include "base/splitmix.h"
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
    int skipped;      /* the same sockets as the last pass, which found none silent */
    unsigned silent;  /* silent, younger than the deadline: left alone */
    unsigned closed;  /* silent past the deadline: shut down */
    char first[INET6_ADDRSTRLEN + 16]; /* the first one closed */
};

static int inode_add(long **v, size_t *n, size_t *cap, long inode)
{
    if (*n == *cap) {
        const size_t c = *cap ? 2 * *cap : 16;
        long *nv = realloc(*v, c * sizeof(**v));
        if (!nv)
            return -ENOMEM;
        *v = nv;
        *cap = c;
    }
    (*v)[(*n)++] = inode;
    return 0;
}

/* The inodes of family's established TCP connections whose local port is
 * `port`, asked of the kernel over NETLINK_SOCK_DIAG (inet_diag: one dump
 * of the established connections of this network namespace, as `ss`
 * does), appended to *v. 0, or a negative errno (the caller then reads
 * the /proc tables). Why not /proc/self/net/tcp first: reading it walks
 * the whole established and listening hash tables, twice a file, at
 * any number of sockets: 6.7 ms of system time for the two files here
 * (262,144 buckets on a 24 GiB machine), once a second in every node;
 * the dump of the established ones only is a fraction of that
 * (docs/transport.md, "Idle connections"). */
static int diag_inodes(int family, unsigned port, long **v, size_t *n, size_t *cap)
{
    const int fd = socket(AF_NETLINK, SOCK_DGRAM | SOCK_CLOEXEC, NETLINK_SOCK_DIAG);
    if (fd < 0)
        return -errno;
    struct {
        struct nlmsghdr nlh;
        struct inet_diag_req_v2 r;
    } req;
    memset(&req, 0, sizeof(req));
    req.nlh.nlmsg_len = sizeof(req);
    req.nlh.nlmsg_type = SOCK_DIAG_BY_FAMILY;
    req.nlh.nlmsg_flags = NLM_F_REQUEST | NLM_F_DUMP;
    req.r.sdiag_family = (uint8_t)family;
    req.r.sdiag_protocol = IPPROTO_TCP;
    req.r.idiag_states = 1u << IDLE_TCP_ESTABLISHED;
    struct sockaddr_nl kernel = {.nl_family = AF_NETLINK};
    if (sendto(fd, &req, sizeof(req), 0, (struct sockaddr *)&kernel, sizeof(kernel)) < 0) {
        const int e = -errno;
        close(fd);
        return e;
    }
    long buf[8192 / sizeof(long)]; /* aligned for nlmsghdr */
    int e = 0, done = 0;
    while (!done && e == 0) {
        const ssize_t len = recv(fd, buf, sizeof(buf), 0);
        if (len < 0) {
            if (errno == EINTR)
                continue;
            e = -errno;
            break;
        }
        if (len == 0) {
            e = -EIO;
            break;
        }
        int left = (int)len;
        for (const struct nlmsghdr *h = (const struct nlmsghdr *)buf; NLMSG_OK(h, left);
             h = NLMSG_NEXT(h, left)) {
            if (h->nlmsg_type == NLMSG_DONE) {
                done = 1;
                break;
            }
            if (h->nlmsg_type == NLMSG_ERROR) {
                const struct nlmsgerr *er = NLMSG_DATA(h);
                e = h->nlmsg_len >= NLMSG_LENGTH(sizeof(*er)) && er->error ? er->error : -EIO;
                break;
            }
            if (h->nlmsg_type != SOCK_DIAG_BY_FAMILY ||
                h->nlmsg_len < NLMSG_LENGTH(sizeof(struct inet_diag_msg)))
                continue;
            const struct inet_diag_msg *m = NLMSG_DATA(h);
            if (m->idiag_state == IDLE_TCP_ESTABLISHED && ntohs(m->id.idiag_sport) == port &&
                m->idiag_inode && (e = inode_add(v, n, cap, (long)m->idiag_inode)) < 0)
                break;
        }
    }
    close(fd);
    return e;
}

/* family's established TCP connections on `port` from the kernel's
 * table for this network namespace (/proc/self/net/tcp or tcp6: "sl
 * local rem st ... inode", addresses as hex IP:PORT, state 01 =
 * established), appended to *v. 0, or -ENOMEM. */
static int proc_inodes(const char *table, unsigned port, long **v, size_t *n, size_t *cap)
{
    FILE *f = fopen(table, "re");
    if (!f)
        return 0;
    char line[512];
    int e = 0;
    if (!fgets(line, sizeof(line), f)) { /* the header */
        fclose(f);
        return 0;
    }
    while (e == 0 && fgets(line, sizeof(line), f)) {
        char local[64], rem[64];
        unsigned st, lport;
        unsigned long inode;
        /* sl local rem st tx:rx tr:when retrnsmt uid timeout inode */
        if (sscanf(line, " %*s %63s %63s %x %*s %*s %*s %*s %*s %lu", local, rem, &st, &inode) != 4)
            continue;
        const char *colon = strrchr(local, ':');
        if (!colon || sscanf(colon + 1, "%x", &lport) != 1 || lport != port ||
            st != IDLE_TCP_ESTABLISHED || !inode)
            continue;
        e = inode_add(v, n, cap, (long)inode);
    }
    fclose(f);
    return e;
}

/* The inodes of the established TCP connections whose local port is
 * `port`, IPv4 and IPv6: over sock_diag (above), or for a family where
 * that fails, from the /proc table. *n of them; NULL with *n = 0 when
 * there are none or memory ran out. */
static long *fabric_inodes(unsigned port, size_t *n)
{
    static const struct {
        int family;
        const char *table;
    } fams[] = {{AF_INET, "/proc/self/net/tcp"}, {AF_INET6, "/proc/self/net/tcp6"}};
    long *v = NULL;
    size_t cap = 0;
    *n = 0;
    for (size_t k = 0; k < sizeof(fams) / sizeof(fams[0]); k++) {
        /* (A dump that failed part way may have added some: a second
         * entry for an inode changes nothing, has_inode.) */
        int e = diag_inodes(fams[k].family, port, &v, n, &cap);
        if (e < 0 && e != -ENOMEM)
            e = proc_inodes(fams[k].table, port, &v, n, &cap);
        if (e < 0) {
            free(v);
            *n = 0;
            return NULL;
        }
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

/* This process's socket descriptors, from the links in /proc/self/fd
 * (readlink on the directory's entries: no call on the descriptors
 * themselves), and a fingerprint of their inodes. */
struct sockfd {
    int fd;
    long inode;
};

static struct sockfd *own_sockets(size_t *n, uint64_t *print)
{
    *n = 0;
    *print = 0;
    DIR *d = opendir("/proc/self/fd");
    if (!d)
        return NULL;
    struct sockfd *v = NULL;
    size_t cap = 0;
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
        if (sscanf(link, "socket:[%ld]", &inode) != 1)
            continue;
        if (*n == cap) {
            const size_t c = cap ? 2 * cap : 32;
            struct sockfd *nv = realloc(v, c * sizeof(*v));
            if (!nv) {
                free(v);
                *n = 0;
                closedir(d);
                return NULL;
            }
            v = nv;
            cap = c;
        }
        v[(*n)++] = (struct sockfd){(int)fd, inode};
        *print += ds_splitmix64_mix((uint64_t)inode ^ ((uint64_t)fd << 40));
    }
    closedir(d);
    *print ^= ds_splitmix64_mix(*n);
    return v;
}

/* One look at this process's sockets on `port`. The process's socket
 * descriptors first (own_sockets): when they are the ones of the last
 * pass and that pass found no silent connection, there is nothing new
 * to look at (a connection libfabric accepted is a new descriptor), and
 * the kernel is not asked. Else the kernel's table names the connections
 * on our port, and only descriptors that are one of those sockets are
 * touched: the other descriptors belong to other threads (another
 * endpoint in the same process, the status server, files), which may
 * close them at any time, so this thread makes no call on them at all.
 * Ours cannot change in between: only libfabric, on this thread, opens
 * and closes them. */
static void idle_pass_run(unsigned port, uint32_t deadline_ms, struct idle_pass *ps,
                          uint64_t *last_print, unsigned last_silent)
{
    size_t n_fd = 0, n_ino = 0;
    uint64_t print;
    struct sockfd *fds = own_sockets(&n_fd, &print);
    if (!fds)
        return;
    if (print == *last_print && !last_silent) {
        ps->skipped = 1;
        free(fds);
        return;
    }
    *last_print = print;
    long *ino = fabric_inodes(port, &n_ino);
    for (size_t i = 0; i < n_fd && n_ino; i++) {
        const int fd = fds[i].fd;
        if (!has_inode(ino, n_ino, fds[i].inode))
            continue;
        char peer[INET6_ADDRSTRLEN + 16];
        long age;
        if (conn_port(fd, peer, sizeof(peer)) != port || (age = silent_for_ms(fd)) < 0)
            continue;
        if (age < (long)deadline_ms) {
            ps->silent++;
            continue;
        }
        /* libfabric sees EOF on its next pass and closes it, as when a
         * client hangs up (see the file's comment). */
        if (shutdown(fd, SHUT_RDWR) != 0)
            continue;
        if (ps->closed++ == 0)
            snprintf(ps->first, sizeof(ps->first), "%s", peer);
    }
    free(ino);
    free(fds);
}

void fab_idle_scan(tp_fab *t, uint64_t now)
{
    const unsigned port = t->listen_port ? (unsigned)strtoul(t->listen_port, NULL, 10) : 0;
    if (!port || !t->idle_scan)
        return;
    struct idle_pass ps = {0};
    idle_pass_run(port, t->o.idle_conn_ms, &ps, &t->idle_print, t->idle_silent);
    if (!ps.skipped) {
        t->idle_silent = ps.silent;
        atomic_store_explicit(&t->st.idle_conns, ps.silent, memory_order_relaxed);
    }
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
