/*
 * node/transport/progress.c: the libfabric backend's progress thread, its
 * resets, and the backend's open and close.
 *
 * Decision (docs/transport.md, "Threads"): one progress thread per
 * endpoint makes every libfabric call, so the domain is opened
 * FI_THREAD_DOMAIN and the application never drives progress. Each pass:
 * take what other threads queued (sends, peer additions and removals, a
 * reset request), post receives and sends, read the completion queue, scan
 * deadlines when the earliest falls due, age the quarantine once a second,
 * and reset when the abandoned sends pass their bound. When idle it sleeps
 * in poll() on the CQ's wait fd (after fi_trywait) and the eventfd that
 * other threads write, never longer than the next deadline or TP_TICK_MS;
 * after activity it spins 50 us first (500 us without a wait fd), since
 * the next completion is usually microseconds away.
 *
 * A reset closes the whole stack, which is the only way to make libfabric
 * 1.17 let go of sends stuck toward a killed or frozen peer: every buffer
 * is ours again, unfinished sends fail -ENETRESET, queued-but-unposted ones
 * go out on the new endpoint, our streams restart at seq 1, and received
 * streams resume at whatever seq comes next. The stack reopens on the same
 * address, retried every 200 ms if that fails.
 */
#include "config.h"

#include <errno.h>
#include <inttypes.h>
#include <poll.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <rdma/fabric.h>
#include <rdma/fi_eq.h>

#include "base/clock.h"
#include "base/log.h"
#include "node/transport/internal.h"

void fab_wake(tp_fab *t)
{
    uint64_t one = 1;
    ssize_t r = write(t->evfd, &one, sizeof(one));
    (void)r; /* EAGAIN: the counter is already non-zero, a wake-up is pending */
}

/* ---- requests from application threads -------------------------------- */

/* Peers added (AV insert) or removed (drain) since the last look. */
static void take_peer_changes(tp_fab *t)
{
    for (uint32_t i = 0; i < t->npeers; i++) {
        struct tp_peer *p = &t->peers[i];
        pthread_mutex_lock(&t->lock);
        uint8_t state = p->state, need_av = p->need_av;
        p->need_av = 0;
        if (state == PEER_REMOVING)
            p->state = PEER_DRAINING;
        pthread_mutex_unlock(&t->lock);
        if (state == PEER_LIVE && need_av) {
            if (!t->broken)
                fab_av_insert(t, i);
        } else if (state == PEER_REMOVING) {
            fab_peer_drain(t, i);
        }
    }
}

static int take_requests(tp_fab *t, int *stop, int *reset)
{
    struct op_list q;
    int dirty;
    pthread_mutex_lock(&t->lock);
    q = t->subq;
    t->subq.head = t->subq.tail = NULL;
    *stop = t->stop;
    *reset = t->reset_req;
    t->reset_req = 0;
    dirty = t->peers_dirty;
    t->peers_dirty = 0;
    pthread_mutex_unlock(&t->lock);

    int n = 0;
    if (dirty) {
        take_peer_changes(t);
        n++;
    }
    while (q.head) {
        struct tp_op *op = q.head;
        q.head = op->next;
        struct tp_peer *p = &t->peers[op->slot];
        if (p->state != PEER_LIVE) {
            fab_op_report(t, op, -ECANCELED);
            fab_op_free(t, op);
            continue;
        }
        list_push_tail(&p->txq, op);
        op->where = OP_TXQ;
        fab_mark_busy(t, op->slot);
        fab_due(t, op->deadline_ms);
        n++;
    }
    return n;
}

/* ---- reset ------------------------------------------------------------ */

static void rx_pool_unpost_all(tp_fab *t)
{
    for (unsigned i = 0; i < t->nrx; i++)
        t->rx[i]->posted = 0;
    t->rx_unposted = t->nrx;
    fab_quarantine_free(t);
}

/* An op the closed stack held, or that had started on a stream that is
 * gone: report -ENETRESET and let it go (nothing can touch it now). */
static void op_settle_reset(tp_fab *t, struct tp_op *op)
{
    op->pending = 0;
    op->pending_bytes = 0;
    op->tainted = 0; /* the stack is closed: nothing can touch it */
    if (!op->reported)
        fab_op_report(t, op, -ENETRESET);
    fab_op_retire(t, op);
}

/* The sends of one peer after the stack closed. */
static void reset_peer_sends(tp_fab *t, struct tp_peer *p)
{
    while (p->ctrlq.head) {
        struct tp_op *cop = p->ctrlq.head;
        list_unlink(&p->ctrlq, cop);
        cop->where = OP_NOWHERE;
        fab_op_free(t, cop);
    }
    /* Nothing is pending in libfabric any more. */
    while (p->inflight.head)
        op_settle_reset(t, p->inflight.head);
    struct tp_op *op = p->txq.head, *nx;
    for (; op; op = nx) {
        nx = op->next;
        if (op->is_abort || op->next_chunk > 0) {
            op_settle_reset(t, op); /* partly posted: its stream is gone */
        } else {
            free(op->chunks);
            op->chunks = NULL;
            op->seq = 0;
        }
    }
    p->inflight_bytes = 0;
    p->tx_stream = 0; /* a fresh one at the next post */
    p->tx_seq = 0;
}

/* One peer after the stack closed: sends, streams, grants. */
static void reset_peer(tp_fab *t, uint32_t slot)
{
    struct tp_peer *p = &t->peers[slot];
    reset_peer_sends(t, p);
    /* The peer does not know we reset: its stream goes on, minus what was
     * in flight on the closed connection. Resynchronise on the next seq it
     * sends rather than wait for the lost ones. */
    for (int k = 0; k < TP_STREAMS; k++) {
        fab_rxs_clear(t, &p->rxs[k], DS_TP_DROP_STALE_STREAM);
        p->rxs[k].resync = 1;
    }
    p->in_av = 0;
    /* Grants: the buffers we posted for it are gone (tell it, so it stops
     * using their tags); those it posted for us still stand. */
    int had = p->grants_out > 0;
    p->grants_out = 0;
    p->need = 0;
    p->gbatch_n = 0;
    p->grant_stream = 0;
    /* and the grants we held: our new stream asks again, and the receiver
     * takes back those our old one held */
    p->gr_head = p->gr_n = 0;
    p->need_sent = 0;
    p->req_pending = 0;
    if (p->state == PEER_DRAINING) {
        fab_peer_free_slot(t, slot);
    } else if (had) {
        uint8_t pl[TP_CTRL_HEAD];
        tp_ctrl_put_head(pl, TP_CTRL_VOID, 0);
        fab_ctrl_send(t, slot, pl, sizeof(pl)); /* posted after the reopen */
    }
}

/* Close the stack (libfabric discards everything outstanding), settle every
 * op, reopen on the same address (try_reopen). */
static void do_reset(tp_fab *t, const char *why)
{
    uint64_t stuck = atomic_load(&t->st.stuck_ops);
    ds_warn(COMP, "resetting endpoint %s: %s stuck_ops=%" PRIu64 " stuck_bytes=%" PRIu64,
            t->pub.addr_text, why, stuck, (uint64_t)atomic_load(&t->st.stuck_bytes));
    fab_stack_close(t);
    rx_pool_unpost_all(t);
    fab_grants_free(t);
    for (uint32_t slot = 0; slot < t->npeers; slot++)
        if (t->peers[slot].state != PEER_FREE)
            reset_peer(t, slot);
    atomic_store(&t->st.stuck_ops, 0);
    atomic_store(&t->st.stuck_bytes, 0);
    ST_ADD(t, resets, 1);
    t->last_stream = 0;
    t->broken = 1;
    t->reopen_at_ms = 0;
    fab_event(t, DS_TRANSPORT_EV_RESET, UINT32_MAX, (int)stuck);
}

static void try_reopen(tp_fab *t)
{
    uint64_t now = ds_now_ms();
    if (now < t->reopen_at_ms)
        return;
    int r = fab_stack_open(t, t->listen_port);
    if (r) {
        ds_log_rl(DS_LOG_ERROR, COMP, "reopen on %s:%s failed (%d); retrying", t->listen_host,
                  t->listen_port, r);
        t->reopen_at_ms = now + 200;
        return;
    }
    t->broken = 0;
    for (uint32_t slot = 0; slot < t->npeers; slot++)
        if (t->peers[slot].state == PEER_LIVE)
            fab_av_insert(t, slot);
    ds_info(COMP, "endpoint %s reopened", t->pub.addr_text);
}

/* ---- the loop --------------------------------------------------------- */

static void wait_for_work(tp_fab *t, uint64_t now)
{
    int timeout = TP_TICK_MS;
    if (t->next_due_ms != UINT64_MAX) {
        uint64_t d = t->next_due_ms > now ? t->next_due_ms - now : 0;
        if (d < (uint64_t)timeout)
            timeout = (int)d;
    }
    if (t->eagain_seen || t->broken)
        timeout = timeout > 1 ? 1 : timeout;
    struct pollfd pf[2] = {{.fd = t->evfd, .events = POLLIN}, {.fd = -1, .events = POLLIN}};
    nfds_t n = 1;
    if (t->cq_fd >= 0 && !t->broken) {
        struct fid *f = &t->cq->fid;
        if (fi_trywait(t->fabric, &f, 1) != FI_SUCCESS)
            return; /* libfabric has work to do first */
        pf[1].fd = t->cq_fd;
        n = 2;
    } else if (timeout > 1) {
        timeout = 1; /* no wait object: the provider needs us to poll */
    }
    if (poll(pf, n, timeout) > 0 && (pf[0].revents & POLLIN)) {
        uint64_t v;
        ssize_t r = read(t->evfd, &v, sizeof(v));
        (void)r;
    }
}

static void free_list(tp_fab *t, struct op_list *l)
{
    while (l->head) {
        struct tp_op *op = l->head;
        list_unlink(l, op);
        op->where = OP_NOWHERE;
        fab_op_free(t, op);
    }
}

static void shutdown_all(tp_fab *t)
{
    /* Fail everything not yet reported, then close the stack so libfabric
     * lets go of every buffer, then release them. */
    for (uint32_t slot = 0; slot < t->npeers; slot++) {
        struct tp_peer *p = &t->peers[slot];
        for (struct tp_op *op = p->txq.head; op; op = op->next)
            fab_op_report(t, op, -ECANCELED);
        for (struct tp_op *op = p->inflight.head; op; op = op->next)
            fab_op_report(t, op, -ECANCELED);
    }
    fab_stack_close(t);
    fab_grants_free(t);
    for (uint32_t slot = 0; slot < t->npeers; slot++) {
        struct tp_peer *p = &t->peers[slot];
        free_list(t, &p->ctrlq);
        free_list(t, &p->txq);
        free_list(t, &p->inflight);
        fab_rx_clear(t, p, DS_TP_DROP_REMOVED_PEER);
    }
    fab_quarantine_free(t);
}

/* Abandoned sends (and quarantine) past their bound: time to reset. */
static int stuck_over_bound(tp_fab *t)
{
    return atomic_load_explicit(&t->st.stuck_ops, memory_order_relaxed) >= t->o.stuck_max_ops ||
           atomic_load_explicit(&t->st.stuck_bytes, memory_order_relaxed) +
                   atomic_load_explicit(&t->st.quarantined_bytes, memory_order_relaxed) >=
               t->o.stuck_max_bytes;
}

/* While the stack is closed: retry opening it; deadlines still run. 1 when
 * it is still closed (the pass is over). */
static int broken_pass(tp_fab *t)
{
    try_reopen(t);
    if (!t->broken)
        return 0;
    uint64_t now = ds_now_ms();
    if (now >= t->next_due_ms)
        fab_scan_due(t, now);
    wait_for_work(t, now);
    return 1;
}

static void *progress_main(void *arg)
{
    tp_fab *t = arg;
    pthread_setname_np(pthread_self(), "ds-transport");
    t->last_work_ns = ds_now_ns();
    for (;;) {
        int stop = 0, reset = 0;
        int work = take_requests(t, &stop, &reset);
        if (stop)
            break;
        if (reset && !t->broken)
            do_reset(t, "requested");
        if (t->broken && broken_pass(t))
            continue;
        work += fab_post_receives(t);
        work += fab_post_sends(t);
        work += fab_read_cq(t);
        uint64_t now = ds_now_ms();
        if (now >= t->next_due_ms)
            work += fab_scan_due(t, now);
        if (now >= t->next_quarantine_ms) {
            fab_quarantine_age(t, now);
            fab_grants_reclaim(t, now);
            fab_idle_scan(t, now);
            t->next_quarantine_ms = now + 1000;
        }
        if (stuck_over_bound(t)) {
            do_reset(t, "abandoned sends past the bound");
            continue;
        }
        uint64_t ns = ds_now_ns();
        if (work) {
            t->last_work_ns = ns;
            continue;
        }
        /* Without a wait fd (shm) spin briefly after activity, since the
         * sleep is a 1 ms poll: 50 us (shm spun 500 us, and four nodes on
         * two cores then trained at 0.55-0.66x of tcp; at 50 us as fast,
         * docs/benchmarks.md, "shm inside a host"). With one (tcp), sleep
         * at once: the wait fd wakes us as soon as a completion is there,
         * and a spin took the CPU the other threads of the exchange and
         * the training need (at 0 instead of 50 us: 7.5% more samples/s
         * and 8% less CPU for four nodes on two cores, and a shorter
         * round trip even on idle cores; docs/benchmarks.md, "The
         * transport's spin"). */
        const uint64_t spin_ns = t->cq_fd >= 0 ? 0 : 50000u;
        if (ns - t->last_work_ns < spin_ns)
            continue;
        wait_for_work(t, now);
    }
    shutdown_all(t);
    return NULL;
}

/* ---- open, close, and the rest of the ops ----------------------------- */

/* Everything but the head; the stack must be closed or never opened. */
static void fabric_free(tp_fab *t)
{
    fab_stack_close(t);
    fab_grants_free(t);
    fab_quarantine_free(t);
    if (t->rx) {
        for (unsigned i = 0; i < t->nrx; i++)
            if (t->rx[i]) {
                free(t->rx[i]->buf);
                free(t->rx[i]);
            }
        free(t->rx);
    }
    free(t->peers);
    if (t->evfd >= 0)
        close(t->evfd);
    pthread_mutex_destroy(&t->lock);
    free(t->provider);
    free(t->listen_host);
    free(t->listen_port);
    free(t->advertise);
}

static void fab_close(ds_transport *pub)
{
    tp_fab *t = fab_of(pub);
    if (t->thread_started) {
        pthread_mutex_lock(&t->lock);
        t->stop = 1;
        pthread_mutex_unlock(&t->lock);
        fab_wake(t);
        pthread_join(t->thread, NULL);
        /* Anything submitted after the thread's last look. */
        while (t->subq.head) {
            struct tp_op *op = t->subq.head;
            t->subq.head = op->next;
            fab_op_report(t, op, -ECANCELED);
            fab_op_free(t, op);
        }
    }
    fabric_free(t);
}

static int fab_reset(ds_transport *pub)
{
    tp_fab *t = fab_of(pub);
    pthread_mutex_lock(&t->lock);
    t->reset_req = 1;
    pthread_mutex_unlock(&t->lock);
    fab_wake(t);
    return 0;
}

static void fab_stats_get(ds_transport *pub, ds_transport_stats *st)
{
    tp_fab *t = fab_of(pub);
#define LD(f) st->f = atomic_load_explicit(&t->st.f, memory_order_relaxed)
    LD(msgs_sent);
    LD(bytes_sent);
    LD(msgs_recv);
    LD(bytes_recv);
    LD(send_timeouts);
    LD(send_errors);
    LD(eagain);
    LD(stuck_ops);
    LD(stuck_bytes);
    LD(queued_bytes);
    LD(resets);
    LD(quarantined_bytes);
    LD(dup_completions);
    LD(idle_conns);
    LD(idle_closed);
    for (int i = 0; i < DS_TP_DROP_COUNT; i++)
        st->drops[i] = atomic_load_explicit(&t->st.drops[i], memory_order_relaxed);
#undef LD
}

static const struct tp_ops fab_ops = {
    .name = "libfabric",
    .close = fab_close,
    .peer_add = fab_peer_add,
    .peer_remove = fab_peer_remove,
    .peer_addr = fab_peer_addr,
    .send = fab_send,
    .reset = fab_reset,
    .stats_get = fab_stats_get,
};

/* The peer table and the small receive pool. */
static int alloc_tables(tp_fab *t, const ds_transport_opts *o)
{
    t->npeers = o->max_peers;
    t->peers = calloc(t->npeers, sizeof(*t->peers));
    t->nrx = o->rx_small_bufs; /* chunk-sized buffers are granted per sender */
    t->rx = calloc(t->nrx, sizeof(*t->rx));
    if (!t->peers || !t->rx)
        return -ENOMEM;
    for (unsigned i = 0; i < t->npeers; i++)
        fab_peer_fresh(&t->peers[i]);
    for (unsigned i = 0; i < t->nrx; i++) {
        t->rx[i] = calloc(1, sizeof(**t->rx));
        if (!t->rx[i])
            return -ENOMEM;
        t->rx[i]->cap = TP_SMALL_BUF;
        t->rx[i]->tag = TP_TAG_SMALL;
        t->rx[i]->slot = i;
    }
    size_t w = (o->max_inflight_bytes + o->chunk_bytes - 1) / o->chunk_bytes;
    t->grants_per_peer = w < 2 ? 2 : w > 128 ? 128 : (unsigned)w;
    t->next_grant_id = tp_random_u64();
    t->rx_unposted = t->nrx;
    return 0;
}

int fab_copy_strings(tp_fab *t, const ds_transport_opts *o)
{
    char host[DS_TRANSPORT_ADDR_MAX], port[8];
    if (tp_split_hostport(o->listen, host, sizeof(host), port, sizeof(port)))
        return -EINVAL;
    t->provider = strdup(fab_provider_name(o->provider));
    t->listen_host = strdup(host);
    t->listen_port = strdup(port);
    t->advertise = o->advertise ? strdup(o->advertise) : NULL;
    if (!t->provider || !t->listen_host || !t->listen_port || (o->advertise && !t->advertise))
        return -ENOMEM;
    return 0;
}

int tp_fabric_open(const ds_transport_opts *o, ds_transport **out)
{
    char why[256];
    int lr = tp_fi_load(why, sizeof(why));
    if (lr) {
        ds_error(COMP, "%s", why);
        return lr;
    }
    tp_fab *t = calloc(1, sizeof(*t));
    if (!t)
        return -ENOMEM;
    tp_head_init(&t->pub, &fab_ops);
    t->evfd = -1;
    t->cq_fd = -1;
    pthread_mutex_init(&t->lock, NULL);
    t->o = *o;
    t->o.provider = NULL;
    t->o.listen = NULL;
    t->o.advertise = NULL;
    t->next_due_ms = UINT64_MAX;
    int r = fab_copy_strings(t, o);
    if (r)
        goto fail;
    /* Debian's shm provider hangs on messages above its inline size when
     * cross-memory attach is refused (containers without ptrace rights);
     * its shared-memory bounce path works everywhere. The user's own
     * setting wins. */
    if (!strncmp(t->provider, "shm", 3))
        setenv("FI_SHM_DISABLE_CMA", "1", 0);
    t->idle_scan = strstr(t->provider, "tcp") != NULL;
    r = alloc_tables(t, o);
    if (r)
        goto fail;
    t->evfd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    if (t->evfd < 0) {
        r = -errno;
        goto fail;
    }
    r = fab_warm_adopt(t) ? 0 : fab_stack_open(t, t->listen_port);
    if (!r)
        r = fab_learn_name(t);
    if (!r && t->namelen > TP_NAME_MAX)
        r = -EINVAL;
    if (r)
        goto fail;
    /* Before the thread starts: its callbacks may use *out at once. */
    *out = &t->pub;
    r = pthread_create(&t->thread, NULL, progress_main, t);
    if (r) {
        *out = NULL;
        r = -r;
        goto fail;
    }
    t->thread_started = 1;
    if (t->advertise)
        ds_info(COMP, "listening on %s, advertised as %s, provider=%s chunk=%zu wait=%s",
                o->listen, t->pub.addr_text, t->provider, o->chunk_bytes,
                t->cq_fd >= 0 ? "fd" : "poll");
    else
        ds_info(COMP, "listening on %s provider=%s chunk=%zu wait=%s", t->pub.addr_text,
                t->provider, o->chunk_bytes, t->cq_fd >= 0 ? "fd" : "poll");
    return 0;
fail:
    fabric_free(t);
    tp_head_free(&t->pub);
    return r;
}
