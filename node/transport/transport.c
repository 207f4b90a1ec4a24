/*
 * node/transport/transport.c: the public API of node/transport (see
 * transport.h for the contract), in front of its two backends.
 *
 * ds_transport_open checks the options and picks a backend by provider
 * name (backend.h): "inproc" is the in-process transport of inproc.c, any
 * other name the libfabric one (internal.h lists its files). Both get the
 * same checks here, so they refuse the same options and send arguments
 * with the same errno, and share what does not depend on how bytes move:
 * the cache of large buffers, ds_transport_msg_take, ds_transport_send_wait
 * and the drop reasons' names.
 *
 * The wire format of the libfabric backend is in chunk.h.
 */
#include "config.h"

#include <errno.h>
#include <malloc.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <unistd.h>

#include "base/clock.h"
#include "base/hostport.h"
#include "base/log.h"
#include "node/transport/backend.h"
#include "node/transport/chunk.h"
#include "node/transport/inproc.h"
#include "node/transport/transport.h"

#define COMP "transport"

static const char *const drop_names[DS_TP_DROP_COUNT] = {
#define DS_TP_DROP_NAME_(e, name, text) name,
    DS_TP_DROP_LIST(DS_TP_DROP_NAME_)
#undef DS_TP_DROP_NAME_
};

const char *ds_transport_drop_name(enum ds_transport_drop reason)
{
    return (unsigned)reason < DS_TP_DROP_COUNT ? drop_names[reason] : "unknown";
}

/* ---- shared helpers ---------------------------------------------------- */

uint64_t tp_random_u64(void)
{
    uint64_t v = 0;
    if (getrandom(&v, sizeof(v), 0) != (ssize_t)sizeof(v))
        v = ds_now_ns() * 0x9e3779b97f4a7c15ull ^ ((uint64_t)getpid() << 32);
    return v ? v : 1;
}

int tp_split_hostport(const char *s, char *host, size_t hn, char *port, size_t pn)
{
    ds_hostport hp;
    if (!s || !host || !port || ds_hostport_parse(s, &hp))
        return -EINVAL;
    const int l = snprintf(host, hn, "%s", hp.host);
    if (l < 0 || (size_t)l >= hn || snprintf(port, pn, "%u", (unsigned)hp.port) >= (int)pn)
        return -EINVAL;
    return 0;
}

void tp_head_init(ds_transport *t, const struct tp_ops *ops)
{
    t->ops = ops;
    pthread_mutex_init(&t->cache_lock, NULL);
}

void tp_head_free(ds_transport *t)
{
    for (unsigned i = 0; i < t->cache_n; i++)
        free(t->cache_buf[i]);
    pthread_mutex_destroy(&t->cache_lock);
    free(t);
}

/* ---- the buffer cache ---------------------------------------------------- */

void *ds_transport_buf_get(ds_transport *t, size_t size)
{
    if (t && size >= TP_CACHE_MIN) {
        pthread_mutex_lock(&t->cache_lock);
        int best = -1;
        for (unsigned i = 0; i < t->cache_n; i++)
            if (t->cache_cap[i] >= size && t->cache_cap[i] <= 2 * size &&
                (best < 0 || t->cache_cap[i] < t->cache_cap[best]))
                best = (int)i;
        void *b = NULL;
        if (best >= 0) {
            b = t->cache_buf[best];
            t->cache_bytes -= t->cache_cap[best];
            t->cache_n--;
            t->cache_buf[best] = t->cache_buf[t->cache_n];
            t->cache_cap[best] = t->cache_cap[t->cache_n];
        }
        pthread_mutex_unlock(&t->cache_lock);
        if (b)
            return b;
    }
    return malloc(size ? size : 1);
}

void ds_transport_buf_put(ds_transport *t, void *buf)
{
    if (!buf)
        return;
    size_t cap = malloc_usable_size(buf);
    if (t && cap >= TP_CACHE_MIN) {
        pthread_mutex_lock(&t->cache_lock);
        if (t->cache_n < TP_CACHE_SLOTS && t->cache_bytes + cap <= TP_CACHE_BYTES) {
            t->cache_buf[t->cache_n] = buf;
            t->cache_cap[t->cache_n++] = cap;
            t->cache_bytes += cap;
            buf = NULL;
        }
        pthread_mutex_unlock(&t->cache_lock);
    }
    free(buf);
}

/* ---- options ----------------------------------------------------------- */

void ds_transport_opts_default(ds_transport_opts *o)
{
    memset(o, 0, sizeof(*o));
    o->provider = "tcp";
    o->listen = "127.0.0.1:0";
    /* 1 MiB of payload plus room for the secured layer's frame header,
     * chunk prefix and tag, so that a 1 MiB message is one libfabric
     * message (delivered without a copy) rather than 1 MiB and a sliver. */
    o->chunk_bytes = (1u << 20) + 4096;
    /* Small on purpose: a receiver must set aside every buffer it matched
     * to a rendezvous from a peer that then froze, and this bounds how many
     * that can be per peer (8 with 1 MiB chunks). Loopback and datacenter
     * bandwidth-delay products are well below it. */
    o->max_inflight_bytes = 8u << 20;
    o->max_queued_bytes = (size_t)2 << 30;
    o->max_msg_bytes = (size_t)1 << 30;
    o->rx_mem_bytes = (size_t)2 << 30;
    o->rx_small_bufs = 64;
    o->rx_large_bufs = 64;
    o->max_peers = 1024;
    o->rx_timeout_ms = 10000;
    o->miss_limit = 1;
    o->stuck_max_ops = 1024;
    o->stuck_max_bytes = 256u << 20;
    o->idle_conn_ms = 10000;
}

static int opts_check(const ds_transport_opts *o)
{
#define BAD(...) do { ds_error(COMP, __VA_ARGS__); return -EINVAL; } while (0)
    if (!o->on_recv)
        BAD("on_recv callback is required");
    if (!o->listen || !*o->listen)
        BAD("listen address is empty");
    if (o->chunk_bytes < TP_MIN_CHUNK || o->chunk_bytes > TP_MAX_CHUNK)
        BAD("chunk_bytes=%zu outside [%u, %u]", o->chunk_bytes, TP_MIN_CHUNK, TP_MAX_CHUNK);
    if (o->max_inflight_bytes < o->chunk_bytes + TP_HDR_MAX)
        BAD("max_inflight_bytes=%zu must hold one chunk (%zu)", o->max_inflight_bytes,
            o->chunk_bytes + TP_HDR_MAX);
    if (o->max_queued_bytes == 0 || o->max_msg_bytes == 0 || o->rx_mem_bytes == 0)
        BAD("max_queued_bytes, max_msg_bytes and rx_mem_bytes must be > 0");
    if (o->rx_small_bufs == 0 || o->rx_large_bufs == 0 || o->rx_small_bufs > 4096 ||
        o->rx_large_bufs > 4096)
        BAD("rx_small_bufs=%u rx_large_bufs=%u: each in [1, 4096]", o->rx_small_bufs,
            o->rx_large_bufs);
    if (o->max_peers == 0 || o->max_peers > 65535)
        BAD("max_peers=%u outside [1, 65535]", o->max_peers);
    if (o->rx_timeout_ms == 0)
        BAD("rx_timeout_ms must be > 0");
    if (o->idle_conn_ms == 0)
        BAD("idle_conn_ms must be > 0");
    if (o->miss_limit == 0 || o->stuck_max_ops == 0 || o->stuck_max_bytes == 0)
        BAD("miss_limit, stuck_max_ops and stuck_max_bytes must be > 0");
    char host[DS_TRANSPORT_ADDR_MAX], port[8];
    if (tp_split_hostport(o->listen, host, sizeof(host), port, sizeof(port)))
        BAD("listen address '%s' is not host:port", o->listen);
    if (o->advertise && tp_split_hostport(o->advertise, host, sizeof(host), port, sizeof(port)))
        BAD("advertise address '%s' is not host:port", o->advertise);
#undef BAD
    return 0;
}

/* ---- the API ----------------------------------------------------------- */

int ds_transport_open(const ds_transport_opts *o, ds_transport **out)
{
    if (!o || !out)
        return -EINVAL;
    *out = NULL;
    int r = opts_check(o);
    if (r)
        return r;
    if (o->provider && !strcmp(o->provider, DS_TRANSPORT_INPROC))
        return tp_inproc_open(o, out);
    tp_fi_env(o->provider);
    fab_warm_join();
    return tp_fabric_open(o, out);
}

void ds_transport_warm(const ds_transport_opts *o)
{
    if (o && !(o->provider && !strcmp(o->provider, DS_TRANSPORT_INPROC))) {
        tp_fi_env(o->provider);
        fab_warm(o);
    }
}

void ds_transport_close(ds_transport **tp)
{
    if (!tp || !*tp)
        return;
    ds_transport *t = *tp;
    /* *tp stays valid until the progress thread has stopped: the done
     * callbacks that run during close may still call through it. */
    t->ops->close(t);
    *tp = NULL;
    tp_head_free(t);
}

int ds_transport_addr(ds_transport *t, char *buf, size_t n)
{
    if (!t || !buf || !n)
        return -EINVAL;
    if ((size_t)snprintf(buf, n, "%s", t->addr_text) >= n)
        return -ENOSPC;
    return 0;
}

int ds_transport_peer_add(ds_transport *t, const char *hostport, ds_transport_peer *out)
{
    if (!t || !hostport || !out)
        return -EINVAL;
    return t->ops->peer_add(t, hostport, out);
}

int ds_transport_peer_remove(ds_transport *t, ds_transport_peer p)
{
    if (!t)
        return -EINVAL;
    return t->ops->peer_remove(t, p);
}

int ds_transport_peer_addr(ds_transport *t, ds_transport_peer p, char *buf, size_t n)
{
    if (!t || !buf || !n)
        return -EINVAL;
    return t->ops->peer_addr(t, p, buf, n);
}

int ds_transport_send(ds_transport *t, ds_transport_peer p, const ds_transport_send_args *a)
{
    if (!t || !a || (a->len && !a->buf) || (a->head_len && !a->head) ||
        (a->tail_len && !a->tail) || a->head_len > DS_TRANSPORT_EDGE_MAX ||
        a->tail_len > DS_TRANSPORT_EDGE_MAX - a->head_len)
        return -EINVAL;
    if (a->deadline_ms <= ds_now_ms())
        return -ETIMEDOUT;
    return t->ops->send(t, p, a);
}

struct send_waiter {
    pthread_mutex_t m;
    pthread_cond_t c;
    int done;
    int status;
};

static void send_waiter_done(void *arg, int status)
{
    struct send_waiter *w = arg;
    pthread_mutex_lock(&w->m);
    w->status = status;
    w->done = 1;
    pthread_cond_signal(&w->c);
    pthread_mutex_unlock(&w->m);
}

int ds_transport_send_wait(ds_transport *t, ds_transport_peer p, const void *buf, size_t len,
                           uint64_t deadline_ms)
{
    struct send_waiter w = {.m = PTHREAD_MUTEX_INITIALIZER, .c = PTHREAD_COND_INITIALIZER};
    ds_transport_send_args a = {
        .buf = buf, .len = len, .deadline_ms = deadline_ms,
        .done = send_waiter_done, .done_arg = &w,
    };
    int r = ds_transport_send(t, p, &a);
    if (r)
        return r;
    /* done runs exactly once, at the latest one progress tick after the
     * deadline or when the transport closes; w must outlive it. */
    pthread_mutex_lock(&w.m);
    while (!w.done)
        pthread_cond_wait(&w.c, &w.m);
    pthread_mutex_unlock(&w.m);
    pthread_cond_destroy(&w.c);
    pthread_mutex_destroy(&w.m);
    return w.status;
}

void *ds_transport_msg_take(ds_transport_msg *msg)
{
    if (!msg || msg->taken_)
        return NULL;
    msg->taken_ = 1;
    return msg->base_;
}

int ds_transport_reset(ds_transport *t)
{
    if (!t)
        return -EINVAL;
    return t->ops->reset(t);
}

void ds_transport_stats_get(ds_transport *t, ds_transport_stats *st)
{
    memset(st, 0, sizeof(*st));
    if (!t)
        return;
    t->ops->stats_get(t, st);
}
