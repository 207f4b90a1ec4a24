/* node/gossip/fake.c: see fake.h. */
#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "base/clock.h"
#include "node/gossip/fake.h"

struct fmsg {
    ds_gmsg m;
    uint32_t *idx;
    float *val;
    struct fmsg *next;
};

struct fnode {
    pthread_mutex_t lock;
    pthread_cond_t cond;
    struct fmsg *head, *tail;
    struct fmsg *held; /* the message handed out by the last recv */
    int dead;
    ds_gossip_io io;
    struct ds_fakenet *net;
    uint32_t me;
};

struct ds_fakenet {
    uint32_t G;
    struct fnode *node;
    pthread_mutex_t stats_lock;
    uint64_t *failures;
    uint64_t *differs;
    uint64_t delivered;
    uint64_t timeouts;
    _Atomic uint64_t clock; /* the fake clock, ns */
    _Atomic int instant;
    _Atomic uint32_t patience; /* real wait = patience x fake time left */
};

/* Move the clock to `to` unless it is there already (it never goes back). */
static void clock_reach(struct ds_fakenet *net, uint64_t to)
{
    uint64_t cur = atomic_load(&net->clock);
    while (cur < to && !atomic_compare_exchange_weak(&net->clock, &cur, to))
        ;
}

static uint64_t fake_now(void *ctx)
{
    struct fnode *self = ctx;
    return atomic_load(&self->net->clock);
}

static void free_msg(struct fmsg *f)
{
    if (!f)
        return;
    free(f->idx);
    free(f->val);
    free(f);
}

static int fake_send(void *ctx, const ds_gmsg *m, uint64_t deadline_ns)
{
    (void)deadline_ns;
    struct fnode *self = ctx;
    struct ds_fakenet *net = self->net;
    if (m->to >= net->G)
        return -EINVAL;
    pthread_mutex_lock(&self->lock);
    int dead = self->dead;
    pthread_mutex_unlock(&self->lock);
    if (dead)
        return -ECONNRESET;
    struct fnode *dst = &net->node[m->to];
    struct fmsg *f = calloc(1, sizeof(*f));
    f->m = *m;
    f->m.from = self->me;
    if (m->idx && m->count) {
        f->idx = malloc(m->count * sizeof(uint32_t));
        memcpy(f->idx, m->idx, m->count * sizeof(uint32_t));
    }
    if (m->val && m->count) {
        f->val = malloc(m->count * sizeof(float));
        memcpy(f->val, m->val, m->count * sizeof(float));
    }
    f->m.idx = f->idx;
    f->m.val = f->val;
    pthread_mutex_lock(&dst->lock);
    if (dst->dead) {
        /* A dead peer: the bytes leave and nothing ever answers. */
        pthread_mutex_unlock(&dst->lock);
        free_msg(f);
        return 0;
    }
    if (dst->tail)
        dst->tail->next = f;
    else
        dst->head = f;
    dst->tail = f;
    pthread_cond_signal(&dst->cond);
    pthread_mutex_unlock(&dst->lock);
    pthread_mutex_lock(&net->stats_lock);
    net->delivered++;
    pthread_mutex_unlock(&net->stats_lock);
    return 0;
}

static int fake_recv(void *ctx, ds_gmsg *m, uint64_t deadline_ns)
{
    struct fnode *self = ctx;
    struct ds_fakenet *net = self->net;
    pthread_mutex_lock(&self->lock);
    free_msg(self->held);
    self->held = NULL;
    if (!self->head) {
        const uint64_t now = atomic_load(&net->clock);
        if (deadline_ns > now && !atomic_load(&net->instant)) {
            /* Wait in real time as long as the fake clock has left. */
            const uint64_t until =
                ds_now_ns() + (deadline_ns - now) * (uint64_t)atomic_load(&net->patience);
            const struct timespec ts = {(time_t)(until / 1000000000u),
                                        (long)(until % 1000000000u)};
            while (!self->head)
                if (pthread_cond_timedwait(&self->cond, &self->lock, &ts) == ETIMEDOUT)
                    break;
        }
        if (!self->head && deadline_ns <= now) {
            /* A poll: nothing waited for, no time out. */
            pthread_mutex_unlock(&self->lock);
            return 0;
        }
        if (!self->head) {
            /* Out of time: the clock is at our deadline now. */
            pthread_mutex_unlock(&self->lock);
            clock_reach(net, deadline_ns);
            pthread_mutex_lock(&net->stats_lock);
            net->timeouts++;
            pthread_mutex_unlock(&net->stats_lock);
            return 0;
        }
    }
    struct fmsg *f = self->head;
    self->head = f->next;
    if (!self->head)
        self->tail = NULL;
    self->held = f;
    *m = f->m;
    pthread_mutex_unlock(&self->lock);
    return 1;
}

/* One more in a per-peer count (failures, differs), and one read back. */
static void count_peer(ds_fakenet *net, uint64_t *counts, uint32_t peer)
{
    pthread_mutex_lock(&net->stats_lock);
    counts[peer]++;
    pthread_mutex_unlock(&net->stats_lock);
}

static uint64_t peer_count(ds_fakenet *net, const uint64_t *counts, uint32_t peer)
{
    pthread_mutex_lock(&net->stats_lock);
    const uint64_t c = counts[peer];
    pthread_mutex_unlock(&net->stats_lock);
    return c;
}

static void fake_differs(void *ctx, uint32_t peer)
{
    struct fnode *self = ctx;
    count_peer(self->net, self->net->differs, peer);
}

static void fake_failed(void *ctx, uint32_t peer)
{
    struct fnode *self = ctx;
    count_peer(self->net, self->net->failures, peer);
}

ds_fakenet *ds_fakenet_create(uint32_t G)
{
    ds_fakenet *net = calloc(1, sizeof(*net));
    net->G = G;
    net->node = calloc(G, sizeof(*net->node));
    net->failures = calloc(G, sizeof(uint64_t));
    net->differs = calloc(G, sizeof(uint64_t));
    atomic_init(&net->clock, 0);
    atomic_init(&net->instant, 0);
    atomic_init(&net->patience, 1);
    pthread_mutex_init(&net->stats_lock, NULL);
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    for (uint32_t i = 0; i < G; i++) {
        struct fnode *n = &net->node[i];
        pthread_mutex_init(&n->lock, NULL);
        pthread_cond_init(&n->cond, &ca);
        n->net = net;
        n->me = i;
        n->io.ctx = n;
        n->io.send = fake_send;
        n->io.recv = fake_recv;
        n->io.peer_failed = fake_failed;
        n->io.peer_view_differs = fake_differs;
        n->io.now_ns = fake_now;
    }
    pthread_condattr_destroy(&ca);
    return net;
}

void ds_fakenet_destroy(ds_fakenet *net)
{
    for (uint32_t i = 0; i < net->G; i++) {
        struct fnode *n = &net->node[i];
        free_msg(n->held);
        while (n->head) {
            struct fmsg *f = n->head;
            n->head = f->next;
            free_msg(f);
        }
        pthread_mutex_destroy(&n->lock);
        pthread_cond_destroy(&n->cond);
    }
    pthread_mutex_destroy(&net->stats_lock);
    free(net->node);
    free(net->failures);
    free(net->differs);
    free(net);
}

const ds_gossip_io *ds_fakenet_io(ds_fakenet *net, uint32_t me)
{
    return &net->node[me].io;
}

void ds_fakenet_set_dead(ds_fakenet *net, uint32_t node, int dead)
{
    struct fnode *n = &net->node[node];
    pthread_mutex_lock(&n->lock);
    n->dead = dead;
    pthread_mutex_unlock(&n->lock);
}

uint64_t ds_fakenet_failures(ds_fakenet *net, uint32_t peer)
{
    return peer_count(net, net->failures, peer);
}

uint64_t ds_fakenet_view_differs(ds_fakenet *net, uint32_t peer)
{
    return peer_count(net, net->differs, peer);
}

uint64_t ds_fakenet_delivered(ds_fakenet *net)
{
    pthread_mutex_lock(&net->stats_lock);
    uint64_t d = net->delivered;
    pthread_mutex_unlock(&net->stats_lock);
    return d;
}

uint64_t ds_fakenet_now_ns(ds_fakenet *net)
{
    return atomic_load(&net->clock);
}

void ds_fakenet_advance(ds_fakenet *net, uint64_t ns)
{
    atomic_fetch_add(&net->clock, ns);
}

uint64_t ds_fakenet_timeouts(ds_fakenet *net)
{
    pthread_mutex_lock(&net->stats_lock);
    uint64_t t = net->timeouts;
    pthread_mutex_unlock(&net->stats_lock);
    return t;
}

void ds_fakenet_set_instant(ds_fakenet *net, int on)
{
    atomic_store(&net->instant, on);
}

void ds_fakenet_set_patience(ds_fakenet *net, uint32_t factor)
{
    atomic_store(&net->patience, factor ? factor : 1);
}
