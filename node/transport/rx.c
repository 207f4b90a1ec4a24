/*
 * node/transport/rx.c: the receive side of the libfabric backend:
 * the pool of small receive buffers, the checks of every chunk, streams,
 * reassembly and in-order delivery.
 *
 * A chunk goes through these phases (fab_rx_chunk), each one function:
 *
 *   parse     the fixed header (chunk.h) and its field rules
 *   route     the peer (found or created from the sender's address in
 *             the chunk) and the sender stream (found, or a new one that
 *             replaces the least recently active of four)
 *   control   grant traffic goes to grants.c and stops here
 *   window    seq against the stream's next: late, or too far ahead
 *   abort     the sender abandoned the message: mark it skipped
 *   geometry  total, chunk size and index agree with the payload length
 *   too big   over max_msg_bytes: skipped
 *   start     the first chunk of a message: a one-chunk message in order
 *             is delivered from its receive buffer without a copy, else
 *             held (small ones copied); a larger one gets its allocation
 *             and bitmap, charged to rx_mem_bytes
 *   place     the chunk's bytes at their offset; the last one completes it
 *
 * Why a bitmap and not a counter alone: ofi_rxm reports completions in any
 * order (a rendezvous read finishes after later eager sends), and a chunk
 * received twice must be dropped, not counted twice. Why held messages are
 * sorted per stream and delivered strictly by seq: messages from one peer
 * are delivered whole, at most once, in the order they were submitted. A
 * hole is skipped after rx_timeout_ms (deadline.c), or 200 ms on a stream
 * nothing was delivered from yet.
 *
 * Progress thread only.
 */
#include "config.h"

#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <rdma/fi_endpoint.h>
#include <rdma/fi_errno.h>
#include <rdma/fi_tagged.h>

#include "base/clock.h"
#include "base/log.h"
#include "node/transport/internal.h"

/* ---- held messages ---------------------------------------------------- */

void fab_rxmsg_free(tp_fab *t, struct tp_rxmsg *m)
{
    t->rx_mem -= m->mem;
    ds_transport_buf_put(&t->pub, m->base);
    free(m->bitmap);
    free(m);
}

void fab_rxs_clear(tp_fab *t, struct tp_rxs *s, enum ds_transport_drop why)
{
    while (s->held) {
        struct tp_rxmsg *m = s->held;
        s->held = m->next;
        if (m->state != RX_SKIP)
            fab_drop(t, why);
        fab_rxmsg_free(t, m);
    }
    s->nheld = 0;
    s->held_tail = NULL;
    s->gap_since_ms = 0;
}

/* Forget every stream of a peer. */
void fab_rx_clear(tp_fab *t, struct tp_peer *p, enum ds_transport_drop why)
{
    for (int i = 0; i < TP_STREAMS; i++) {
        fab_rxs_clear(t, &p->rxs[i], why);
        memset(&p->rxs[i], 0, sizeof(p->rxs[i]));
        p->rxs[i].next = 1;
    }
    t->last_stream = 0;
}

int fab_peer_holds(const struct tp_peer *p)
{
    for (int i = 0; i < TP_STREAMS; i++)
        if (p->rxs[i].held)
            return 1;
    return 0;
}

struct tp_rxmsg *fab_held_pop(struct tp_rxs *s)
{
    struct tp_rxmsg *m = s->held;
    s->held = m->next;
    if (!s->held)
        s->held_tail = NULL;
    s->nheld--;
    return m;
}

/* Mark a held message skipped and give back its memory. */
static void msg_skip(tp_fab *t, struct tp_rxmsg *m)
{
    t->rx_mem -= m->mem;
    free(m->base);
    free(m->bitmap);
    m->base = m->bitmap = NULL;
    m->mem = 0;
    m->state = RX_SKIP;
}

static void deliver(tp_fab *t, uint32_t slot, struct tp_rxs *s, uint8_t *base,
                    const uint8_t *data, uint64_t len, int *taken)
{
    ds_transport_msg msg = {
        .peer = fab_peer_handle(t, slot),
        .data = data,
        .len = (size_t)len,
        .base_ = base,
    };
    ST_ADD(t, msgs_recv, 1);
    ST_ADD(t, bytes_recv, len);
    s->fresh = 0;
    t->o.on_recv(t->o.cb_ctx, &msg);
    *taken = msg.taken_;
}

/* How long a hole in the order may wait. A stream we have delivered
 * nothing from yet may be one we joined late (we removed the peer and it
 * came back, or we started after it): its first message is then not seq 1,
 * and waiting rx_timeout for messages we will never see would stall it;
 * 200 ms still absorbs the reordering of its first messages. */
uint64_t fab_gap_ms(const tp_fab *t, const struct tp_rxs *s)
{
    return s->fresh && TP_FRESH_GAP_MS < t->o.rx_timeout_ms ? TP_FRESH_GAP_MS
                                                             : t->o.rx_timeout_ms;
}

/* Deliver every message at the head of the held list that is next in
 * order; skip what was aborted or dropped. */
void fab_deliver_ready(tp_fab *t, uint32_t slot, struct tp_rxs *s)
{
    struct tp_peer *p = &t->peers[slot];
    while (s->held && s->held->seq == s->next && s->held->state != RX_PARTIAL) {
        struct tp_rxmsg *m = fab_held_pop(s);
        s->next++;
        s->gap_since_ms = 0;
        if (m->state == RX_COMPLETE && p->state == PEER_LIVE) {
            int taken = 0;
            deliver(t, slot, s, m->base, m->data, m->len, &taken);
            if (taken)
                m->base = NULL; /* the application frees it */
        } else if (m->state == RX_COMPLETE) {
            fab_drop(t, DS_TP_DROP_REMOVED_PEER);
        }
        fab_rxmsg_free(t, m);
    }
    if (s->held && s->held->seq != s->next && !s->gap_since_ms)
        s->gap_since_ms = ds_now_ms();
    if (s->held) {
        uint64_t due = s->gap_since_ms ? s->gap_since_ms + fab_gap_ms(t, s)
                                       : s->held->last_ms + t->o.rx_timeout_ms;
        fab_due(t, due);
        fab_mark_busy(t, slot);
    }
}

static struct tp_rxmsg *held_find(struct tp_rxs *s, uint64_t seq, struct tp_rxmsg ***link)
{
    /* Messages mostly complete in order: try the tail first. */
    if (s->held_tail && seq >= s->held_tail->seq) {
        *link = &s->held_tail->next;
        return seq == s->held_tail->seq ? s->held_tail : NULL;
    }
    struct tp_rxmsg **pp = &s->held;
    while (*pp && (*pp)->seq < seq)
        pp = &(*pp)->next;
    *link = pp;
    return (*pp && (*pp)->seq == seq) ? *pp : NULL;
}

static struct tp_rxmsg *held_insert(tp_fab *t, uint32_t slot, struct tp_rxs *s,
                                    struct tp_rxmsg **link, uint64_t seq, uint8_t state)
{
    if (s->nheld >= TP_RX_HELD_MAX)
        return NULL;
    struct tp_rxmsg *m = calloc(1, sizeof(*m));
    if (!m)
        return NULL;
    m->seq = seq;
    m->state = state;
    m->last_ms = ds_now_ms();
    m->next = *link;
    *link = m;
    if (!m->next)
        s->held_tail = m;
    s->nheld++;
    fab_mark_busy(t, slot);
    return m;
}

/* ---- one received chunk, phase by phase ------------------------------- */

/* What the phases know about the chunk at hand. */
struct rx_in {
    tp_chunk_hdr h;
    const uint8_t *buf; /* the receive buffer: header, name, payload */
    size_t hl;          /* header and name bytes */
    uint64_t plen;      /* payload bytes */
    uint64_t nchunks;   /* of the message (after the geometry phase) */
    uint32_t slot;
    struct tp_peer *p;
    struct tp_rxs *s;
};

/* Parse: the fixed header and the rules on its fields. 0, or -1 (dropped,
 * counted). */
static int rx_parse(tp_fab *t, const uint8_t *buf, size_t len, struct rx_in *in)
{
    if (tp_chunk_hdr_get(buf, len, &in->h)) {
        fab_drop(t, DS_TP_DROP_BAD_HEADER);
        ds_log_rl(DS_LOG_WARN, COMP, "dropped chunk: bad header (len=%zu)", len);
        return -1;
    }
    const tp_chunk_hdr *h = &in->h;
    in->buf = buf;
    in->hl = TP_HDR_FIXED + h->name_len;
    int ctrl = (h->flags & TP_F_CTRL) != 0;
    if (h->name_len == 0 || h->name_len > TP_NAME_MAX || in->hl > len || h->stream == 0 ||
        (h->seq == 0) != ctrl || (h->flags & ~(TP_F_ABORT | TP_F_CTRL)) ||
        (ctrl && (h->flags & TP_F_ABORT))) {
        fab_drop(t, DS_TP_DROP_BAD_HEADER);
        ds_log_rl(DS_LOG_WARN, COMP, "dropped chunk: bad header fields");
        return -1;
    }
    in->plen = len - in->hl;
    return 0;
}

/* The stream entry for a stream id not seen on this peer: a free entry,
 * else the one idle the longest, whose held messages are dropped. */
static unsigned stream_new(tp_fab *t, uint32_t slot, uint64_t stream, int created)
{
    struct tp_peer *p = &t->peers[slot];
    unsigned k = 0;
    for (unsigned i = 0; i < TP_STREAMS; i++) {
        if (!p->rxs[i].id) {
            k = i;
            break;
        }
        if (p->rxs[i].last_use < p->rxs[k].last_use)
            k = i;
    }
    struct tp_rxs *s = &p->rxs[k];
    if (!created) {
        /* A new incarnation of the sender (or a forgery): the grants it
         * gave us may be gone; ask again rather than use them. */
        p->gr_n = 0;
        p->need_sent = 0;
    }
    if (s->id) {
        fab_rxs_clear(t, s, DS_TP_DROP_STALE_STREAM);
        ds_debug(COMP, "peer %s: stream %016" PRIx64 " replaces %016" PRIx64, p->addr, stream,
                 s->id);
    }
    memset(s, 0, sizeof(*s));
    s->id = stream;
    s->next = 1;
    s->fresh = 1;
    return k;
}

/* A known stream: the one-entry cache, else a scan of the live peers. */
static int stream_find(tp_fab *t, uint64_t stream, uint32_t *slot, unsigned *sidx)
{
    if (stream == t->last_stream && t->last_slot < t->npeers &&
        t->peers[t->last_slot].state == PEER_LIVE &&
        t->peers[t->last_slot].rxs[t->last_sidx].id == stream) {
        *slot = t->last_slot;
        *sidx = t->last_sidx;
        return 1;
    }
    for (uint32_t i = 0; i < t->npeers; i++) {
        if (t->peers[i].state != PEER_LIVE)
            continue;
        for (unsigned k = 0; k < TP_STREAMS; k++)
            if (t->peers[i].rxs[k].id == stream) {
                *slot = i;
                *sidx = k;
                return 1;
            }
    }
    return 0;
}

/* Route: the peer and the stream the chunk belongs to, creating the peer
 * for an unknown address and the stream state for a new stream. 0, or -1
 * (dropped, counted). */
static int rx_route(tp_fab *t, struct rx_in *in)
{
    const uint64_t stream = in->h.stream;
    uint32_t slot;
    unsigned sidx;
    int created = 0;
    if (!stream_find(t, stream, &slot, &sidx)) {
        char key[DS_TRANSPORT_ADDR_MAX];
        if (fab_addr_canon(t->addr_format, in->buf + TP_CH_NAME, in->h.name_len, key,
                           sizeof(key))) {
            fab_drop(t, DS_TP_DROP_BAD_ADDR);
            ds_log_rl(DS_LOG_WARN, COMP, "dropped chunk: sender address invalid for %s",
                      t->provider);
            return -1;
        }
        slot = fab_peer_find_or_create(t, key, in->buf + TP_CH_NAME, in->h.name_len, 1, &created,
                                       NULL);
        if (slot == UINT32_MAX) {
            fab_drop(t, DS_TP_DROP_PEERS_FULL);
            ds_log_rl(DS_LOG_WARN, COMP, "dropped message from %s: all %u peer slots in use",
                      key, t->o.max_peers);
            return -1;
        }
        sidx = stream_new(t, slot, stream, created);
        if (created) {
            ds_info(COMP, "new peer %s (first message)", key);
            fab_event(t, DS_TRANSPORT_EV_PEER_NEW, slot, 0);
        }
    }
    t->last_stream = stream;
    t->last_slot = slot;
    t->last_sidx = sidx;
    in->slot = slot;
    in->p = &t->peers[slot];
    in->s = &in->p->rxs[sidx];
    in->s->last_use = ++t->rx_tick;
    return 0;
}

/* Control: grant traffic (grants.c), never delivered. */
static void rx_control(tp_fab *t, const struct rx_in *in)
{
    if (in->h.total != in->plen || in->h.chunk_idx != 0 ||
        !fab_rx_ctrl(t, in->slot, in->h.stream, in->buf + in->hl, (size_t)in->plen)) {
        fab_drop(t, DS_TP_DROP_BAD_HEADER);
        ds_log_rl(DS_LOG_WARN, COMP, "dropped control chunk from %s: malformed", in->p->addr);
    }
}

/* Window: a seq already delivered or skipped is late; one too far ahead
 * of the stream is refused. 0, or -1 (dropped, counted). */
static int rx_window(tp_fab *t, const struct rx_in *in)
{
    struct tp_rxs *s = in->s;
    const uint64_t seq = in->h.seq;
    if (s->resync) {
        s->resync = 0;
        if (seq > s->next)
            s->next = seq;
    }
    if (seq < s->next) {
        fab_drop(t, DS_TP_DROP_LATE);
        return -1;
    }
    if (seq - s->next >= TP_RX_WINDOW) {
        fab_drop(t, DS_TP_DROP_BACKLOG);
        ds_log_rl(DS_LOG_WARN, COMP, "dropped chunk from %s: seq %" PRIu64 " far ahead of %" PRIu64,
                  in->p->addr, seq, s->next);
        return -1;
    }
    return 0;
}

/* Abort: the sender abandoned message seq after posting part of it. */
static void rx_abort(tp_fab *t, const struct rx_in *in, struct tp_rxmsg *m,
                     struct tp_rxmsg **link)
{
    if (in->plen) {
        fab_drop(t, DS_TP_DROP_BAD_HEADER);
        return;
    }
    fab_drop(t, DS_TP_DROP_ABORTED);
    if (m)
        msg_skip(t, m);
    else if (!held_insert(t, in->slot, in->s, link, in->h.seq, RX_SKIP))
        fab_drop(t, DS_TP_DROP_BACKLOG);
    fab_deliver_ready(t, in->slot, in->s);
}

/* Geometry: the chunk's size and index agree with the message's total
 * and chunk size. Before anything is allocated or copied. 0, or -1
 * (dropped, counted). */
static int rx_geometry(tp_fab *t, struct rx_in *in)
{
    const tp_chunk_hdr *h = &in->h;
    if (h->total == 0) {
        in->nchunks = 1;
    } else {
        if (h->chunk_size == 0) {
            fab_drop(t, DS_TP_DROP_BAD_HEADER);
            return -1;
        }
        in->nchunks = (h->total + h->chunk_size - 1) / h->chunk_size;
    }
    const uint64_t idx = h->chunk_idx;
    uint64_t expect = h->total == 0 ? 0
                      : idx + 1 == in->nchunks ? h->total - idx * h->chunk_size
                                               : h->chunk_size;
    if (idx >= in->nchunks || in->nchunks > UINT32_MAX || in->plen != expect) {
        fab_drop(t, DS_TP_DROP_BAD_HEADER);
        ds_log_rl(DS_LOG_WARN, COMP, "dropped chunk from %s: geometry idx=%u size=%u total=%" PRIu64
                  " len=%" PRIu64, in->p->addr, h->chunk_idx, h->chunk_size, h->total, in->plen);
        return -1;
    }
    return 0;
}

/* Too big: the message is over max_msg_bytes; it is skipped. */
static void rx_too_big(tp_fab *t, const struct rx_in *in, struct tp_rxmsg *m,
                       struct tp_rxmsg **link)
{
    fab_drop(t, DS_TP_DROP_TOO_BIG);
    ds_log_rl(DS_LOG_WARN, COMP, "dropped message from %s: %" PRIu64 " bytes > max %zu",
              in->p->addr, in->h.total, t->o.max_msg_bytes);
    if (!m)
        m = held_insert(t, in->slot, in->s, link, in->h.seq, RX_SKIP);
    if (m && m->state == RX_PARTIAL)
        msg_skip(t, m);
    fab_deliver_ready(t, in->slot, in->s);
}

/* Start, one chunk: in order, delivered from the receive buffer (zero
 * copy; rb->buf is taken when the application keeps it); out of order,
 * held. */
static void rx_single(tp_fab *t, struct tp_rxbuf *rb, const struct rx_in *in,
                      struct tp_rxmsg **link)
{
    struct tp_rxs *s = in->s;
    uint8_t *base = rb->buf;
    const uint64_t plen = in->plen;
    if (in->h.seq == s->next) {
        int taken = 0;
        s->next++;
        deliver(t, in->slot, s, base, base + in->hl, plen, &taken);
        if (taken)
            rb->buf = NULL;
        fab_deliver_ready(t, in->slot, s);
        return;
    }
    /* Out of order: hold it. A small one is copied to its own allocation
     * (thousands may wait behind one large message whose rendezvous
     * chunks complete late); a large one keeps its pool buffer. */
    int copy = plen <= TP_RX_COPY_MAX;
    uint64_t cost = (copy ? plen : rb->cap) + sizeof(struct tp_rxmsg);
    if (t->rx_mem + cost > t->o.rx_mem_bytes) {
        fab_drop(t, DS_TP_DROP_NO_MEMORY);
        held_insert(t, in->slot, s, link, in->h.seq, RX_SKIP);
        fab_deliver_ready(t, in->slot, s);
        return;
    }
    struct tp_rxmsg *m = held_insert(t, in->slot, s, link, in->h.seq, RX_COMPLETE);
    if (!m) {
        fab_drop(t, DS_TP_DROP_BACKLOG);
        return;
    }
    if (copy) {
        m->base = malloc(plen ? plen : 1);
        if (!m->base) {
            m->state = RX_SKIP;
            fab_drop(t, DS_TP_DROP_NO_MEMORY);
            fab_deliver_ready(t, in->slot, s);
            return;
        }
        memcpy(m->base, base + in->hl, plen);
        m->data = m->base;
    } else {
        m->base = base;
        m->pooled = 1;
        m->data = base + in->hl;
        rb->buf = NULL;
    }
    m->len = plen;
    m->mem = cost;
    t->rx_mem += m->mem;
    fab_deliver_ready(t, in->slot, s);
}

/* Start, several chunks: the message's allocation and bitmap, within
 * rx_mem_bytes. NULL when it was dropped (counted). */
static struct tp_rxmsg *rx_start(tp_fab *t, const struct rx_in *in, struct tp_rxmsg **link)
{
    const uint64_t total = in->h.total;
    uint64_t bm = (in->nchunks + 7) / 8;
    if (t->rx_mem + total + bm > t->o.rx_mem_bytes) {
        fab_drop(t, DS_TP_DROP_NO_MEMORY);
        ds_log_rl(DS_LOG_WARN, COMP, "dropped %" PRIu64 "-byte message from %s: rx memory bound",
                  total, in->p->addr);
        if (held_insert(t, in->slot, in->s, link, in->h.seq, RX_SKIP))
            fab_deliver_ready(t, in->slot, in->s);
        return NULL;
    }
    struct tp_rxmsg *m = held_insert(t, in->slot, in->s, link, in->h.seq, RX_PARTIAL);
    if (!m) {
        fab_drop(t, DS_TP_DROP_BACKLOG);
        return NULL;
    }
    m->base = ds_transport_buf_get(&t->pub, total);
    m->bitmap = calloc(bm, 1);
    if (!m->base || !m->bitmap) {
        free(m->base);
        free(m->bitmap);
        m->base = m->bitmap = NULL;
        m->state = RX_SKIP;
        fab_drop(t, DS_TP_DROP_NO_MEMORY);
        fab_deliver_ready(t, in->slot, in->s);
        return NULL;
    }
    m->data = m->base;
    m->len = total;
    m->chunk_size = in->h.chunk_size;
    m->nchunks = (uint32_t)in->nchunks;
    m->mem = total + bm;
    t->rx_mem += m->mem;
    fab_due(t, m->last_ms + t->o.rx_timeout_ms);
    return m;
}

/* Place: copy the chunk to its offset; the last one completes the
 * message. */
static void rx_place(tp_fab *t, const struct rx_in *in, struct tp_rxmsg *m)
{
    const uint32_t idx = in->h.chunk_idx;
    if (m->state != RX_PARTIAL) {
        fab_drop(t, m->state == RX_SKIP ? DS_TP_DROP_LATE : DS_TP_DROP_DUPLICATE);
        return;
    }
    if (m->len != in->h.total || m->chunk_size != in->h.chunk_size) {
        fab_drop(t, DS_TP_DROP_BAD_HEADER);
        return;
    }
    if (m->bitmap[idx / 8] & (1u << (idx % 8))) {
        fab_drop(t, DS_TP_DROP_DUPLICATE);
        return;
    }
    m->bitmap[idx / 8] |= (uint8_t)(1u << (idx % 8));
    memcpy(m->base + (uint64_t)idx * in->h.chunk_size, in->buf + in->hl, in->plen);
    m->got++;
    m->last_ms = ds_now_ms();
    if (m->got == m->nchunks) {
        m->state = RX_COMPLETE;
        free(m->bitmap);
        m->bitmap = NULL;
        fab_deliver_ready(t, in->slot, in->s);
    }
}

/* Handle one received chunk in rb. May take rb->buf (sets it NULL). */
void fab_rx_chunk(tp_fab *t, struct tp_rxbuf *rb, size_t len)
{
    struct rx_in in;
    memset(&in, 0, sizeof(in));
    if (rx_parse(t, rb->buf, len, &in) || rx_route(t, &in))
        return;
    if (in.h.flags & TP_F_CTRL) {
        rx_control(t, &in);
        return;
    }
    ds_debug(COMP, "chunk from %s stream=%016" PRIx64 " seq=%" PRIu64 " (next %" PRIu64
             ") chunk=%u total=%" PRIu64 "%s", in.p->addr, in.h.stream, in.h.seq, in.s->next,
             in.h.chunk_idx, in.h.total, (in.h.flags & TP_F_ABORT) ? " ABORT" : "");
    fab_peer_alive(t, in.slot);
    if (rx_window(t, &in))
        return;
    struct tp_rxmsg **link;
    struct tp_rxmsg *m = held_find(in.s, in.h.seq, &link);
    if (in.h.flags & TP_F_ABORT) {
        rx_abort(t, &in, m, link);
        return;
    }
    if (rx_geometry(t, &in))
        return;
    if (in.h.total > t->o.max_msg_bytes) {
        rx_too_big(t, &in, m, link);
        return;
    }
    if (!m) {
        if (in.nchunks == 1) {
            rx_single(t, rb, &in, link);
            return;
        }
        m = rx_start(t, &in, link);
        if (!m)
            return;
    }
    rx_place(t, &in, m);
}

/* ---- the small receive pool ------------------------------------------- */

int fab_post_receives(tp_fab *t)
{
    int n = 0;
    if (!t->rx_unposted || t->broken)
        return 0;
    for (unsigned i = 0; i < t->nrx && t->rx_unposted; i++) {
        struct tp_rxbuf *rb = t->rx[i];
        if (rb->posted)
            continue;
        if (!rb->buf) {
            rb->buf = ds_transport_buf_get(&t->pub, rb->cap);
            if (!rb->buf)
                break;
        }
        rb->ctx.kind = CTX_RX;
        ssize_t r = fi_trecv(t->ep, rb->buf, rb->cap, NULL, FI_ADDR_UNSPEC, rb->tag, 0, &rb->ctx);
        if (r == -FI_EAGAIN)
            break;
        if (r) {
            ds_log_rl(DS_LOG_ERROR, COMP, "fi_trecv: %s", tp_fi.strerror((int)-r));
            break;
        }
        rb->posted = 1;
        rb->since_ms = ds_now_ms();
        t->rx_unposted--;
        n++;
    }
    return n;
}

/* A pool receive failed: a fresh posting takes its slot and the failed one
 * goes to quarantine (ofi_rxm may report it again). */
static void pool_failed(tp_fab *t, struct tp_rxbuf *rb, int err)
{
    struct tp_rxbuf *fresh = calloc(1, sizeof(*fresh));
    if (fresh) {
        fresh->cap = rb->cap;
        fresh->tag = rb->tag;
        fresh->slot = rb->slot;
        t->rx[rb->slot] = fresh;
        rb->qnext = t->q_rx;
        rb->q_ms = ds_now_ms();
        t->q_rx = rb;
        ST_ADD(t, quarantined_bytes, rb->cap);
    }
    /* (without memory for a fresh posting the old one is reused: the
     * lesser risk than stopping receives) */
    if (err != FI_ECANCELED) {
        fab_drop(t, err == FI_ETRUNC ? DS_TP_DROP_TOO_BIG : DS_TP_DROP_RX_ERROR);
        ds_log_rl(DS_LOG_WARN, COMP, "receive error: %s%s", tp_fi.strerror(err),
                  err == FI_ETRUNC ? " (a chunk larger than this node's receive buffers: every "
                                     "node must use the same chunk size, ds_tp_opts.chunk_bytes, "
                                     "which no config key changes)" : "");
    }
}

void fab_rx_complete(tp_fab *t, struct tp_rxbuf *rb, size_t len, int err)
{
    if (!rb->posted) {
        /* A second report for a receive already completed or failed. */
        ST_ADD(t, dup_completions, 1);
        return;
    }
    if (rb->is_grant) {
        fab_grant_complete(t, rb, len, err);
        return;
    }
    rb->posted = 0;
    t->rx_unposted++;
    if (err) {
        pool_failed(t, rb, err);
        return;
    }
    fab_rx_chunk(t, rb, len);
}
