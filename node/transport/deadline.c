/*
 * node/transport/deadline.c: everything in the libfabric backend that
 * happens because time passed.
 *
 *   - Send deadlines. Every send has one (absolute, ds_now_ms() clock). A
 *     send past it is failed with -ETIMEDOUT at once (tx.c's fab_op_fail:
 *     its buffer stays with us while libfabric holds chunks of it).
 *   - Held messages. A partial message at the head of its stream that got
 *     no chunk for rx_timeout_ms, or a hole in the order that waited as
 *     long (200 ms on a stream nothing was delivered from yet), is skipped
 *     so the messages behind it flow.
 *   - Quarantine. What libfabric failed, or we cancelled, is freed after
 *     TP_QUARANTINE_GRACE_MS, or at the next stack close.
 *
 * The progress loop calls fab_scan_due only when the earliest thing it
 * watches falls due (t->next_due_ms, which every place that adds a
 * deadline lowers) and never sleeps past it, so a done(-ETIMEDOUT) runs
 * within about one TP_TICK_MS of the deadline. The scan walks only the busy
 * list: peers with queued or in-flight sends, grants, or held messages;
 * a peer with none of these leaves it here.
 *
 * Progress thread only.
 */
#include "config.h"

#include <errno.h>
#include <inttypes.h>
#include <stdlib.h>

#include "base/log.h"
#include "node/transport/internal.h"

/* Fail the sends of one list past their deadline; lower *next to the
 * earliest deadline left. Returns how many failed. */
static int scan_list(tp_fab *t, struct op_list *l, int is_txq, uint64_t now, uint64_t *next)
{
    int work = 0;
    struct tp_op *op, *nx;
    for (op = l->head; op; op = nx) {
        nx = op->next;
        if (op->reported || (is_txq && op->is_abort))
            continue;
        if (op->deadline_ms <= now) {
            fab_op_fail(t, op, -ETIMEDOUT);
            work++;
            if (is_txq)
                nx = l->head; /* the list may have changed (abort pushed) */
        } else if (op->deadline_ms < *next) {
            *next = op->deadline_ms;
        }
    }
    return work;
}

/* When the stream's head message falls due: its last chunk plus
 * rx_timeout when it is next in order, else the start of the gap plus the
 * gap wait. 0 for a gap not yet stamped. */
static void held_due(const tp_fab *t, const struct tp_rxs *s, uint64_t *since, uint64_t *wait)
{
    const struct tp_rxmsg *h = s->held;
    *since = h->seq == s->next ? h->last_ms : s->gap_since_ms;
    *wait = h->seq == s->next ? t->o.rx_timeout_ms : fab_gap_ms(t, s);
}

/* Skip what waited too long at the head of one stream. Returns 1 when
 * something was skipped. */
static int scan_stream(tp_fab *t, uint32_t slot, struct tp_rxs *s, uint64_t now, uint64_t *next)
{
    struct tp_peer *p = &t->peers[slot];
    int work = 0;
    uint64_t since, wait;
    held_due(t, s, &since, &wait);
    if (since && since + wait <= now) {
        struct tp_rxmsg *h = s->held;
        if (h->seq == s->next) {
            fab_held_pop(s);
            if (h->state == RX_PARTIAL)
                fab_drop(t, DS_TP_DROP_RX_TIMEOUT);
            fab_rxmsg_free(t, h);
            s->next++;
        } else {
            fab_drop(t, DS_TP_DROP_RX_TIMEOUT);
            s->next = h->seq;
        }
        s->gap_since_ms = 0;
        ds_log_rl(DS_LOG_WARN, COMP, "peer %s: skipped a message after %" PRIu64
                  " ms without chunks", p->addr, wait);
        fab_deliver_ready(t, slot, s);
        work++;
    }
    if (s->held) {
        held_due(t, s, &since, &wait);
        if (!since)
            since = now;
        if (since + wait < *next)
            *next = since + wait;
    }
    return work;
}

int fab_scan_due(tp_fab *t, uint64_t now)
{
    int work = 0;
    uint64_t next = UINT64_MAX;
    uint32_t *link = &t->busy_head;
    while (*link) {
        uint32_t slot = *link - 1;
        struct tp_peer *p = &t->peers[slot];
        work += scan_list(t, &p->txq, 1, now, &next);
        work += scan_list(t, &p->inflight, 0, now, &next);
        /* Held messages: a partial head or a gap that waited too long. */
        for (int k = 0; k < TP_STREAMS; k++)
            if (p->rxs[k].held)
                work += scan_stream(t, slot, &p->rxs[k], now, &next);
        if (p->state == PEER_DRAINING && !p->inflight.head && !p->txq.head && !p->ctrlq.head)
            fab_peer_free_slot(t, slot);
        /* Leave the busy list when nothing is left to watch. */
        if (!p->txq.head && !p->inflight.head && !p->ctrlq.head && !p->gr_n &&
            !fab_peer_holds(p)) {
            *link = p->busy_next;
            p->in_busy = 0;
            p->busy_next = 0;
        } else {
            link = &p->busy_next;
        }
    }
    t->next_due_ms = next;
    return work;
}

/* Free what has sat in quarantine past its grace period. */
void fab_quarantine_age(tp_fab *t, uint64_t now)
{
    for (struct tp_op **pp = &t->q_ops; *pp;) {
        struct tp_op *op = *pp;
        if (now - op->q_ms >= TP_QUARANTINE_GRACE_MS) {
            *pp = op->next;
            ST_SUB(t, quarantined_bytes, op->len);
            fab_op_free(t, op);
        } else {
            pp = &op->next;
        }
    }
    for (struct tp_rxbuf **pp = &t->q_rx; *pp;) {
        struct tp_rxbuf *rb = *pp;
        if (now - rb->q_ms >= TP_QUARANTINE_GRACE_MS) {
            *pp = rb->qnext;
            ST_SUB(t, quarantined_bytes, rb->cap);
            free(rb->buf);
            free(rb);
        } else {
            pp = &rb->qnext;
        }
    }
}

/* After the stack is closed nothing in quarantine can be touched again. */
void fab_quarantine_free(tp_fab *t)
{
    while (t->q_ops) {
        struct tp_op *op = t->q_ops;
        t->q_ops = op->next;
        fab_op_free(t, op);
    }
    while (t->q_rx) {
        struct tp_rxbuf *rb = t->q_rx;
        t->q_rx = rb->qnext;
        free(rb->buf);
        free(rb);
    }
    atomic_store(&t->st.quarantined_bytes, 0);
}
