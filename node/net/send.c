/*
 * node/net/send.c: the secured layer's send paths.
 *
 * A sender looks the peer up under the lock, takes a reference to its
 * session, and seals and hands the frame to the transport outside the
 * lock, on its own thread (ds_session_seal is thread-safe), so the gossip
 * thread and the failure detector send at once without waiting for each
 * other or for the worker. Without a session the frame waits in the peer's
 * queue (bounded in bytes, with its deadline) and a handshake starts (dial,
 * a HELLO); the worker seals the queue when the session comes up
 * (handshake.c) and fails what passed its deadline (worker.c). New frames
 * queue behind a queue being flushed, so nothing overtakes it.
 *
 * ds_net_send_msg_ref lends a STATE_CHUNK's data to the transport instead
 * of copying it (mode none, a session up, DS_NET_REF_MIN bytes or more):
 * header and chunk prefix travel as the transport's `head`, the data from
 * the caller's memory. In mode encrypt it seals the data from the
 * caller's memory into the frame (one pass, ds_session_seal_from) and
 * releases it at once. Every other case copies and releases at once.
 *
 * The test hooks (ds_net_seal_for_test, ds_net_send_raw) are here too: they
 * seal and send exactly as the real paths do, for the attacker process of
 * the cross-process security suite.
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
#include "node/wire/header.h"

/* Tests only: show a handshake frame to cfg.hs_tap ('S' sent, 'R' received). */
void net_tap(ds_net *n, char dir, const uint8_t *frame, size_t len)
{
    if (n->cfg.hs_tap)
        n->cfg.hs_tap(n->cfg.cb_ctx, dir, frame, len);
}

static void send_done(void *arg, int status)
{
    struct send_ctx *c = arg;
    if (status)
        ADD(c->n, send_failures, 1);
    if (c->done)
        c->done(c->done_arg, status);
    free(c);
}

/* Frames go back to the transport's buffer cache (arg: the transport,
 * captured at send time, as n->tp is cleared while it closes). */
static void release_frame(void *arg, void *buf)
{
    ds_transport_buf_put(arg, buf);
}

/* Hand the sealed frame buf[0..out_len) to the transport, which takes
 * buf. On failure buf is freed and done is NOT called. */
static int send_sealed(ds_net *n, ds_transport_peer tp, uint8_t *buf, size_t out_len,
                       uint64_t deadline_ms, ds_transport_done_fn done, void *done_arg)
{
    /* read before the transport takes buf */
    const unsigned buf_type = out_len > DS_WH_TYPE ? buf[DS_WH_TYPE] : 0;
    struct send_ctx *c = malloc(sizeof(*c));
    if (!c) {
        free(buf);
        return -ENOMEM;
    }
    c->n = n;
    c->done = done;
    c->done_arg = done_arg;
    ds_transport_send_args a = {
        .buf = buf,
        .len = out_len,
        .deadline_ms = deadline_ms,
        .release = release_frame,
        .release_arg = n->tp,
        .done = send_done,
        .done_arg = c,
    };
    int r = ds_transport_send(n->tp, tp, &a);
    if (r) {
        free(c);
        free(buf);
        return r;
    }
    ADD(n, frames_sent, 1);
    ADD(n, bytes_sent, out_len);
    ADD(n, kind_sent[net_kind_of(buf_type)], out_len);
    return 0;
}

/* Seal buf[0..len) (cap len + tag) with s and hand it to the transport,
 * which takes buf. On failure buf is freed and done is NOT called. */
int net_seal_and_send(ds_net *n, struct net_sess *s, ds_transport_peer tp, uint8_t *buf,
                         size_t len, uint64_t deadline_ms, ds_transport_done_fn done,
                         void *done_arg)
{
    size_t out_len = 0;
    int r = ds_session_seal(&s->s, buf, len, len + DS_WIRE_TAG_SIZE, &out_len);
    if (r) {
        free(buf);
        return r;
    }
    return send_sealed(n, tp, buf, out_len, deadline_ms, done, done_arg);
}

int net_send_hs_frame(ds_net *n, struct net_peer *p, const uint8_t *frame, size_t len)
{
    net_tap(n, 'S', frame, len);
    ds_transport_send_args a = {.buf = frame, .len = len, .deadline_ms = p->hs_deadline_ms};
    return ds_transport_send(n->tp, p->tp, &a); /* copied */
}

/* Start a handshake as initiator (under the lock). */
int net_dial(ds_net *n, struct net_peer *p)
{
    if (p->hs)
        return 0;
    const char *addr = p->dial[0] ? p->dial : p->pub[0] ? p->pub : p->addr;
    if (!addr[0])
        return -EHOSTUNREACH;
    int r;
    if (!p->tp) {
        r = ds_transport_peer_add(n->tp, addr, &p->tp);
        if (r)
            return r == -ENOENT || r == -EINVAL ? -EHOSTUNREACH : r;
        if (ds_transport_peer_addr(n->tp, p->tp, p->addr, sizeof(p->addr)))
            p->addr[0] = 0;
    }
    ds_hs *hs = calloc(1, sizeof(*hs));
    if (!hs)
        return -ENOMEM;
    r = ds_hs_init_initiator(hs, &n->hs_cfg, p->id ? p->id : p->expect);
    uint8_t frame[DS_WIRE_MAX_HS_FRAME];
    size_t len = 0;
    if (!r)
        r = ds_hs_write(hs, frame, sizeof(frame), &len);
    if (r) {
        ds_hs_wipe(hs);
        free(hs);
        return r;
    }
    p->hs = hs;
    p->hs_initiator = 1;
    p->hs_refused = 0;
    p->hs_deadline_ms = ds_now_ms() + n->cfg.handshake_timeout_ms;
    crypto_generichash(p->hello_hash, sizeof(p->hello_hash), frame, len, NULL, 0);
    r = net_send_hs_frame(n, p, frame, len);
    if (r)
        ds_log_rl(DS_LOG_WARN, COMP, "HELLO to %s not sent: %s", addr, strerror(-r));
    ds_debug(COMP, "handshake: HELLO to %s", addr);
    return 0;
}

void net_wake_worker(ds_net *n)
{
    pthread_mutex_lock(&n->rxlock);
    pthread_cond_signal(&n->rxcond);
    pthread_mutex_unlock(&n->rxlock);
}

/* Takes buf (unsealed frame of len bytes, capacity len + tag). */
static int submit(ds_net *n, uint64_t to, const char *to_addr, uint8_t *buf, size_t len,
                  const ds_net_send_opts *o)
{
    if (to_addr && !*to_addr)
        to_addr = NULL;
    pthread_mutex_lock(&n->lock);
    if (n->closing) {
        pthread_mutex_unlock(&n->lock);
        free(buf);
        return -ECANCELED;
    }
    struct net_peer *p = to ? net_peer_by_id(n, to) : NULL;
    if (!p && to_addr)
        p = net_peer_by_addr(n, to_addr);
    if (!p) {
        if (!to_addr) {
            pthread_mutex_unlock(&n->lock);
            free(buf);
            return -EHOSTUNREACH;
        }
        p = net_peer_new(n);
        if (!p) {
            pthread_mutex_unlock(&n->lock);
            free(buf);
            return -ENOMEM;
        }
        p->expect = to;
        snprintf(p->dial, sizeof(p->dial), "%s", to_addr);
    } else if (to_addr && !p->dial[0]) {
        snprintf(p->dial, sizeof(p->dial), "%s", to_addr);
    }
    if (p->sess && p->tp && !p->flushing) {
        struct net_sess *s = net_sess_ref(p->sess);
        ds_transport_peer tp = p->tp;
        if (ds_session_rekey_due(&s->s) && !p->hs) {
            p->rekey = 1;
            net_wake_worker(n);
        }
        pthread_mutex_unlock(&n->lock);
        int r = net_seal_and_send(n, s, tp, buf, len, o->deadline_ms, o->done, o->done_arg);
        net_sess_unref(s);
        return r;
    }
    if (p->pend_bytes + len > n->cfg.max_pending_bytes) {
        pthread_mutex_unlock(&n->lock);
        free(buf);
        return -ENOBUFS;
    }
    /* Queue behind what waits already (a session that is being flushed
     * keeps the order: nothing overtakes the queue). */
    int r = p->sess ? 0 : net_dial(n, p);
    if (r) {
        pthread_mutex_unlock(&n->lock);
        free(buf);
        return r;
    }
    struct pend *q = calloc(1, sizeof(*q));
    if (!q) {
        pthread_mutex_unlock(&n->lock);
        free(buf);
        return -ENOMEM;
    }
    q->buf = buf;
    q->len = len;
    q->deadline_ms = o->deadline_ms;
    q->done = o->done;
    q->done_arg = o->done_arg;
    if (p->pend_tail)
        p->pend_tail->next = q;
    else
        p->pend_head = q;
    p->pend_tail = q;
    p->pend_bytes += len;
    p->npend++;
    pthread_mutex_unlock(&n->lock);
    net_wake_worker(n); /* its timer now covers this deadline */
    return 0;
}

int ds_net_send_frame(ds_net *n, uint64_t to, const char *to_addr, const uint8_t *frame,
                      size_t len, const ds_net_send_opts *o)
{
    if (!n || !frame || !o)
        return -EINVAL;
    if (o->deadline_ms <= ds_now_ms())
        return -ETIMEDOUT;
    ds_wire_hdr h;
    if (ds_wire_hdr_check(frame, len, &n->limits, &h) != DS_DROP_NONE ||
        ds_wire_is_handshake(h.type) || ds_wire_prot(&h) != DS_PROT_NONE)
        return len > n->limits.max_payload + DS_WIRE_HDR_SIZE ? -EMSGSIZE : -EINVAL;
    uint8_t *buf = ds_transport_buf_get(n->tp, len + DS_WIRE_TAG_SIZE);
    if (!buf)
        return -ENOMEM;
    memcpy(buf, frame, len);
    return submit(n, to, to_addr, buf, len, o);
}

/* Address m from us to `to` and check its encoded size (*size) against
 * the limits. */
static int stamp(ds_net *n, uint64_t to, ds_wire_msg *m, size_t *size)
{
    m->h.cluster = n->cluster_id;
    m->h.sender = n->self_id;
    m->h.receiver = to;
    *size = ds_wire_encoded_size(m);
    if (!*size)
        return -EINVAL;
    if (*size > (size_t)n->limits.max_payload + DS_WIRE_HDR_SIZE)
        return -EMSGSIZE;
    return 0;
}

int ds_net_send_msg(ds_net *n, uint64_t to, const char *to_addr, ds_wire_msg *m,
                    const ds_net_send_opts *o)
{
    if (!n || !m || !o || ds_wire_is_handshake(m->h.type))
        return -EINVAL;
    if (o->deadline_ms <= ds_now_ms())
        return -ETIMEDOUT;
    size_t size;
    int r = stamp(n, to, m, &size);
    if (r)
        return r;
    uint8_t *buf = ds_transport_buf_get(n->tp, size + DS_WIRE_TAG_SIZE);
    if (!buf)
        return -ENOMEM;
    size_t len = 0;
    r = ds_wire_encode(buf, size + DS_WIRE_TAG_SIZE, m, &len);
    if (r) {
        free(buf);
        return r;
    }
    return submit(n, to, to_addr, buf, len, o);
}

/* The session to send to `to` on directly (up, connection known, no
 * queue being flushed, no rekey due: what submit() would seal at once),
 * referenced, and its connection; NULL when the frame would have to wait
 * or start something. */
static struct net_sess *direct_sess(ds_net *n, uint64_t to, const char *to_addr,
                                    ds_transport_peer *tp)
{
    struct net_sess *s = NULL;
    if (to_addr && !*to_addr)
        to_addr = NULL;
    pthread_mutex_lock(&n->lock);
    struct net_peer *p = n->closing ? NULL : to ? net_peer_by_id(n, to) : NULL;
    if (!p && to_addr && !n->closing)
        p = net_peer_by_addr(n, to_addr);
    if (p && p->sess && p->tp && !p->flushing && !ds_session_rekey_due(&p->sess->s)) {
        if (to_addr && !p->dial[0])
            snprintf(p->dial, sizeof(p->dial), "%s", to_addr);
        s = net_sess_ref(p->sess);
        *tp = p->tp;
    }
    pthread_mutex_unlock(&n->lock);
    return s;
}

/* The zero-copy path of ds_net_send_msg_ref. -EAGAIN, with nothing
 * consumed, when it does not apply (no direct session, a mode that must
 * copy): the caller copies then. */
static int send_ref(ds_net *n, uint64_t to, const char *to_addr, ds_wire_msg *m,
                    const ds_net_send_opts *o, ds_transport_release_fn release, void *release_arg)
{
    size_t size;
    int r = stamp(n, to, m, &size);
    if (r)
        return r;
    uint8_t head[DS_WIRE_HDR_SIZE + DS_WIRE_CHUNK_PREFIX], tag[DS_WIRE_TAG_SIZE];
    size_t head_len = 0, tag_len = 0;
    r = ds_wire_encode_head(head, sizeof(head), m, &head_len);
    if (r)
        return r;
    ds_transport_peer tp = 0;
    struct net_sess *s = direct_sess(n, to, to_addr, &tp);
    if (!s)
        return -EAGAIN;
    const uint8_t *data = m->u.chunk.data;
    const size_t data_len = m->h.count;
    r = ds_session_seal_ref(&s->s, head, head_len, data, data_len, tag, &tag_len);
    net_sess_unref(s);
    if (r)
        return r == -ENOTSUP ? -EAGAIN : r;
    struct send_ctx *c = malloc(sizeof(*c));
    if (!c)
        return -ENOMEM;
    c->n = n;
    c->done = o->done;
    c->done_arg = o->done_arg;
    ds_transport_send_args a = {
        .buf = data,
        .len = data_len,
        .head = head,
        .head_len = head_len,
        .tail = tag,
        .tail_len = tag_len,
        .deadline_ms = o->deadline_ms,
        .release = release,
        .release_arg = release_arg,
        .done = send_done,
        .done_arg = c,
    };
    r = ds_transport_send(n->tp, tp, &a);
    if (r) {
        free(c);
        return r;
    }
    ADD(n, frames_sent, 1);
    ADD(n, bytes_sent, head_len + data_len + tag_len);
    ADD(n, kind_sent[net_kind_of(head[DS_WH_TYPE])], head_len + data_len + tag_len);
    return 0;
}

/* The one-pass path of ds_net_send_msg_ref in mode encrypt: the frame's
 * head is encoded into a transport buffer and the chunk's data sealed from
 * the caller's memory straight behind it (ds_session_seal_from: encrypted
 * on the way, no separate copy). The data is not lent past the return.
 * -EAGAIN, with nothing consumed, when there is no direct session. */
static int send_from(ds_net *n, uint64_t to, const char *to_addr, ds_wire_msg *m,
                     const ds_net_send_opts *o)
{
    size_t size;
    int r = stamp(n, to, m, &size);
    if (r)
        return r;
    ds_transport_peer tp = 0;
    struct net_sess *s = direct_sess(n, to, to_addr, &tp);
    if (!s)
        return -EAGAIN;
    uint8_t *buf = ds_transport_buf_get(n->tp, size + DS_WIRE_TAG_SIZE);
    size_t hl = 0, out_len = 0;
    r = buf ? ds_wire_encode_head(buf, size + DS_WIRE_TAG_SIZE, m, &hl) : -ENOMEM;
    if (!r)
        r = ds_session_seal_from(&s->s, buf, hl, m->u.chunk.data, m->h.count,
                                 size + DS_WIRE_TAG_SIZE, &out_len);
    net_sess_unref(s);
    if (r) {
        free(buf);
        return r;
    }
    return send_sealed(n, tp, buf, out_len, o->deadline_ms, o->done, o->done_arg);
}

int ds_net_send_msg_ref(ds_net *n, uint64_t to, const char *to_addr, ds_wire_msg *m,
                        const ds_net_send_opts *o, ds_transport_release_fn release,
                        void *release_arg)
{
    if (!n || !m || !o || !release || m->h.type != DS_MSG_STATE_CHUNK)
        return -EINVAL;
    if (o->deadline_ms <= ds_now_ms())
        return -ETIMEDOUT;
    const void *data = m->u.chunk.data;
    if (m->h.count >= DS_NET_REF_MIN && n->cfg.mode == DS_SEC_NONE) {
        int r = send_ref(n, to, to_addr, m, o, release, release_arg);
        if (r != -EAGAIN)
            return r;
    }
    if (m->h.count >= DS_NET_REF_MIN && n->cfg.mode == DS_SEC_ENCRYPT) {
        int r = send_from(n, to, to_addr, m, o);
        if (r != -EAGAIN) {
            if (!r)
                release(release_arg, (void *)data); /* sealed from it: lent no longer */
            return r;
        }
    }
    int r = ds_net_send_msg(n, to, to_addr, m, o);
    if (!r)
        release(release_arg, (void *)data); /* copied: lent no longer */
    return r;
}

int ds_net_connect(ds_net *n, const char *addr, uint64_t expect)
{
    if (!n || !addr || !*addr)
        return -EINVAL;
    pthread_mutex_lock(&n->lock);
    struct net_peer *p = expect ? net_peer_by_id(n, expect) : NULL;
    if (!p)
        p = net_peer_by_addr(n, addr);
    if (!p) {
        p = net_peer_new(n);
        if (!p) {
            pthread_mutex_unlock(&n->lock);
            return -ENOMEM;
        }
        p->expect = expect;
        snprintf(p->dial, sizeof(p->dial), "%s", addr);
    }
    int r = p->sess ? 0 : net_dial(n, p);
    pthread_mutex_unlock(&n->lock);
    net_wake_worker(n);
    return r;
}

int ds_net_connected(ds_net *n, uint64_t peer)
{
    pthread_mutex_lock(&n->lock);
    struct net_peer *p = net_peer_by_id(n, peer);
    int up = p && p->sess;
    pthread_mutex_unlock(&n->lock);
    return up;
}

int ds_net_forget(ds_net *n, uint64_t peer)
{
    struct report *rep = NULL;
    pthread_mutex_lock(&n->lock);
    struct net_peer *p = net_peer_by_id(n, peer);
    if (p)
        net_peer_free(n, p, &rep);
    pthread_mutex_unlock(&n->lock);
    net_reports_run(n, rep);
    return p ? 0 : -ENOENT;
}

int ds_net_seal_for_test(ds_net *n, uint64_t to, ds_wire_msg *m, uint8_t **out, size_t *out_len)
{
    m->h.cluster = n->cluster_id;
    m->h.sender = n->self_id;
    m->h.receiver = to;
    size_t size = ds_wire_encoded_size(m);
    if (!size)
        return -EINVAL;
    uint8_t *buf = malloc(size + DS_WIRE_TAG_SIZE);
    if (!buf)
        return -ENOMEM;
    size_t len = 0;
    int r = ds_wire_encode(buf, size + DS_WIRE_TAG_SIZE, m, &len);
    if (r) {
        free(buf);
        return r;
    }
    pthread_mutex_lock(&n->lock);
    struct net_peer *p = net_peer_by_id(n, to);
    struct net_sess *s = p ? net_sess_ref(p->sess) : NULL;
    pthread_mutex_unlock(&n->lock);
    if (!s) {
        free(buf);
        return -ENOTCONN;
    }
    r = ds_session_seal(&s->s, buf, len, len + DS_WIRE_TAG_SIZE, out_len);
    net_sess_unref(s);
    if (r) {
        free(buf);
        return r;
    }
    *out = buf;
    return 0;
}

int ds_net_send_raw(ds_net *n, uint64_t to, const uint8_t *bytes, size_t len, uint64_t deadline_ms)
{
    pthread_mutex_lock(&n->lock);
    struct net_peer *p = net_peer_by_id(n, to);
    ds_transport_peer tp = p ? p->tp : 0;
    pthread_mutex_unlock(&n->lock);
    if (!tp)
        return -ENOTCONN;
    ds_transport_send_args a = {.buf = bytes, .len = len, .deadline_ms = deadline_ms};
    return ds_transport_send(n->tp, tp, &a);
}
