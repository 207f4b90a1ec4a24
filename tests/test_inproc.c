/*
 * tests/test_inproc.c: the in-process transport (provider "inproc",
 * node/transport/inproc.h), and what runs on it without libfabric: the
 * secured layer (node/net), a model state transfer (node/gossip/state.h)
 * and gossip exchanges (node/gossip/gossip_net.h).
 *
 * Suite "inproc" (meson suite unit):
 *   - the transport: options and addresses, messages 0 B .. 16 MiB both
 *     ways in order, copied and lent with head and tail pieces; sends to an
 *     address where nobody listens time out at their deadline; a dead peer:
 *     its sends time out, their buffers stay until a reset (on demand or at
 *     the stuck bound), the peer is reported unresponsive and responsive
 *     again; a dropped message is reported sent and never arrives; the
 *     queue bound, removal, peers_full and too_big; close cancels and
 *     releases what waits;
 *   - node/net: sessions in every mode with frames and a lent state chunk
 *     both ways; a lost HELLO fails the handshake at its timeout and the
 *     next one works; a dead peer's frames time out, it is reported
 *     unresponsive, and it works again when it comes back;
 *   - node/gossip/state: a transfer of a lent snapshot to a live joiner
 *     while another requester is dead (its chunks stay lent until the net
 *     closes, after the server's ds_state is gone); a server that dies
 *     after the request leaves the joiner waiting out its deadline, and a
 *     second request after it comes back succeeds;
 *   - node/gossip/gossip_net: every gossip message type through the io
 *     seam, mapped to view indices; a frame from outside the view is
 *     dropped; a REQ to a dead peer never arrives and the exchange recovers
 *     when the peer does.
 * Faults are process-wide: every test clears them in its teardown.
 */
#include <criterion/criterion.h>
#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "base/clock.h"
#include "helpers/net_node.h"
#include "helpers/tp_testutil.h"
#include "node/gossip/gossip_net.h"
#include "node/gossip/state.h"
#include "node/transport/inproc.h"

#define SEED 0x1d9c0ull

static ds_cluster_key g_key;

static void setup(void)
{
    signal(SIGPIPE, SIG_IGN);
    const char *lv = getenv("DS_TEST_LOG");
    int level = lv ? ds_log_level_parse(lv) : -1;
    ds_log_setup("test", level >= 0 ? (enum ds_log_level)level : DS_LOG_ERROR, stderr);
    cr_assert_eq(ds_crypto_init(), 0);
    cr_assert_eq(ds_cluster_key_generate(&g_key), 0);
    ds_transport_inproc_clear();
}

static void teardown(void)
{
    ds_transport_inproc_clear();
}

TestSuite(inproc, .init = setup, .fini = teardown, .timeout = 60);

/* ---- bare transport endpoints ------------------------------------------- */

struct ep {
    ds_transport *t;
    tp_inbox in;
    tp_events ev;
    char addr[DS_TRANSPORT_ADDR_MAX];
};

static void ep_on_recv(void *ctx, ds_transport_msg *m)
{
    struct ep *e = ctx;
    tp_inbox_on_recv(&e->in, m);
}

static void ep_on_event(void *ctx, const ds_transport_event *ev)
{
    struct ep *e = ctx;
    tp_events_on_event(&e->ev, ev);
}

static void ep_opts(ds_transport_opts *o)
{
    ds_transport_opts_default(o);
    o->provider = DS_TRANSPORT_INPROC;
}

static int ep_open_opts(struct ep *e, ds_transport_opts *o)
{
    memset(e, 0, sizeof(*e));
    tp_inbox_init(&e->in);
    pthread_mutex_init(&e->ev.m, NULL);
    o->on_recv = ep_on_recv;
    o->on_event = ep_on_event;
    o->cb_ctx = e;
    int r = ds_transport_open(o, &e->t);
    if (r == 0)
        cr_assert_eq(ds_transport_addr(e->t, e->addr, sizeof(e->addr)), 0);
    return r;
}

static void ep_open(struct ep *e)
{
    ds_transport_opts o;
    ep_opts(&o);
    int r = ep_open_opts(e, &o);
    cr_assert_eq(r, 0, "ds_transport_open(inproc): %s", strerror(-r));
}

static void ep_close(struct ep *e)
{
    ds_transport_close(&e->t);
    tp_inbox_destroy(&e->in);
}

/* Wait until the endpoint has seen `want` events of this kind (or 5 s). */
static unsigned ep_wait_event(struct ep *e, int kind, unsigned want)
{
    uint64_t end = ds_now_ms() + 5000;
    unsigned n;
    while ((n = tp_events_count(&e->ev, kind)) < want && ds_now_ms() < end)
        usleep(2000);
    return n;
}

static ds_transport_stats ep_stats(struct ep *e)
{
    ds_transport_stats st;
    ds_transport_stats_get(e->t, &st);
    return st;
}

/* Releases of lent buffers, counted. */
typedef struct lent {
    pthread_mutex_t m;
    unsigned released;
} lent;

static void lent_release(void *arg, void *buf)
{
    lent *l = arg;
    (void)buf;
    pthread_mutex_lock(&l->m);
    l->released++;
    pthread_mutex_unlock(&l->m);
}

static unsigned lent_count(lent *l)
{
    pthread_mutex_lock(&l->m);
    unsigned n = l->released;
    pthread_mutex_unlock(&l->m);
    return n;
}

static unsigned lent_wait(lent *l, unsigned n, int timeout_ms)
{
    uint64_t end = ds_now_ms() + (uint64_t)timeout_ms;
    unsigned got;
    while ((got = lent_count(l)) < n && ds_now_ms() < end)
        usleep(2000);
    return got;
}

/* A lent send of buf (len bytes) from e to p. */
static int send_lent(struct ep *e, ds_transport_peer p, const uint8_t *buf, size_t len,
                     uint64_t deadline, tp_done *d, lent *l)
{
    ds_transport_send_args a = {
        .buf = buf, .len = len, .deadline_ms = deadline,
        .release = lent_release, .release_arg = l,
        .done = tp_done_cb, .done_arg = d,
    };
    return ds_transport_send(e->t, p, &a);
}

static int send_copy(struct ep *e, ds_transport_peer p, const void *buf, size_t len,
                     uint64_t deadline, tp_done *d)
{
    ds_transport_send_args a = {
        .buf = buf, .len = len, .deadline_ms = deadline,
        .done = d ? tp_done_cb : NULL, .done_arg = d,
    };
    return ds_transport_send(e->t, p, &a);
}

Test(inproc, options_and_addresses)
{
    struct ep a, b;
    ds_transport_opts o;
    /* The same checks as the libfabric transport. */
    ep_opts(&o);
    ds_transport *t = NULL;
    cr_assert_eq(ds_transport_open(&o, &t), -EINVAL, "no on_recv");
    ep_opts(&o);
    o.chunk_bytes = 100;
    cr_assert_eq(ep_open_opts(&a, &o), -EINVAL, "chunk_bytes");
    tp_inbox_destroy(&a.in);
    ep_opts(&o);
    o.listen = "0.0.0.0:0";
    cr_assert_eq(ep_open_opts(&a, &o), -EINVAL, "wildcard without advertise");
    tp_inbox_destroy(&a.in);
    /* Port 0 picks distinct ports; an explicit port is taken once. */
    ep_open(&a);
    ep_open(&b);
    cr_assert_str_neq(a.addr, b.addr);
    ep_opts(&o);
    o.listen = a.addr;
    struct ep c;
    cr_assert_eq(ep_open_opts(&c, &o), -EADDRINUSE);
    tp_inbox_destroy(&c.in);
    ep_opts(&o);
    o.listen = "0.0.0.0:0";
    o.advertise = "[::1]:7001";
    cr_assert_eq(ep_open_opts(&c, &o), 0);
    cr_assert_str_eq(c.addr, "[::1]:7001");
    /* Peers: malformed or port 0 refused; one handle per address. */
    ds_transport_peer p1, p2;
    cr_assert_eq(ds_transport_peer_add(a.t, "nohost", &p1), -EINVAL);
    cr_assert_eq(ds_transport_peer_add(a.t, "127.0.0.1:0", &p1), -EINVAL);
    cr_assert_eq(ds_transport_peer_add(a.t, b.addr, &p1), 0);
    cr_assert_eq(ds_transport_peer_add(a.t, b.addr, &p2), 0);
    cr_assert_eq(p1, p2);
    char buf[DS_TRANSPORT_ADDR_MAX];
    cr_assert_eq(ds_transport_peer_addr(a.t, p1, buf, sizeof(buf)), 0);
    cr_assert_str_eq(buf, b.addr);
    /* Send arguments: the front's checks. */
    cr_assert_eq(send_copy(&a, p1, "x", 1, ds_now_ms() - 1, NULL), -ETIMEDOUT);
    ds_transport_send_args bad = {.len = 3, .deadline_ms = ds_now_ms() + 1000};
    cr_assert_eq(ds_transport_send(a.t, p1, &bad), -EINVAL);
    cr_assert_eq(send_copy(&a, p1 + (1u << 16), "x", 1, ds_now_ms() + 1000, NULL), -ENOENT);
    ep_close(&c);
    ep_close(&a);
    ep_close(&b);
}

static const size_t sizes[] = {0, 1, 7, 4096, 16384, 16385, (1u << 20) + 4097, 16u << 20};
#define NSIZES (sizeof(sizes) / sizeof(sizes[0]))

Test(inproc, sizes_both_ways_in_order_copied_and_lent)
{
    struct ep a, b;
    ep_open(&a);
    ep_open(&b);
    ds_transport_peer pb, pa = 0;
    cr_assert_eq(ds_transport_peer_add(a.t, b.addr, &pb), 0);
    uint8_t *bufs[NSIZES];
    tp_done d;
    tp_done_init(&d);
    lent l = {.m = PTHREAD_MUTEX_INITIALIZER};
    const uint64_t dl = ds_now_ms() + 20000;
    /* a -> b: even indices copied, odd ones lent with head and tail. */
    for (unsigned i = 0; i < NSIZES; i++) {
        bufs[i] = malloc(sizes[i] + 16);
        tp_pattern_fill(bufs[i], sizes[i] + 16, SEED, i);
        if (i % 2 == 0) {
            cr_assert_eq(send_copy(&a, pb, bufs[i], sizes[i] + 16, dl, &d), 0);
            continue;
        }
        /* head = the first 8 bytes (the index), tail = the last 8. */
        ds_transport_send_args s = {
            .head = bufs[i], .head_len = 8, .buf = bufs[i] + 8, .len = sizes[i],
            .tail = bufs[i] + 8 + sizes[i], .tail_len = 8, .deadline_ms = dl,
            .release = lent_release, .release_arg = &l, .done = tp_done_cb, .done_arg = &d,
        };
        cr_assert_eq(ds_transport_send(a.t, pb, &s), 0);
    }
    for (unsigned i = 0; i < NSIZES; i++) {
        tp_item *it = tp_inbox_pop(&b.in, 10000);
        cr_assert(it, "message %u missing", i);
        int ok = 0;
        cr_assert_eq(it->len, sizes[i] + 16);
        cr_assert_eq(tp_pattern_check(it->data, it->len, SEED, &ok), i, "order");
        cr_assert(ok, "message %u differs", i);
        if (i == 0)
            pa = it->peer;
        tp_item_free(it);
    }
    cr_assert_eq(tp_done_wait(&d, NSIZES, 5000), NSIZES);
    cr_assert_eq(d.ok, NSIZES);
    cr_assert_eq(lent_wait(&l, NSIZES / 2, 5000), NSIZES / 2);
    cr_assert_eq(tp_events_count(&b.ev, DS_TRANSPORT_EV_PEER_NEW), 1);
    /* b -> a on the peer its first message created. */
    for (unsigned i = 0; i < NSIZES; i++)
        cr_assert_eq(send_copy(&b, pa, bufs[i], sizes[i] + 16, dl, NULL), 0);
    for (unsigned i = 0; i < NSIZES; i++) {
        tp_item *it = tp_inbox_pop(&a.in, 10000);
        cr_assert(it, "reply %u missing", i);
        cr_assert_eq(it->peer, pb, "the reply comes from the peer a added");
        cr_assert_eq(it->len, sizes[i] + 16);
        cr_assert_eq(memcmp(it->data, bufs[i], it->len), 0);
        tp_item_free(it);
    }
    ds_transport_stats st = ep_stats(&a);
    cr_assert_eq(st.msgs_sent, NSIZES);
    cr_assert_eq(st.msgs_recv, NSIZES);
    cr_assert_eq(st.queued_bytes, 0);
    ep_close(&a);
    ep_close(&b);
    for (unsigned i = 0; i < NSIZES; i++)
        free(bufs[i]);
}

Test(inproc, deadline_to_nobody_then_someone_opens_there)
{
    struct ep a, b;
    ep_open(&a);
    ds_transport_peer p;
    cr_assert_eq(ds_transport_peer_add(a.t, "127.0.0.1:40999", &p), 0);
    tp_done d;
    tp_done_init(&d);
    const uint64_t dl = ds_now_ms() + 300;
    cr_assert_eq(send_copy(&a, p, "hello", 5, dl, &d), 0);
    cr_assert_eq(tp_done_wait(&d, 1, 3000), 1);
    cr_assert_eq(d.timeouts, 1);
    cr_assert_geq(d.last_ms, dl, "reported before its deadline");
    cr_assert_leq(d.last_ms, dl + 1000, "reported %" PRIu64 " ms late", d.last_ms - dl);
    cr_assert_eq(ep_wait_event(&a, DS_TRANSPORT_EV_PEER_UNRESPONSIVE, 1), 1);
    cr_assert_eq(ep_stats(&a).send_timeouts, 1);
    /* Someone opens there: the next send arrives, the peer is back. */
    ds_transport_opts o;
    ep_opts(&o);
    o.listen = "127.0.0.1:40999";
    cr_assert_eq(ep_open_opts(&b, &o), 0);
    cr_assert_eq(ds_transport_send_wait(a.t, p, "again", 5, ds_now_ms() + 5000), 0);
    tp_item *it = tp_inbox_pop(&b.in, 5000);
    cr_assert(it);
    cr_assert_eq(it->len, 5);
    cr_assert_eq(memcmp(it->data, "again", 5), 0, "the timed-out message is never delivered");
    tp_item_free(it);
    cr_assert_eq(ep_wait_event(&a, DS_TRANSPORT_EV_PEER_RESPONSIVE, 1), 1);
    ep_close(&a);
    ep_close(&b);
}

Test(inproc, dead_peer_sends_stay_stuck_until_reset)
{
    struct ep a, b;
    ep_open(&a);
    ep_open(&b);
    ds_transport_peer p;
    cr_assert_eq(ds_transport_peer_add(a.t, b.addr, &p), 0);
    cr_assert_eq(ds_transport_inproc_kill(b.addr, 1), 0);
    uint8_t data[3][1000];
    tp_done d;
    tp_done_init(&d);
    lent l = {.m = PTHREAD_MUTEX_INITIALIZER};
    const uint64_t dl = ds_now_ms() + 300;
    for (int i = 0; i < 3; i++) {
        tp_pattern_fill(data[i], sizeof(data[i]), SEED, (uint64_t)i);
        cr_assert_eq(send_lent(&a, p, data[i], sizeof(data[i]), dl, &d, &l), 0);
    }
    cr_assert_eq(tp_done_wait(&d, 3, 3000), 3);
    cr_assert_eq(d.timeouts, 3);
    cr_assert_leq(d.last_ms, dl + 1000);
    cr_assert_eq(tp_events_count(&a.ev, DS_TRANSPORT_EV_PEER_UNRESPONSIVE), 1, "once per episode");
    /* The buffers stay lent: a killed peer's sends never complete. */
    ds_transport_stats st = ep_stats(&a);
    cr_assert_eq(st.stuck_ops, 3);
    cr_assert_eq(st.stuck_bytes, 3 * sizeof(data[0]));
    cr_assert_eq(lent_count(&l), 0);
    cr_assert_null(tp_inbox_pop(&b.in, 50));
    /* A reset gives them back, once each. */
    cr_assert_eq(ds_transport_reset(a.t), 0);
    cr_assert_eq(ep_wait_event(&a, DS_TRANSPORT_EV_RESET, 1), 1);
    cr_assert_eq(lent_wait(&l, 3, 3000), 3);
    st = ep_stats(&a);
    cr_assert_eq(st.stuck_ops, 0);
    cr_assert_eq(st.resets, 1);
    /* Alive again: messages flow, and none of the abandoned ones. */
    cr_assert_eq(ds_transport_inproc_kill(b.addr, 0), 0);
    cr_assert_eq(ds_transport_send_wait(a.t, p, "back", 4, ds_now_ms() + 5000), 0);
    tp_item *it = tp_inbox_pop(&b.in, 5000);
    cr_assert(it);
    cr_assert_eq(it->len, 4);
    tp_item_free(it);
    cr_assert_null(tp_inbox_pop(&b.in, 50));
    cr_assert_eq(ep_wait_event(&a, DS_TRANSPORT_EV_PEER_RESPONSIVE, 1), 1);
    ep_close(&a);
    ep_close(&b);
    cr_assert_eq(lent_count(&l), 3);
}

Test(inproc, stuck_bound_resets_by_itself_and_close_releases)
{
    struct ep a, b;
    ds_transport_opts o;
    ep_opts(&o);
    o.stuck_max_ops = 2;
    cr_assert_eq(ep_open_opts(&a, &o), 0);
    ep_open(&b);
    ds_transport_peer p;
    cr_assert_eq(ds_transport_peer_add(a.t, b.addr, &p), 0);
    cr_assert_eq(ds_transport_inproc_kill(b.addr, 1), 0);
    static uint8_t data[4][64];
    tp_done d;
    tp_done_init(&d);
    lent l = {.m = PTHREAD_MUTEX_INITIALIZER};
    uint64_t dl = ds_now_ms() + 200;
    cr_assert_eq(send_lent(&a, p, data[0], 64, dl, &d, &l), 0);
    cr_assert_eq(send_lent(&a, p, data[1], 64, dl, &d, &l), 0);
    cr_assert_eq(tp_done_wait(&d, 2, 3000), 2);
    cr_assert_eq(ep_wait_event(&a, DS_TRANSPORT_EV_RESET, 1), 1, "the stuck bound resets");
    cr_assert_eq(lent_wait(&l, 2, 3000), 2);
    /* Two more, one timed out and one still waiting when the endpoint
     * closes: the waiting one is cancelled, both are released. */
    cr_assert_eq(send_lent(&a, p, data[2], 64, ds_now_ms() + 200, &d, &l), 0);
    cr_assert_eq(tp_done_wait(&d, 3, 3000), 3);
    cr_assert_eq(send_lent(&a, p, data[3], 64, ds_now_ms() + 60000, &d, &l), 0);
    ep_close(&a);
    cr_assert_eq(d.ok + d.timeouts + d.other, 4);
    cr_assert_eq(d.timeouts, 3);
    cr_assert_eq(d.last_error, -ECANCELED);
    cr_assert_eq(lent_count(&l), 4);
    ep_close(&b);
}

Test(inproc, dropped_message_is_reported_sent_and_never_arrives)
{
    struct ep a, b;
    ep_open(&a);
    ep_open(&b);
    ds_transport_peer p;
    cr_assert_eq(ds_transport_peer_add(a.t, b.addr, &p), 0);
    cr_assert_eq(ds_transport_inproc_drop(b.addr, 1), 0);
    cr_assert_eq(ds_transport_send_wait(a.t, p, "lost", 4, ds_now_ms() + 3000), 0);
    cr_assert_eq(ds_transport_send_wait(a.t, p, "kept", 4, ds_now_ms() + 3000), 0);
    tp_item *it = tp_inbox_pop(&b.in, 3000);
    cr_assert(it);
    cr_assert_eq(memcmp(it->data, "kept", 4), 0);
    tp_item_free(it);
    cr_assert_null(tp_inbox_pop(&b.in, 50));
    ep_close(&a);
    ep_close(&b);
}

Test(inproc, queue_bound_removal_and_a_new_peer)
{
    struct ep a, b;
    ds_transport_opts o;
    ep_opts(&o);
    o.max_queued_bytes = 10000;
    cr_assert_eq(ep_open_opts(&a, &o), 0);
    ep_open(&b);
    ds_transport_peer p;
    cr_assert_eq(ds_transport_peer_add(a.t, b.addr, &p), 0);
    cr_assert_eq(ds_transport_inproc_kill(b.addr, 1), 0); /* sends wait */
    static uint8_t buf[4000];
    tp_done d;
    tp_done_init(&d);
    const uint64_t dl = ds_now_ms() + 30000;
    cr_assert_eq(send_copy(&a, p, buf, sizeof(buf), dl, &d), 0);
    cr_assert_eq(send_copy(&a, p, buf, sizeof(buf), dl, &d), 0);
    cr_assert_eq(send_copy(&a, p, buf, sizeof(buf), dl, &d), -ENOBUFS);
    /* Removal cancels what waits; the handle is gone. */
    cr_assert_eq(ds_transport_peer_remove(a.t, p), 0);
    cr_assert_eq(tp_done_wait(&d, 2, 3000), 2);
    cr_assert_eq(d.other, 2);
    cr_assert_eq(d.last_error, -ECANCELED);
    cr_assert_eq(send_copy(&a, p, buf, 10, dl, NULL), -ENOENT);
    cr_assert_eq(ds_transport_peer_remove(a.t, p), -ENOENT);
    /* b, alive again, writes to a: a new peer with a new handle. */
    cr_assert_eq(ds_transport_inproc_kill(b.addr, 0), 0);
    ds_transport_peer pa;
    cr_assert_eq(ds_transport_peer_add(b.t, a.addr, &pa), 0);
    cr_assert_eq(ds_transport_send_wait(b.t, pa, "hi", 2, ds_now_ms() + 3000), 0);
    tp_item *it = tp_inbox_pop(&a.in, 3000);
    cr_assert(it);
    cr_assert_neq(it->peer, p);
    cr_assert_eq(ep_wait_event(&a, DS_TRANSPORT_EV_PEER_NEW, 1), 1);
    tp_item_free(it);
    cr_assert_eq(ep_stats(&a).queued_bytes, 0);
    ep_close(&a);
    ep_close(&b);
}

Test(inproc, receive_drops_too_big_and_peers_full)
{
    struct ep a, b, c;
    ds_transport_opts o;
    ep_opts(&o);
    o.max_msg_bytes = 1000;
    o.max_peers = 1;
    cr_assert_eq(ep_open_opts(&a, &o), 0);
    ep_open(&b);
    ep_open(&c);
    ds_transport_peer pb, pc;
    cr_assert_eq(ds_transport_peer_add(b.t, a.addr, &pb), 0);
    cr_assert_eq(ds_transport_peer_add(c.t, a.addr, &pc), 0);
    static uint8_t big[1001];
    cr_assert_eq(ds_transport_send_wait(b.t, pb, big, sizeof(big), ds_now_ms() + 3000), 0);
    cr_assert_eq(ds_transport_send_wait(b.t, pb, big, 1000, ds_now_ms() + 3000), 0);
    tp_item *it = tp_inbox_pop(&a.in, 3000);
    cr_assert(it);
    cr_assert_eq(it->len, 1000, "the 1001-byte message was dropped, the next one arrived");
    tp_item_free(it);
    cr_assert_eq(ep_stats(&a).drops[DS_TP_DROP_TOO_BIG], 1);
    /* a's one slot is b's: c is refused. */
    cr_assert_eq(ds_transport_send_wait(c.t, pc, "x", 1, ds_now_ms() + 3000), 0);
    uint64_t end = ds_now_ms() + 3000;
    while (ep_stats(&a).drops[DS_TP_DROP_PEERS_FULL] < 1 && ds_now_ms() < end)
        usleep(2000);
    cr_assert_eq(ep_stats(&a).drops[DS_TP_DROP_PEERS_FULL], 1);
    cr_assert_null(tp_inbox_pop(&a.in, 50));
    ep_close(&a);
    ep_close(&b);
    ep_close(&c);
}

/* ---- node/net over inproc ------------------------------------------------- */

static void net_pair(node *a, node *b, enum ds_sec_mode mode, uint32_t hs_timeout_ms)
{
    node_opts o = {.mode = mode, .key = &g_key, .name = "alpha", .provider = DS_TRANSPORT_INPROC,
                   .handshake_timeout_ms = hs_timeout_ms};
    cr_assert_eq(node_open(a, &o), 0);
    o.name = "beta";
    cr_assert_eq(node_open(b, &o), 0);
}

/* A STATE_CHUNK of n pattern bytes from a to b, lent or copied. */
static void send_chunk(node *a, node *b, const uint8_t *data, size_t n, int lend, lent *l,
                       tp_done *d)
{
    ds_wire_msg m;
    memset(&m, 0, sizeof(m));
    m.h.type = DS_MSG_STATE_CHUNK;
    m.h.count = (uint32_t)n;
    m.u.chunk.total = n;
    m.u.chunk.data = data;
    ds_net_send_opts so = {.deadline_ms = ds_now_ms() + 10000, .done = tp_done_cb, .done_arg = d};
    if (lend)
        cr_assert_eq(ds_net_send_msg_ref(a->n, b->id.id, NULL, &m, &so, lent_release, l), 0);
    else
        cr_assert_eq(ds_net_send_msg(a->n, b->id.id, NULL, &m, &so), 0);
}

static void expect_chunk(node *b, const uint8_t *data, size_t n)
{
    nt_item *it = node_pop(b, 10000);
    cr_assert(it, "state chunk missing");
    ds_wire_msg got;
    ds_wire_bufs bufs = {0};
    cr_assert_eq(ds_net_decode(b->n, &(ds_net_rx){.frame = it->frame, .len = it->len}, &bufs, &got),
                 DS_DROP_NONE);
    cr_assert_eq(got.h.type, DS_MSG_STATE_CHUNK);
    cr_assert_eq(got.h.count, n);
    cr_assert_eq(memcmp(got.u.chunk.data, data, n), 0, "chunk differs");
    item_free(it);
}

Test(inproc, net_sessions_every_mode_both_ways)
{
    const enum ds_sec_mode modes[] = {DS_SEC_NONE, DS_SEC_AUTH, DS_SEC_ENCRYPT};
    const size_t n = (3u << 20) + 5;
    uint8_t *data = malloc(n);
    cr_assert(data);
    for (int k = 0; k < 3; k++) {
        node a, b;
        net_pair(&a, &b, modes[k], 0);
        tp_pattern_fill(data, n, SEED, (uint64_t)k);
        const uint64_t dl = ds_now_ms() + 10000;
        /* a knows only b's address; the frame waits for the handshake. */
        cr_assert_eq(send_stale(&a, 0, b.addr, 7, dl, NULL), 0);
        expect_stale(&b, a.id.id, 7, 5000);
        cr_assert(ds_net_connected(a.n, b.id.id));
        cr_assert_eq(send_stale(&b, a.id.id, NULL, 8, dl, NULL), 0);
        expect_stale(&a, b.id.id, 8, 5000);
        /* A 3 MiB state chunk each way, lent from a (zero copy in mode
         * none), copied from b. */
        lent l = {.m = PTHREAD_MUTEX_INITIALIZER};
        tp_done d;
        tp_done_init(&d);
        send_chunk(&a, &b, data, n, 1, &l, &d);
        expect_chunk(&b, data, n);
        send_chunk(&b, &a, data, n, 0, NULL, &d);
        expect_chunk(&a, data, n);
        cr_assert_eq(tp_done_wait(&d, 2, 5000), 2);
        cr_assert_eq(d.ok, 2);
        cr_assert_eq(lent_wait(&l, 1, 5000), 1);
        /* Many frames in order. */
        for (uint64_t r = 1; r <= 500; r++)
            cr_assert_eq(send_stale(&a, b.id.id, NULL, r, dl, NULL), 0);
        for (uint64_t r = 1; r <= 500; r++)
            expect_stale(&b, a.id.id, r, 5000);
        ds_net_stats st;
        ds_net_stats_get(b.n, &st);
        cr_assert_eq(st.handshakes_ok, 1);
        cr_assert_eq(st.sessions, 1);
        cr_assert_eq(ds_drop_total(ds_net_drops(a.n)), 0);
        cr_assert_eq(ds_drop_total(ds_net_drops(b.n)), 0);
        node_close(&a);
        node_close(&b);
    }
    free(data);
}

Test(inproc, net_lost_hello_fails_the_handshake_then_the_next_works)
{
    node a, b;
    net_pair(&a, &b, DS_SEC_ENCRYPT, 300);
    cr_assert_eq(ds_transport_inproc_drop(b.addr, 1), 0); /* the HELLO */
    tp_done d;
    tp_done_init(&d);
    cr_assert_eq(send_stale(&a, 0, b.addr, 1, ds_now_ms() + 5000, &d), 0);
    cr_assert_eq(node_wait_event(&a, DS_NET_EV_HANDSHAKE_FAILED, 1), 1);
    cr_assert_eq(a.last_hs_status, -ETIMEDOUT);
    cr_assert_eq(tp_done_wait(&d, 1, 3000), 1);
    cr_assert_eq(d.timeouts, 1, "the waiting frame fails with its handshake");
    cr_assert_null(node_pop(&b, 50));
    cr_assert_eq(send_stale(&a, 0, b.addr, 2, ds_now_ms() + 5000, NULL), 0);
    expect_stale(&b, a.id.id, 2, 5000);
    node_close(&a);
    node_close(&b);
}

Test(inproc, net_dead_peer_is_unresponsive_then_recovers)
{
    node a, b;
    net_pair(&a, &b, DS_SEC_AUTH, 0);
    cr_assert_eq(send_stale(&a, 0, b.addr, 1, ds_now_ms() + 5000, NULL), 0);
    expect_stale(&b, a.id.id, 1, 5000);
    cr_assert_eq(ds_transport_inproc_kill(b.addr, 1), 0);
    tp_done d;
    tp_done_init(&d);
    const uint64_t dl = ds_now_ms() + 300;
    cr_assert_eq(send_stale(&a, b.id.id, NULL, 2, dl, &d), 0);
    cr_assert_eq(tp_done_wait(&d, 1, 3000), 1);
    cr_assert_eq(d.timeouts, 1);
    cr_assert_leq(d.last_ms, dl + 1000);
    cr_assert_eq(node_wait_event(&a, DS_NET_EV_PEER_UNRESPONSIVE, 1), 1);
    ds_net_stats st;
    ds_net_stats_get(a.n, &st);
    cr_assert_eq(st.send_failures, 1);
    cr_assert_eq(st.transport.stuck_ops, 1);
    /* Back: the session still stands and frames flow both ways. */
    cr_assert_eq(ds_transport_inproc_kill(b.addr, 0), 0);
    cr_assert_eq(send_stale(&a, b.id.id, NULL, 3, ds_now_ms() + 5000, NULL), 0);
    expect_stale(&b, a.id.id, 3, 5000);
    cr_assert_eq(node_wait_event(&a, DS_NET_EV_PEER_RESPONSIVE, 1), 1);
    cr_assert_eq(send_stale(&b, a.id.id, NULL, 4, ds_now_ms() + 5000, NULL), 0);
    expect_stale(&a, b.id.id, 4, 5000);
    node_close(&a);
    node_close(&b);
}

/* ---- node/gossip/state over inproc ----------------------------------------- */

/* dsnode's on_recv for state frames, on the net's worker thread. */
typedef struct state_ctx {
    ds_state *st;
    _Atomic unsigned reqs; /* STATE_REQs handed to st */
} state_ctx;

static int state_hook(void *ctx, ds_net_rx *rx)
{
    state_ctx *sc = ctx;
    if (!sc->st)
        return 0;
    if (rx->hdr.type == DS_MSG_STATE_REQ) {
        ds_state_on_req(sc->st, rx);
        atomic_fetch_add(&sc->reqs, 1);
    } else if (rx->hdr.type == DS_MSG_STATE_CHUNK) {
        ds_state_on_chunk(sc->st, rx);
    } else {
        return 0;
    }
    return 1;
}

/* Wait until the server's hook has handed over `n` requests. */
static void wait_reqs(state_ctx *sc, unsigned n)
{
    uint64_t end = ds_now_ms() + 5000;
    while (atomic_load(&sc->reqs) < n && ds_now_ms() < end)
        usleep(2000);
    cr_assert_eq(atomic_load(&sc->reqs), n, "STATE_REQ did not arrive");
}

static void theta_fill(float *theta, size_t n, int round)
{
    for (size_t i = 0; i < n; i++)
        theta[i] = (float)(i % 1000) * 0.001f * (float)round - 0.5f;
}

Test(inproc, state_transfer_to_a_joiner_while_another_requester_is_dead)
{
    node a, b, c;
    state_ctx sa = {0}, sb = {0}, sc = {0};
    net_pair(&a, &b, DS_SEC_NONE, 0); /* mode none: the snapshot is lent */
    node_opts o = {.mode = DS_SEC_NONE, .key = &g_key, .name = "gamma",
                   .provider = DS_TRANSPORT_INPROC};
    cr_assert_eq(node_open(&c, &o), 0);
    a.hook = b.hook = c.hook = state_hook;
    a.hook_ctx = &sa;
    b.hook_ctx = &sb;
    c.hook_ctx = &sc;
    const size_t n = 700001; /* 2.8 MB: three 1 MiB chunks, the last one odd */
    float *theta = malloc(n * sizeof(float)), *got = malloc(n * sizeof(float));
    cr_assert(theta && got);
    theta_fill(theta, n, 1);
    cr_assert_eq(ds_state_create(&sa.st, a.n, n, 1u << 20), 0);
    cr_assert_eq(ds_state_create(&sb.st, b.n, n, 1u << 20), 0);
    cr_assert_eq(ds_state_create(&sc.st, c.n, n, 1u << 20), 0);
    const uint64_t dl = ds_now_ms() + 10000;
    cr_assert_eq(ds_state_request(sc.st, a.id.id, a.addr, dl), 0);
    cr_assert_eq(ds_state_request(sb.st, a.id.id, a.addr, dl), 0);
    wait_reqs(&sa, 2);
    /* c dies before the server serves: its chunks stay lent. */
    cr_assert_eq(ds_transport_inproc_kill(c.addr, 1), 0);
    /* The deadline covers packing, hashing and sending 2.8 MB: 400 ms was
     * too short for the ThreadSanitizer build on a busy machine. */
    cr_assert_eq(ds_state_serve(sa.st, theta, 42, 1, 50, 2.5, 77, ds_now_ms() + 1500), 2);
    ds_state_info info;
    cr_assert_eq(ds_state_wait(sb.st, ds_now_ms() + 5000, got, &info), 0);
    cr_assert_eq(info.step, 42);
    cr_assert_eq(info.round, 50);
    cr_assert_eq(info.lag_rounds, 77);
    cr_assert_eq(info.from, a.id.id);
    cr_assert_eq(memcmp(got, theta, n * sizeof(float)), 0, "state differs");
    uint64_t end = ds_now_ms() + 5000;
    ds_net_stats st;
    do {
        usleep(5000);
        ds_net_stats_get(a.n, &st);
    } while (st.transport.stuck_ops < 3 && ds_now_ms() < end);
    cr_assert_eq(st.transport.stuck_ops, 3, "c's three chunks are stuck");
    /* The server's state object goes first; the stuck chunks still point
     * into its snapshot, released when the net closes (the sanitizer build
     * would see a use after free). */
    ds_state *gone = sa.st;
    sa.st = NULL; /* (no more state frames come to a) */
    ds_state_destroy(&gone);
    node_close(&a);
    node_close(&b);
    node_close(&c);
    ds_state_destroy(&sb.st);
    ds_state_destroy(&sc.st);
    free(theta);
    free(got);
}

Test(inproc, state_server_dies_after_the_request_then_serves_again)
{
    node a, b;
    state_ctx sa = {0}, sb = {0};
    net_pair(&a, &b, DS_SEC_ENCRYPT, 0); /* copied chunks */
    a.hook = b.hook = state_hook;
    a.hook_ctx = &sa;
    b.hook_ctx = &sb;
    const size_t n = 300000;
    float *theta = malloc(n * sizeof(float)), *got = malloc(n * sizeof(float));
    cr_assert(theta && got);
    cr_assert_eq(ds_state_create(&sa.st, a.n, n, 1u << 20), 0);
    cr_assert_eq(ds_state_create(&sb.st, b.n, n, 1u << 20), 0);
    theta_fill(theta, n, 1);
    cr_assert_eq(ds_state_request(sb.st, a.id.id, a.addr, ds_now_ms() + 5000), 0);
    wait_reqs(&sa, 1);
    cr_assert_eq(ds_transport_inproc_kill(a.addr, 1), 0);
    cr_assert_eq(ds_state_serve(sa.st, theta, 7, 1, 5, 1.0, 32, ds_now_ms() + 300), 1);
    ds_state_info info;
    const uint64_t t0 = ds_now_ms();
    cr_assert_eq(ds_state_wait(sb.st, t0 + 600, got, &info), -ETIMEDOUT);
    cr_assert_geq(ds_now_ms(), t0 + 600);
    /* Back: a second request is served. */
    cr_assert_eq(ds_transport_inproc_kill(a.addr, 0), 0);
    theta_fill(theta, n, 2);
    cr_assert_eq(ds_state_request(sb.st, a.id.id, NULL, ds_now_ms() + 5000), 0);
    wait_reqs(&sa, 2);
    cr_assert_eq(ds_state_serve(sa.st, theta, 8, 1, 6, 1.0, 32, ds_now_ms() + 5000), 1);
    cr_assert_eq(ds_state_wait(sb.st, ds_now_ms() + 5000, got, &info), 0);
    cr_assert_eq(info.step, 8);
    cr_assert_eq(memcmp(got, theta, n * sizeof(float)), 0);
    node_close(&a);
    node_close(&b);
    ds_state_destroy(&sa.st);
    ds_state_destroy(&sb.st);
    free(theta);
    free(got);
}

/* ---- node/gossip/gossip_net over inproc ------------------------------------ */

/* dsnode's on_recv for gossip frames, on the net's worker thread. */
static int gossip_hook(void *ctx, ds_net_rx *rx)
{
    ds_gnet *g = *(ds_gnet **)ctx;
    if (!g || !ds_gnet_handles(rx->hdr.type))
        return 0;
    ds_gnet_on_frame(g, rx);
    return 1;
}

typedef struct gnode {
    node nd;
    ds_gnet *g;
} gnode;

static void gnode_open_sized(gnode *x, const char *name, uint32_t max_count, size_t queue)
{
    node_opts o = {.mode = DS_SEC_ENCRYPT, .key = &g_key, .name = name,
                   .provider = DS_TRANSPORT_INPROC};
    x->g = NULL;
    cr_assert_eq(node_open(&x->nd, &o), 0);
    cr_assert_eq(ds_gnet_create(&x->g, x->nd.n, max_count, queue), 0);
    x->nd.hook = gossip_hook;
    x->nd.hook_ctx = &x->g;
}

static void gnode_open(gnode *x, const char *name)
{
    gnode_open_sized(x, name, 4096, 1u << 20);
}

static void gnode_close(gnode *x)
{
    ds_net_close(&x->nd.n); /* the worker stops before the gnet goes */
    ds_gnet_destroy(&x->g);
    node_close(&x->nd);
}

/* The same two-node view on both: [a, b]. */
static void gnet_views(gnode *a, gnode *b)
{
    const uint64_t ids[2] = {a->nd.id.id, b->nd.id.id};
    const char *addrs[2] = {a->nd.addr, b->nd.addr};
    cr_assert_eq(ds_gnet_set_view(a->g, ids, addrs, 2), 0);
    cr_assert_eq(ds_gnet_set_view(b->g, ids, addrs, 2), 0);
}

static uint64_t ns_in(int ms)
{
    return ds_now_ns() + (uint64_t)ms * 1000000u;
}

/* Receive one gossip message at x within 5 s; it must be of this type,
 * from view index `from`, for `round`. */
static void gexpect(gnode *x, uint8_t type, uint32_t from, uint64_t round, ds_gmsg *m)
{
    const ds_gossip_io *io = ds_gnet_io(x->g);
    cr_assert_eq(io->recv(io->ctx, m, ns_in(5000)), 1, "gossip type %u missing", type);
    cr_assert_eq(m->type, type);
    cr_assert_eq(m->from, from);
    cr_assert_eq(m->round, round);
}

Test(inproc, gossip_net_every_message_type_through_the_io_seam)
{
    gnode a, b;
    gnode_open(&a, "alpha");
    gnode_open(&b, "beta");
    gnet_views(&a, &b);
    const ds_gossip_io *ia = ds_gnet_io(a.g), *ib = ds_gnet_io(b.g);
    uint32_t idx[5] = {3, 17, 200, 1000, 4095};
    float val[5] = {0.5f, -1.25f, 3.0f, 1e-3f, -7.5f}, resp[5] = {1, 2, 3, 4, 5};
    /* REQ a -> b (sparse), RESP b -> a. */
    ds_gmsg req = {.type = DS_GMSG_REQ, .from = 0, .to = 1, .epoch = 3, .round = 11,
                   .round_now = 11, .segment = 2, .seg_len = 4096, .count = 5, .idx = idx,
                   .val = val};
    cr_assert_eq(ia->send(ia->ctx, &req, ns_in(5000)), 0);
    ds_gmsg m;
    gexpect(&b, DS_GMSG_REQ, 0, 11, &m);
    cr_assert_eq(m.segment, 2);
    cr_assert_eq(m.epoch, 3);
    cr_assert_eq(m.count, 5);
    cr_assert_eq(memcmp(m.idx, idx, sizeof(idx)), 0);
    cr_assert_eq(memcmp(m.val, val, sizeof(val)), 0);
    ds_gmsg rsp = {.type = DS_GMSG_RESP, .from = 1, .to = 0, .epoch = 3, .round = 11,
                   .round_now = 11, .segment = 2, .count = 5, .val = resp};
    cr_assert_eq(ib->send(ib->ctx, &rsp, ns_in(5000)), 0);
    gexpect(&a, DS_GMSG_RESP, 1, 11, &m);
    cr_assert_eq(m.count, 5);
    cr_assert_eq(memcmp(m.val, resp, sizeof(resp)), 0);
    /* STALE, the dense crossover push, an all-reduce chunk. */
    ds_gmsg stale = {.type = DS_GMSG_STALE, .to = 1, .round = 10, .round_now = 12};
    cr_assert_eq(ia->send(ia->ctx, &stale, ns_in(5000)), 0);
    gexpect(&b, DS_GMSG_STALE, 0, 10, &m);
    cr_assert_eq(m.round_now, 12);
    float dense[64];
    for (int i = 0; i < 64; i++)
        dense[i] = (float)i * 0.25f;
    ds_gmsg cross = {.type = DS_GMSG_CROSS, .to = 0, .round = 13, .round_now = 13, .segment = 1,
                     .seg_len = 64, .count = 64, .val = dense};
    cr_assert_eq(ib->send(ib->ctx, &cross, ns_in(5000)), 0);
    gexpect(&a, DS_GMSG_CROSS, 1, 13, &m);
    cr_assert_eq(m.count, 64);
    cr_assert_eq(memcmp(m.val, dense, sizeof(dense)), 0);
    ds_gmsg ared = {.type = DS_GMSG_ARED, .to = 1, .round = 99, .round_now = 99, .segment = 1,
                    .count = 64, .val = dense};
    cr_assert_eq(ia->send(ia->ctx, &ared, ns_in(5000)), 0);
    gexpect(&b, DS_GMSG_ARED, 0, 99, &m);
    cr_assert_eq(m.segment, 1);
    cr_assert_eq(memcmp(m.val, dense, sizeof(dense)), 0);
    /* Out of range of the view: refused at once. */
    ds_gmsg nowhere = stale;
    nowhere.to = 2;
    cr_assert_eq(ia->send(ia->ctx, &nowhere, ns_in(5000)), -EHOSTUNREACH);
    /* A third node outside b's view: its frame is dropped at recv. */
    gnode c;
    gnode_open(&c, "gamma");
    const uint64_t cids[2] = {c.nd.id.id, b.nd.id.id};
    const char *caddrs[2] = {c.nd.addr, b.nd.addr};
    cr_assert_eq(ds_gnet_set_view(c.g, cids, caddrs, 2), 0);
    const ds_gossip_io *ic = ds_gnet_io(c.g);
    cr_assert_eq(ic->send(ic->ctx, &stale, ns_in(5000)), 0);
    ds_gnet_stats gs;
    const uint64_t end = ds_now_ms() + 5000;
    do {
        cr_assert_eq(ib->recv(ib->ctx, &m, ns_in(50)), 0, "nothing from outside the view");
        ds_gnet_stats_get(b.g, &gs);
    } while (gs.dropped_not_in_view < 1 && ds_now_ms() < end);
    cr_assert_eq(gs.dropped_not_in_view, 1);
    cr_assert_eq(gs.dropped_decode, 0);
    gnode_close(&c);
    gnode_close(&a);
    gnode_close(&b);
}

/* Large frames are queued in memory kept from earlier ones (glibc would
 * hand it back and fault it in again for each): one that fits is reused,
 * one too small or more than twice the size is not, and every frame
 * arrives whole whatever it was queued in. */
Test(inproc, gossip_net_reuses_large_queue_entries_and_delivers_them_whole)
{
    gnode a, b;
    gnode_open_sized(&a, "alpha", 1u << 18, 8u << 20);
    gnode_open_sized(&b, "beta", 1u << 18, 8u << 20); /* kept: at most 2 MiB */
    gnet_views(&a, &b);
    const ds_gossip_io *ia = ds_gnet_io(a.g), *ib = ds_gnet_io(b.g);
    /* Frames of 80 KB, again (reused), 240 KB (too large for that one:
     * new), 64 KB (the 80 KB one; the 240 KB one is more than twice its
     * size), 16 KB (under 64 KiB: neither reused nor kept), 240 KB. */
    static const uint32_t counts[] = {20000, 20000, 60000, 16384, 4096, 60000};
    static const uint64_t reused_after[] = {0, 1, 1, 2, 2, 3};
    float *v = malloc(60000 * sizeof(float));
    cr_assert_not_null(v);
    for (size_t k = 0; k < sizeof(counts) / sizeof(counts[0]); k++) {
        for (uint32_t j = 0; j < counts[k]; j++)
            v[j] = (float)(k * 100000 + j);
        ds_gmsg ared = {.type = DS_GMSG_ARED, .to = 1, .round = 100 + k, .round_now = 100 + k,
                        .segment = 1, .count = counts[k], .val = v};
        cr_assert_eq(ia->send(ia->ctx, &ared, ns_in(5000)), 0);
        ds_gmsg m;
        gexpect(&b, DS_GMSG_ARED, 0, 100 + k, &m);
        cr_assert_eq(m.count, counts[k]);
        cr_assert_eq(memcmp(m.val, v, counts[k] * sizeof(float)), 0, "frame %zu", k);
        /* A poll hands the frame back (kept), before the next one is sent. */
        cr_assert_eq(ib->recv(ib->ctx, &m, 0), 0);
        ds_gnet_stats gs;
        ds_gnet_stats_get(b.g, &gs);
        cr_expect_eq(gs.queue_reused, reused_after[k], "after frame %zu: %llu reused", k,
                     (unsigned long long)gs.queue_reused);
    }
    free(v);
    gnode_close(&a);
    gnode_close(&b);
}

Test(inproc, gossip_net_req_to_a_dead_peer_never_arrives_then_recovers)
{
    gnode a, b;
    gnode_open(&a, "alpha");
    gnode_open(&b, "beta");
    gnet_views(&a, &b);
    const ds_gossip_io *ia = ds_gnet_io(a.g), *ib = ds_gnet_io(b.g);
    ds_gmsg stale = {.type = DS_GMSG_STALE, .to = 1, .round = 1, .round_now = 1};
    ds_gmsg m;
    /* A session first, so the dead peer's failure is the transport's. */
    cr_assert_eq(ia->send(ia->ctx, &stale, ns_in(5000)), 0);
    gexpect(&b, DS_GMSG_STALE, 0, 1, &m);
    cr_assert_eq(ds_transport_inproc_kill(b.nd.addr, 1), 0);
    stale.round = stale.round_now = 2;
    cr_assert_eq(ia->send(ia->ctx, &stale, ns_in(300)), 0);
    cr_assert_eq(ib->recv(ib->ctx, &m, ns_in(600)), 0, "a dead node receives nothing");
    cr_assert_eq(node_wait_event(&a.nd, DS_NET_EV_PEER_UNRESPONSIVE, 1), 1);
    cr_assert_eq(ds_transport_inproc_kill(b.nd.addr, 0), 0);
    stale.round = stale.round_now = 3;
    cr_assert_eq(ia->send(ia->ctx, &stale, ns_in(5000)), 0);
    gexpect(&b, DS_GMSG_STALE, 0, 3, &m);
    cr_assert_eq(node_wait_event(&a.nd, DS_NET_EV_PEER_RESPONSIVE, 1), 1);
    gnode_close(&a);
    gnode_close(&b);
}
