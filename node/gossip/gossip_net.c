/* node/gossip/gossip_net.c: see gossip_net.h. */
#include "config.h"

#include <assert.h>
#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "node/gossip/gossip_net.h"
#include "node/wire/values.h"
#include "base/log.h"

struct gq {
    struct gq *next;
    uint64_t sender;
    size_t bytes;
    ds_gmsg m;        /* idx/val point into the allocation after this struct */
    size_t cap;       /* the allocation's size (bytes is what this message uses) */
};

/* Large queue entries are kept for the next messages of their size, not
 * freed: the gossip thread frees what the net's thread allocated, and
 * glibc gives such memory back (madvise, munmap) and faults it in again
 * for the next one. Measured: a 1.1 MB all-reduce message cost about 1.5
 * ms in page faults each (docs/benchmarks.md, "group.allreduce"). */
#define GQ_KEEP 4
#define GQ_KEEP_MIN ((size_t)64 << 10)
/* and together at most a quarter of the queue's bound (max_queue_bytes) */

struct ds_gnet {
    ds_net *net;
    ds_gossip_io io;
    uint32_t max_count;
    size_t max_queue_bytes;

    /* Decode scratch: the net's worker thread only. */
    uint32_t *dec_idx;
    float *dec_val;

    pthread_mutex_t lock;
    pthread_cond_t cond;
    struct gq *head, *tail;
    size_t queued_bytes;
    struct gq *held;  /* handed out by the last recv (gossip thread) */
    struct gq *keep[GQ_KEEP]; /* large entries for reuse (GQ_KEEP_MIN) */
    unsigned n_keep;
    size_t keep_bytes;
    uint64_t *view;   /* n_ids node ids, group by group */
    char (*addr)[DS_WIRE_ADDR_MAX + 1];
    uint32_t n_ids;
    uint32_t *gidx;   /* n_ids: the view index (group) of each id */
    uint32_t *gfirst; /* G + 1: group h's ids are view[gfirst[h] .. gfirst[h + 1]) */
    uint32_t G;       /* view indices: groups (of one, without hierarchy) */
    void (*failed_fn)(void *ctx, uint64_t id);
    void *failed_ctx;
    void (*differs_fn)(void *ctx, uint64_t id);
    void *differs_ctx;
    void (*heard_fn)(void *ctx, uint64_t id);
    void *heard_ctx;
    const atomic_int *stop; /* non-zero: waits end (may be NULL) */
    ds_gnet_stats st;
};

/* How often a recv looks at the stop flag while it waits. A signal
 * handler cannot wake a condition variable, so the wait is sliced. */
#define STOP_POLL_NS 50000000u

static int stop_requested(const ds_gnet *g)
{
    return g->stop && *g->stop;
}

/* The end of the next slice of a wait until deadline_ns. */
static struct timespec wait_slice(uint64_t deadline_ns)
{
    const uint64_t now = ds_now_ns();
    uint64_t until = now + STOP_POLL_NS;
    if (until > deadline_ns)
        until = deadline_ns;
    return (struct timespec){(time_t)(until / 1000000000u), (long)(until % 1000000000u)};
}

int ds_gnet_handles(unsigned t)
{
    return t == DS_MSG_GOSSIP_REQ || t == DS_MSG_GOSSIP_RESP || t == DS_MSG_GOSSIP_STALE ||
           t == DS_MSG_GOSSIP_PUSH || t == DS_MSG_ALLREDUCE;
}

static int to_wire_type(uint8_t t)
{
    switch (t) {
    case DS_GMSG_REQ: return DS_MSG_GOSSIP_REQ;
    case DS_GMSG_RESP: return DS_MSG_GOSSIP_RESP;
    case DS_GMSG_STALE: return DS_MSG_GOSSIP_STALE;
    case DS_GMSG_CROSS: return DS_MSG_GOSSIP_PUSH;
    case DS_GMSG_ARED: return DS_MSG_ALLREDUCE;
    default: return -1;
    }
}

static uint8_t from_wire_type(unsigned t)
{
    switch (t) {
    case DS_MSG_GOSSIP_REQ: return DS_GMSG_REQ;
    case DS_MSG_GOSSIP_RESP: return DS_GMSG_RESP;
    case DS_MSG_GOSSIP_STALE: return DS_GMSG_STALE;
    case DS_MSG_GOSSIP_PUSH: return DS_GMSG_CROSS;
    default: return DS_GMSG_ARED;
    }
}

/* sparsify.value_format's values are the header's value-format bits. */
static_assert((int)DS_VALUE_F32 == (int)DS_VF_F32 && (int)DS_VALUE_F16 == (int)DS_VF_F16 &&
                  (int)DS_VALUE_BF16 == (int)DS_VF_BF16,
              "conf/choices.h DS_VALUE_FORMATS = node/wire enum ds_wire_vfmt");

static int gnet_send(void *ctx, const ds_gmsg *m, uint64_t deadline_ns)
{
    ds_gnet *g = ctx;
    const int type = to_wire_type(m->type);
    if (type < 0)
        return -EINVAL;
    if (stop_requested(g))
        return -ECANCELED;
    char to_addr[DS_WIRE_ADDR_MAX + 1];
    uint64_t to = 0;
    pthread_mutex_lock(&g->lock);
    if (m->to < g->G) {
        /* Segment s of group h is handled by its member s mod |h|
         * (ds_topo_hier_route); a group of one is that node. */
        const uint32_t size = g->gfirst[m->to + 1] - g->gfirst[m->to];
        const uint32_t k = g->gfirst[m->to] + (m->type == DS_GMSG_ARED ? 0 : m->segment % size);
        to = g->view[k];
        memcpy(to_addr, g->addr[k], sizeof(to_addr));
    }
    pthread_mutex_unlock(&g->lock);
    if (!to)
        return -EHOSTUNREACH;
    ds_wire_msg w;
    memset(&w, 0, sizeof(w));
    w.h.type = (uint8_t)type;
    w.h.round = m->round;
    w.h.epoch = (uint32_t)m->epoch;
    w.h.segment = m->segment;
    w.h.count = m->count;
    if (m->type == DS_GMSG_REQ || m->type == DS_GMSG_RESP || m->type == DS_GMSG_CROSS)
        w.h.flags = (uint16_t)((unsigned)m->vfmt << DS_WF_VAL_SHIFT);
    switch (m->type) {
    case DS_GMSG_REQ:
    case DS_GMSG_CROSS:
        w.u.sparse.seg_len = m->seg_len;
        w.u.sparse.enc = DS_IDX_AUTO;
        w.u.sparse.idx = m->idx;
        w.u.sparse.val = m->val;
        break;
    case DS_GMSG_RESP:
        w.u.values.held_us = m->held_us;
        w.u.values.val = m->val;
        break;
    case DS_GMSG_STALE:
        w.h.count = 0;
        w.u.stale.round_now = m->round_now;
        break;
    case DS_GMSG_ARED:
        w.u.ar.phase = 0;
        w.u.ar.step = m->segment;
        w.u.ar.elem_offset = m->aux; /* the wire's spare field: group.c's orphans */
        w.u.ar.val = m->val;
        break;
    }
    const ds_net_send_opts o = {.deadline_ms = deadline_ns / 1000000u};
    int r = ds_net_send_msg(g->net, to, to_addr[0] ? to_addr : NULL, &w, &o);
    if (r < 0) {
        pthread_mutex_lock(&g->lock);
        g->st.send_failed++;
        pthread_mutex_unlock(&g->lock);
        ds_log_rl(DS_LOG_WARN, "gossip", "send %s to view index %u failed: %s",
                  ds_msg_type_name((unsigned)type), m->to, strerror(-r));
    }
    return r;
}

/* A queue entry of `bytes`: a kept one that fits (at most twice the
 * size), else a new one. Takes the lock. */
static struct gq *gq_get(ds_gnet *g, size_t bytes)
{
    struct gq *q = NULL;
    if (bytes >= GQ_KEEP_MIN) {
        pthread_mutex_lock(&g->lock);
        int best = -1;
        for (unsigned i = 0; i < g->n_keep; i++)
            if (g->keep[i]->cap >= bytes && g->keep[i]->cap <= 2 * bytes &&
                (best < 0 || g->keep[i]->cap < g->keep[best]->cap))
                best = (int)i;
        if (best >= 0) {
            q = g->keep[best];
            g->keep_bytes -= q->cap;
            g->st.queue_reused++;
            g->keep[best] = g->keep[--g->n_keep];
        }
        pthread_mutex_unlock(&g->lock);
    }
    if (!q) {
        q = malloc(bytes);
        if (!q)
            return NULL;
        q->cap = bytes;
    }
    return q;
}

/* Done with q: kept when large and there is room (the smallest kept one
 * makes room for a larger), else freed. Called with the lock held. */
static void gq_put(ds_gnet *g, struct gq *q)
{
    if (!q)
        return;
    const size_t limit = g->max_queue_bytes / 4;
    if (q->cap >= GQ_KEEP_MIN && q->cap <= limit) {
        /* Room by evicting smaller ones first: the large ones cost most to
         * fault in again. */
        while (g->n_keep && (g->n_keep == GQ_KEEP || g->keep_bytes + q->cap > limit)) {
            unsigned small = 0;
            for (unsigned i = 1; i < g->n_keep; i++)
                if (g->keep[i]->cap < g->keep[small]->cap)
                    small = i;
            if (g->keep[small]->cap > q->cap)
                break;
            g->keep_bytes -= g->keep[small]->cap;
            free(g->keep[small]);
            g->keep[small] = g->keep[--g->n_keep];
        }
        if (g->n_keep < GQ_KEEP && g->keep_bytes + q->cap <= limit) {
            g->keep[g->n_keep++] = q;
            g->keep_bytes += q->cap;
            return;
        }
    }
    free(q);
}

/* View index (group) of a node id, or UINT32_MAX. Called with the lock
 * held. */
static uint32_t index_of(const ds_gnet *g, uint64_t id)
{
    for (uint32_t i = 0; i < g->n_ids; i++)
        if (g->view[i] == id)
            return g->gidx[i];
    return UINT32_MAX;
}

static int gnet_recv(void *ctx, ds_gmsg *m, uint64_t deadline_ns)
{
    ds_gnet *g = ctx;
    pthread_mutex_lock(&g->lock);
    gq_put(g, g->held);
    g->held = NULL;
    for (;;) {
        while (!g->head) {
            if (stop_requested(g)) {
                pthread_mutex_unlock(&g->lock);
                return -ECANCELED;
            }
            if (ds_now_ns() >= deadline_ns) {
                pthread_mutex_unlock(&g->lock);
                return 0;
            }
            const struct timespec ts = wait_slice(deadline_ns);
            pthread_cond_timedwait(&g->cond, &g->lock, &ts);
        }
        struct gq *q = g->head;
        g->head = q->next;
        if (!g->head)
            g->tail = NULL;
        g->queued_bytes -= q->bytes;
        const uint32_t from = index_of(g, q->sender);
        if (from == UINT32_MAX) {
            g->st.dropped_not_in_view++;
            ds_log_rl(DS_LOG_INFO, "gossip", "dropped %s from %016llx: not in this round's view",
                      ds_msg_type_name((unsigned)to_wire_type(q->m.type)),
                      (unsigned long long)q->sender);
            gq_put(g, q);
            continue;
        }
        q->m.from = from;
        g->held = q;
        *m = q->m;
        pthread_mutex_unlock(&g->lock);
        return 1;
    }
}

static void gnet_failed(void *ctx, uint32_t peer)
{
    ds_gnet *g = ctx;
    const uint64_t id = ds_gnet_view_id(g, peer);
    if (id && g->failed_fn)
        g->failed_fn(g->failed_ctx, id);
}

static void gnet_view_differs(void *ctx, uint32_t peer)
{
    ds_gnet *g = ctx;
    const uint64_t id = ds_gnet_view_id(g, peer);
    if (id && g->differs_fn)
        g->differs_fn(g->differs_ctx, id);
}

int ds_gnet_create(ds_gnet **out, ds_net *net, uint32_t max_count, size_t max_queue_bytes)
{
    *out = NULL;
    ds_gnet *g = calloc(1, sizeof(*g));
    if (!g)
        return -ENOMEM;
    g->net = net;
    g->max_count = max_count;
    g->max_queue_bytes = max_queue_bytes;
    g->dec_idx = malloc(((size_t)max_count + 1) * sizeof(uint32_t));
    g->dec_val = malloc(((size_t)max_count + 1) * sizeof(float));
    if (!g->dec_idx || !g->dec_val) {
        free(g->dec_idx);
        free(g->dec_val);
        free(g);
        return -ENOMEM;
    }
    pthread_mutex_init(&g->lock, NULL);
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(&g->cond, &ca);
    pthread_condattr_destroy(&ca);
    g->io.ctx = g;
    g->io.send = gnet_send;
    g->io.recv = gnet_recv;
    g->io.peer_failed = gnet_failed;
    g->io.peer_view_differs = gnet_view_differs;
    g->io.now_ns = ds_gossip_monotonic_ns;
    *out = g;
    return 0;
}

void ds_gnet_destroy(ds_gnet **gp)
{
    if (!gp || !*gp)
        return;
    ds_gnet *g = *gp;
    while (g->head) {
        struct gq *q = g->head;
        g->head = q->next;
        free(q);
    }
    free(g->held);
    for (unsigned i = 0; i < g->n_keep; i++)
        free(g->keep[i]);
    free(g->view);
    free(g->addr);
    free(g->gidx);
    free(g->gfirst);
    free(g->dec_idx);
    free(g->dec_val);
    pthread_mutex_destroy(&g->lock);
    pthread_cond_destroy(&g->cond);
    free(g);
    *gp = NULL;
}

void ds_gnet_on_frame(ds_gnet *g, const ds_net_rx *rx)
{
    if (g->heard_fn)
        g->heard_fn(g->heard_ctx, rx->sender);
    const ds_wire_bufs bufs = {
        .idx = g->dec_idx,
        .idx_cap = g->max_count,
        .val = g->dec_val,
        .val_cap = g->max_count,
    };
    ds_wire_msg w;
    if (ds_net_decode(g->net, rx, &bufs, &w) != DS_DROP_NONE) {
        /* Counted and logged by the decoder. */
        pthread_mutex_lock(&g->lock);
        g->st.dropped_decode++;
        pthread_mutex_unlock(&g->lock);
        return;
    }
    const uint8_t type = from_wire_type(w.h.type);
    uint32_t count = w.h.count;
    const uint32_t *idx = NULL;
    const float *val = NULL;
    switch (type) {
    case DS_GMSG_REQ:
    case DS_GMSG_CROSS:
        idx = type == DS_GMSG_REQ ? w.u.sparse.idx : NULL;
        val = w.u.sparse.val;
        if (type == DS_GMSG_REQ && count && !idx) {
            /* Dense encoding: the decoder left the indices implicit. */
            for (uint32_t i = 0; i < count; i++)
                g->dec_idx[i] = i;
            idx = g->dec_idx;
        }
        break;
    case DS_GMSG_RESP:
        val = w.u.values.val;
        break;
    case DS_GMSG_STALE:
        count = 0;
        break;
    case DS_GMSG_ARED:
        val = w.u.ar.val;
        break;
    }
    const size_t bytes = sizeof(struct gq) + (idx ? (size_t)count * 4 : 0) +
                         (val ? (size_t)count * 4 : 0);
    pthread_mutex_lock(&g->lock);
    if (g->queued_bytes + bytes > g->max_queue_bytes) {
        g->st.dropped_full++;
        pthread_mutex_unlock(&g->lock);
        ds_log_rl(DS_LOG_WARN, "gossip", "receive queue full (%zu bytes): dropped %s from %s",
                  g->max_queue_bytes, ds_msg_type_name(w.h.type), rx->name);
        return;
    }
    g->queued_bytes += bytes;
    pthread_mutex_unlock(&g->lock);

    struct gq *q = gq_get(g, bytes);
    if (!q) {
        pthread_mutex_lock(&g->lock);
        g->queued_bytes -= bytes;
        g->st.dropped_full++;
        pthread_mutex_unlock(&g->lock);
        return;
    }
    const size_t cap = q->cap;
    memset(q, 0, sizeof(*q));
    q->cap = cap;
    q->bytes = bytes;
    q->sender = rx->sender;
    q->m.type = type;
    q->m.epoch = w.h.epoch;
    q->m.round = w.h.round;
    q->m.round_now = type == DS_GMSG_STALE ? w.u.stale.round_now : w.h.round;
    q->m.held_us = type == DS_GMSG_RESP ? w.u.values.held_us : 0;
    q->m.segment = type == DS_GMSG_ARED ? w.u.ar.step : w.h.segment;
    q->m.aux = type == DS_GMSG_ARED ? w.u.ar.elem_offset : 0;
    q->m.count = count;
    q->m.vfmt = (uint8_t)((w.h.flags & DS_WF_VAL_MASK) >> DS_WF_VAL_SHIFT);
    uint8_t *p = (uint8_t *)(q + 1);
    if (idx) {
        memcpy(p, idx, (size_t)count * 4);
        q->m.idx = (const uint32_t *)p;
        p += (size_t)count * 4;
    }
    if (val) {
        memcpy(p, val, (size_t)count * 4);
        q->m.val = (const float *)p;
    }
    pthread_mutex_lock(&g->lock);
    if (g->tail)
        g->tail->next = q;
    else
        g->head = q;
    g->tail = q;
    g->st.queued++;
    pthread_cond_signal(&g->cond);
    pthread_mutex_unlock(&g->lock);
}

int ds_gnet_set_view(ds_gnet *g, const uint64_t *ids, const char *const *addrs, uint32_t G)
{
    return ds_gnet_set_groups(g, ids, addrs, G, NULL, G);
}

int ds_gnet_set_groups(ds_gnet *g, const uint64_t *ids, const char *const *addrs, uint32_t n,
                       const uint32_t *group, uint32_t G)
{
    uint64_t *v = malloc((n ? n : 1) * sizeof(uint64_t));
    char(*a)[DS_WIRE_ADDR_MAX + 1] = calloc(n ? n : 1, sizeof(*a));
    uint32_t *gi = malloc((n ? n : 1) * sizeof(uint32_t));
    uint32_t *gf = calloc((size_t)G + 1, sizeof(uint32_t));
    int e = !v || !a || !gi || !gf ? -ENOMEM : 0;
    for (uint32_t i = 0; !e && i < n; i++) {
        gi[i] = group ? group[i] : i;
        /* Groups come in order, each non-empty. */
        if (gi[i] >= G || (i && gi[i] != gi[i - 1] && gi[i] != gi[i - 1] + 1) ||
            (!i && gi[i] != 0))
            e = -EINVAL;
        else
            gf[gi[i] + 1] = i + 1;
    }
    if (!e && n && gi[n - 1] != G - 1)
        e = -EINVAL;
    if (e) {
        free(v);
        free(a);
        free(gi);
        free(gf);
        return e;
    }
    memcpy(v, ids, (size_t)n * sizeof(uint64_t));
    for (uint32_t i = 0; addrs && i < n; i++)
        if (addrs[i])
            snprintf(a[i], sizeof(a[i]), "%s", addrs[i]);
    pthread_mutex_lock(&g->lock);
    free(g->view);
    free(g->addr);
    free(g->gidx);
    free(g->gfirst);
    g->view = v;
    g->addr = a;
    g->gidx = gi;
    g->gfirst = gf;
    g->n_ids = n;
    g->G = G;
    pthread_mutex_unlock(&g->lock);
    return 0;
}

uint64_t ds_gnet_view_id(ds_gnet *g, uint32_t i)
{
    pthread_mutex_lock(&g->lock);
    const uint64_t id =
        i < g->G && g->gfirst[i + 1] - g->gfirst[i] == 1 ? g->view[g->gfirst[i]] : 0;
    pthread_mutex_unlock(&g->lock);
    return id;
}

const ds_gossip_io *ds_gnet_io(ds_gnet *g)
{
    return &g->io;
}

void ds_gnet_set_failure_hook(ds_gnet *g, void (*fn)(void *ctx, uint64_t id), void *ctx)
{
    g->failed_fn = fn;
    g->failed_ctx = ctx;
}

void ds_gnet_set_stop(ds_gnet *g, const atomic_int *flag)
{
    g->stop = flag;
}

void ds_gnet_set_view_differs_hook(ds_gnet *g, void (*fn)(void *ctx, uint64_t id), void *ctx)
{
    g->differs_fn = fn;
    g->differs_ctx = ctx;
}

void ds_gnet_set_heard_hook(ds_gnet *g, void (*fn)(void *ctx, uint64_t id), void *ctx)
{
    g->heard_fn = fn;
    g->heard_ctx = ctx;
}

void ds_gnet_stats_get(ds_gnet *g, ds_gnet_stats *st)
{
    pthread_mutex_lock(&g->lock);
    *st = g->st;
    pthread_mutex_unlock(&g->lock);
}
