/*
 * node/transport/grants.c: the grant credit protocol of the libfabric
 * backend.
 *
 * Why it exists: ofi_rxm 1.17 crashes when a receive is posted that
 * matches an *unexpected* message above its eager limit (16 KiB) whose
 * sender's connection has closed. So only chunks of at most TP_EAGER_MAX
 * wire bytes travel unsolicited (into rx.c's pool of small buffers); a
 * larger chunk is sent only on a grant: the receiver first posts a
 * chunk-sized buffer under a tag of its own (TP_TAG_GRANT | 48-bit id) and
 * tells the sender that id. No large message is then ever unexpected, and
 * a frozen sender pins only the buffers granted to it, which also ends
 * cross-peer head-of-line blocking.
 *
 * The messages (CONTROL chunks, chunk.h): REQ "I need n", GRANT "ids, for
 * your stream s", RELEASE "ids back", VOID "I reset, forget my grants".
 * Grants are standing credit, up to a window per peer (grants_per_peer)
 * and rx_large_bufs in all:
 *   - a sender asks when its queue head needs one (again after
 *     TP_REQ_REFRESH_MS if nothing came) and gives back what it held unused
 *     for TP_GRANT_IDLE_MS;
 *   - a receiver re-grants as chunks arrive, takes back grants unused for
 *     TP_GRANT_RECLAIM_MS (their sender is dead or frozen), and repeats its
 *     outstanding grants whenever a sender asks again, because the first
 *     message sent to a peer that has just reopened its endpoint is lost
 *     with the dead connection; the sender ignores ids it holds or used;
 *   - both forget grants across a reset: a GRANT names the sender stream
 *     it was issued for, so grants meant for an earlier incarnation are
 *     never used.
 * A cancelled grant buffer is quarantined (deadline.c), because after a
 * cancel ofi_rxm may still report it again or even write into it.
 *
 * Progress thread only.
 */
#include "config.h"

#include <errno.h>
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

#include <rdma/fi_endpoint.h>
#include <rdma/fi_errno.h>
#include <rdma/fi_tagged.h>

#include "base/clock.h"
#include "base/log.h"
#include "node/transport/internal.h"

/* ---- as a sender: the grants a peer gave us --------------------------- */

static int gr_known(const struct tp_peer *p, uint64_t id)
{
    for (unsigned i = 0; i < p->gr_n; i++)
        if (p->gr[(p->gr_head + i) % TP_GRANT_RING] == id)
            return 1;
    for (unsigned i = 0; i < TP_GRANT_RING; i++)
        if (p->used[i] == id)
            return 1;
    return 0;
}

/* A grant from the peer; one we hold or used already is ignored (the
 * receiver repeats outstanding grants when we ask again, because a GRANT
 * message can be lost: the first send to a peer that just reopened its
 * endpoint vanishes with the dead connection). */
static void gr_push_back(struct tp_peer *p, uint64_t id)
{
    if (gr_known(p, id))
        return;
    if (p->gr_n < TP_GRANT_RING) {
        p->gr[(p->gr_head + p->gr_n) % TP_GRANT_RING] = id;
        p->gr_n++;
    }
}

void fab_gr_push_front(struct tp_peer *p, uint64_t id)
{
    if (p->gr_n < TP_GRANT_RING) {
        p->gr_head = (p->gr_head + TP_GRANT_RING - 1) % TP_GRANT_RING;
        p->gr[p->gr_head] = id;
        p->gr_n++;
    }
}

uint64_t fab_gr_pop(struct tp_peer *p)
{
    uint64_t id = p->gr[p->gr_head];
    p->gr_head = (p->gr_head + 1) % TP_GRANT_RING;
    p->gr_n--;
    return id;
}

/* ---- control messages -------------------------------------------------- */

/* Queue a control message (a whole payload, chunk.h) for the peer; control
 * goes out before data, outside the window, so grants flow even while our
 * own data waits for the peer's. */
int fab_ctrl_send(tp_fab *t, uint32_t slot, const uint8_t *payload, size_t len)
{
    struct tp_peer *p = &t->peers[slot];
    struct tp_op *op = calloc(1, sizeof(*op));
    uint8_t *pl = malloc(len);
    if (!op || !pl) {
        free(op);
        free(pl);
        return -ENOMEM;
    }
    memcpy(pl, payload, len);
    op->is_ctrl = 1;
    op->slot = slot;
    op->copy = pl;
    op->data = pl;
    op->len = len;
    op->body_len = op->len;
    op->nchunks = 1;
    op->chunk_size = (uint32_t)op->len;
    op->reported = 1;
    list_push_tail(&p->ctrlq, op);
    op->where = OP_CTRLQ;
    fab_mark_busy(t, slot);
    return 0;
}

/* Send grant ids as one message per TP_GRANTS_PER_MSG: n, epoch (for
 * GRANT: the sender stream the grants are for, so that grants issued to an
 * incarnation that has since reset are never used; else 0), ids. */
void fab_ctrl_send_ids(tp_fab *t, uint32_t slot, uint8_t kind, uint64_t epoch,
                       const uint64_t *ids, unsigned n)
{
    while (n) {
        unsigned k = n < TP_GRANTS_PER_MSG ? n : TP_GRANTS_PER_MSG;
        uint8_t pl[TP_CTRL_IDS + 8 * TP_GRANTS_PER_MSG];
        tp_ctrl_put_head(pl, kind, k);
        ds_put64(pl + TP_CTRL_EPOCH, epoch);
        for (unsigned i = 0; i < k; i++)
            ds_put64(pl + TP_CTRL_IDS + 8 * i, ids[i]);
        fab_ctrl_send(t, slot, pl, TP_CTRL_IDS + 8 * (size_t)k);
        ids += k;
        n -= k;
    }
}

/* ---- as a receiver: the buffers we post for a peer -------------------- */

/* Post one chunk-sized buffer granted to the peer in slot. NULL when none
 * could be allocated or libfabric refused it (-FI_EAGAIN: the next chunk
 * that arrives retries). */
static struct tp_rxbuf *grant_post(tp_fab *t, uint32_t slot)
{
    struct tp_peer *p = &t->peers[slot];
    struct tp_rxbuf *rb = calloc(1, sizeof(*rb));
    if (!rb)
        return NULL;
    rb->cap = t->o.chunk_bytes + TP_HDR_MAX;
    rb->buf = ds_transport_buf_get(&t->pub, rb->cap);
    if (!rb->buf) {
        free(rb);
        return NULL;
    }
    rb->is_grant = 1;
    rb->grant_slot = slot;
    rb->grant_gen = p->gen;
    rb->grant_id = t->next_grant_id++ & TP_GRANT_MASK;
    rb->grant_stream = p->grant_stream;
    rb->tag = TP_TAG_GRANT | rb->grant_id;
    rb->ctx.kind = CTX_RX;
    ssize_t r = fi_trecv(t->ep, rb->buf, rb->cap, NULL, FI_ADDR_UNSPEC, rb->tag, 0, &rb->ctx);
    if (r) {
        ds_transport_buf_put(&t->pub, rb->buf);
        free(rb);
        return NULL;
    }
    rb->posted = 1;
    rb->since_ms = ds_now_ms();
    rb->gnext = t->grants;
    if (t->grants)
        t->grants->gprev = rb;
    t->grants = rb;
    t->ngrants++;
    return rb;
}

/* Post buffers for what the peer asked for (up to a window per peer and
 * rx_large_bufs in all) and tell it their tags. */
static void grant_more(tp_fab *t, uint32_t slot)
{
    struct tp_peer *p = &t->peers[slot];
    if (t->broken || p->state != PEER_LIVE)
        return;
    while (p->need && p->grants_out < t->grants_per_peer && t->ngrants < t->o.rx_large_bufs) {
        struct tp_rxbuf *rb = grant_post(t, slot);
        if (!rb)
            break;
        p->grants_out++;
        p->need--;
        p->gbatch[p->gbatch_n++] = rb->grant_id;
        if (p->gbatch_n == TP_GRANTS_PER_MSG) {
            fab_ctrl_send_ids(t, slot, TP_CTRL_GRANT, p->grant_stream, p->gbatch, p->gbatch_n);
            p->gbatch_n = 0;
        }
    }
    if (p->gbatch_n) {
        fab_ctrl_send_ids(t, slot, TP_CTRL_GRANT, p->grant_stream, p->gbatch, p->gbatch_n);
        p->gbatch_n = 0;
    }
}

static void grant_unlink(tp_fab *t, struct tp_rxbuf *rb)
{
    if (rb->gprev)
        rb->gprev->gnext = rb->gnext;
    else
        t->grants = rb->gnext;
    if (rb->gnext)
        rb->gnext->gprev = rb->gprev;
    rb->gnext = rb->gprev = NULL;
    t->ngrants--;
}

/* Cancel our grants to a peer: all of them, or those in ids[0..n). Unused
 * ones come back FI_ECANCELED; one in use completes as it will. */
void fab_grants_cancel(tp_fab *t, uint32_t slot, const uint64_t *ids, unsigned n)
{
    if (t->broken)
        return;
    for (struct tp_rxbuf *rb = t->grants; rb; rb = rb->gnext) {
        if (rb->grant_slot != slot || rb->grant_gen != t->peers[slot].gen || rb->canceling)
            continue;
        int hit = ids == NULL;
        for (unsigned i = 0; i < n && !hit; i++)
            hit = ids[i] == rb->grant_id;
        if (hit && fi_cancel(&t->ep->fid, &rb->ctx) == 0)
            rb->canceling = 1;
    }
}

/* Take back grants left unused past TP_GRANT_RECLAIM_MS (dead senders). */
void fab_grants_reclaim(tp_fab *t, uint64_t now)
{
    if (t->broken)
        return;
    for (struct tp_rxbuf *rb = t->grants; rb; rb = rb->gnext)
        if (rb->posted && !rb->canceling && now - rb->since_ms >= TP_GRANT_RECLAIM_MS &&
            fi_cancel(&t->ep->fid, &rb->ctx) == 0)
            rb->canceling = 1;
}

/* After a stack close: every grant buffer is ours again. */
void fab_grants_free(tp_fab *t)
{
    while (t->grants) {
        struct tp_rxbuf *rb = t->grants;
        grant_unlink(t, rb);
        ds_transport_buf_put(&t->pub, rb->buf);
        free(rb);
    }
    t->ngrants = 0;
}

/* ---- as a sender: asking and giving back ------------------------------ */

/* Large chunks still to post to the peer (stops counting at `cap`). */
uint32_t fab_large_chunks_queued(tp_fab *t, struct tp_peer *p, uint32_t cap)
{
    size_t hl = TP_HDR_FIXED + t->namelen;
    uint32_t n = 0;
    for (struct tp_op *op = p->txq.head; op && n < cap; op = op->next) {
        if (op->is_abort)
            continue;
        uint64_t cs = op->chunks ? op->chunk_size : t->o.chunk_bytes;
        uint64_t nch = op->len ? (op->len + cs - 1) / cs : 1;
        uint64_t last = op->len - (nch - 1) * cs;
        for (uint64_t k = op->next_chunk; k < nch && n < cap; k++)
            n += hl + (k + 1 == nch ? last : cs) > TP_EAGER_MAX;
    }
    return n;
}

/* As a sender blocked on grants: ask (once at a time; again after
 * TP_REQ_REFRESH_MS if nothing came, e.g. across a reset). */
void fab_ask_grants(tp_fab *t, uint32_t slot)
{
    struct tp_peer *p = &t->peers[slot];
    uint64_t now = ds_now_ms();
    uint64_t due = p->req_ms + TP_REQ_REFRESH_MS;
    if (p->req_pending || (p->need_sent && now < due)) {
        fab_due(t, due);
        return;
    }
    uint32_t need = fab_large_chunks_queued(t, p, 2 * t->grants_per_peer);
    if (!need)
        return;
    p->large_ms = now;
    uint8_t pl[TP_CTRL_HEAD];
    tp_ctrl_put_head(pl, TP_CTRL_REQ, need);
    if (fab_ctrl_send(t, slot, pl, sizeof(pl)))
        return;
    p->req_pending = 1;
    p->need_sent = need;
    p->req_ms = now;
    fab_due(t, now + TP_REQ_REFRESH_MS);
}

/* Give back grants we hold and no longer need. */
void fab_release_grants(tp_fab *t, uint32_t slot)
{
    struct tp_peer *p = &t->peers[slot];
    uint64_t ids[TP_GRANT_RING];
    unsigned n = 0;
    while (p->gr_n)
        ids[n++] = fab_gr_pop(p);
    fab_ctrl_send_ids(t, slot, TP_CTRL_RELEASE, 0, ids, n);
    p->need_sent = 0;
}

/* ---- control messages received ---------------------------------------- */

/* A REQ from the peer: remember what it needs, repeat what is outstanding
 * (the GRANT may have been lost; the sender ignores ids it has), then add
 * what it still needs. */
static void on_req(tp_fab *t, uint32_t slot, uint64_t stream, uint32_t n)
{
    struct tp_peer *p = &t->peers[slot];
    if (stream != p->grant_stream) {
        /* A new incarnation of the sender asks: the grants its old one
         * held will not be used (a sender drops its grants when it
         * resets), so take them back and start over. */
        if (p->grant_stream && p->grants_out)
            fab_grants_cancel(t, slot, NULL, 0);
        p->grant_stream = stream;
        p->grants_out = 0;
    }
    p->need = n < (1u << 20) ? n : (1u << 20);
    ds_debug(COMP, "grants for %s: need=%u out=%u all=%u of %u", p->addr, p->need, p->grants_out,
             t->ngrants, t->o.rx_large_bufs);
    uint64_t ids[TP_GRANT_RING];
    unsigned k = 0;
    for (struct tp_rxbuf *rb = t->grants; rb && k < TP_GRANT_RING; rb = rb->gnext)
        if (rb->grant_slot == slot && rb->grant_gen == p->gen &&
            rb->grant_stream == p->grant_stream && !rb->canceling)
            ids[k++] = rb->grant_id;
    if (k)
        fab_ctrl_send_ids(t, slot, TP_CTRL_GRANT, p->grant_stream, ids, k);
    grant_more(t, slot);
}

/* A GRANT or RELEASE carrying n ids. 1 when well-formed. */
static int on_ids(tp_fab *t, uint32_t slot, const uint8_t *b, size_t len, uint32_t n)
{
    struct tp_peer *p = &t->peers[slot];
    if (n == 0 || n > TP_GRANTS_PER_MSG || len != TP_CTRL_IDS + 8 * (size_t)n)
        return 0;
    uint64_t epoch = ds_le64(b + TP_CTRL_EPOCH);
    uint64_t ids[TP_GRANTS_PER_MSG];
    for (uint32_t i = 0; i < n; i++)
        ids[i] = ds_le64(b + TP_CTRL_IDS + 8 * i) & TP_GRANT_MASK;
    if (b[TP_CTRL_KIND] == TP_CTRL_RELEASE) {
        fab_grants_cancel(t, slot, ids, n);
        return 1;
    }
    if (epoch != p->tx_stream)
        return 1; /* issued to our previous incarnation, since cancelled */
    for (uint32_t i = 0; i < n; i++)
        gr_push_back(p, ids[i]);
    p->need_sent = p->need_sent > n ? p->need_sent - n : 0;
    fab_mark_busy(t, slot);
    return 1;
}

/* A control message from the peer in slot. 1 when well-formed. */
int fab_rx_ctrl(tp_fab *t, uint32_t slot, uint64_t stream, const uint8_t *b, size_t len)
{
    struct tp_peer *p = &t->peers[slot];
    if (len < TP_CTRL_HEAD)
        return 0;
    uint32_t n = ds_le32(b + TP_CTRL_N);
    ds_debug(COMP, "control %u n=%u from %s", b[TP_CTRL_KIND], n, p->addr);
    switch (b[TP_CTRL_KIND]) {
    case TP_CTRL_REQ:
        if (len != TP_CTRL_HEAD)
            return 0;
        on_req(t, slot, stream, n);
        return 1;
    case TP_CTRL_GRANT:
    case TP_CTRL_RELEASE:
        return on_ids(t, slot, b, len, n);
    case TP_CTRL_VOID:
        /* The peer reset: the grants it gave us are gone. */
        p->gr_n = 0;
        p->need_sent = 0;
        fab_mark_busy(t, slot);
        return 1;
    default:
        return 0;
    }
}

/* A granted receive completed (or failed, or was cancelled). */
void fab_grant_complete(tp_fab *t, struct tp_rxbuf *rb, size_t len, int err)
{
    rb->posted = 0;
    grant_unlink(t, rb);
    uint32_t slot = rb->grant_slot;
    struct tp_peer *p = &t->peers[slot];
    int same = p->state != PEER_FREE && p->gen == rb->grant_gen;
    if (same && p->grants_out && rb->grant_stream == p->grant_stream)
        p->grants_out--;
    if (err) {
        /* Cancelled or failed: ofi_rxm may report it again, and after a
         * cancel may even still write into it. Keep both untouched. */
        rb->qnext = t->q_rx;
        rb->q_ms = ds_now_ms();
        t->q_rx = rb;
        ST_ADD(t, quarantined_bytes, rb->cap);
        if (err != FI_ECANCELED) {
            fab_drop(t, DS_TP_DROP_RX_ERROR);
            ds_log_rl(DS_LOG_WARN, COMP, "granted receive failed: %s", tp_fi.strerror(err));
        }
    } else {
        fab_rx_chunk(t, rb, len);
        ds_transport_buf_put(&t->pub, rb->buf);
        free(rb);
    }
    if (same && p->state == PEER_LIVE)
        grant_more(t, slot);
}
