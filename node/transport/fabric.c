/*
 * node/transport/fabric.c: the libfabric stack under one endpoint.
 *
 * What this file owns: opening and closing the chain of libfabric objects
 * (fabric, domain, completion queue, address vector, FI_EP_RDM endpoint
 * with tagged messages), learning the name we put in every chunk header,
 * turning "host:port" into the provider's raw address and raw addresses
 * into the canonical text that keys our peers, the address vector, and
 * reading the completion queue. Everything else in the backend talks to
 * libfabric only through posts (tx.c, rx.c, grants.c) and these functions.
 *
 * Why the stack is closed and reopened as a whole (progress.c's reset):
 * fi_close of the endpoint is the only thing in libfabric 1.17 that makes
 * ofi_rxm let go of sends stuck toward a killed or frozen peer, and the
 * CQ, AV and domain hold references to it. Reopening on the same port is
 * cheap (about 55 ms for the whole stack, docs/transport.md).
 *
 * Runs on the progress thread, except fab_resolve (any thread: it only
 * asks fi_getinfo), the first open (ds_transport_open's thread, before
 * the progress thread exists) and the warm-up (its own thread: it loads
 * libfabric, fabric_dl.c, and asks one fi_getinfo).
 */
#include "config.h"

#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>

#include <rdma/fabric.h>
#include <rdma/fi_cm.h>
#include <rdma/fi_domain.h>
#include <rdma/fi_endpoint.h>
#include <rdma/fi_errno.h>
#include <rdma/fi_tagged.h>

#include "base/hostport.h"
#include "base/log.h"
#include "node/transport/internal.h"

/* libfabric errors are errno values below 256 (FI_ETRUNC etc. above). */
int fab_errno(int fierr)
{
    if (fierr < 0)
        fierr = -fierr;
    if (fierr > 0 && fierr < 256)
        return -fierr;
    return -EIO;
}

/* One socket address, IPv4 or IPv6, as canonical text. */
static int sockaddr_canon(uint32_t fmt, const uint8_t *raw, size_t len, char *out, size_t n)
{
    char ip[INET6_ADDRSTRLEN];
    sa_family_t fam;
    if (len < sizeof(fam))
        return -EINVAL;
    memcpy(&fam, raw, sizeof(fam));
    if (fam == AF_INET && len == sizeof(struct sockaddr_in) && fmt != FI_SOCKADDR_IN6) {
        struct sockaddr_in a;
        memcpy(&a, raw, sizeof(a));
        if (a.sin_addr.s_addr == htonl(INADDR_ANY) || a.sin_port == 0)
            return -EINVAL;
        inet_ntop(AF_INET, &a.sin_addr, ip, sizeof(ip));
        snprintf(out, n, "%s:%u", ip, ntohs(a.sin_port));
        return 0;
    }
    if (fam == AF_INET6 && len == sizeof(struct sockaddr_in6) && fmt != FI_SOCKADDR_IN) {
        struct sockaddr_in6 a;
        memcpy(&a, raw, sizeof(a));
        if (IN6_IS_ADDR_UNSPECIFIED(&a.sin6_addr) || a.sin6_port == 0)
            return -EINVAL;
        inet_ntop(AF_INET6, &a.sin6_addr, ip, sizeof(ip));
        snprintf(out, n, "[%s]:%u", ip, ntohs(a.sin6_port));
        return 0;
    }
    return -EINVAL;
}

/* Canonical text of a raw libfabric address for our address format, and
 * the check that a raw name from the wire is one we can insert. Returns 0
 * or -EINVAL. */
int fab_addr_canon(uint32_t fmt, const uint8_t *raw, size_t len, char *out, size_t n)
{
    if (fmt == FI_SOCKADDR_IN || fmt == FI_SOCKADDR_IN6 || fmt == FI_SOCKADDR)
        return sockaddr_canon(fmt, raw, len, out, n);
    if (fmt == FI_ADDR_STR) {
        /* e.g. "fi_ns://127.0.0.1:5000" from shm: printable, NUL inside. */
        size_t sl = strnlen((const char *)raw, len);
        if (sl == 0 || sl == len)
            return -EINVAL;
        for (size_t i = 0; i < sl; i++)
            if (raw[i] < 0x21 || raw[i] > 0x7e)
                return -EINVAL;
        const char *s = (const char *)raw;
        const char *sep = strstr(s, "://");
        snprintf(out, n, "%s", sep ? sep + 3 : s);
        return 0;
    }
    /* Other formats (InfiniBand, ...): hex is canonical enough. */
    if (len == 0 || len * 2 + 1 > n)
        return -EINVAL;
    for (size_t i = 0; i < len; i++)
        snprintf(out + 2 * i, 3, "%02x", raw[i]);
    return 0;
}

void fab_stack_close(tp_fab *t)
{
    if (t->ep)
        fi_close(&t->ep->fid);
    if (t->av)
        fi_close(&t->av->fid);
    if (t->cq)
        fi_close(&t->cq->fid);
    if (t->domain)
        fi_close(&t->domain->fid);
    if (t->fabric)
        fi_close(&t->fabric->fid);
    if (t->info)
        tp_fi.freeinfo(t->info);
    t->ep = NULL;
    t->av = NULL;
    t->cq = NULL;
    t->domain = NULL;
    t->fabric = NULL;
    t->info = NULL;
    t->cq_fd = -1;
}

static struct fi_info *make_hints(const char *provider)
{
    struct fi_info *h = tp_fi.dupinfo(NULL);
    if (!h)
        return NULL;
    h->caps = FI_TAGGED;
    h->mode = FI_CONTEXT | FI_CONTEXT2;
    h->ep_attr->type = FI_EP_RDM;
    h->domain_attr->threading = FI_THREAD_DOMAIN;
    h->domain_attr->mr_mode = 0; /* we register nothing: providers that need it are skipped */
    h->fabric_attr->prov_name = strdup(provider);
    if (!h->fabric_attr->prov_name) {
        tp_fi.freeinfo(h);
        return NULL;
    }
    return h;
}

const char *fab_provider_name(const char *provider)
{
    const char *p = provider && *provider ? provider : "tcp";
    /* "tcp" alone names the msg-endpoint provider; RDM needs rxm on top. */
    return !strcmp(p, "tcp") ? "tcp;ofi_rxm" : p;
}

/* ---- libfabric's initialisation and the first endpoint, ahead of time ---- */

/* Process-wide, as libfabric's own initialisation is: one warm-up thread
 * per process, joined by the first open after it. The thread loads
 * libfabric (fabric_dl.c) and, given a listen address, opens the whole
 * stack for it (fab_stack_open: the provider's buffer pools are most of
 * an endpoint's opening); the first open adopts that stack when provider,
 * address and peer count are the ones it asks for, and closes it
 * otherwise. */
static pthread_mutex_t warm_mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_t warm_thr;
static int warm_state;     /* 0: never started, 1: running (to join), 2: done */
static tp_fab *warm_stack; /* the stack opened ahead (only fields of the stack set) */

static void warm_stack_free(tp_fab *w)
{
    if (!w)
        return;
    fab_stack_close(w);
    free(w->provider);
    free(w->listen_host);
    free(w->listen_port);
    free(w->advertise);
    free(w);
}

static void *warm_main(void *arg)
{
    tp_fab *w = arg;
    /* Loading libfabric runs its dependencies' constructors; the first
     * fi_getinfo then initialises libfabric and its providers. */
    if (tp_fi_load(NULL, 0) == 0) {
        if (w->listen_host) {
            /* Quiet: a failure here is repeated, and logged, by the open. */
            if (fab_stack_open(w, w->listen_port) == 0) {
                warm_stack = w; /* published by pthread_join */
                return NULL;
            }
        } else {
            struct fi_info *hints = make_hints(w->provider), *info = NULL;
            if (hints && tp_fi.getinfo(FI_VERSION(FI_MAJOR_VERSION, FI_MINOR_VERSION), NULL,
                                       NULL, 0, hints, &info) == 0)
                tp_fi.freeinfo(info);
            if (hints)
                tp_fi.freeinfo(hints);
        }
    }
    warm_stack_free(w);
    return NULL;
}

/* The warm-up's own tp_fab: o's strings as tp_fabric_open copies them
 * (only the provider without a listen address), the peer count; quiet.
 * NULL when out of memory or the address does not split (the open will
 * say so). */
static tp_fab *warm_args(const ds_transport_opts *o)
{
    tp_fab *w = calloc(1, sizeof(*w));
    if (!w)
        return NULL;
    w->quiet = 1;
    w->cq_fd = -1;
    w->o.max_peers = o->max_peers;
    const int ok = o->listen ? fab_copy_strings(w, o) == 0
                             : (w->provider = strdup(fab_provider_name(o->provider))) != NULL;
    if (!ok) {
        warm_stack_free(w);
        return NULL;
    }
    return w;
}

void fab_warm(const ds_transport_opts *o)
{
    pthread_mutex_lock(&warm_mu);
    if (warm_state == 0) {
        warm_state = 2;
        tp_fab *w = warm_args(o);
        if (w && pthread_create(&warm_thr, NULL, warm_main, w) == 0)
            warm_state = 1;
        else
            warm_stack_free(w);
    }
    pthread_mutex_unlock(&warm_mu);
}

void fab_warm_join(void)
{
    pthread_mutex_lock(&warm_mu);
    if (warm_state == 1) {
        pthread_join(warm_thr, NULL);
        warm_state = 2;
    }
    pthread_mutex_unlock(&warm_mu);
}

int fab_warm_adopt(tp_fab *t)
{
    pthread_mutex_lock(&warm_mu);
    tp_fab *w = warm_stack;
    warm_stack = NULL;
    pthread_mutex_unlock(&warm_mu);
    if (!w)
        return 0;
    if (strcmp(w->provider, t->provider) || strcmp(w->listen_host, t->listen_host) ||
        strcmp(w->listen_port, t->listen_port) || w->o.max_peers != t->o.max_peers) {
        warm_stack_free(w);
        return 0;
    }
    t->info = w->info;
    t->fabric = w->fabric;
    t->domain = w->domain;
    t->cq = w->cq;
    t->av = w->av;
    t->ep = w->ep;
    t->cq_fd = w->cq_fd;
    t->addr_format = w->addr_format;
    t->iov_limit = w->iov_limit;
    w->info = NULL;
    w->fabric = NULL;
    w->domain = NULL;
    w->cq = NULL;
    w->av = NULL;
    w->ep = NULL;
    warm_stack_free(w);
    return 1;
}

static int map_getinfo_err(int r)
{
    if (r == -FI_ENODATA)
        return -ENODATA;
    return fab_errno(r);
}

/* The completion queue and the address vector, with the fallbacks some
 * providers need. */
static int open_cq_av(tp_fab *t, const char **step)
{
    /* A CQ with a file descriptor lets the progress thread sleep in poll();
     * shm has none, and then the loop naps in 1 ms steps instead. */
    struct fi_cq_attr ca = {
        .format = FI_CQ_FORMAT_TAGGED,
        .size = 4096,
        .wait_obj = FI_WAIT_FD,
    };
    *step = "fi_cq_open";
    int r = fi_cq_open(t->domain, &ca, &t->cq, NULL);
    if (r) {
        t->cq = NULL;
        ca.wait_obj = FI_WAIT_NONE;
        r = fi_cq_open(t->domain, &ca, &t->cq, NULL);
        if (r)
            return r;
    } else if (fi_control(&t->cq->fid, FI_GETWAIT, &t->cq_fd)) {
        t->cq_fd = -1;
    }
    struct fi_av_attr aa = {.type = FI_AV_TABLE, .count = t->o.max_peers};
    *step = "fi_av_open";
    r = fi_av_open(t->domain, &aa, &t->av, NULL);
    if (r) {
        /* shm refuses counts above its own limit (256 peers): let it size
         * the table itself; inserts past its limit then fail visibly. */
        t->av = NULL;
        aa.count = 0;
        r = fi_av_open(t->domain, &aa, &t->av, NULL);
    }
    return r;
}

/* A wildcard listen host (0.0.0.0, ::) means every interface. libfabric
 * 1.17's fi_getinfo with FI_SOURCE turns it into one info per interface
 * address, loopback first, so the endpoint would bind 127.0.0.1 (or ::1)
 * and peers on other hosts could not connect. Put the wildcard back as
 * the source address of the info we use. 0, or -ENOMEM. */
static int keep_wildcard_source(tp_fab *t, const char *port_text)
{
    struct fi_info *i = t->info;
    if (!ds_host_is_wildcard(t->listen_host) || !i->src_addr)
        return 0;
    const uint16_t port = (uint16_t)atoi(port_text);
    void *a = NULL;
    size_t len = 0;
    if (i->addr_format == FI_SOCKADDR_IN || (i->addr_format == FI_SOCKADDR &&
                                             i->src_addrlen == sizeof(struct sockaddr_in))) {
        struct sockaddr_in *v4 = calloc(1, sizeof(*v4));
        if (v4) {
            v4->sin_family = AF_INET;
            v4->sin_addr.s_addr = htonl(INADDR_ANY);
            v4->sin_port = htons(port);
        }
        a = v4;
        len = sizeof(*v4);
    } else if (i->addr_format == FI_SOCKADDR_IN6 ||
               (i->addr_format == FI_SOCKADDR && i->src_addrlen == sizeof(struct sockaddr_in6))) {
        struct sockaddr_in6 *v6 = calloc(1, sizeof(*v6));
        if (v6) {
            v6->sin6_family = AF_INET6;
            v6->sin6_addr = in6addr_any;
            v6->sin6_port = htons(port);
        }
        a = v6;
        len = sizeof(*v6);
    } else {
        return 0; /* not a socket address: the provider's own business */
    }
    if (!a)
        return -ENOMEM;
    free(i->src_addr);
    i->src_addr = a;
    i->src_addrlen = len;
    return 0;
}

/* Open fabric, domain, CQ, AV and endpoint, bound to listen_host:port. */
int fab_stack_open(tp_fab *t, const char *port)
{
    int r;
    struct fi_info *hints = make_hints(t->provider);
    if (!hints)
        return -ENOMEM;
    r = tp_fi.getinfo(FI_VERSION(FI_MAJOR_VERSION, FI_MINOR_VERSION), t->listen_host, port,
                   FI_SOURCE, hints, &t->info);
    tp_fi.freeinfo(hints);
    if (r) {
        if (!t->quiet)
            ds_error(COMP, "fi_getinfo provider=%s listen=%s:%s: %s", t->provider,
                     t->listen_host, port, tp_fi.strerror(-r));
        t->info = NULL;
        return map_getinfo_err(r);
    }
    if (keep_wildcard_source(t, port) < 0) {
        tp_fi.freeinfo(t->info);
        t->info = NULL;
        return -ENOMEM;
    }
    t->addr_format = t->info->addr_format;
    t->iov_limit = t->info->tx_attr ? t->info->tx_attr->iov_limit : 1;
    const char *step = "fi_fabric";
    r = tp_fi.fabric(t->info->fabric_attr, &t->fabric, NULL);
    if (r)
        goto fail;
    step = "fi_domain";
    r = fi_domain(t->fabric, t->info, &t->domain, NULL);
    if (r)
        goto fail;
    r = open_cq_av(t, &step);
    if (r)
        goto fail;
    step = "fi_endpoint";
    r = fi_endpoint(t->domain, t->info, &t->ep, NULL);
    if (r)
        goto fail;
    step = "fi_ep_bind(cq)";
    r = fi_ep_bind(t->ep, &t->cq->fid, FI_TRANSMIT | FI_RECV);
    if (r)
        goto fail;
    step = "fi_ep_bind(av)";
    r = fi_ep_bind(t->ep, &t->av->fid, 0);
    if (r)
        goto fail;
    step = "fi_enable";
    r = fi_enable(t->ep);
    if (r)
        goto fail;
    return 0;
fail:
    if (!t->quiet)
        ds_error(COMP, "opening provider=%s on %s:%s failed at %s: %s", t->provider,
                 t->listen_host, port, step, tp_fi.strerror(r < 0 ? -r : r));
    fab_stack_close(t);
    return r == -FI_EADDRINUSE ? -EADDRINUSE : fab_errno(r);
}

/* Ask fi_getinfo for host:port as a destination of our provider: its raw
 * address and canonical text. 0, -ENOENT (does not resolve), -EINVAL (not
 * usable with the provider), -ENOMEM. */
static int resolve_dest(tp_fab *t, const char *host, const char *port, uint8_t *raw,
                        size_t *rawlen, char *key, size_t keyn)
{
    struct fi_info *hints = make_hints(t->provider), *di = NULL;
    if (!hints)
        return -ENOMEM;
    int r = tp_fi.getinfo(FI_VERSION(FI_MAJOR_VERSION, FI_MINOR_VERSION), host, port, 0, hints, &di);
    tp_fi.freeinfo(hints);
    if (r)
        return -ENOENT;
    r = 0;
    if (!di->dest_addr || di->dest_addrlen > TP_NAME_MAX ||
        fab_addr_canon(t->addr_format, di->dest_addr, di->dest_addrlen, key, keyn)) {
        r = -EINVAL;
    } else {
        memcpy(raw, di->dest_addr, di->dest_addrlen);
        *rawlen = di->dest_addrlen;
    }
    tp_fi.freeinfo(di);
    return r;
}

int fab_resolve(tp_fab *t, const char *hostport, uint8_t *raw, size_t *rawlen, char *key,
                size_t keyn)
{
    char h[DS_TRANSPORT_ADDR_MAX], port[8];
    if (tp_split_hostport(hostport, h, sizeof(h), port, sizeof(port)))
        return -EINVAL;
    int r = resolve_dest(t, h, port, raw, rawlen, key, keyn);
    if (r == -ENOENT)
        ds_warn(COMP, "peer address %s does not resolve", hostport);
    else if (r == -EINVAL)
        ds_warn(COMP, "peer address %s is not usable with provider %s", hostport, t->provider);
    return r;
}

/* After the first open: learn our bound name, the real port, and the name
 * we advertise in headers. */
int fab_learn_name(tp_fab *t)
{
    uint8_t bound[TP_NAME_MAX];
    size_t blen = sizeof(bound);
    int r = fi_getname(&t->ep->fid, bound, &blen);
    if (r) {
        ds_error(COMP, "fi_getname: %s", tp_fi.strerror(-r));
        return fab_errno(r);
    }
    char text[DS_TRANSPORT_ADDR_MAX];
    int bound_ok = fab_addr_canon(t->addr_format, bound, blen, text, sizeof(text)) == 0;

    /* Remember the real port for reopening after a reset. */
    if (bound_ok) {
        char h[DS_TRANSPORT_ADDR_MAX], p[8];
        if (tp_split_hostport(text, h, sizeof(h), p, sizeof(p)) == 0) {
            free(t->listen_port);
            t->listen_port = strdup(p);
            if (!t->listen_port)
                return -ENOMEM;
        }
    }

    if (!t->advertise) {
        if (!bound_ok) {
            ds_error(COMP, "listen address %s:%s cannot be advertised (a wildcard address?); "
                     "set node.advertise = host:port, the address peers dial",
                     t->listen_host, t->listen_port);
            return -EINVAL;
        }
        memcpy(t->name, bound, blen);
        t->namelen = blen;
        snprintf(t->pub.addr_text, sizeof(t->pub.addr_text), "%s", text);
        return 0;
    }
    /* Resolve the advertised address like a peer's. */
    char h[DS_TRANSPORT_ADDR_MAX], p[8];
    if (tp_split_hostport(t->advertise, h, sizeof(h), p, sizeof(p)))
        return -EINVAL;
    size_t nlen = 0;
    r = resolve_dest(t, h, p, t->name, &nlen, text, sizeof(text));
    if (r == -ENOMEM)
        return r;
    if (r) {
        ds_error(COMP, "advertise address %s (node.advertise) does not resolve for provider %s", t->advertise,
                 t->provider);
        return -EINVAL;
    }
    t->namelen = nlen;
    snprintf(t->pub.addr_text, sizeof(t->pub.addr_text), "%s", text);
    return 0;
}

void fab_av_insert(tp_fab *t, uint32_t slot)
{
    struct tp_peer *p = &t->peers[slot];
    fi_addr_t fa = FI_ADDR_NOTAVAIL;
    int r = fi_av_insert(t->av, p->raw, 1, &fa, 0, NULL);
    if (r != 1) {
        ds_log_rl(DS_LOG_ERROR, COMP, "fi_av_insert %s failed (%d)", p->addr, r);
        p->in_av = 0;
        return;
    }
    p->fa = fa;
    p->in_av = 1;
}

void fab_av_remove(tp_fab *t, uint32_t slot)
{
    struct tp_peer *p = &t->peers[slot];
    if (p->in_av && t->av)
        fi_av_remove(t->av, &p->fa, 1, 0);
}

static void complete(tp_fab *t, void *op_context, size_t len, int err)
{
    struct tp_ctx *c = op_context;
    if (c->kind == CTX_RX)
        fab_rx_complete(t, (struct tp_rxbuf *)c, len, err);
    else
        fab_tx_complete(t, (struct tp_chunk *)c, err);
}

/* Read completions (a few batches at most, so posting is not starved) and
 * the error queue. Returns how many were handled. */
int fab_read_cq(tp_fab *t)
{
    struct fi_cq_tagged_entry e[TP_CQ_BATCH];
    int total = 0;
    for (int round = 0; round < 4; round++) {
        ssize_t n = fi_cq_read(t->cq, e, TP_CQ_BATCH);
        if (n == -FI_EAGAIN)
            break;
        if (n == -FI_EAVAIL) {
            struct fi_cq_err_entry ee;
            memset(&ee, 0, sizeof(ee));
            ssize_t r = fi_cq_readerr(t->cq, &ee, 0);
            if (r != 1)
                break;
            total++;
            if (ee.op_context)
                complete(t, ee.op_context, ee.len, ee.err ? ee.err : FI_EIO);
            continue;
        }
        if (n < 0) {
            ds_log_rl(DS_LOG_ERROR, COMP, "fi_cq_read: %s", tp_fi.strerror((int)-n));
            break;
        }
        for (ssize_t i = 0; i < n; i++)
            complete(t, e[i].op_context, e[i].len, 0);
        total += (int)n;
        if (n < TP_CQ_BATCH)
            break;
    }
    return total;
}
