/*
 * node/net/net.c: see net.h for the contract. How it is built:
 *
 * Peers. A struct net_peer exists per transport connection we handshake
 * on (an address). Its id is 0 until a handshake proves one; after that it
 * is the table's key. The peer owns at most one handshake in progress and
 * one current session; a session is a refcounted object, because senders
 * seal outside the lock while the worker may replace it (a rekey, or the
 * peer handshaking again after a restart): the old one is wiped when its
 * last sender lets go. Everything in the table is guarded by n->lock.
 *
 * Receiving. The transport's progress thread only queues what arrives
 * (taking the buffer, bounded in bytes: over the bound a frame is dropped
 * as overload) and returns; the worker thread does the rest, so decryption
 * never stalls libfabric progress. Per frame: the header is checked
 * against the limits; a handshake frame goes to the connection's handshake
 * (starting one as responder on a HELLO, bounded by max_handshakes); a data
 * frame is opened with the connection's session, which checks cluster,
 * sender, receiver, replay window and tag, and then delivered in place.
 *
 * Handshake collisions. When both sides dial at once each receives a HELLO
 * while waiting for a HELLO_ACK. The side with the smaller node id keeps
 * its initiator role and ignores the other HELLO; the larger one drops its
 * own handshake and answers as responder. Both see the same two ids, so
 * exactly one handshake survives. Frames waiting for the session stay.
 *
 * Sending. A sender looks the peer up under the lock, takes a reference to
 * its session, and seals and hands the frame to the transport outside the
 * lock. Without a session the frame waits in the peer's queue (bounded in
 * bytes) and a handshake starts; the worker seals the queue when the
 * session comes up and fails what passed its deadline.
 *
 * Callbacks (on_recv, on_event, the senders' done) never run under the
 * lock: the worker collects what to report while it holds it and reports
 * after letting go.
 */
#include "config.h"

#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <sodium.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "base/clock.h"
#include "base/log.h"
#include "node/net/net.h"

#define COMP "net"
#define NET_TICK_MS 100

struct pend {
    struct pend *next;
    uint8_t *buf; /* unsealed frame, room for the tag */
    size_t len;
    uint64_t deadline_ms;
    ds_transport_done_fn done;
    void *done_arg;
};

struct net_sess {
    ds_session s;
    _Atomic int refs;
};

struct net_peer {
    struct net_peer *next;
    uint64_t id;      /* 0 until authenticated */
    uint64_t expect;  /* dialled for this id (0: whoever answers) */
    char dial[DS_TRANSPORT_ADDR_MAX]; /* address we were asked to use */
    char addr[DS_TRANSPORT_ADDR_MAX]; /* the transport's text for tp */
    char name[DS_WIRE_NAME_MAX + 1];
    char pub[DS_WIRE_ADDR_MAX + 1];   /* address it published in its HELLO */
    ds_transport_peer tp;
    struct net_sess *sess;
    ds_hs *hs;
    int hs_initiator;
    uint64_t hs_deadline_ms;
    int hs_refused;   /* a handshake frame was refused (policy, key, MAC),
                       * or the responder sent HELLO_REJECT for our HELLO */
    uint8_t hello_hash[32]; /* BLAKE2b-256 of the HELLO we sent (initiator) */
    int rekey;
    int flushing;     /* the worker is sealing the queue: new frames queue too */
    struct pend *pend_head, *pend_tail;
    size_t pend_bytes;
    unsigned npend;
};

/* What the transport's progress thread hands to the worker. */
struct rxitem {
    struct rxitem *next;
    int is_event;
    ds_transport_peer tp;
    ds_transport_event ev;
    uint8_t *base;
    const uint8_t *data;
    size_t len;
};

/* Reports collected under the lock, delivered after it. */
struct report {
    struct report *next;
    int is_event;
    ds_net_event ev;
    char name[DS_WIRE_NAME_MAX + 1];
    char addr[DS_TRANSPORT_ADDR_MAX];
    ds_transport_done_fn done;
    void *done_arg;
    int status;
};

struct send_ctx {
    ds_net *n;
    ds_transport_done_fn done;
    void *done_arg;
};

struct ds_net {
    ds_net_cfg cfg;
    uint64_t reject_window_ms;   /* HELLO_REJECT rate limit (under lock) */
    unsigned rejects_in_window;
    char name[DS_WIRE_NAME_MAX + 1];
    uint64_t cluster_id;
    uint64_t self_id;
    ds_wire_limits limits;
    ds_hs_config hs_cfg;
    ds_transport *tp;
    char addr[DS_TRANSPORT_ADDR_MAX];
    ds_drop_counters drops;

    pthread_mutex_t lock;
    struct net_peer *peers;
    unsigned nhandshakes;
    int closing;

    pthread_mutex_t rxlock;
    pthread_cond_t rxcond;
    struct rxitem *rx_head, *rx_tail;
    size_t rx_bytes;
    int stop;
    pthread_t worker;
    int worker_started;

    _Atomic uint64_t frames_sent, bytes_sent, frames_recv, bytes_recv;
    _Atomic uint64_t hs_ok, hs_failed, send_failures;
};

#define ADD(n, f, v) atomic_fetch_add_explicit(&(n)->f, (uint64_t)(v), memory_order_relaxed)

/* ---- sessions ---------------------------------------------------------- */

static struct net_sess *sess_ref(struct net_sess *s)
{
    if (s)
        atomic_fetch_add(&s->refs, 1);
    return s;
}

static void sess_unref(struct net_sess *s)
{
    if (s && atomic_fetch_sub(&s->refs, 1) == 1) {
        ds_session_wipe(&s->s);
        free(s);
    }
}

/* ---- reports ------------------------------------------------------------ */

static void report_event(struct report **list, enum ds_net_event_kind kind, const struct net_peer *p,
                         int status)
{
    struct report *r = calloc(1, sizeof(*r));
    if (!r)
        return;
    r->is_event = 1;
    r->ev.kind = kind;
    r->ev.status = status;
    if (p) {
        r->ev.peer = p->id;
        snprintf(r->name, sizeof(r->name), "%s", p->name);
        snprintf(r->addr, sizeof(r->addr), "%s", p->addr[0] ? p->addr : p->dial);
    }
    r->next = *list;
    *list = r;
}

static void report_done(struct report **list, ds_transport_done_fn done, void *arg, int status)
{
    if (!done)
        return;
    struct report *r = calloc(1, sizeof(*r));
    if (!r) {
        done(arg, status); /* better late under the lock than never */
        return;
    }
    r->done = done;
    r->done_arg = arg;
    r->status = status;
    r->next = *list;
    *list = r;
}

static void reports_run(ds_net *n, struct report *list)
{
    /* Reverse to deliver in the order collected. */
    struct report *rev = NULL;
    while (list) {
        struct report *r = list;
        list = r->next;
        r->next = rev;
        rev = r;
    }
    while (rev) {
        struct report *r = rev;
        rev = r->next;
        if (r->is_event) {
            r->ev.name = r->name;
            r->ev.addr = r->addr;
            if (n->cfg.on_event)
                n->cfg.on_event(n->cfg.cb_ctx, &r->ev);
        } else {
            if (r->status)
                ADD(n, send_failures, 1);
            r->done(r->done_arg, r->status);
        }
        free(r);
    }
}

/* ---- peers (under n->lock) ---------------------------------------------- */

/* The peer authenticated as id, else one being dialled for it. */
static struct net_peer *peer_by_id(ds_net *n, uint64_t id)
{
    struct net_peer *dialled = NULL;
    if (!id)
        return NULL;
    for (struct net_peer *p = n->peers; p; p = p->next) {
        if (p->id == id)
            return p;
        if (!p->id && p->expect == id && !dialled)
            dialled = p;
    }
    return dialled;
}

static struct net_peer *peer_by_tp(ds_net *n, ds_transport_peer tp)
{
    for (struct net_peer *p = n->peers; p; p = p->next)
        if (p->tp == tp && tp)
            return p;
    return NULL;
}

static struct net_peer *peer_by_addr(ds_net *n, const char *addr)
{
    for (struct net_peer *p = n->peers; p; p = p->next)
        if (!strcmp(p->dial, addr) || !strcmp(p->addr, addr) || !strcmp(p->pub, addr))
            return p;
    return NULL;
}

static struct net_peer *peer_new(ds_net *n)
{
    struct net_peer *p = calloc(1, sizeof(*p));
    if (!p)
        return NULL;
    p->next = n->peers;
    n->peers = p;
    return p;
}

static void pend_fail_all(struct net_peer *p, int status, struct report **rep)
{
    while (p->pend_head) {
        struct pend *q = p->pend_head;
        p->pend_head = q->next;
        report_done(rep, q->done, q->done_arg, status);
        free(q->buf);
        free(q);
    }
    p->pend_tail = NULL;
    p->pend_bytes = 0;
    p->npend = 0;
}

static void hs_drop(ds_net *n, struct net_peer *p)
{
    if (p->hs) {
        ds_hs_wipe(p->hs);
        free(p->hs);
        p->hs = NULL;
        if (!p->hs_initiator && n->nhandshakes)
            n->nhandshakes--;
    }
}

/* Unlink and free; its transport peer goes too. */
static void peer_free(ds_net *n, struct net_peer *p, struct report **rep)
{
    for (struct net_peer **pp = &n->peers; *pp; pp = &(*pp)->next)
        if (*pp == p) {
            *pp = p->next;
            break;
        }
    hs_drop(n, p);
    pend_fail_all(p, -ECANCELED, rep);
    sess_unref(p->sess);
    if (p->tp) {
        /* Another peer entry may share the connection (never, in
         * practice); only remove it when none does. */
        int shared = 0;
        for (struct net_peer *q = n->peers; q; q = q->next)
            shared |= q->tp == p->tp;
        if (!shared)
            ds_transport_peer_remove(n->tp, p->tp);
    }
    free(p);
}

/* ---- sending ------------------------------------------------------------ */

static void tap(ds_net *n, char dir, const uint8_t *frame, size_t len)
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

/* Seal buf[0..len) (cap len + tag) with s and hand it to the transport,
 * which takes buf. On failure buf is freed and done is NOT called. */
static int seal_and_send(ds_net *n, struct net_sess *s, ds_transport_peer tp, uint8_t *buf,
                         size_t len, uint64_t deadline_ms, ds_transport_done_fn done,
                         void *done_arg)
{
    size_t out_len = 0;
    int r = ds_session_seal(&s->s, buf, len, len + DS_WIRE_TAG_SIZE, &out_len);
    if (r) {
        free(buf);
        return r;
    }
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
    r = ds_transport_send(n->tp, tp, &a);
    if (r) {
        free(c);
        free(buf);
        return r;
    }
    ADD(n, frames_sent, 1);
    ADD(n, bytes_sent, out_len);
    return 0;
}

static int send_hs_frame(ds_net *n, struct net_peer *p, const uint8_t *frame, size_t len)
{
    tap(n, 'S', frame, len);
    ds_transport_send_args a = {.buf = frame, .len = len, .deadline_ms = p->hs_deadline_ms};
    return ds_transport_send(n->tp, p->tp, &a); /* copied */
}

/* Start a handshake as initiator (under the lock). */
static int dial(ds_net *n, struct net_peer *p)
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
    r = send_hs_frame(n, p, frame, len);
    if (r)
        ds_log_rl(DS_LOG_WARN, COMP, "HELLO to %s not sent: %s", addr, strerror(-r));
    ds_debug(COMP, "handshake: HELLO to %s", addr);
    return 0;
}

static void wake_worker(ds_net *n)
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
    struct net_peer *p = to ? peer_by_id(n, to) : NULL;
    if (!p && to_addr)
        p = peer_by_addr(n, to_addr);
    if (!p) {
        if (!to_addr) {
            pthread_mutex_unlock(&n->lock);
            free(buf);
            return -EHOSTUNREACH;
        }
        p = peer_new(n);
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
        struct net_sess *s = sess_ref(p->sess);
        ds_transport_peer tp = p->tp;
        if (ds_session_rekey_due(&s->s) && !p->hs) {
            p->rekey = 1;
            wake_worker(n);
        }
        pthread_mutex_unlock(&n->lock);
        int r = seal_and_send(n, s, tp, buf, len, o->deadline_ms, o->done, o->done_arg);
        sess_unref(s);
        return r;
    }
    if (p->pend_bytes + len > n->cfg.max_pending_bytes) {
        pthread_mutex_unlock(&n->lock);
        free(buf);
        return -ENOBUFS;
    }
    /* Queue behind what waits already (a session that is being flushed
     * keeps the order: nothing overtakes the queue). */
    int r = p->sess ? 0 : dial(n, p);
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
    wake_worker(n); /* its timer now covers this deadline */
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
    struct net_peer *p = n->closing ? NULL : to ? peer_by_id(n, to) : NULL;
    if (!p && to_addr && !n->closing)
        p = peer_by_addr(n, to_addr);
    if (p && p->sess && p->tp && !p->flushing && !ds_session_rekey_due(&p->sess->s)) {
        if (to_addr && !p->dial[0])
            snprintf(p->dial, sizeof(p->dial), "%s", to_addr);
        s = sess_ref(p->sess);
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
    sess_unref(s);
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
    return 0;
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
    struct net_peer *p = expect ? peer_by_id(n, expect) : NULL;
    if (!p)
        p = peer_by_addr(n, addr);
    if (!p) {
        p = peer_new(n);
        if (!p) {
            pthread_mutex_unlock(&n->lock);
            return -ENOMEM;
        }
        p->expect = expect;
        snprintf(p->dial, sizeof(p->dial), "%s", addr);
    }
    int r = p->sess ? 0 : dial(n, p);
    pthread_mutex_unlock(&n->lock);
    wake_worker(n);
    return r;
}

int ds_net_connected(ds_net *n, uint64_t peer)
{
    pthread_mutex_lock(&n->lock);
    struct net_peer *p = peer_by_id(n, peer);
    int up = p && p->sess;
    pthread_mutex_unlock(&n->lock);
    return up;
}

int ds_net_forget(ds_net *n, uint64_t peer)
{
    struct report *rep = NULL;
    pthread_mutex_lock(&n->lock);
    struct net_peer *p = peer_by_id(n, peer);
    if (p)
        peer_free(n, p, &rep);
    pthread_mutex_unlock(&n->lock);
    reports_run(n, rep);
    return p ? 0 : -ENOENT;
}

/* ---- the worker: handshakes ---------------------------------------------- */

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
        hs_drop(n, p);
        ADD(n, hs_failed, 1);
        pend_fail_all(p, -ENOMEM, rep);
        report_event(rep, DS_NET_EV_HANDSHAKE_FAILED, p, -ENOMEM);
        return;
    }
    atomic_store(&s->refs, 1);
    uint64_t id = info->id;
    char name[DS_WIRE_NAME_MAX + 1], pub[DS_WIRE_ADDR_MAX + 1];
    snprintf(name, sizeof(name), "%s", info->name);
    snprintf(pub, sizeof(pub), "%s", info->address);
    hs_drop(n, p);

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
        peer_free(n, q, rep);
        qn = n->peers; /* the list changed: start over (p stays, q is gone) */
    }
    int rekey = p->sess != NULL;
    sess_unref(p->sess);
    p->sess = s;
    p->id = id;
    p->rekey = 0;
    snprintf(p->name, sizeof(p->name), "%s", name);
    snprintf(p->pub, sizeof(p->pub), "%s", pub);
    ADD(n, hs_ok, 1);
    ds_info(COMP, "session %s with %s id=%016" PRIx64 " addr=%s mode=%s aead=%s", rekey ? "rekeyed" : "up",
            p->name, p->id, p->addr, ds_sec_mode_name(s->s.mode), ds_aead_name(s->s.aead));
    report_event(rep, DS_NET_EV_PEER_UP, p, 0);
    *flush = p->pend_head;
    p->pend_head = p->pend_tail = NULL;
    p->pend_bytes = 0;
    p->npend = 0;
    p->flushing = 1;
    *flush_sess = sess_ref(s);
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
                report_done(rep, q->done, q->done_arg, -ETIMEDOUT);
                free(q->buf);
            } else {
                int r = seal_and_send(n, s, tp, q->buf, q->len, q->deadline_ms, q->done,
                                      q->done_arg);
                if (r)
                    report_done(rep, q->done, q->done_arg, r);
            }
            free(q);
        }
        pthread_mutex_lock(&n->lock);
        struct net_peer *p = peer_by_tp(n, tp);
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
    sess_unref(s);
}

/* ---- refusals ------------------------------------------------------------ */

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
    tap(n, 'S', out, out_len);
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

static void on_hs_frame(ds_net *n, ds_transport_peer tp, const uint8_t *frame, size_t len,
                        const ds_wire_hdr *h, struct report **rep)
{
    uint8_t out[DS_WIRE_MAX_HS_FRAME];
    size_t out_len = 0;
    struct pend *flush = NULL;
    struct net_sess *flush_sess = NULL;
    ds_transport_peer flush_tp = 0;

    tap(n, 'R', frame, len);
    pthread_mutex_lock(&n->lock);
    struct net_peer *p = peer_by_tp(n, tp);
    if (h->type == DS_MSG_HELLO_REJECT) {
        on_reject(n, p, frame, len);
        pthread_mutex_unlock(&n->lock);
        return;
    }
    if (h->type == DS_MSG_HELLO) {
        if (p && p->hs && p->hs_initiator) {
            if (n->self_id < h->sender) {
                /* Both dialled: the smaller id stays initiator. */
                pthread_mutex_unlock(&n->lock);
                ds_debug(COMP, "handshake collision with %016" PRIx64 ": keeping ours", h->sender);
                return;
            }
            hs_drop(n, p);
        }
        int fresh = 0;
        if (!p) {
            if (n->nhandshakes >= n->cfg.max_handshakes) {
                pthread_mutex_unlock(&n->lock);
                ds_drop_note(&n->drops, DS_DROP_OVERLOAD, COMP, "handshakes=%u (bound)",
                             n->nhandshakes);
                return;
            }
            p = peer_new(n);
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
            if (fresh && !p->sess) {
                p->tp = 0; /* the transport peer goes below */
                peer_free(n, p, rep);
                /* Tell a node we do not admit, so it stops retrying; its
                 * transport peer then goes once the refusal is out. */
                if (!admission_refusal(why) || send_reject(n, tp, frame, len, h, why) != 0)
                    ds_transport_peer_remove(n->tp, tp);
            }
            pthread_mutex_unlock(&n->lock);
            return;
        }
        /* A running responder handshake (a replayed or repeated HELLO)
         * is replaced; an established session stays until this one
         * completes. */
        hs_drop(n, p);
        p->hs = hs;
        p->hs_initiator = 0;
        p->hs_refused = 0;
        p->hs_deadline_ms = ds_now_ms() + n->cfg.handshake_timeout_ms;
        n->nhandshakes++;
        int r = send_hs_frame(n, p, out, out_len);
        if (r)
            ds_log_rl(DS_LOG_WARN, COMP, "HELLO_ACK to %s not sent: %s", p->addr, strerror(-r));
        pthread_mutex_unlock(&n->lock);
        return;
    }

    /* HELLO_ACK (we initiated) or HELLO_FIN (we answered). */
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
        int r = send_hs_frame(n, p, out, out_len);
        if (r)
            ds_log_rl(DS_LOG_WARN, COMP, "HELLO_FIN to %s not sent: %s", p->addr, strerror(-r));
    }
    if (ds_hs_done(p->hs))
        hs_complete(n, p, rep, &flush, &flush_sess, &flush_tp);
    pthread_mutex_unlock(&n->lock);
    if (flush_sess)
        flush_pending(n, flush, flush_sess, flush_tp, rep);
}

/* ---- the worker: data frames ------------------------------------------- */

static void on_data_frame(ds_net *n, struct rxitem *it, const ds_wire_hdr *h)
{
    char name[DS_WIRE_NAME_MAX + 1], pub[DS_WIRE_ADDR_MAX + 1];
    pthread_mutex_lock(&n->lock);
    struct net_peer *p = peer_by_tp(n, it->tp);
    struct net_sess *s = p ? sess_ref(p->sess) : NULL;
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
    sess_unref(s);
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
        report_event(rep, DS_NET_EV_RESET, NULL, it->ev.status);
        return;
    default:
        return;
    }
    pthread_mutex_lock(&n->lock);
    struct net_peer *p = peer_by_tp(n, it->ev.peer);
    if (p)
        report_event(rep, kind, p, 0);
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
            hs_drop(n, p);
            ADD(n, hs_failed, 1);
            report_event(rep, DS_NET_EV_HANDSHAKE_FAILED, p, status);
            if (!p->sess) {
                pend_fail_all(p, status, rep);
                if (!p->id) {
                    peer_free(n, p, rep);
                    continue;
                }
            }
        }
        if (p->rekey && !p->hs && p->sess)
            if (dial(n, p))
                p->rekey = 0;
        /* Waiting frames past their deadline. */
        struct pend **pp = &p->pend_head, *last = NULL;
        while (*pp) {
            struct pend *q = *pp;
            if (q->deadline_ms <= now) {
                *pp = q->next;
                p->pend_bytes -= q->len;
                p->npend--;
                report_done(rep, q->done, q->done_arg, -ETIMEDOUT);
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

static void *worker_main(void *arg)
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
                        on_hs_frame(n, it->tp, it->data, it->len, &h, &rep);
                    else
                        on_data_frame(n, it, &h);
                }
            }
            ds_transport_buf_put(n->tp, it->base); /* (the worker runs while tp lives) */
            free(it);
        }
        if (!it || ds_now_ms() >= next_timer)
            next_timer = timers(n, &rep);
        reports_run(n, rep);
    }
    return NULL;
}

/* ---- transport callbacks (its progress thread) ------------------------- */

static void tp_on_recv(void *ctx, ds_transport_msg *msg)
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

static void tp_on_event(void *ctx, const ds_transport_event *ev)
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

/* ---- open / close ----------------------------------------------------- */

void ds_net_cfg_default(ds_net_cfg *cfg)
{
    memset(cfg, 0, sizeof(*cfg));
    cfg->mode = DS_SEC_ENCRYPT;
    ds_transport_opts_default(&cfg->transport);
    ds_wire_limits_default(&cfg->limits);
    cfg->handshake_timeout_ms = 5000;
    cfg->max_pending_bytes = 64u << 20;
    cfg->max_rx_queue_bytes = (size_t)1 << 30;
    cfg->max_handshakes = 64;
}

int ds_net_open(const ds_net_cfg *cfg, ds_net **out)
{
    if (!cfg || !out)
        return -EINVAL;
    *out = NULL;
    if (!cfg->identity || !cfg->name || !cfg->cluster || !cfg->on_recv) {
        ds_error(COMP, "net config needs identity, name, cluster and on_recv");
        return -EINVAL;
    }
    if (!cfg->cluster_key && !cfg->allow) {
        ds_error(COMP, "no admission policy: configure a cluster key, an allow-list, or both");
        return -EINVAL;
    }
    ds_net *n = calloc(1, sizeof(*n));
    if (!n)
        return -ENOMEM;
    n->cfg = *cfg;
    if (!n->cfg.handshake_timeout_ms)
        n->cfg.handshake_timeout_ms = 5000;
    if (!n->cfg.max_pending_bytes)
        n->cfg.max_pending_bytes = 64u << 20;
    if (!n->cfg.max_rx_queue_bytes)
        n->cfg.max_rx_queue_bytes = (size_t)1 << 30;
    if (!n->cfg.max_handshakes)
        n->cfg.max_handshakes = 64;
    n->limits = cfg->limits;
    if (!n->limits.max_payload)
        ds_wire_limits_default(&n->limits);
    snprintf(n->name, sizeof(n->name), "%s", cfg->name);
    n->cluster_id = ds_wire_cluster_id(cfg->cluster);
    n->self_id = cfg->identity->id;
    n->hs_cfg = (ds_hs_config){
        .identity = cfg->identity,
        .name = n->name,
        .address = n->addr,
        .cluster_id = n->cluster_id,
        .cluster_key = cfg->cluster_key,
        .allow = cfg->allow,
        .mode = cfg->mode,
        .aeads = cfg->aeads,
        .drops = &n->drops,
    };
    pthread_mutex_init(&n->lock, NULL);
    pthread_mutex_init(&n->rxlock, NULL);
    pthread_cond_init(&n->rxcond, NULL);

    /* Validate the handshake config before anything starts. */
    ds_hs probe;
    memset(&probe, 0, sizeof(probe));
    int r = ds_hs_init_responder(&probe, &n->hs_cfg);
    ds_hs_wipe(&probe);
    if (r) {
        ds_error(COMP, "handshake configuration refused (name, mode or ciphers)");
        goto fail;
    }
    /* Every frame the transport carries is at most a header, the payload
     * limit and a tag. */
    ds_transport_opts to = cfg->transport;
    to.on_recv = tp_on_recv;
    to.on_event = tp_on_event;
    to.cb_ctx = n;
    if (to.max_msg_bytes > (size_t)n->limits.max_payload + DS_WIRE_HDR_SIZE + DS_WIRE_TAG_SIZE)
        to.max_msg_bytes = (size_t)n->limits.max_payload + DS_WIRE_HDR_SIZE + DS_WIRE_TAG_SIZE;
    r = ds_transport_open(&to, &n->tp);
    if (r)
        goto fail;
    r = ds_transport_addr(n->tp, n->addr, sizeof(n->addr));
    if (r)
        goto fail;
    r = pthread_create(&n->worker, NULL, worker_main, n);
    if (r) {
        r = -r;
        goto fail;
    }
    n->worker_started = 1;
    ds_info(COMP, "node %s id=%016" PRIx64 " on %s mode=%s", n->name, n->self_id, n->addr,
            ds_sec_mode_name(cfg->mode));
    *out = n;
    return 0;
fail:
    ds_transport_close(&n->tp);
    pthread_mutex_destroy(&n->lock);
    pthread_mutex_destroy(&n->rxlock);
    pthread_cond_destroy(&n->rxcond);
    free(n);
    return r;
}

void ds_net_close(ds_net **np)
{
    if (!np || !*np)
        return;
    ds_net *n = *np;
    *np = NULL;
    pthread_mutex_lock(&n->lock);
    n->closing = 1;
    pthread_mutex_unlock(&n->lock);
    if (n->worker_started) {
        pthread_mutex_lock(&n->rxlock);
        n->stop = 1;
        pthread_cond_signal(&n->rxcond);
        pthread_mutex_unlock(&n->rxlock);
        pthread_join(n->worker, NULL);
    }
    /* The transport fails and releases what it holds (our send contexts
     * run their done callbacks on its thread before it stops). */
    ds_transport_close(&n->tp);
    struct report *rep = NULL;
    pthread_mutex_lock(&n->lock);
    while (n->peers) {
        n->peers->tp = 0;
        peer_free(n, n->peers, &rep);
    }
    pthread_mutex_unlock(&n->lock);
    reports_run(n, rep);
    while (n->rx_head) {
        struct rxitem *it = n->rx_head;
        n->rx_head = it->next;
        free(it->base);
        free(it);
    }
    pthread_mutex_destroy(&n->lock);
    pthread_mutex_destroy(&n->rxlock);
    pthread_cond_destroy(&n->rxcond);
    free(n);
}

int ds_net_addr(ds_net *n, char *buf, size_t len)
{
    if (!n || !buf || !len)
        return -EINVAL;
    if ((size_t)snprintf(buf, len, "%s", n->addr) >= len)
        return -ENOSPC;
    return 0;
}

uint64_t ds_net_self_id(const ds_net *n)
{
    return n ? n->self_id : 0;
}

void *ds_net_rx_take(ds_net_rx *rx)
{
    if (!rx || rx->taken_)
        return NULL;
    rx->taken_ = 1;
    return rx->base_;
}

enum ds_drop_reason ds_net_decode(ds_net *n, const ds_net_rx *rx, const ds_wire_bufs *bufs,
                                  ds_wire_msg *out)
{
    return ds_wire_decode(rx->frame, rx->len, &n->limits, bufs, out, &n->drops);
}

ds_drop_counters *ds_net_drops(ds_net *n)
{
    return &n->drops;
}

void ds_net_stats_get(ds_net *n, ds_net_stats *st)
{
    memset(st, 0, sizeof(*st));
    if (!n)
        return;
    st->frames_sent = atomic_load(&n->frames_sent);
    st->bytes_sent = atomic_load(&n->bytes_sent);
    st->frames_recv = atomic_load(&n->frames_recv);
    st->bytes_recv = atomic_load(&n->bytes_recv);
    st->handshakes_ok = atomic_load(&n->hs_ok);
    st->handshakes_failed = atomic_load(&n->hs_failed);
    st->send_failures = atomic_load(&n->send_failures);
    pthread_mutex_lock(&n->lock);
    for (struct net_peer *p = n->peers; p; p = p->next) {
        st->sessions += p->sess != NULL;
        st->pending_frames += p->npend;
    }
    pthread_mutex_unlock(&n->lock);
    ds_transport_stats_get(n->tp, &st->transport);
}

/* ---- test hooks ------------------------------------------------------- */

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
    struct net_peer *p = peer_by_id(n, to);
    struct net_sess *s = p ? sess_ref(p->sess) : NULL;
    pthread_mutex_unlock(&n->lock);
    if (!s) {
        free(buf);
        return -ENOTCONN;
    }
    r = ds_session_seal(&s->s, buf, len, len + DS_WIRE_TAG_SIZE, out_len);
    sess_unref(s);
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
    struct net_peer *p = peer_by_id(n, to);
    ds_transport_peer tp = p ? p->tp : 0;
    pthread_mutex_unlock(&n->lock);
    if (!tp)
        return -ENOTCONN;
    ds_transport_send_args a = {.buf = bytes, .len = len, .deadline_ms = deadline_ms};
    return ds_transport_send(n->tp, tp, &a);
}
