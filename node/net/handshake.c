/*
 * node/net/handshake.c: the worker's side of the three-frame handshake of
 * node/sec/crypto.h (HELLO, HELLO_ACK, HELLO_FIN, and HELLO_REJECT).
 *
 * A HELLO from a connection starts a responder (at most max_handshakes at
 * once: beyond, overload). A refused HELLO is dropped and forgotten at
 * once, and a node we do not admit is told so (HELLO_REJECT, rate-limited)
 * so it stops retrying; a refused HELLO_ACK or HELLO_FIN leaves the
 * handshake unchanged (the genuine frame may still come), and the
 * handshake fails at its timeout (worker.c).
 *
 * Collisions. When both sides dial at once each receives a HELLO while
 * waiting for a HELLO_ACK. The side with the smaller node id keeps its
 * initiator role and ignores the other HELLO; the larger one drops its own
 * handshake and answers as responder. Both see the same two ids, so
 * exactly one handshake survives. Frames waiting for the session stay.
 *
 * A session is replaced, never torn down, by a new handshake: a replayed
 * HELLO cannot cut a link. When a handshake completes, the session is
 * installed, any older entry for the same node is merged into this one
 * (its waiting frames included), and what waited is sealed and sent
 * outside the lock.
 */
#include "config.h"

#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <sodium.h>

#include "base/clock.h"
#include "base/log.h"
#include "node/net/internal.h"

/* A handshake finished: install the session, merge with any older entry
 * for the same node, flush what waited. Under the lock; the flush list is
 * returned for sealing outside it. */
static void hs_complete(ds_net *n, struct net_peer *p, struct report **rep, struct pend **flush,
                        struct net_sess **flush_sess, ds_transport_peer *flush_tp)
{
    const ds_peer_info *info = ds_hs_peer(p->hs);
    struct net_sess *s = calloc(1, sizeof(*s));
    if (!s || ds_hs_session(p->hs, &s->s, &n->limits)) {
        free(s);
        net_hs_drop(n, p);
        ADD(n, hs_failed, 1);
        net_pend_fail_all(p, -ENOMEM, rep);
        net_report_event(rep, DS_NET_EV_HANDSHAKE_FAILED, p, -ENOMEM);
        return;
    }
    atomic_store(&s->refs, 1);
    uint64_t id = info->id;
    char name[DS_WIRE_NAME_MAX + 1], pub[DS_WIRE_ADDR_MAX + 1];
    uint8_t pk[DS_PK_BYTES];
    memcpy(pk, info->pk, DS_PK_BYTES);
    snprintf(name, sizeof(name), "%s", info->name);
    snprintf(pub, sizeof(pub), "%s", info->address);
    net_hs_drop(n, p);

    /* Another entry for the same node (dialled by id before this
     * connection authenticated, or an older connection): this one wins,
     * and inherits its waiting frames. */
    struct net_peer *q, *qn;
    for (q = n->peers; q; q = qn) {
        qn = q->next;
        if (q == p || !(q->id == id || (!q->id && q->expect == id)))
            continue;
        while (q->pend_head) {
            struct pend *f = q->pend_head;
            q->pend_head = f->next;
            f->next = NULL;
            if (p->pend_tail)
                p->pend_tail->next = f;
            else
                p->pend_head = f;
            p->pend_tail = f;
            p->pend_bytes += f->len;
            p->npend++;
        }
        q->pend_tail = NULL;
        q->pend_bytes = 0;
        q->npend = 0;
        if (!p->dial[0] && q->dial[0])
            snprintf(p->dial, sizeof(p->dial), "%s", q->dial);
        if (q->tp == p->tp)
            q->tp = 0; /* do not remove the connection we keep */
        net_peer_free(n, q, rep);
        qn = n->peers; /* the list changed: start over (p stays, q is gone) */
    }
    int rekey = p->sess != NULL;
    net_sess_unref(p->sess);
    p->sess = s;
    p->id = id;
    p->rekey = 0;
    snprintf(p->name, sizeof(p->name), "%s", name);
    snprintf(p->pub, sizeof(p->pub), "%s", pub);
    memcpy(p->pk, pk, DS_PK_BYTES);
    ADD(n, hs_ok, 1);
    ds_info(COMP, "session %s with %s id=%016" PRIx64 " addr=%s mode=%s aead=%s", rekey ? "rekeyed" : "up",
            p->name, p->id, p->addr, ds_sec_mode_name(s->s.mode), ds_aead_name(s->s.aead));
    net_report_event(rep, DS_NET_EV_PEER_UP, p, 0);
    *flush = p->pend_head;
    p->pend_head = p->pend_tail = NULL;
    p->pend_bytes = 0;
    p->npend = 0;
    p->flushing = 1;
    *flush_sess = net_sess_ref(s);
    *flush_tp = p->tp;
}

/* Seal and send what waited, outside the lock; then whatever senders
 * queued meanwhile, until the queue is empty and direct sends may resume. */
static void flush_pending(ds_net *n, struct pend *f, struct net_sess *s, ds_transport_peer tp,
                          struct report **rep)
{
    for (;;) {
        uint64_t now = ds_now_ms();
        while (f) {
            struct pend *q = f;
            f = q->next;
            if (q->deadline_ms <= now) {
                net_report_done(rep, q->done, q->done_arg, -ETIMEDOUT);
                free(q->buf);
            } else {
                int r = net_seal_and_send(n, s, tp, q->buf, q->len, q->deadline_ms, q->done,
                                      q->done_arg);
                if (r)
                    net_report_done(rep, q->done, q->done_arg, r);
            }
            free(q);
        }
        pthread_mutex_lock(&n->lock);
        struct net_peer *p = net_peer_by_tp(n, tp);
        if (p && p->sess == s && p->pend_head) {
            f = p->pend_head;
            p->pend_head = p->pend_tail = NULL;
            p->pend_bytes = 0;
            p->npend = 0;
            pthread_mutex_unlock(&n->lock);
            continue;
        }
        if (p && p->sess == s)
            p->flushing = 0; /* (a newer session's flush owns the flag otherwise) */
        pthread_mutex_unlock(&n->lock);
        break;
    }
    net_sess_unref(s);
}

/* Admission reasons a responder tells the initiator about (HELLO_REJECT):
 * the initiator can do nothing but give up on us, so waiting out its
 * handshake timeout, again and again, helps nobody. */
static int admission_refusal(enum ds_drop_reason why)
{
    return why == DS_DROP_NOT_ALLOWED || why == DS_DROP_BAD_MAC || why == DS_DROP_POLICY_MISMATCH ||
           why == DS_DROP_WRONG_CLUSTER;
}

struct reject_done {
    ds_net *n;
    ds_transport_peer tp;
};

/* The transport peer of a refused HELLO lives until its REJECT is out. */
static void reject_sent(void *arg, int status)
{
    struct reject_done *d = arg;
    ds_transport_peer_remove(d->n->tp, d->tp);
    free(d);
}

/* Under the lock. At most REJECTS_PER_S per second: a refusal costs us one
 * small frame per HELLO received, never more than the HELLO itself. */
#define REJECTS_PER_S 20
static int send_reject(ds_net *n, ds_transport_peer tp, const uint8_t *hello, size_t len,
                       const ds_wire_hdr *h, enum ds_drop_reason why)
{
    const uint64_t now = ds_now_ms();
    if (now - n->reject_window_ms >= 1000) {
        n->reject_window_ms = now;
        n->rejects_in_window = 0;
    }
    if (n->rejects_in_window >= REJECTS_PER_S)
        return -EAGAIN;
    ds_wire_msg m;
    memset(&m, 0, sizeof(m));
    m.h.type = DS_MSG_HELLO_REJECT;
    m.h.cluster = h->cluster; /* theirs: they must be able to read it */
    m.h.sender = n->self_id;
    m.h.receiver = h->sender;
    crypto_generichash(m.u.reject.echo, sizeof(m.u.reject.echo), hello, len, NULL, 0);
    m.u.reject.reason = (uint8_t)why;
    uint8_t out[DS_WIRE_HDR_SIZE + DS_WIRE_HELLO_REJECT_SIZE];
    size_t out_len;
    if (ds_wire_encode(out, sizeof(out), &m, &out_len))
        return -EINVAL;
    struct reject_done *d = malloc(sizeof(*d));
    if (!d)
        return -ENOMEM;
    d->n = n;
    d->tp = tp;
    net_tap(n, 'S', out, out_len);
    ds_transport_send_args a = {.buf = out, .len = out_len, .deadline_ms = now + 2000,
                                .done = reject_sent, .done_arg = d};
    int r = ds_transport_send(n->tp, tp, &a);
    if (r) {
        free(d);
        return r;
    }
    n->rejects_in_window++;
    return 0;
}

/* An initiator hears that its HELLO was refused. */
static void on_reject(ds_net *n, struct net_peer *p, const uint8_t *frame, size_t len)
{
    ds_wire_msg m;
    const ds_wire_bufs no_bufs = {0};
    if (ds_wire_decode(frame, len, &n->limits, &no_bufs, &m, &n->drops) != DS_DROP_NONE)
        return;
    if (!p || !p->hs || !p->hs_initiator ||
        sodium_memcmp(m.u.reject.echo, p->hello_hash, sizeof(p->hello_hash)) != 0) {
        ds_drop_note(&n->drops, DS_DROP_STALE_HANDSHAKE, COMP,
                     "HELLO_REJECT that names no HELLO of ours");
        return;
    }
    ds_log_rl(DS_LOG_WARN, COMP, "%s refused our handshake: %s", p->addr,
              ds_drop_str((enum ds_drop_reason)m.u.reject.reason));
    p->hs_refused = 1;
    p->hs_deadline_ms = 0; /* fails at the next timer pass, with -EACCES */
}

/* A refused HELLO on connection tp (under the lock): forget the entry it
 * made, and tell a node we do not admit, so it stops retrying; its
 * transport peer then goes once the refusal is out. */
static void hello_refused(ds_net *n, struct net_peer *p, int fresh, ds_transport_peer tp,
                          const uint8_t *frame, size_t len, const ds_wire_hdr *h,
                          enum ds_drop_reason why, struct report **rep)
{
    if (!fresh || p->sess)
        return;
    p->tp = 0; /* the transport peer goes below */
    net_peer_free(n, p, rep);
    if (!admission_refusal(why) || send_reject(n, tp, frame, len, h, why) != 0)
        ds_transport_peer_remove(n->tp, tp);
}

/* A HELLO: answer as responder (under the lock, which it lets go). */
static void on_hello(ds_net *n, struct net_peer *p, ds_transport_peer tp, const uint8_t *frame,
                     size_t len, const ds_wire_hdr *h, struct report **rep)
{
    uint8_t out[DS_WIRE_MAX_HS_FRAME];
    size_t out_len = 0;
    if (p && p->hs && p->hs_initiator) {
        if (n->self_id < h->sender) {
            /* Both dialled: the smaller id stays initiator. */
            pthread_mutex_unlock(&n->lock);
            ds_debug(COMP, "handshake collision with %016" PRIx64 ": keeping ours", h->sender);
            return;
        }
        net_hs_drop(n, p);
    }
    int fresh = 0;
    if (!p) {
        if (n->nhandshakes >= n->cfg.max_handshakes) {
            pthread_mutex_unlock(&n->lock);
            ds_drop_note(&n->drops, DS_DROP_OVERLOAD, COMP, "handshakes=%u (bound)",
                         n->nhandshakes);
            return;
        }
        p = net_peer_new(n);
        if (!p) {
            pthread_mutex_unlock(&n->lock);
            return;
        }
        p->tp = tp;
        if (ds_transport_peer_addr(n->tp, tp, p->addr, sizeof(p->addr)))
            p->addr[0] = 0;
        fresh = 1;
    }
    ds_hs *hs = calloc(1, sizeof(*hs));
    enum ds_drop_reason why = DS_DROP_OVERLOAD;
    if (hs && ds_hs_init_responder(hs, &n->hs_cfg) == 0) {
        why = ds_hs_read(hs, frame, len); /* counted and logged there */
        if (why == DS_DROP_NONE && ds_hs_write(hs, out, sizeof(out), &out_len))
            why = DS_DROP_OVERLOAD;
    }
    if (why != DS_DROP_NONE) {
        if (hs) {
            ds_hs_wipe(hs);
            free(hs);
        }
        hello_refused(n, p, fresh, tp, frame, len, h, why, rep);
        pthread_mutex_unlock(&n->lock);
        return;
    }
    /* A running responder handshake (a replayed or repeated HELLO) is
     * replaced; an established session stays until this one completes. */
    net_hs_drop(n, p);
    p->hs = hs;
    p->hs_initiator = 0;
    p->hs_refused = 0;
    p->hs_deadline_ms = ds_now_ms() + n->cfg.handshake_timeout_ms;
    n->nhandshakes++;
    int r = net_send_hs_frame(n, p, out, out_len);
    if (r)
        ds_log_rl(DS_LOG_WARN, COMP, "HELLO_ACK to %s not sent: %s", p->addr, strerror(-r));
    pthread_mutex_unlock(&n->lock);
}

/* HELLO_ACK (we initiated) or HELLO_FIN (we answered), under the lock,
 * which it lets go; the frames that waited for the session are flushed
 * after that. */
static void on_ack_fin(ds_net *n, struct net_peer *p, ds_transport_peer tp, const uint8_t *frame,
                       size_t len, const ds_wire_hdr *h, struct report **rep)
{
    uint8_t out[DS_WIRE_MAX_HS_FRAME];
    size_t out_len = 0;
    struct pend *flush = NULL;
    struct net_sess *flush_sess = NULL;
    ds_transport_peer flush_tp = 0;
    int want_initiator = h->type == DS_MSG_HELLO_ACK;
    if (!p || !p->hs || p->hs_initiator != want_initiator) {
        pthread_mutex_unlock(&n->lock);
        ds_drop_note(&n->drops, DS_DROP_STALE_HANDSHAKE, COMP, "type=%s no handshake waits for it",
                     ds_msg_type_name(h->type));
        if (!p)
            ds_transport_peer_remove(n->tp, tp);
        return;
    }
    enum ds_drop_reason why = ds_hs_read(p->hs, frame, len);
    if (why != DS_DROP_NONE) {
        /* The state is unchanged: the genuine frame may still come. */
        if (why == DS_DROP_BAD_MAC || why == DS_DROP_NOT_ALLOWED || why == DS_DROP_POLICY_MISMATCH ||
            why == DS_DROP_BAD_SIGNATURE)
            p->hs_refused = 1;
        pthread_mutex_unlock(&n->lock);
        return;
    }
    if (want_initiator) {
        if (ds_hs_write(p->hs, out, sizeof(out), &out_len)) {
            pthread_mutex_unlock(&n->lock);
            return;
        }
        int r = net_send_hs_frame(n, p, out, out_len);
        if (r)
            ds_log_rl(DS_LOG_WARN, COMP, "HELLO_FIN to %s not sent: %s", p->addr, strerror(-r));
    }
    if (ds_hs_done(p->hs))
        hs_complete(n, p, rep, &flush, &flush_sess, &flush_tp);
    pthread_mutex_unlock(&n->lock);
    if (flush_sess)
        flush_pending(n, flush, flush_sess, flush_tp, rep);
}

/* One handshake frame from connection tp (worker thread, no lock held). */
void net_on_hs_frame(ds_net *n, ds_transport_peer tp, const uint8_t *frame, size_t len,
                     const ds_wire_hdr *h, struct report **rep)
{
    net_tap(n, 'R', frame, len);
    pthread_mutex_lock(&n->lock);
    struct net_peer *p = net_peer_by_tp(n, tp);
    if (h->type == DS_MSG_HELLO_REJECT) {
        on_reject(n, p, frame, len);
        pthread_mutex_unlock(&n->lock);
    } else if (h->type == DS_MSG_HELLO) {
        on_hello(n, p, tp, frame, len, h, rep);
    } else {
        on_ack_fin(n, p, tp, frame, len, h, rep);
    }
}
