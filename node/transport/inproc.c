/*
 * node/transport/inproc.c: the in-process transport (inproc.h says what it
 * promises and what it leaves out).
 *
 * How it works. A process-wide registry (g) holds every open inproc
 * endpoint by its advertised address, and the fault table. Each endpoint
 * has one progress thread and, under its lock, three queues filled by
 * other threads: sends submitted by the application, messages delivered by
 * other endpoints' progress threads (the inbox), and requests (peer
 * removals, a reset, stop). The progress thread:
 *
 *   - moves submitted sends to their peer's queue and tries the head of
 *     every peer's queue: when the destination is open and neither side is
 *     dead, it copies head || buf || tail into a fresh buffer, appends it
 *     to the destination's inbox (under g.lock, so the destination cannot
 *     close meanwhile) and reports done(0), then releases the buffer. A
 *     blocked head blocks the peer's queue, which keeps the order;
 *   - fails a waiting send at its deadline (-ETIMEDOUT) and keeps it as
 *     stuck until a reset, a close, its peer's removal or the end of the
 *     fault (docs/transport.md: a send toward a killed peer keeps its
 *     buffer until the endpoint resets); past stuck_max_ops or
 *     stuck_max_bytes it resets by itself, as the libfabric backend does;
 *   - hands every inbox message to on_recv, creating the sender's peer on
 *     first contact.
 * While anything waits it looks again every IP_POLL_MS, so a fault that
 * ends or an endpoint that opens is noticed without a signal.
 *
 * Lock order: g.lock, then an endpoint's lock. No callback runs with
 * either held.
 */
#include "config.h"

#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "base/clock.h"
#include "base/hostport.h"
#include "base/log.h"
#include "node/transport/backend.h"
#include "node/transport/inproc.h"

#define COMP "transport"
#define IP_POLL_MS 5       /* look again this often while a send waits */
#define IP_TICK_MS 100     /* longest sleep otherwise */
#define IP_FAULTS 256

enum { IP_FREE = 0, IP_LIVE, IP_REMOVING };

struct ip_op {
    struct ip_op *next;
    uint32_t slot;
    uint8_t reported;
    const uint8_t *data;   /* the caller's buf, or copy */
    size_t body_len, len;  /* len: head + body + tail */
    uint16_t head_len, tail_len;
    uint8_t edge[DS_TRANSPORT_EDGE_MAX];
    void *copy;
    ds_transport_release_fn release;
    void *release_arg;
    ds_transport_done_fn done;
    void *done_arg;
    uint64_t deadline_ms;
};

struct ip_msg {
    struct ip_msg *next;
    char from[DS_TRANSPORT_ADDR_MAX];
    uint8_t *buf;
    size_t len;
};

struct ip_peer {
    /* under the endpoint's lock */
    uint8_t state;
    uint16_t gen;
    char addr[DS_TRANSPORT_ADDR_MAX];
    /* progress thread */
    struct ip_op *q_head, *q_tail; /* waiting for delivery, in order */
    uint32_t misses;
    uint8_t unresponsive;
};

struct ip_stats {
    _Atomic uint64_t msgs_sent, bytes_sent, msgs_recv, bytes_recv;
    _Atomic uint64_t send_timeouts, stuck_ops, stuck_bytes, queued_bytes, resets;
    _Atomic uint64_t drops[DS_TP_DROP_COUNT];
};

typedef struct ip_ep {
    ds_transport pub; /* first: the public handle (backend.h) */
    ds_transport_opts o;
    struct ip_ep *next_ep; /* the registry (g.lock) */
    uint16_t port;
    char host[DS_HOST_MAX + 1];

    pthread_mutex_t lock;
    pthread_cond_t cond;
    /* under lock */
    struct ip_op *subq_head, *subq_tail;
    struct ip_msg *in_head, *in_tail;
    int stop, reset_req, peers_dirty, kick;
    struct ip_peer *peers;
    unsigned npeers;
    pthread_t thread;
    int thread_started;

    /* progress thread */
    struct ip_op *stuck;   /* timed out; buffer kept */
    uint64_t waiting;      /* sends in peer queues */
    struct ip_stats st;
} ip_ep;

#define IST_ADD(e, f, n) atomic_fetch_add_explicit(&(e)->st.f, (uint64_t)(n), memory_order_relaxed)
#define IST_SUB(e, f, n) atomic_fetch_sub_explicit(&(e)->st.f, (uint64_t)(n), memory_order_relaxed)

/* ---- the registry and the faults -------------------------------------- */

struct ip_fault {
    char addr[DS_TRANSPORT_ADDR_MAX]; /* "" = free entry */
    int dead;
    unsigned drop;
};

static struct {
    pthread_mutex_t lock;
    ip_ep *eps;
    struct ip_fault faults[IP_FAULTS];
} g = {.lock = PTHREAD_MUTEX_INITIALIZER};

static ip_ep *ip_of(ds_transport *t)
{
    return (ip_ep *)t;
}

/* Canonical text of a host:port; port 0 allowed only when may_be_zero. */
static int canon(const char *s, int may_be_zero, char *out, size_t n, ds_hostport *hp)
{
    if (!s || ds_hostport_parse(s, hp) || (!may_be_zero && hp->port == 0))
        return -EINVAL;
    return ds_hostport_format(hp->host, hp->port, out, n) < 0 ? -EINVAL : 0;
}

/* Under g.lock. */
static ip_ep *ep_find(const char *addr)
{
    for (ip_ep *e = g.eps; e; e = e->next_ep)
        if (!strcmp(e->pub.addr_text, addr))
            return e;
    return NULL;
}

/* Under g.lock. create: take a free entry when there is none for addr. */
static struct ip_fault *fault_find(const char *addr, int create)
{
    struct ip_fault *free_f = NULL;
    for (int i = 0; i < IP_FAULTS; i++) {
        if (!strcmp(g.faults[i].addr, addr) && addr[0])
            return &g.faults[i];
        if (!g.faults[i].addr[0] && !free_f)
            free_f = &g.faults[i];
    }
    if (!create || !free_f)
        return NULL;
    snprintf(free_f->addr, sizeof(free_f->addr), "%s", addr);
    return free_f;
}

/* Under g.lock. */
static int is_dead(const char *addr)
{
    const struct ip_fault *f = fault_find(addr, 0);
    return f && f->dead;
}

static int fault_set(const char *addr, int set_dead, int dead, unsigned drop)
{
    char key[DS_TRANSPORT_ADDR_MAX];
    ds_hostport hp;
    if (canon(addr, 0, key, sizeof(key), &hp))
        return -EINVAL;
    pthread_mutex_lock(&g.lock);
    struct ip_fault *f = fault_find(key, 1);
    if (f) {
        if (set_dead)
            f->dead = dead;
        else
            f->drop = drop;
        if (!f->dead && !f->drop)
            f->addr[0] = 0;
    }
    pthread_mutex_unlock(&g.lock);
    return f ? 0 : -ENOSPC;
}

int ds_transport_inproc_kill(const char *addr, int dead)
{
    return fault_set(addr, 1, dead != 0, 0);
}

int ds_transport_inproc_drop(const char *addr, unsigned n)
{
    return fault_set(addr, 0, 0, n);
}

void ds_transport_inproc_clear(void)
{
    pthread_mutex_lock(&g.lock);
    memset(g.faults, 0, sizeof(g.faults));
    pthread_mutex_unlock(&g.lock);
}

/* ---- peers ------------------------------------------------------------- */

static ds_transport_peer handle_of(const ip_ep *e, uint32_t slot)
{
    return ((uint32_t)e->peers[slot].gen << 16) | (slot + 1);
}

/* Under e->lock. */
static int slot_of(const ip_ep *e, ds_transport_peer p, uint32_t *slot)
{
    uint32_t s = p & 0xffffu;
    if (s == 0 || s > e->npeers)
        return -ENOENT;
    s--;
    if (e->peers[s].state != IP_LIVE || e->peers[s].gen != (uint16_t)(p >> 16))
        return -ENOENT;
    *slot = s;
    return 0;
}

/* Find the live peer at key or take a free slot for it (takes e->lock).
 * UINT32_MAX when none is free. */
static uint32_t find_or_create(ip_ep *e, const char *key, int *created, ds_transport_peer *h)
{
    uint32_t slot = UINT32_MAX, free_slot = UINT32_MAX;
    *created = 0;
    pthread_mutex_lock(&e->lock);
    for (uint32_t i = 0; i < e->npeers; i++) {
        if (e->peers[i].state == IP_LIVE && !strcmp(e->peers[i].addr, key)) {
            slot = i;
            break;
        }
        if (e->peers[i].state == IP_FREE && free_slot == UINT32_MAX)
            free_slot = i;
    }
    if (slot == UINT32_MAX && free_slot != UINT32_MAX) {
        struct ip_peer *p = &e->peers[free_slot];
        p->state = IP_LIVE;
        p->gen++;
        snprintf(p->addr, sizeof(p->addr), "%s", key);
        slot = free_slot;
        *created = 1;
    }
    if (slot != UINT32_MAX && h)
        *h = handle_of(e, slot);
    pthread_mutex_unlock(&e->lock);
    return slot;
}

static void event(ip_ep *e, enum ds_transport_event_kind kind, uint32_t slot, int status)
{
    if (!e->o.on_event)
        return;
    ds_transport_event ev = {
        .kind = kind,
        .peer = slot == UINT32_MAX ? 0 : handle_of(e, slot),
        .misses = slot == UINT32_MAX ? 0 : e->peers[slot].misses,
        .status = status,
    };
    e->o.on_event(e->o.cb_ctx, &ev);
}

static void peer_alive(ip_ep *e, uint32_t slot)
{
    struct ip_peer *p = &e->peers[slot];
    p->misses = 0;
    if (p->unresponsive) {
        p->unresponsive = 0;
        event(e, DS_TRANSPORT_EV_PEER_RESPONSIVE, slot, 0);
    }
}

/* ---- sends (progress thread) ------------------------------------------ */

static void op_free(ip_ep *e, struct ip_op *op)
{
    if (op->release)
        op->release(op->release_arg, (void *)op->data);
    ds_transport_buf_put(&e->pub, op->copy);
    IST_SUB(e, queued_bytes, op->len);
    free(op);
}

/* Report once; a missed deadline counts against the peer. */
static void op_report(ip_ep *e, struct ip_op *op, int status)
{
    if (op->reported)
        return;
    op->reported = 1;
    struct ip_peer *p = &e->peers[op->slot];
    if (status == 0) {
        IST_ADD(e, msgs_sent, 1);
        IST_ADD(e, bytes_sent, op->len);
        peer_alive(e, op->slot);
    } else if (status == -ETIMEDOUT) {
        IST_ADD(e, send_timeouts, 1);
        p->misses++;
        if (p->misses >= e->o.miss_limit && !p->unresponsive && p->state == IP_LIVE) {
            p->unresponsive = 1;
            event(e, DS_TRANSPORT_EV_PEER_UNRESPONSIVE, op->slot, status);
        }
    }
    if (op->done)
        op->done(op->done_arg, status);
}

/* Copy op's message (head || body || tail) into a new buffer. */
static uint8_t *op_flat(const struct ip_op *op)
{
    uint8_t *b = malloc(op->len ? op->len : 1);
    if (!b)
        return NULL;
    memcpy(b, op->edge, op->head_len);
    if (op->body_len)
        memcpy(b + op->head_len, op->data, op->body_len);
    memcpy(b + op->head_len + op->body_len, op->edge + op->head_len, op->tail_len);
    return b;
}

/* Try to hand op to the endpoint at `to`. 1 when it left (delivered, or
 * lost to a drop fault), 0 when it must wait. */
static int try_deliver(ip_ep *e, struct ip_op *op, const char *to)
{
    int r = 0;
    pthread_mutex_lock(&g.lock);
    ip_ep *dst = ep_find(to);
    struct ip_fault *f = fault_find(to, 0);
    if (!dst || is_dead(e->pub.addr_text) || (f && f->dead)) {
        r = 0;
    } else if (f && f->drop) {
        if (--f->drop == 0 && !f->dead)
            f->addr[0] = 0;
        r = 1;
    } else {
        struct ip_msg *m = calloc(1, sizeof(*m));
        uint8_t *buf = m ? op_flat(op) : NULL;
        if (buf) {
            snprintf(m->from, sizeof(m->from), "%s", e->pub.addr_text);
            m->buf = buf;
            m->len = op->len;
            pthread_mutex_lock(&dst->lock);
            if (dst->in_tail)
                dst->in_tail->next = m;
            else
                dst->in_head = m;
            dst->in_tail = m;
            pthread_cond_signal(&dst->cond);
            pthread_mutex_unlock(&dst->lock);
            r = 1;
        } else {
            free(m); /* no memory: try again on the next pass */
        }
    }
    pthread_mutex_unlock(&g.lock);
    return r;
}

/* Deliver what can go from the head of a peer's queue; fail what waited
 * past its deadline. Lowers *next to the next deadline. */
static int pump_peer(ip_ep *e, uint32_t slot, uint64_t now, uint64_t *next)
{
    struct ip_peer *p = &e->peers[slot];
    int work = 0;
    while (p->q_head) {
        struct ip_op *op = p->q_head;
        int gone = try_deliver(e, op, p->addr);
        if (!gone && op->deadline_ms > now) {
            if (op->deadline_ms < *next)
                *next = op->deadline_ms;
            break;
        }
        p->q_head = op->next;
        if (!p->q_head)
            p->q_tail = NULL;
        e->waiting--;
        work++;
        if (gone) {
            op_report(e, op, 0);
            op_free(e, op);
            continue;
        }
        /* Stuck before done runs, so done sees it counted. */
        op->next = e->stuck;
        e->stuck = op;
        IST_ADD(e, stuck_ops, 1);
        IST_ADD(e, stuck_bytes, op->len);
        op_report(e, op, -ETIMEDOUT);
    }
    return work;
}

/* Release stuck sends: all of them (slot UINT32_MAX), a removed peer's, or
 * (reachable_only) those whose peer can be reached again. */
static unsigned stuck_release(ip_ep *e, uint32_t slot, int reachable_only)
{
    unsigned n = 0;
    for (struct ip_op **pp = &e->stuck; *pp;) {
        struct ip_op *op = *pp;
        int hit = slot == UINT32_MAX || op->slot == slot;
        if (hit && reachable_only) {
            pthread_mutex_lock(&g.lock);
            const char *to = e->peers[op->slot].addr;
            hit = ep_find(to) && !is_dead(to) && !is_dead(e->pub.addr_text);
            pthread_mutex_unlock(&g.lock);
        }
        if (!hit) {
            pp = &op->next;
            continue;
        }
        *pp = op->next;
        IST_SUB(e, stuck_ops, 1);
        IST_SUB(e, stuck_bytes, op->len);
        op_free(e, op);
        n++;
    }
    return n;
}

/* Fail and free what a peer has waiting (removal, close). */
static void peer_fail_all(ip_ep *e, uint32_t slot, int status)
{
    struct ip_peer *p = &e->peers[slot];
    while (p->q_head) {
        struct ip_op *op = p->q_head;
        p->q_head = op->next;
        e->waiting--;
        op_report(e, op, status);
        op_free(e, op);
    }
    p->q_tail = NULL;
}

static void do_reset(ip_ep *e)
{
    unsigned n = stuck_release(e, UINT32_MAX, 0);
    IST_ADD(e, resets, 1);
    ds_warn(COMP, "inproc endpoint %s reset: %u stuck sends released", e->pub.addr_text, n);
    event(e, DS_TRANSPORT_EV_RESET, UINT32_MAX, (int)n);
}

/* ---- receives (progress thread) --------------------------------------- */

static void receive(ip_ep *e, struct ip_msg *m, int self_dead)
{
    int created = 0;
    uint32_t slot = self_dead ? UINT32_MAX : find_or_create(e, m->from, &created, NULL);
    if (self_dead) {
        /* lost with the dead process */
    } else if (slot == UINT32_MAX) {
        IST_ADD(e, drops[DS_TP_DROP_PEERS_FULL], 1);
        ds_log_rl(DS_LOG_WARN, COMP, "dropped message from %s: all %u peer slots in use",
                  m->from, e->o.max_peers);
    } else {
        if (created)
            event(e, DS_TRANSPORT_EV_PEER_NEW, slot, 0);
        peer_alive(e, slot);
        if (m->len > e->o.max_msg_bytes) {
            IST_ADD(e, drops[DS_TP_DROP_TOO_BIG], 1);
        } else {
            ds_transport_msg msg = {
                .peer = handle_of(e, slot), .data = m->buf, .len = m->len, .base_ = m->buf,
            };
            IST_ADD(e, msgs_recv, 1);
            IST_ADD(e, bytes_recv, m->len);
            e->o.on_recv(e->o.cb_ctx, &msg);
            if (msg.taken_)
                m->buf = NULL;
        }
    }
    ds_transport_buf_put(&e->pub, m->buf);
    free(m);
}

/* ---- the progress thread ---------------------------------------------- */

struct ip_take {
    struct ip_op *subq;
    struct ip_msg *in;
    int stop, reset, dirty;
};

/* Wait for work (at most until `until`), then take every queue. */
static void take(ip_ep *e, uint64_t until, struct ip_take *tk)
{
    pthread_mutex_lock(&e->lock);
    if (!e->subq_head && !e->in_head && !e->stop && !e->reset_req && !e->peers_dirty &&
        !e->kick && ds_now_ms() < until) {
        struct timespec ts = {(time_t)(until / 1000), (long)(until % 1000) * 1000000L};
        pthread_cond_timedwait(&e->cond, &e->lock, &ts);
    }
    tk->subq = e->subq_head;
    tk->in = e->in_head;
    e->subq_head = e->subq_tail = NULL;
    e->in_head = e->in_tail = NULL;
    tk->stop = e->stop;
    tk->reset = e->reset_req;
    tk->dirty = e->peers_dirty;
    e->reset_req = e->peers_dirty = e->kick = 0;
    pthread_mutex_unlock(&e->lock);
}

/* Peers the application removed: fail their sends, free their slots. */
static void take_removals(ip_ep *e)
{
    for (uint32_t i = 0; i < e->npeers; i++) {
        pthread_mutex_lock(&e->lock);
        int removing = e->peers[i].state == IP_REMOVING;
        pthread_mutex_unlock(&e->lock);
        if (!removing)
            continue;
        peer_fail_all(e, i, -ECANCELED);
        stuck_release(e, i, 0);
        struct ip_peer *p = &e->peers[i];
        p->misses = 0;
        p->unresponsive = 0;
        pthread_mutex_lock(&e->lock);
        p->state = IP_FREE;
        p->addr[0] = 0;
        pthread_mutex_unlock(&e->lock);
    }
}

/* Submitted sends to their peers' queues. */
static void take_sends(ip_ep *e, struct ip_op *q)
{
    while (q) {
        struct ip_op *op = q;
        q = op->next;
        op->next = NULL;
        struct ip_peer *p = &e->peers[op->slot];
        if (p->state != IP_LIVE) {
            op_report(e, op, -ECANCELED);
            op_free(e, op);
            continue;
        }
        if (p->q_tail)
            p->q_tail->next = op;
        else
            p->q_head = op;
        p->q_tail = op;
        e->waiting++;
    }
}

static int stuck_over_bound(ip_ep *e)
{
    return atomic_load(&e->st.stuck_ops) >= e->o.stuck_max_ops ||
           atomic_load(&e->st.stuck_bytes) >= e->o.stuck_max_bytes;
}

/* One pass over received messages, sends and stuck ones. Returns when it
 * should look again. */
static uint64_t pass(ip_ep *e, struct ip_take *tk)
{
    uint64_t now = ds_now_ms(), next = now + IP_TICK_MS;
    if (tk->in) {
        pthread_mutex_lock(&g.lock);
        int self_dead = is_dead(e->pub.addr_text);
        pthread_mutex_unlock(&g.lock);
        while (tk->in) {
            struct ip_msg *m = tk->in;
            tk->in = m->next;
            receive(e, m, self_dead);
        }
    }
    for (uint32_t i = 0; i < e->npeers && e->waiting; i++)
        if (e->peers[i].q_head)
            pump_peer(e, i, now, &next);
    if (e->stuck)
        stuck_release(e, UINT32_MAX, 1);
    if (tk->reset || stuck_over_bound(e))
        do_reset(e);
    if (e->waiting || e->stuck) {
        if (now + IP_POLL_MS < next)
            next = now + IP_POLL_MS;
    }
    return next;
}

static void shutdown_all(ip_ep *e, struct ip_msg *in)
{
    for (uint32_t i = 0; i < e->npeers; i++)
        peer_fail_all(e, i, -ECANCELED);
    stuck_release(e, UINT32_MAX, 0);
    while (in) {
        struct ip_msg *m = in;
        in = m->next;
        free(m->buf);
        free(m);
    }
}

static void *progress_main(void *arg)
{
    ip_ep *e = arg;
    pthread_setname_np(pthread_self(), "ds-inproc");
    uint64_t next = 0;
    struct ip_take tk;
    for (;;) {
        take(e, next, &tk);
        if (tk.stop) {
            take_sends(e, tk.subq);
            shutdown_all(e, tk.in);
            break;
        }
        if (tk.dirty)
            take_removals(e);
        take_sends(e, tk.subq);
        next = pass(e, &tk);
    }
    return NULL;
}

/* ---- the ops ----------------------------------------------------------- */

static int ip_peer_add(ds_transport *t, const char *hostport, ds_transport_peer *out)
{
    ip_ep *e = ip_of(t);
    char key[DS_TRANSPORT_ADDR_MAX];
    ds_hostport hp;
    if (canon(hostport, 0, key, sizeof(key), &hp))
        return -EINVAL;
    int created;
    if (find_or_create(e, key, &created, out) == UINT32_MAX)
        return -ENOSPC;
    return 0;
}

static int ip_peer_remove(ds_transport *t, ds_transport_peer p)
{
    ip_ep *e = ip_of(t);
    uint32_t slot;
    pthread_mutex_lock(&e->lock);
    int r = slot_of(e, p, &slot);
    if (!r) {
        e->peers[slot].state = IP_REMOVING;
        e->peers_dirty = 1;
        pthread_cond_signal(&e->cond);
    }
    pthread_mutex_unlock(&e->lock);
    return r;
}

static int ip_peer_addr(ds_transport *t, ds_transport_peer p, char *buf, size_t n)
{
    ip_ep *e = ip_of(t);
    uint32_t slot;
    pthread_mutex_lock(&e->lock);
    int r = slot_of(e, p, &slot);
    if (!r && (size_t)snprintf(buf, n, "%s", e->peers[slot].addr) >= n)
        r = -ENOSPC;
    pthread_mutex_unlock(&e->lock);
    return r;
}

static struct ip_op *op_new(ip_ep *e, const ds_transport_send_args *a)
{
    struct ip_op *op = calloc(1, sizeof(*op));
    if (!op)
        return NULL;
    if (a->head_len)
        memcpy(op->edge, a->head, a->head_len);
    if (a->tail_len)
        memcpy(op->edge + a->head_len, a->tail, a->tail_len);
    op->head_len = (uint16_t)a->head_len;
    op->tail_len = (uint16_t)a->tail_len;
    op->body_len = a->len;
    op->len = a->len + a->head_len + a->tail_len;
    if (a->release) {
        op->data = a->buf;
        op->release = a->release;
        op->release_arg = a->release_arg;
    } else if (a->len) {
        op->copy = ds_transport_buf_get(&e->pub, a->len);
        if (!op->copy) {
            free(op);
            return NULL;
        }
        memcpy(op->copy, a->buf, a->len);
        op->data = op->copy;
    }
    op->deadline_ms = a->deadline_ms;
    op->done = a->done;
    op->done_arg = a->done_arg;
    return op;
}

static int ip_send(ds_transport *t, ds_transport_peer p, const ds_transport_send_args *a)
{
    ip_ep *e = ip_of(t);
    struct ip_op *op = op_new(e, a);
    if (!op)
        return -ENOMEM;
    uint32_t slot;
    int r;
    pthread_mutex_lock(&e->lock);
    if (e->stop) {
        r = -ECANCELED;
    } else if ((r = slot_of(e, p, &slot)) == 0) {
        if (atomic_load(&e->st.queued_bytes) + op->len > e->o.max_queued_bytes) {
            r = -ENOBUFS;
        } else {
            IST_ADD(e, queued_bytes, op->len);
            op->slot = slot;
            if (e->subq_tail)
                e->subq_tail->next = op;
            else
                e->subq_head = op;
            e->subq_tail = op;
            pthread_cond_signal(&e->cond);
        }
    }
    pthread_mutex_unlock(&e->lock);
    if (r) {
        free(op->copy);
        free(op);
    }
    return r;
}

static int ip_reset(ds_transport *t)
{
    ip_ep *e = ip_of(t);
    pthread_mutex_lock(&e->lock);
    e->reset_req = 1;
    pthread_cond_signal(&e->cond);
    pthread_mutex_unlock(&e->lock);
    return 0;
}

static void ip_stats_get(ds_transport *t, ds_transport_stats *st)
{
    ip_ep *e = ip_of(t);
#define LD(f) st->f = atomic_load_explicit(&e->st.f, memory_order_relaxed)
    LD(msgs_sent);
    LD(bytes_sent);
    LD(msgs_recv);
    LD(bytes_recv);
    LD(send_timeouts);
    LD(stuck_ops);
    LD(stuck_bytes);
    LD(queued_bytes);
    LD(resets);
    for (int i = 0; i < DS_TP_DROP_COUNT; i++)
        st->drops[i] = atomic_load_explicit(&e->st.drops[i], memory_order_relaxed);
#undef LD
}

static void unregister(ip_ep *e)
{
    pthread_mutex_lock(&g.lock);
    for (ip_ep **pp = &g.eps; *pp; pp = &(*pp)->next_ep)
        if (*pp == e) {
            *pp = e->next_ep;
            break;
        }
    pthread_mutex_unlock(&g.lock);
}

/* Everything but the head. */
static void ip_free(ip_ep *e)
{
    free(e->peers);
    pthread_mutex_destroy(&e->lock);
    pthread_cond_destroy(&e->cond);
}

static void ip_close(ds_transport *t)
{
    ip_ep *e = ip_of(t);
    /* Out of the registry first: no other endpoint can deliver to us once
     * this returns (they deliver under g.lock). */
    unregister(e);
    if (e->thread_started) {
        pthread_mutex_lock(&e->lock);
        e->stop = 1;
        pthread_cond_signal(&e->cond);
        pthread_mutex_unlock(&e->lock);
        pthread_join(e->thread, NULL);
        /* Anything submitted after the thread's last look. */
        while (e->subq_head) {
            struct ip_op *op = e->subq_head;
            e->subq_head = op->next;
            op_report(e, op, -ECANCELED);
            op_free(e, op);
        }
    }
    ip_free(e);
}

static const struct tp_ops ip_ops = {
    .name = DS_TRANSPORT_INPROC,
    .close = ip_close,
    .peer_add = ip_peer_add,
    .peer_remove = ip_peer_remove,
    .peer_addr = ip_peer_addr,
    .send = ip_send,
    .reset = ip_reset,
    .stats_get = ip_stats_get,
};

/* Under g.lock: the address this endpoint takes. Port 0 in listen picks
 * the lowest port no inproc endpoint of that host uses. */
static int claim_address(ip_ep *e, const ds_transport_opts *o)
{
    ds_hostport hp;
    char text[DS_TRANSPORT_ADDR_MAX];
    if (canon(o->listen, 1, text, sizeof(text), &hp))
        return -EINVAL;
    if (!o->advertise && ds_host_is_wildcard(hp.host)) {
        ds_error(COMP, "listen address %s cannot be advertised (a wildcard address); set "
                 "node.advertise = host:port, the address peers dial", o->listen);
        return -EINVAL;
    }
    uint32_t port = hp.port;
    for (uint32_t p = 1; port == 0 && p <= 65535; p++) {
        ds_hostport_format(hp.host, (uint16_t)p, text, sizeof(text));
        if (!ep_find(text))
            port = p;
    }
    if (port == 0)
        return -EADDRINUSE;
    if (ds_hostport_format(hp.host, (uint16_t)port, text, sizeof(text)) < 0)
        return -EINVAL;
    if (o->advertise && canon(o->advertise, 0, text, sizeof(text), &hp))
        return -EINVAL;
    if (ep_find(text))
        return -EADDRINUSE;
    snprintf(e->pub.addr_text, sizeof(e->pub.addr_text), "%s", text);
    return 0;
}

int tp_inproc_open(const ds_transport_opts *o, ds_transport **out)
{
    ip_ep *e = calloc(1, sizeof(*e));
    if (!e)
        return -ENOMEM;
    tp_head_init(&e->pub, &ip_ops);
    e->o = *o;
    e->o.provider = e->o.listen = e->o.advertise = NULL;
    pthread_mutex_init(&e->lock, NULL);
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(&e->cond, &ca);
    pthread_condattr_destroy(&ca);
    e->npeers = o->max_peers;
    e->peers = calloc(e->npeers, sizeof(*e->peers));
    int r = e->peers ? 0 : -ENOMEM;
    /* Before the thread starts: its callbacks may use *out at once. */
    *out = &e->pub;
    pthread_mutex_lock(&g.lock);
    if (!r)
        r = claim_address(e, o);
    if (!r)
        r = pthread_create(&e->thread, NULL, progress_main, e);
    if (!r) {
        e->thread_started = 1;
        e->next_ep = g.eps;
        g.eps = e;
    }
    pthread_mutex_unlock(&g.lock);
    if (r) {
        *out = NULL;
        ip_free(e);
        tp_head_free(&e->pub);
        return r > 0 ? -r : r;
    }
    ds_info(COMP, "inproc endpoint %s", e->pub.addr_text);
    return 0;
}
