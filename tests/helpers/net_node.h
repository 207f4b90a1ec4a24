/*
 * tests/helpers/net_node.h: a ds_net node inside the test process, shared
 * by the net suite (tests/test_net.c, over libfabric) and the in-process
 * suite (tests/test_inproc.c, over provider "inproc").
 *
 * - node_open/node_close: a net with a fresh identity; what it receives is
 *   queued (node_pop drains it with a timeout), unless the node's `hook`
 *   takes the frame first on the net's worker thread (what dsnode's own
 *   on_recv does for gossip and state frames);
 * - events are counted by kind (PEER_UP, HANDSHAKE_FAILED with its last
 *   status, PEER_UNRESPONSIVE, PEER_RESPONSIVE, RESET);
 * - send_stale/expect_stale: a small frame with a round number, to check
 *   arrival and order;
 * - expect_drop: wait for a drop counter to reach a value.
 * Tests synchronise on these queues and counters, never on sleeps alone.
 */
#ifndef DS_TESTS_NET_NODE_H
#define DS_TESTS_NET_NODE_H

#include <criterion/criterion.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/clock.h"
#include "helpers/tp_testutil.h"
#include "node/net/net.h"
#include "node/sec/crypto.h"

#define CLUSTER "test-cluster"

typedef struct nt_item {
    struct nt_item *next;
    uint64_t sender;
    ds_wire_hdr hdr;
    const uint8_t *frame;
    size_t len;
    void *base;
} nt_item;

typedef struct node {
    ds_net *n;
    ds_identity id;
    char addr[DS_TRANSPORT_ADDR_MAX];
    pthread_mutex_t m;
    pthread_cond_t c;
    nt_item *head, *tail;
    unsigned up, hs_failed;
    int last_hs_status;
    unsigned ev[8]; /* events by kind */
    /* Called first for every frame on the net's worker thread; returns 1
     * when it consumed the frame (it is not queued then). May be NULL. */
    int (*hook)(void *hook_ctx, ds_net_rx *rx);
    void *hook_ctx;
} node;

static inline void node_on_recv(void *ctx, ds_net_rx *rx)
{
    node *nd = ctx;
    if (nd->hook && nd->hook(nd->hook_ctx, rx))
        return;
    nt_item *it = calloc(1, sizeof(*it));
    if (!it)
        return;
    it->sender = rx->sender;
    it->hdr = rx->hdr;
    it->frame = rx->frame;
    it->len = rx->len;
    it->base = ds_net_rx_take(rx);
    pthread_mutex_lock(&nd->m);
    if (nd->tail)
        nd->tail->next = it;
    else
        nd->head = it;
    nd->tail = it;
    pthread_cond_broadcast(&nd->c);
    pthread_mutex_unlock(&nd->m);
}

static inline void node_on_event(void *ctx, const ds_net_event *ev)
{
    node *nd = ctx;
    pthread_mutex_lock(&nd->m);
    if (ev->kind == DS_NET_EV_PEER_UP)
        nd->up++;
    if (ev->kind == DS_NET_EV_HANDSHAKE_FAILED) {
        nd->hs_failed++;
        nd->last_hs_status = ev->status;
    }
    if ((unsigned)ev->kind < 8)
        nd->ev[ev->kind]++;
    pthread_cond_broadcast(&nd->c);
    pthread_mutex_unlock(&nd->m);
}

/* How many events of this kind the node has seen. */
static inline unsigned node_events(node *nd, enum ds_net_event_kind kind)
{
    pthread_mutex_lock(&nd->m);
    unsigned n = nd->ev[kind];
    pthread_mutex_unlock(&nd->m);
    return n;
}

/* Wait until the node has seen `want` events of this kind (or 5 s). */
static inline unsigned node_wait_event(node *nd, enum ds_net_event_kind kind, unsigned want)
{
    uint64_t end = ds_now_ms() + 5000;
    unsigned n;
    while ((n = node_events(nd, kind)) < want && ds_now_ms() < end)
        usleep(2000);
    return n;
}

static inline nt_item *node_pop(node *nd, int timeout_ms)
{
    uint64_t end = ds_now_ms() + (uint64_t)timeout_ms;
    pthread_mutex_lock(&nd->m);
    while (!nd->head && ds_now_ms() < end) {
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        ts.tv_nsec += 20000000L;
        if (ts.tv_nsec >= 1000000000L) {
            ts.tv_sec++;
            ts.tv_nsec -= 1000000000L;
        }
        pthread_cond_timedwait(&nd->c, &nd->m, &ts);
    }
    nt_item *it = nd->head;
    if (it) {
        nd->head = it->next;
        if (!nd->head)
            nd->tail = NULL;
    }
    pthread_mutex_unlock(&nd->m);
    return it;
}

static inline void item_free(nt_item *it)
{
    if (it) {
        free(it->base);
        free(it);
    }
}

typedef struct node_opts {
    enum ds_sec_mode mode;
    const ds_cluster_key *key;
    const ds_allowlist *allow;
    const char *allow_file;                    /* re-read by ds_net_allow_reload */
    const atomic_int *allow_reload; /* reload when it changes */
    const char *name;
    const char *listen;
    const char *provider;          /* NULL: the default ("tcp") */
    uint32_t handshake_timeout_ms; /* 0: 2000 */
} node_opts;

static inline int node_open(node *nd, const node_opts *o)
{
    memset(nd, 0, sizeof(*nd));
    pthread_mutex_init(&nd->m, NULL);
    pthread_cond_init(&nd->c, NULL);
    cr_assert_eq(ds_identity_generate(&nd->id), 0);
    ds_net_cfg cfg;
    ds_net_cfg_default(&cfg);
    cfg.identity = &nd->id;
    cfg.name = o->name ? o->name : "node";
    cfg.cluster = CLUSTER;
    cfg.cluster_key = o->key;
    cfg.allow = o->allow;
    cfg.allow_file = o->allow_file;
    cfg.allow_reload = o->allow_reload;
    cfg.mode = o->mode;
    cfg.transport.rx_small_bufs = 16;
    cfg.transport.rx_large_bufs = 8;
    if (o->listen)
        cfg.transport.listen = o->listen;
    if (o->provider)
        cfg.transport.provider = o->provider;
    cfg.handshake_timeout_ms = o->handshake_timeout_ms ? o->handshake_timeout_ms : 2000;
    cfg.on_recv = node_on_recv;
    cfg.on_event = node_on_event;
    cfg.cb_ctx = nd;
    int r = ds_net_open(&cfg, &nd->n);
    if (!r)
        cr_assert_eq(ds_net_addr(nd->n, nd->addr, sizeof(nd->addr)), 0);
    return r;
}

static inline void node_close(node *nd)
{
    ds_net_close(&nd->n);
    nt_item *it;
    while ((it = nd->head)) {
        nd->head = it->next;
        item_free(it);
    }
    ds_identity_wipe(&nd->id);
}

static inline uint64_t drops(node *nd, enum ds_drop_reason r)
{
    return ds_drop_get(ds_net_drops(nd->n), r);
}

/* Wait until reason r's counter reaches want. */
static inline void expect_drop(node *nd, enum ds_drop_reason r, uint64_t want, const char *what)
{
    uint64_t end = ds_now_ms() + 4000, got;
    while ((got = drops(nd, r)) < want && ds_now_ms() < end)
        usleep(2000);
    cr_assert_eq(got, want, "%s: %s = %" PRIu64 ", expected %" PRIu64, what, ds_drop_name(r), got,
                 want);
}

static inline int send_stale(node *from, uint64_t to, const char *to_addr, uint64_t round,
                             uint64_t deadline, tp_done *d)
{
    ds_wire_msg m;
    memset(&m, 0, sizeof(m));
    m.h.type = DS_MSG_GOSSIP_STALE;
    m.h.round = round;
    m.u.stale.round_now = round;
    ds_net_send_opts o = {.deadline_ms = deadline, .done = d ? tp_done_cb : NULL, .done_arg = d};
    return ds_net_send_msg(from->n, to, to_addr, &m, &o);
}

/* The next frame must be a STALE with this round from `sender`. */
static inline void expect_stale(node *nd, uint64_t sender, uint64_t round, int timeout_ms)
{
    nt_item *it = node_pop(nd, timeout_ms);
    cr_assert(it, "STALE round %" PRIu64 " did not arrive", round);
    cr_assert_eq(it->sender, sender, "sender %016" PRIx64 ", expected %016" PRIx64, it->sender,
                 sender);
    cr_assert_eq(it->hdr.type, DS_MSG_GOSSIP_STALE);
    cr_assert_eq(it->hdr.round, round, "round %" PRIu64 ", expected %" PRIu64, it->hdr.round, round);
    item_free(it);
}

#endif
