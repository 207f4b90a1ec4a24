/*
 * node/status/http.c: the status page's HTTP server, libmicrohttpd (MHD)
 * driven by the status thread.
 *
 * MHD runs in its "external" epoll mode: no thread of its own; the status
 * thread polls MHD's epoll descriptor and calls MHD_run, so every callback
 * below runs on the status thread and needs no lock of its own. The
 * listening socket is bound here (so a taken port is -EADDRINUSE with its
 * errno, not a bare failure) and handed to MHD, which closes it at stop.
 *
 * What MHD's options give, and what is added here (docs/status.md has the
 * reasons):
 *   - connections: MHD_OPTION_CONNECTION_LIMIT = 2 x max_conns. The first
 *     max_conns connections hold a slot and are served; the ones beyond
 *     are taken only to be answered 503 (Retry-After: 1) as soon as their
 *     request arrives, so a full server answers fast instead of leaving
 *     clients in the listen queue. Past both, MHD stops accepting and
 *     clients wait in the kernel's listen queue. MHD has no 503 of its
 *     own: at its limit it closes a new connection without an answer.
 *   - per client address: MHD_OPTION_PER_IP_CONNECTION_LIMIT (MHD closes
 *     the extra connection at once, without an answer).
 *   - timeouts: MHD_OPTION_CONNECTION_TIMEOUT is an idle timeout in whole
 *     seconds, which a client sending one byte a second never meets. So
 *     each connection also has a deadline here: request_timeout_ms from
 *     accept for the whole request, then write_timeout_ms for the whole
 *     answer. Past it, the connection's socket is shut down (not closed:
 *     MHD owns the descriptor), which MHD sees as the client gone and
 *     cleans up. MHD's idle timeout stays as a backstop.
 *   - request size: MHD_OPTION_CONNECTION_MEMORY_LIMIT (2 x max_request,
 *     at least 4 KiB; MHD reads into half of it). MHD answers 414 or 431
 *     itself when the request line or the headers do not fit.
 *   - parsing: MHD's, at its default tolerance (it accepts repeated spaces
 *     in the request line and HTTP/1.1 without Host, as this server always
 *     did); it answers 400 for what it cannot parse and 505 for HTTP/2 and
 *     later. On top of that the handler refuses with 400 a method that is
 *     not a token, a target not starting with '/', a version other than
 *     HTTP/1.0 and HTTP/1.1, and control characters in a header.
 *   - HEAD: MHD sends the headers of the GET answer without its body.
 * MHD reports its own error answers only through its log; the logger
 * below reads the code from that line to count them, and logs them like
 * every bad request, rate-limited.
 *
 * Answers are built once per published snapshot for /status (a cached MHD
 * response, shared by every connection that asks until the next
 * generation) and per request for /metrics (the server's own counters
 * change with every request).
 */
#include "config.h"

#include <arpa/inet.h>
#include <errno.h>
#include <microhttpd.h>
#include <netdb.h>
#include <netinet/in.h>
#include <poll.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "base/hostport.h"
#include "base/log.h"
#include "node/status/internal.h"

#define COMP DS_STATUS_COMP
#define LISTEN_BACKLOG 64

/* One connection MHD accepted. */
typedef struct hconn {
    int used;
    uint64_t serial;  /* tells this connection from a later one in its slot */
    int fd;           /* MHD's: only ever shut down here, never closed */
    int overflow;     /* beyond max_conns: answered 503 */
    int answered;     /* the answer is queued: the write deadline runs */
    int dropped;      /* shut down at its deadline */
    uint64_t deadline;
    char peer[DS_HOSTPORT_MAX + 1];
} hconn;

struct ds_status_http {
    struct MHD_Daemon *d;
    int epfd;
    char addr[DS_HOSTPORT_MAX + 1];
    hconn *conns;                   /* MHD's connection limit of them */
    unsigned n_conns;
    int served;                     /* connections holding a slot */
    struct MHD_Response *json_resp; /* /status for st->json_gen */
    uint64_t json_resp_gen;
    uint64_t serial;                /* of the last connection accepted */
    unsigned *watch;                /* pollfd 1 + i watches conns[watch[i]] */
    uint64_t *watch_serial;         /* ... while it has this serial */
};

/* "host:port" of a socket address (IPv6 in brackets). */
static void name_of(const struct sockaddr *a, char *buf, size_t n)
{
    char ip[INET6_ADDRSTRLEN] = "?";
    unsigned port = 0;
    if (a && a->sa_family == AF_INET) {
        const struct sockaddr_in *v4 = (const struct sockaddr_in *)(const void *)a;
        inet_ntop(AF_INET, &v4->sin_addr, ip, sizeof(ip));
        port = ntohs(v4->sin_port);
    } else if (a && a->sa_family == AF_INET6) {
        const struct sockaddr_in6 *v6 = (const struct sockaddr_in6 *)(const void *)a;
        inet_ntop(AF_INET6, &v6->sin6_addr, ip, sizeof(ip));
        port = ntohs(v6->sin6_port);
    }
    if (ds_hostport_format(ip, (uint16_t)port, buf, n) < 0)
        snprintf(buf, n, "?");
}

static void count(ds_status *st, unsigned code)
{
    pthread_mutex_lock(&st->mu);
    switch (code) {
    case 200: st->stats.resp_200++; break;
    case 400: st->stats.resp_400++; break;
    case 404: st->stats.resp_404++; break;
    case 405: st->stats.resp_405++; break;
    case 414: st->stats.resp_414++; break;
    case 431: st->stats.resp_431++; break;
    case 503: st->stats.refused_full++; break;
    case 505: st->stats.resp_505++; break;
    default: break;
    }
    pthread_mutex_unlock(&st->mu);
}

/* ---- MHD's callbacks (status thread) ---- */

/* MHD's own messages: its error answers (counted by code) and its
 * refusals at the connection limits. */
static void on_log(void *cls, const char *fmt, va_list ap)
{
    ds_status *st = cls;
    char msg[256];
    vsnprintf(msg, sizeof(msg), fmt, ap);
    const char *p = strstr(msg, "HTTP response code is ");
    unsigned code;
    if (p && sscanf(p + strlen("HTTP response code is "), "%u", &code) == 1) {
        count(st, code);
        ds_log_rl(DS_LOG_INFO, COMP, "bad request: answered %u (libmicrohttpd)", code);
        return;
    }
    size_t n = strlen(msg);
    while (n && (msg[n - 1] == '\n' || msg[n - 1] == '\r'))
        msg[--n] = 0;
    ds_log_rl(DS_LOG_INFO, COMP, "http: %s", msg);
}

static void on_connection(void *cls, struct MHD_Connection *c, void **socket_ctx,
                          enum MHD_ConnectionNotificationCode what)
{
    ds_status *st = cls;
    ds_status_http *h = st->http;
    if (what == MHD_CONNECTION_NOTIFY_CLOSED) {
        hconn *k = *socket_ctx;
        if (k) {
            if (!k->overflow)
                h->served--;
            k->used = 0;
        }
        *socket_ctx = NULL;
        return;
    }
    hconn *k = NULL;
    for (unsigned i = 0; i < h->n_conns && !k; i++)
        if (!h->conns[i].used)
            k = &h->conns[i];
    *socket_ctx = k;
    if (!k)
        return; /* cannot happen: MHD accepts at most n_conns */
    const union MHD_ConnectionInfo *fd = MHD_get_connection_info(c,
                                                                 MHD_CONNECTION_INFO_CONNECTION_FD);
    const union MHD_ConnectionInfo *ca =
        MHD_get_connection_info(c, MHD_CONNECTION_INFO_CLIENT_ADDRESS);
    memset(k, 0, sizeof(*k));
    k->used = 1;
    k->serial = ++h->serial;
    k->fd = fd ? fd->connect_fd : -1;
    k->overflow = h->served >= st->o.max_conns;
    if (!k->overflow)
        h->served++;
    k->deadline = ds_now_ms() + (uint64_t)st->o.request_timeout_ms;
    name_of(ca ? ca->client_addr : NULL, k->peer, sizeof(k->peer));
    DS_STATUS_BUMP(st, accepted);
}

static hconn *conn_of(struct MHD_Connection *c)
{
    const union MHD_ConnectionInfo *i =
        MHD_get_connection_info(c, MHD_CONNECTION_INFO_SOCKET_CONTEXT);
    return i ? i->socket_context : NULL;
}

static int is_token(const char *s)
{
    if (!*s)
        return 0;
    for (; *s; s++) {
        const unsigned char ch = (unsigned char)*s;
        if (!((ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') || (ch >= '0' && ch <= '9') ||
              strchr("!#$%&'*+-.^_`|~", ch)))
            return 0;
    }
    return 1;
}

static enum MHD_Result header_ok(void *cls, enum MHD_ValueKind kind, const char *key,
                                 const char *value)
{
    int *bad = cls;
    (void)kind;
    int ok = key && is_token(key);
    for (const unsigned char *v = (const unsigned char *)value; ok && v && *v; v++)
        if ((*v < 0x20 && *v != '\t') || *v == 0x7f)
            ok = 0;
    if (!ok)
        *bad = 1;
    return ok ? MHD_YES : MHD_NO;
}

/* What MHD lets through and this server still calls malformed; NULL when
 * the request is fine. */
static const char *malformed(struct MHD_Connection *c, const char *method, const char *url,
                             const char *version)
{
    if (!is_token(method))
        return "malformed method";
    /* "OPTIONS *" is the one request whose target is not a path; it asks
     * what the server allows, which the 405 below answers (Allow). */
    if (url[0] != '/' && !(url[0] == '*' && !url[1] && !strcmp(method, MHD_HTTP_METHOD_OPTIONS)))
        return "malformed target";
    if (strcmp(version, MHD_HTTP_VERSION_1_0) && strcmp(version, MHD_HTTP_VERSION_1_1))
        return "not HTTP/1.0 or 1.1";
    int bad = 0;
    MHD_get_connection_values(c, MHD_HEADER_KIND, header_ok, &bad);
    return bad ? "malformed header" : NULL;
}

/* The headers every answer carries. 0 or -ENOMEM. */
static int common_headers(struct MHD_Response *r, const char *ctype)
{
    return MHD_add_response_header(r, MHD_HTTP_HEADER_CONTENT_TYPE, ctype) == MHD_YES &&
                   MHD_add_response_header(r, MHD_HTTP_HEADER_CACHE_CONTROL, "no-store") ==
                       MHD_YES &&
                   MHD_add_response_header(r, MHD_HTTP_HEADER_CONNECTION, "close") == MHD_YES
               ? 0
               : -ENOMEM;
}

static enum MHD_Result queue(ds_status *st, struct MHD_Connection *c, unsigned code,
                             struct MHD_Response *r)
{
    const enum MHD_Result e = MHD_queue_response(c, code, r);
    if (e == MHD_YES)
        count(st, code);
    return e;
}

/* A short text answer (404, 405, 400, 503). */
static enum MHD_Result answer_text(ds_status *st, struct MHD_Connection *c, unsigned code,
                                   const char *text)
{
    struct MHD_Response *r =
        MHD_create_response_from_buffer(strlen(text), (void *)text, MHD_RESPMEM_PERSISTENT);
    if (!r)
        return MHD_NO;
    enum MHD_Result e = MHD_NO;
    if (common_headers(r, "text/plain; charset=utf-8") == 0 &&
        (code != 405 || MHD_add_response_header(r, MHD_HTTP_HEADER_ALLOW, "GET, HEAD")) &&
        (code != 503 || MHD_add_response_header(r, MHD_HTTP_HEADER_RETRY_AFTER, "1")))
        e = queue(st, c, code, r);
    MHD_destroy_response(r);
    return e;
}

static enum MHD_Result answer_status(ds_status *st, struct MHD_Connection *c)
{
    ds_status_http *h = st->http;
    if (ds_status_cached_json(st) < 0)
        return MHD_NO;
    if (!h->json_resp || h->json_resp_gen != st->json_gen) {
        if (h->json_resp)
            MHD_destroy_response(h->json_resp);
        /* A copy: the response outlives the cache's buffer when a slow
         * client still reads it after the next generation. */
        h->json_resp =
            MHD_create_response_from_buffer(st->json_len, st->json, MHD_RESPMEM_MUST_COPY);
        if (h->json_resp && common_headers(h->json_resp, "application/json") < 0) {
            MHD_destroy_response(h->json_resp);
            h->json_resp = NULL;
        }
        if (!h->json_resp)
            return MHD_NO;
        h->json_resp_gen = st->json_gen;
    }
    return queue(st, c, MHD_HTTP_OK, h->json_resp);
}

static enum MHD_Result answer_metrics(ds_status *st, struct MHD_Connection *c)
{
    if (ds_status_cached_metrics(st) < 0)
        return MHD_NO;
    ds_status_stats ss;
    ds_status_stats_get(st, &ss);
    ss.resp_200++; /* this answer */
    char *extra = NULL;
    size_t extra_len = 0;
    if (ds_status_render_server_metrics(st->cur, &ss, &extra, &extra_len) < 0)
        return MHD_NO;
    char *body = malloc(st->metrics_len + extra_len);
    if (!body) {
        free(extra);
        return MHD_NO;
    }
    memcpy(body, st->metrics, st->metrics_len);
    memcpy(body + st->metrics_len, extra, extra_len);
    free(extra);
    struct MHD_Response *r = MHD_create_response_from_buffer(st->metrics_len + extra_len, body,
                                                             MHD_RESPMEM_MUST_FREE);
    if (!r) {
        free(body);
        return MHD_NO;
    }
    enum MHD_Result e = MHD_NO;
    if (common_headers(r, "text/plain; version=0.0.4; charset=utf-8") == 0)
        e = queue(st, c, MHD_HTTP_OK, r);
    MHD_destroy_response(r);
    return e;
}

static enum MHD_Result answer_html(ds_status *st, struct MHD_Connection *c)
{
    char *body = NULL;
    size_t len = 0;
    if (ds_status_cached_metrics(st) < 0) /* takes the newest snapshot */
        return MHD_NO;
    if (ds_status_render_html(st->cur, &body, &len) < 0)
        return MHD_NO;
    struct MHD_Response *r = MHD_create_response_from_buffer(len, body, MHD_RESPMEM_MUST_FREE);
    if (!r) {
        free(body);
        return MHD_NO;
    }
    enum MHD_Result e = MHD_NO;
    if (common_headers(r, "text/html; charset=utf-8") == 0)
        e = queue(st, c, MHD_HTTP_OK, r);
    MHD_destroy_response(r);
    return e;
}

static enum MHD_Result on_request(void *cls, struct MHD_Connection *c, const char *url,
                                  const char *method, const char *version,
                                  const char *upload_data, size_t *upload_size, void **req_ctx)
{
    ds_status *st = cls;
    (void)upload_data;
    if (*req_ctx) {
        /* A body after the answer was queued (a POST): discard it. */
        *upload_size = 0;
        return MHD_YES;
    }
    *req_ctx = st;
    hconn *k = conn_of(c);
    if (k) {
        k->answered = 1;
        k->deadline = ds_now_ms() + (uint64_t)st->o.write_timeout_ms;
    }
    const char *peer = k ? k->peer : "?";
    if (k && k->overflow) {
        ds_log_rl(DS_LOG_INFO, COMP, "refused %s: %d connections busy", peer, st->o.max_conns);
        return answer_text(st, c, MHD_HTTP_SERVICE_UNAVAILABLE, "busy\n");
    }
    const char *why = malformed(c, method, url, version);
    if (why) {
        ds_log_rl(DS_LOG_INFO, COMP, "bad request from %s: %s", peer, why);
        return answer_text(st, c, MHD_HTTP_BAD_REQUEST, "bad request\n");
    }
    if (strcmp(method, MHD_HTTP_METHOD_GET) && strcmp(method, MHD_HTTP_METHOD_HEAD))
        return answer_text(st, c, MHD_HTTP_METHOD_NOT_ALLOWED, "only GET and HEAD are served\n");
    const size_t plen = strcspn(url, "?#");
    if (plen == 7 && !memcmp(url, "/status", 7))
        return answer_status(st, c);
    if (plen == 8 && !memcmp(url, "/metrics", 8))
        return answer_metrics(st, c);
    if (plen == 1 && url[0] == '/')
        return answer_html(st, c);
    return answer_text(st, c, MHD_HTTP_NOT_FOUND, "not found: try /, /status or /metrics\n");
}

/* ---- the listener ---- */

/* Bind and listen on st->listen: the socket, or a negative errno
 * (logged). */
static int open_listener(const ds_status *st, char *addr, size_t addr_len)
{
    ds_hostport hp;
    if (ds_hostport_parse(st->listen, &hp) < 0) {
        ds_error(COMP, "status.listen: expected host:port, found '%s'", st->listen);
        return -EINVAL;
    }
    char port[8];
    snprintf(port, sizeof(port), "%u", (unsigned)hp.port);
    struct addrinfo hints = {.ai_family = hp.kind == DS_HOST_IPV6 ? AF_INET6 : AF_INET,
                             .ai_socktype = SOCK_STREAM,
                             .ai_flags = AI_PASSIVE | AI_NUMERICSERV};
    struct addrinfo *ai = NULL;
    const int g = getaddrinfo(hp.host, port, &hints, &ai);
    if (g != 0 || !ai) {
        ds_error(COMP, "status.listen: cannot resolve '%s': %s", hp.host, gai_strerror(g));
        if (ai)
            freeaddrinfo(ai);
        return -EINVAL;
    }
    int e = 0;
    int fd = socket(ai->ai_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (fd < 0) {
        e = -errno;
        goto out;
    }
    const int one = 1;
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    struct sockaddr_storage a;
    socklen_t al = sizeof(a);
    if (bind(fd, ai->ai_addr, ai->ai_addrlen) < 0 || listen(fd, LISTEN_BACKLOG) < 0 ||
        getsockname(fd, (struct sockaddr *)&a, &al) < 0) {
        e = -errno;
        close(fd);
        goto out;
    }
    name_of((const struct sockaddr *)&a, addr, addr_len);
out:
    freeaddrinfo(ai);
    if (e < 0) {
        ds_error(COMP, "cannot serve status on %s: %s", st->listen, strerror(-e));
        return e;
    }
    return fd;
}

int ds_status_http_start(ds_status *st)
{
    ds_status_http *h = calloc(1, sizeof(*h));
    if (!h)
        return -ENOMEM;
    h->n_conns = 2u * (unsigned)st->o.max_conns;
    h->conns = calloc(h->n_conns, sizeof(*h->conns));
    h->watch = calloc(h->n_conns, sizeof(*h->watch));
    h->watch_serial = calloc(h->n_conns, sizeof(*h->watch_serial));
    st->http = h;
    if (!h->conns || !h->watch || !h->watch_serial) {
        ds_status_http_stop(st);
        return -ENOMEM;
    }
    const int lfd = open_listener(st, h->addr, sizeof(h->addr));
    if (lfd < 0) {
        ds_status_http_stop(st);
        return lfd;
    }
    const int longest = st->o.request_timeout_ms > st->o.write_timeout_ms
                            ? st->o.request_timeout_ms
                            : st->o.write_timeout_ms;
    const unsigned idle_s = (unsigned)(longest / 1000) + 1;
    const size_t pool = 2 * st->o.max_request > 4096 ? 2 * st->o.max_request : 4096;
    h->d = MHD_start_daemon(
        MHD_USE_EPOLL | MHD_USE_ERROR_LOG, 0, NULL, NULL, on_request, st,
        MHD_OPTION_EXTERNAL_LOGGER, on_log, st, MHD_OPTION_LISTEN_SOCKET, lfd,
        MHD_OPTION_CONNECTION_LIMIT, h->n_conns, MHD_OPTION_PER_IP_CONNECTION_LIMIT,
        (unsigned)st->o.max_conns_per_ip, MHD_OPTION_CONNECTION_TIMEOUT, idle_s,
        MHD_OPTION_CONNECTION_MEMORY_LIMIT, pool, MHD_OPTION_NOTIFY_CONNECTION, on_connection,
        st, MHD_OPTION_END);
    const union MHD_DaemonInfo *ep =
        h->d ? MHD_get_daemon_info(h->d, MHD_DAEMON_INFO_EPOLL_FD) : NULL;
    if (!ep) {
        /* When MHD refuses to start, whether it closed lfd is not
         * documented; leaving it open (the node is about to exit) is
         * safer than closing a descriptor number another thread may
         * have been given since. */
        ds_error(COMP, "cannot serve status on %s: libmicrohttpd did not start", st->listen);
        ds_status_http_stop(st);
        return -EIO;
    }
    h->epfd = ep->epoll_fd;
    return 0;
}

void ds_status_http_stop(ds_status *st)
{
    ds_status_http *h = st->http;
    if (!h)
        return;
    /* MHD closes the connections (calling on_connection, which still
     * needs h) and the listening socket. */
    if (h->d)
        MHD_stop_daemon(h->d);
    if (h->json_resp)
        MHD_destroy_response(h->json_resp);
    free(h->conns);
    free(h->watch);
    free(h->watch_serial);
    free(h);
    st->http = NULL;
}

size_t ds_status_http_max_pollfds(const ds_status *st)
{
    return 1 + st->http->n_conns;
}

size_t ds_status_http_pollfds(ds_status *st, struct pollfd *pfd)
{
    ds_status_http *h = st->http;
    size_t n = 0;
    pfd[n++] = (struct pollfd){.fd = h->epfd, .events = POLLIN};
    for (unsigned i = 0; i < h->n_conns; i++) {
        const hconn *k = &h->conns[i];
        if (!k->used || k->answered || k->dropped || k->fd < 0)
            continue;
        h->watch[n - 1] = i;
        h->watch_serial[n - 1] = k->serial;
        pfd[n++] = (struct pollfd){.fd = k->fd, .events = POLLRDHUP};
    }
    return n;
}

const char *ds_status_http_addr(const ds_status *st)
{
    return st->http->addr;
}

int64_t ds_status_http_timeout(ds_status *st, uint64_t now_ms, int64_t cap)
{
    ds_status_http *h = st->http;
    int64_t t = cap;
    MHD_UNSIGNED_LONG_LONG mt;
    if (MHD_get_timeout(h->d, &mt) == MHD_YES && (int64_t)mt < t)
        t = (int64_t)mt;
    for (unsigned i = 0; i < h->n_conns; i++) {
        const hconn *k = &h->conns[i];
        if (!k->used || k->dropped)
            continue;
        const int64_t left = k->deadline > now_ms ? (int64_t)(k->deadline - now_ms) : 0;
        if (left < t)
            t = left;
    }
    return t;
}

/* Shut a connection's socket down: MHD sees end of stream on its next
 * read or an error on its next write, and closes the connection itself
 * (the descriptor is MHD's to close). */
static void drop(hconn *k)
{
    shutdown(k->fd, SHUT_RDWR);
    k->dropped = 1;
}

void ds_status_http_run(ds_status *st, uint64_t now_ms, const struct pollfd *pfd, size_t n)
{
    ds_status_http *h = st->http;
    MHD_run(h->d);
    /* A client that sent part of a request and then closed its side will
     * never complete it. MHD's edge-triggered epoll can miss that end of
     * stream when it comes with the last bytes, and would hold the
     * connection until its deadline; the level-triggered POLLRDHUP above
     * sees it. MHD_run came first, so a request that was complete has its
     * answer queued by now and is left alone. */
    for (size_t j = 1; j < n; j++) {
        if (!(pfd[j].revents & (POLLRDHUP | POLLHUP | POLLERR)))
            continue;
        hconn *k = &h->conns[h->watch[j - 1]];
        if (k->used && k->serial == h->watch_serial[j - 1] && !k->answered && !k->dropped)
            drop(k);
    }
    for (unsigned i = 0; i < h->n_conns; i++) {
        hconn *k = &h->conns[i];
        if (!k->used || k->dropped || now_ms < k->deadline || k->fd < 0)
            continue;
        /* Counted first: a client that sees the close may ask for the
         * count at once. */
        DS_STATUS_BUMP(st, timeouts);
        drop(k);
        ds_log_rl(DS_LOG_INFO, COMP, "dropped %s: %s took longer than %d ms", k->peer,
                  k->answered ? "answer" : "request",
                  k->answered ? st->o.write_timeout_ms : st->o.request_timeout_ms);
    }
}
