/*
 * node/net/worker.c: the net's worker thread.
 *
 * The transport's progress thread only queues what arrives (taking the
 * buffer, bounded in bytes: over the bound a frame is dropped as overload)
 * and returns; the worker does the rest, so decryption never stalls
 * libfabric progress, and ds_session_open, which must be serialised per
 * session, runs on one thread. Per frame: the header is checked against
 * the limits; a handshake frame goes to handshake.c; a data frame is opened
 * with the session of the connection it arrived on, which checks cluster,
 * sender, receiver, replay window and tag, and is then delivered in place
 * (on_recv). Between frames, and at least every NET_TICK_MS, the timers
 * run: handshakes past their timeout fail, waiting frames past their
 * deadline fail, due rekeys start, and a requested allow-list reload runs
 * (allow.c).
 */
#include "config.h"

#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "base/clock.h"
#include "base/log.h"
#include "node/net/internal.h"

static void on_data_frame(ds_net *n, struct rxitem *it, const ds_wire_hdr *h)
{
    char name[DS_WIRE_NAME_MAX + 1], pub[DS_WIRE_ADDR_MAX + 1];
    pthread_mutex_lock(&n->lock);
    struct net_peer *p = net_peer_by_tp(n, it->tp);
    struct net_sess *s = p ? net_sess_ref(p->sess) : NULL;
    if (s) {
        snprintf(name, sizeof(name), "%s", p->name);
        snprintf(pub, sizeof(pub), "%s", p->pub);
    }
    pthread_mutex_unlock(&n->lock);
    if (!s) {
        ds_drop_note(&n->drops, DS_DROP_UNKNOWN_SENDER, COMP, "type=%s sender=%016" PRIx64,
                     ds_msg_type_name(h->type), h->sender);
        if (!p)
            ds_transport_peer_remove(n->tp, it->tp);
        return;
    }
    /* Only this thread opens: the per-session serialisation open needs. */
    enum ds_drop_reason why = ds_session_open(&s->s, (uint8_t *)it->data, it->len);
    uint64_t sender = s->s.peer_id;
    net_sess_unref(s);
    if (why != DS_DROP_NONE)
        return; /* counted and logged by open */
    ds_net_rx rx = {
        .sender = sender,
        .name = name,
        .addr = pub,
        .hdr = *h,
        .frame = it->data,
        .len = it->len,
        .payload = it->data + DS_WIRE_HDR_SIZE,
        .payload_len = h->payload_len,
        .base_ = it->base,
    };
    ADD(n, frames_recv, 1);
    ADD(n, bytes_recv, it->len);
    ADD(n, kind_recv[net_kind_of(h->type)], it->len);
    n->cfg.on_recv(n->cfg.cb_ctx, &rx);
    if (rx.taken_)
        it->base = NULL;
}

static void on_transport_event(ds_net *n, struct rxitem *it, struct report **rep)
{
    enum ds_net_event_kind kind;
    switch (it->ev.kind) {
    case DS_TRANSPORT_EV_PEER_UNRESPONSIVE:
        kind = DS_NET_EV_PEER_UNRESPONSIVE;
        break;
    case DS_TRANSPORT_EV_PEER_RESPONSIVE:
        kind = DS_NET_EV_PEER_RESPONSIVE;
        break;
    case DS_TRANSPORT_EV_RESET:
        net_report_event(rep, DS_NET_EV_RESET, NULL, it->ev.status);
        return;
    default:
        return;
    }
    pthread_mutex_lock(&n->lock);
    struct net_peer *p = net_peer_by_tp(n, it->ev.peer);
    if (p)
        net_report_event(rep, kind, p, 0);
    pthread_mutex_unlock(&n->lock);
}

/* Handshake and pending-frame deadlines, rekeys. Returns the next time
 * something falls due. */
static uint64_t timers(ds_net *n, struct report **rep)
{
    uint64_t now = ds_now_ms(), next = now + NET_TICK_MS;
    pthread_mutex_lock(&n->lock);
    struct net_peer *p = n->peers, *nx;
    for (; p; p = nx) {
        nx = p->next;
        if (p->hs && p->hs_deadline_ms <= now) {
            int status = p->hs_refused ? -EACCES : -ETIMEDOUT;
            ds_log_rl(DS_LOG_WARN, COMP, "handshake with %s (%s) %s", p->addr[0] ? p->addr : p->dial,
                      p->hs_initiator ? "we dialled" : "it dialled",
                      status == -EACCES ? "refused" : "timed out");
            net_hs_drop(n, p);
            ADD(n, hs_failed, 1);
            net_report_event(rep, DS_NET_EV_HANDSHAKE_FAILED, p, status);
            if (!p->sess) {
                net_pend_fail_all(p, status, rep);
                if (!p->id) {
                    net_peer_free(n, p, rep);
                    continue;
                }
            }
        }
        if (p->rekey && !p->hs && p->sess)
            if (net_dial(n, p))
                p->rekey = 0;
        /* Waiting frames past their deadline. */
        struct pend **pp = &p->pend_head, *last = NULL;
        while (*pp) {
            struct pend *q = *pp;
            if (q->deadline_ms <= now) {
                *pp = q->next;
                p->pend_bytes -= q->len;
                p->npend--;
                net_report_done(rep, q->done, q->done_arg, -ETIMEDOUT);
                free(q->buf);
                free(q);
                continue;
            }
            if (q->deadline_ms < next)
                next = q->deadline_ms;
            last = q;
            pp = &q->next;
        }
        p->pend_tail = last;
        if (p->hs && p->hs_deadline_ms < next)
            next = p->hs_deadline_ms;
    }
    pthread_mutex_unlock(&n->lock);
    return next;
}

void *net_worker_main(void *arg)
{
    ds_net *n = arg;
    pthread_setname_np(pthread_self(), "ds-net");
    uint64_t next_timer = 0;
    for (;;) {
        pthread_mutex_lock(&n->rxlock);
        /* One wait at most: a wake-up without a frame (a send queued a
         * frame with a new deadline) runs the timers below. */
        if (!n->rx_head && !n->stop && ds_now_ms() < next_timer) {
            uint64_t now = ds_now_ms();
            struct timespec ts;
            clock_gettime(CLOCK_REALTIME, &ts);
            uint64_t wait = next_timer - now;
            ts.tv_sec += (time_t)(wait / 1000);
            ts.tv_nsec += (long)(wait % 1000) * 1000000L;
            if (ts.tv_nsec >= 1000000000L) {
                ts.tv_sec++;
                ts.tv_nsec -= 1000000000L;
            }
            pthread_cond_timedwait(&n->rxcond, &n->rxlock, &ts);
            next_timer = 0;
        }
        if (n->stop) {
            pthread_mutex_unlock(&n->rxlock);
            break;
        }
        struct rxitem *it = n->rx_head;
        if (it) {
            n->rx_head = it->next;
            if (!n->rx_head)
                n->rx_tail = NULL;
            n->rx_bytes -= it->len;
        }
        pthread_mutex_unlock(&n->rxlock);

        struct report *rep = NULL;
        if (it) {
            if (it->is_event) {
                on_transport_event(n, it, &rep);
            } else {
                ds_wire_hdr h;
                if (ds_wire_hdr_decode(it->data, it->len, &n->limits, &h, &n->drops) ==
                    DS_DROP_NONE) {
                    if (ds_wire_is_handshake(h.type))
                        net_on_hs_frame(n, it->tp, it->data, it->len, &h, &rep);
                    else
                        on_data_frame(n, it, &h);
                }
            }
            ds_transport_buf_put(n->tp, it->base); /* (the worker runs while tp lives) */
            free(it);
        }
        if (!it || ds_now_ms() >= next_timer) {
            next_timer = timers(n, &rep);
            net_allow_poll(n); /* a SIGHUP: reload the allow-list here */
        }
        net_reports_run(n, rep);
    }
    return NULL;
}

void net_tp_on_recv(void *ctx, ds_transport_msg *msg)
{
    ds_net *n = ctx;
    pthread_mutex_lock(&n->rxlock);
    int over = n->rx_bytes + msg->len > n->cfg.max_rx_queue_bytes;
    pthread_mutex_unlock(&n->rxlock);
    if (over) {
        ds_drop_note(&n->drops, DS_DROP_OVERLOAD, COMP, "rx queue over %zu bytes",
                     n->cfg.max_rx_queue_bytes);
        return;
    }
    struct rxitem *it = calloc(1, sizeof(*it));
    if (!it)
        return;
    it->tp = msg->peer;
    it->len = msg->len;
    it->data = msg->data;
    it->base = ds_transport_msg_take(msg);
    pthread_mutex_lock(&n->rxlock);
    if (n->rx_tail)
        n->rx_tail->next = it;
    else
        n->rx_head = it;
    n->rx_tail = it;
    n->rx_bytes += it->len;
    pthread_cond_signal(&n->rxcond);
    pthread_mutex_unlock(&n->rxlock);
}

void net_tp_on_event(void *ctx, const ds_transport_event *ev)
{
    ds_net *n = ctx;
    if (ev->kind == DS_TRANSPORT_EV_PEER_NEW)
        return; /* a HELLO (or garbage) follows */
    struct rxitem *it = calloc(1, sizeof(*it));
    if (!it)
        return;
    it->is_event = 1;
    it->ev = *ev;
    pthread_mutex_lock(&n->rxlock);
    if (n->rx_tail)
        n->rx_tail->next = it;
    else
        n->rx_head = it;
    n->rx_tail = it;
    pthread_cond_signal(&n->rxcond);
    pthread_mutex_unlock(&n->rxlock);
}
