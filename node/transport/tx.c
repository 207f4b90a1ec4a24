/*
 * node/transport/tx.c: the send side of the libfabric backend.
 *
 * A send becomes one op: the caller's buffer (lent until release, or our
 * copy) with up to DS_TRANSPORT_EDGE_MAX bytes of head and tail copied in,
 * queued first on the submission queue (any thread, under t->lock), then
 * on its peer's txq (progress thread). Posting cuts it into chunks of
 * chunk_bytes, each one libfabric message sent as an iovec of its header
 * and the pieces of head || body || tail it covers, within the peer's
 * window of bytes in flight (max_inflight_bytes) and, above the eager
 * limit, only on a grant (grants.c). An op's seq is taken when its chunk 0
 * is accepted, so every seq the receiver sees is followed by all its chunks
 * or by an ABORT chunk.
 *
 * An op is reported (done) once: 0 when every chunk completed, or the
 * first failure (deadline, provider error, removal, reset, close). A failed
 * op whose chunks libfabric still holds is "abandoned": it stays, with its
 * buffer, until the completions come or the stack is closed, and counts
 * toward the stuck bound that triggers a reset (progress.c). An op with a
 * chunk libfabric failed is quarantined after that (deadline.c), because
 * ofi_rxm may report a failure twice.
 *
 * Every function here runs on the progress thread except fab_send.
 */
#include "config.h"

#include <errno.h>
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>
#include <sys/uio.h>

#include <rdma/fi_errno.h>
#include <rdma/fi_tagged.h>

#include "base/clock.h"
#include "base/log.h"
#include "node/transport/internal.h"

void fab_op_free(tp_fab *t, struct tp_op *op)
{
    if (op->is_ctrl) {
        if (op->data && op->data[TP_CTRL_KIND] == TP_CTRL_REQ)
            t->peers[op->slot].req_pending = 0;
        free(op->copy);
    } else if (!op->is_abort) {
        if (op->release)
            op->release(op->release_arg, (void *)op->data);
        ds_transport_buf_put(&t->pub, op->copy);
        ds_transport_buf_put(&t->pub, op->flat);
        ST_SUB(t, queued_bytes, op->len);
    }
    free(op->chunks);
    free(op);
}

/* Count a failure against the op's peer: a missed deadline or a provider
 * error is the peer's miss; a removal or our own reset is not. */
static void count_miss(tp_fab *t, struct tp_op *op, int status)
{
    struct tp_peer *p = &t->peers[op->slot];
    if (status == -ETIMEDOUT)
        ST_ADD(t, send_timeouts, 1);
    else
        ST_ADD(t, send_errors, 1);
    p->misses++;
    if (p->misses >= t->o.miss_limit && !p->unresponsive && p->state == PEER_LIVE) {
        p->unresponsive = 1;
        ds_log_rl(DS_LOG_WARN, COMP, "peer %s unresponsive misses=%u", p->addr, p->misses);
        fab_event(t, DS_TRANSPORT_EV_PEER_UNRESPONSIVE, op->slot, status);
    }
}

/* Report an op's outcome to its owner, once. */
void fab_op_report(tp_fab *t, struct tp_op *op, int status)
{
    if (op->reported || op->is_abort)
        return;
    op->reported = 1;
    if (status == 0) {
        ST_ADD(t, msgs_sent, 1);
        ST_ADD(t, bytes_sent, op->len);
        fab_peer_alive(t, op->slot);
    } else if (status != -ECANCELED && status != -ENETRESET) {
        count_miss(t, op, status);
    }
    if (op->done)
        op->done(op->done_arg, status);
}

/* The op has no chunk left in libfabric and nothing more will be posted:
 * unlink and free it. */
void fab_op_retire(tp_fab *t, struct tp_op *op)
{
    struct tp_peer *p = &t->peers[op->slot];
    if (op->where == OP_TXQ)
        list_unlink(&p->txq, op);
    else if (op->where == OP_INFLIGHT)
        list_unlink(&p->inflight, op);
    else if (op->where == OP_CTRLQ)
        list_unlink(&p->ctrlq, op);
    op->where = OP_NOWHERE;
    if (op->abandoned) {
        ST_SUB(t, stuck_ops, 1);
        op->abandoned = 0;
    }
    uint32_t slot = op->slot;
    if (op->tainted) {
        /* libfabric failed a chunk of it; ofi_rxm may report a failure
         * twice, so its contexts and buffer stay valid for the grace
         * period (or until the stack is closed). */
        op->next = t->q_ops;
        op->q_ms = ds_now_ms();
        t->q_ops = op;
        ST_ADD(t, quarantined_bytes, op->len);
    } else {
        fab_op_free(t, op);
    }
    if (p->state == PEER_DRAINING && !p->txq.head && !p->inflight.head && !p->ctrlq.head)
        fab_peer_free_slot(t, slot);
}

static struct tp_op *abort_op_new(uint32_t slot, uint64_t stream, uint64_t seq)
{
    struct tp_op *a = calloc(1, sizeof(*a));
    if (!a)
        return NULL;
    a->is_abort = 1;
    a->slot = slot;
    a->stream = stream;
    a->seq = seq;
    a->nchunks = 1;
    a->reported = 1;
    return a;
}

/* An op failed (deadline, error, removal) with status. Stop posting it; if
 * part of it reached the wire, tell the receiver with an ABORT; keep it
 * while libfabric still holds chunks of it. */
void fab_op_fail(tp_fab *t, struct tp_op *op, int status)
{
    struct tp_peer *p = &t->peers[op->slot];
    fab_op_report(t, op, status);
    if (op->is_abort)
        return;
    int partly_posted = op->next_chunk > 0 && op->next_chunk < op->nchunks;
    if (op->where == OP_TXQ) {
        list_unlink(&p->txq, op);
        op->where = OP_NOWHERE;
        if (partly_posted) {
            struct tp_op *a = abort_op_new(op->slot, op->stream, op->seq);
            if (a) {
                list_push_head(&p->txq, a);
                a->where = OP_TXQ;
            }
        }
        if (op->pending) {
            list_push_tail(&p->inflight, op);
            op->where = OP_INFLIGHT;
        }
    }
    op->next_chunk = op->nchunks; /* nothing more goes out */
    if (op->pending == 0) {
        fab_op_retire(t, op);
        return;
    }
    if (!op->abandoned) {
        op->abandoned = 1;
        ST_ADD(t, stuck_ops, 1);
        ST_ADD(t, stuck_bytes, op->pending_bytes);
    }
}

/* The chunk header of op's chunk idx (chunk.h), our name after it. */
static void chunk_header(tp_fab *t, struct tp_op *op, uint32_t idx, uint8_t *h)
{
    const tp_chunk_hdr c = {
        .flags = (uint8_t)(op->is_abort ? TP_F_ABORT : op->is_ctrl ? TP_F_CTRL : 0),
        .name_len = (uint16_t)t->namelen,
        .stream = op->stream,
        .seq = op->seq,
        .total = op->len,
        .chunk_idx = idx,
        .chunk_size = op->chunk_size,
    };
    tp_chunk_hdr_put(h, &c, t->name);
}

/* The iovecs of bytes [off, off + len) of op's message (head || body ||
 * tail, or its flat copy) into iov[0..3); returns how many. */
static int op_iov(const struct tp_op *op, uint64_t off, size_t len, struct iovec *iov)
{
    const uint8_t *base[3] = {op->edge, op->data, op->edge + op->head_len};
    size_t size[3] = {op->head_len, op->body_len, op->tail_len};
    if (op->flat) {
        base[0] = op->flat;
        size[0] = op->len;
        size[1] = size[2] = 0;
    }
    const uint64_t end = off + len;
    uint64_t at = 0;
    int n = 0;
    for (int i = 0; i < 3; i++) {
        const uint64_t lo = at > off ? at : off;
        const uint64_t hi = at + size[i] < end ? at + size[i] : end;
        if (lo < hi) {
            iov[n].iov_base = (void *)(base[i] + (lo - at));
            iov[n].iov_len = (size_t)(hi - lo);
            n++;
        }
        at += size[i];
    }
    return n;
}

/* A chunk needs up to four iovecs (its header and three pieces); with a
 * provider that takes fewer, an op with pieces goes out from one flat
 * copy instead (the caller's buffer is still released with the op). */
static int op_flatten(tp_fab *t, struct tp_op *op)
{
    if (op->flat || (!op->head_len && !op->tail_len) || t->iov_limit >= 4)
        return 0;
    uint8_t *f = ds_transport_buf_get(&t->pub, op->len ? op->len : 1);
    if (!f)
        return -ENOMEM;
    memcpy(f, op->edge, op->head_len);
    if (op->body_len)
        memcpy(f + op->head_len, op->data, op->body_len);
    memcpy(f + op->head_len + op->body_len, op->edge + op->head_len, op->tail_len);
    op->flat = f;
    return 0;
}

/* Payload bytes of op's chunk idx. */
static size_t chunk_len(const struct tp_op *op, uint32_t idx)
{
    if (op->is_abort)
        return 0;
    uint64_t off = (uint64_t)idx * op->chunk_size;
    return (size_t)(op->len - off < op->chunk_size ? op->len - off : op->chunk_size);
}

/* Post one chunk of op with tag; 0 or the libfabric error. */
static ssize_t post_chunk(tp_fab *t, struct tp_peer *p, struct tp_op *op, uint32_t idx,
                          uint64_t tag)
{
    uint64_t off = (uint64_t)idx * op->chunk_size;
    size_t clen = chunk_len(op, idx);
    struct tp_chunk *c = &op->chunks[idx];
    size_t hl = TP_HDR_FIXED + t->namelen;
    c->ctx.kind = CTX_TX;
    c->op = op;
    c->posted = 1;
    chunk_header(t, op, idx, c->hdr);
    struct iovec iov[4] = {{.iov_base = c->hdr, .iov_len = hl}};
    int niov = 1 + (clen ? op_iov(op, off, clen, iov + 1) : 0);
    ssize_t r = fi_tsendv(t->ep, iov, NULL, (size_t)niov, p->fa, tag, &c->ctx);
    if (r)
        c->posted = 0;
    if (r == -FI_EAGAIN) {
        ST_ADD(t, eagain, 1);
        t->eagain_seen = 1;
    }
    return r;
}

/* Control messages go first and outside the window, so grants flow even
 * while our data waits for the peer's. Sets *stop when posting must end
 * for this pass (no memory, or the provider said -FI_EAGAIN). */
static int post_ctrlq(tp_fab *t, uint32_t slot, int budget, int *stop)
{
    struct tp_peer *p = &t->peers[slot];
    int posted = 0;
    while (p->ctrlq.head && posted < budget) {
        struct tp_op *op = p->ctrlq.head;
        if (!op->chunks) {
            op->chunks = calloc(1, sizeof(*op->chunks));
            if (!op->chunks) {
                *stop = 1;
                return posted;
            }
        }
        op->stream = p->tx_stream;
        op->chunks[0].wire = (uint32_t)(TP_HDR_FIXED + t->namelen + op->len);
        ssize_t r = post_chunk(t, p, op, 0, TP_TAG_SMALL);
        if (r == -FI_EAGAIN) {
            *stop = 1;
            return posted;
        }
        list_unlink(&p->ctrlq, op);
        op->where = OP_NOWHERE;
        if (r) {
            fab_op_free(t, op);
            continue;
        }
        posted++;
        op->pending = 1;
        op->pending_bytes = op->chunks[0].wire;
        op->next_chunk = 1;
        list_push_tail(&p->inflight, op);
        op->where = OP_INFLIGHT;
    }
    return posted;
}

enum post_res {
    POST_OK,     /* a chunk was posted */
    POST_NEXT,   /* the head op failed and left the queue: try the next */
    POST_BREAK,  /* window full, no grant, or -FI_EAGAIN: stop this peer */
    POST_RETURN, /* no memory: stop this peer, retry on the next pass */
};

/* The head op's chunk table, allocated at its first post. */
static enum post_res op_prepare(tp_fab *t, struct tp_op *op)
{
    if (op->chunks)
        return POST_OK;
    if (!op->is_abort) {
        if (op_flatten(t, op))
            return POST_RETURN;
        op->chunk_size = (uint32_t)t->o.chunk_bytes;
        op->nchunks = op->len ? (uint32_t)((op->len + op->chunk_size - 1) / op->chunk_size) : 1;
    }
    op->chunks = calloc(op->nchunks, sizeof(*op->chunks));
    return op->chunks ? POST_OK : POST_RETURN;
}

/* A post that libfabric refused with a real error: give back the grant it
 * would have used, and fail the op (an ABORT is dropped quietly). */
static void post_refused(tp_fab *t, uint32_t slot, struct tp_op *op, uint32_t idx, int granted,
                         uint64_t gid, ssize_t r)
{
    struct tp_peer *p = &t->peers[slot];
    if (granted)
        fab_ctrl_send_ids(t, slot, TP_CTRL_RELEASE, 0, &gid, 1);
    if (!op->is_abort && idx == 0)
        op->seq = 0;
    ds_log_rl(DS_LOG_WARN, COMP, "fi_tsendv to %s: %s", p->addr, tp_fi.strerror((int)-r));
    if (!op->is_abort) {
        fab_op_fail(t, op, fab_errno((int)r));
        return;
    }
    list_unlink(&p->txq, op);
    op->where = OP_NOWHERE;
    if (op->pending == 0) {
        fab_op_free(t, op);
    } else {
        list_push_tail(&p->inflight, op);
        op->where = OP_INFLIGHT;
    }
}

/* Post the next chunk of the peer's head op, if the window and the grants
 * allow. */
static enum post_res post_txq_head(tp_fab *t, uint32_t slot)
{
    struct tp_peer *p = &t->peers[slot];
    struct tp_op *op = p->txq.head;
    enum post_res pr = op_prepare(t, op);
    if (pr != POST_OK)
        return pr;
    uint32_t idx = op->next_chunk;
    if (!op->is_abort && idx == 0) {
        /* The seq is taken for good only when chunk 0 is accepted, so
         * every seq on the wire is followed by all its chunks or an
         * ABORT, and the receiver never waits for a number that was
         * never sent. */
        op->stream = p->tx_stream;
        op->seq = p->tx_seq + 1;
    }
    struct tp_chunk *c = &op->chunks[idx];
    c->wire = (uint32_t)(TP_HDR_FIXED + t->namelen + chunk_len(op, idx));
    if (p->inflight_bytes && p->inflight_bytes + c->wire > t->o.max_inflight_bytes)
        return POST_BREAK; /* window full: wait for completions */
    uint64_t tag = TP_TAG_SMALL, gid = 0;
    int granted = 0;
    if (c->wire > TP_EAGER_MAX) {
        if (!p->gr_n) {
            fab_ask_grants(t, slot);
            return POST_BREAK;
        }
        gid = fab_gr_pop(p);
        granted = 1;
        tag = TP_TAG_GRANT | gid;
        p->large_ms = ds_now_ms();
        p->used[p->used_pos++ % TP_GRANT_RING] = gid;
    }
    ssize_t r = post_chunk(t, p, op, idx, tag);
    if (r == -FI_EAGAIN) {
        if (granted)
            fab_gr_push_front(p, gid);
        return POST_BREAK;
    }
    if (r) {
        post_refused(t, slot, op, idx, granted, gid, r);
        return POST_NEXT;
    }
    ds_debug(COMP, "posted to %s stream=%016" PRIx64 " seq=%" PRIu64 " chunk=%u/%u bytes=%u%s",
             p->addr, op->stream, op->seq, idx, op->nchunks, c->wire,
             op->is_abort ? " ABORT" : granted ? " granted" : "");
    if (!op->is_abort && idx == 0)
        p->tx_seq = op->seq;
    op->pending++;
    op->pending_bytes += c->wire;
    op->next_chunk++;
    p->inflight_bytes += c->wire;
    if (op->next_chunk == op->nchunks) {
        list_unlink(&p->txq, op);
        list_push_tail(&p->inflight, op);
        op->where = OP_INFLIGHT;
    }
    return POST_OK;
}

/* Post what the peer's queues, window and grants allow. Returns chunks
 * posted. */
static int post_peer(tp_fab *t, uint32_t slot, int budget)
{
    struct tp_peer *p = &t->peers[slot];
    if (!p->in_av || t->broken)
        return 0;
    if (!p->tx_stream)
        p->tx_stream = tp_random_u64();
    int stop = 0;
    int posted = post_ctrlq(t, slot, budget, &stop);
    if (stop)
        return posted;
    while (p->txq.head && posted < budget) {
        enum post_res r = post_txq_head(t, slot);
        if (r == POST_OK)
            posted++;
        else if (r == POST_BREAK)
            break;
        else if (r == POST_RETURN)
            return posted;
    }
    /* Grants are standing credit; they go back only after a long idle
     * spell (taking them back costs the receiver a cancel and a quarantine,
     * see TP_QUARANTINE_GRACE_MS). */
    if (p->gr_n && ds_now_ms() - p->large_ms >= TP_GRANT_IDLE_MS &&
        !fab_large_chunks_queued(t, p, 1))
        fab_release_grants(t, slot);
    return posted;
}

int fab_post_sends(tp_fab *t)
{
    int n = 0;
    t->eagain_seen = 0;
    for (uint32_t b = t->busy_head; b; b = t->peers[b - 1].busy_next) {
        struct tp_peer *p = &t->peers[b - 1];
        if (p->txq.head || p->ctrlq.head || p->gr_n)
            n += post_peer(t, b - 1, TP_POST_BUDGET);
    }
    return n;
}

void fab_tx_complete(tp_fab *t, struct tp_chunk *c, int err)
{
    if (!c->posted) {
        ST_ADD(t, dup_completions, 1);
        return;
    }
    c->posted = 0;
    struct tp_op *op = c->op;
    struct tp_peer *p = &t->peers[op->slot];
    if (err)
        op->tainted = 1;
    op->pending--;
    op->pending_bytes -= c->wire;
    if (!op->is_ctrl)
        p->inflight_bytes -= c->wire;
    if (op->abandoned)
        ST_SUB(t, stuck_bytes, c->wire);
    if (err) {
        if (!op->is_abort && !op->reported) {
            ds_log_rl(DS_LOG_WARN, COMP, "send to %s failed: %s", p->addr, tp_fi.strerror(err));
            fab_op_fail(t, op, fab_errno(err));
            return; /* fab_op_fail retired it if nothing is pending */
        }
    } else {
        op->completed++;
        if (op->completed == op->nchunks)
            fab_op_report(t, op, 0);
    }
    if (op->pending == 0 && op->next_chunk == op->nchunks)
        fab_op_retire(t, op);
}

/* Look the peer up and queue op for the progress thread (any thread). */
static int submit(tp_fab *t, ds_transport_peer p, struct tp_op *op)
{
    uint32_t slot;
    int r;
    pthread_mutex_lock(&t->lock);
    if (t->stop) {
        r = -ECANCELED;
    } else if ((r = fab_peer_slot(t, p, &slot)) == 0) {
        uint64_t q = atomic_load(&t->st.queued_bytes);
        if (q + op->len > t->o.max_queued_bytes) {
            r = -ENOBUFS;
        } else {
            ST_ADD(t, queued_bytes, op->len);
            op->slot = slot;
            list_push_tail(&t->subq, op);
        }
    }
    pthread_mutex_unlock(&t->lock);
    return r;
}

int fab_send(ds_transport *pub, ds_transport_peer p, const ds_transport_send_args *a)
{
    tp_fab *t = fab_of(pub);
    struct tp_op *op = calloc(1, sizeof(*op));
    if (!op)
        return -ENOMEM;
    if (a->head_len)
        memcpy(op->edge, a->head, a->head_len);
    if (a->tail_len)
        memcpy(op->edge + a->head_len, a->tail, a->tail_len);
    op->head_len = (uint16_t)a->head_len;
    op->tail_len = (uint16_t)a->tail_len;
    op->body_len = a->len;
    if (a->release) {
        op->data = a->buf;
        op->release = a->release;
        op->release_arg = a->release_arg;
    } else if (a->len) {
        op->copy = ds_transport_buf_get(pub, a->len);
        if (!op->copy) {
            free(op);
            return -ENOMEM;
        }
        memcpy(op->copy, a->buf, a->len);
        op->data = op->copy;
    }
    op->len = a->len + a->head_len + a->tail_len;
    op->deadline_ms = a->deadline_ms;
    op->done = a->done;
    op->done_arg = a->done_arg;
    int r = submit(t, p, op);
    if (r) {
        free(op->copy);
        free(op);
        return r;
    }
    fab_wake(t);
    return 0;
}
