/* node/gossip/state.c: see state.h. */
#include "config.h"

#include <errno.h>
#include <pthread.h>
#include <math.h>
#include <sodium.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "base/log.h"
#include "node/gossip/state.h"

#define MAX_REQUESTERS 64

struct requester {
    uint64_t id;
    char addr[DS_WIRE_ADDR_MAX + 1];
};

/* A served snapshot. Its chunks are lent to the net (ds_net_send_msg_ref),
 * which reads them until the transport releases each send, possibly long
 * after the serve (a send to a killed peer is held until the transport
 * resets its endpoint or closes): one reference per lent chunk and one for
 * the ds_state, the last one frees it. So a snapshot outlives the
 * ds_state if it must, and the next serve repacks it in place only when
 * nothing holds it. */
struct snap {
    _Atomic unsigned refs;
    uint8_t data[];
};

static struct snap *snap_new(size_t bytes)
{
    struct snap *sn = malloc(sizeof(*sn) + bytes);
    if (sn)
        atomic_init(&sn->refs, 1);
    return sn;
}

static void snap_unref(struct snap *sn)
{
    if (sn && atomic_fetch_sub(&sn->refs, 1) == 1)
        free(sn);
}

/* The net's release of one lent chunk (any thread). */
static void snap_release(void *arg, void *buf)
{
    (void)buf;
    snap_unref(arg);
}

struct ds_state {
    ds_net *net;
    size_t n;
    size_t total;        /* DS_STATE_HDR_BYTES + 4 n */
    uint32_t chunk;
    pthread_mutex_t lock;
    pthread_cond_t cond;

    /* server */
    struct requester req[MAX_REQUESTERS];
    int n_req;
    struct snap *snap;   /* the last snapshot served (our reference) */

    /* client */
    uint64_t want_from;  /* 0: no transfer wanted */
    uint8_t *buf;        /* total bytes */
    size_t got;
    uint8_t digest[32];
    int have_digest;
    int complete;
    uint64_t dropped;
};

int ds_state_create(ds_state **out, ds_net *net, size_t n_params, uint32_t chunk_bytes)
{
    *out = NULL;
    if (!net || !n_params || chunk_bytes < 1024)
        return -EINVAL;
    ds_state *s = calloc(1, sizeof(*s));
    if (!s)
        return -ENOMEM;
    s->net = net;
    s->n = n_params;
    s->total = DS_STATE_HDR_BYTES + 4 * n_params;
    s->chunk = chunk_bytes;
    pthread_mutex_init(&s->lock, NULL);
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(&s->cond, &ca);
    pthread_condattr_destroy(&ca);
    *out = s;
    return 0;
}

void ds_state_destroy(ds_state **sp)
{
    if (!sp || !*sp)
        return;
    ds_state *s = *sp;
    snap_unref(s->snap); /* chunks still lent keep it alive */
    free(s->buf);
    pthread_mutex_destroy(&s->lock);
    pthread_cond_destroy(&s->cond);
    free(s);
    *sp = NULL;
}

void ds_state_pack(uint8_t *buf, const float *theta, size_t n, uint64_t step, uint64_t round0,
                   uint64_t round, double rounds_per_s, uint64_t lag_rounds)
{
    memset(buf, 0, DS_STATE_HDR_BYTES);
    memcpy(buf, "DSSTATE1", 8);
    ds_put64(buf + 8, (uint64_t)n);
    ds_put64(buf + 16, step);
    ds_put64(buf + 24, round0);
    ds_put64(buf + 32, round);
    ds_put64(buf + 40, rounds_per_s > 0 && rounds_per_s < 1e12 ? (uint64_t)(rounds_per_s * 1000) : 0);
    ds_put64(buf + 48, lag_rounds);
    for (size_t i = 0; i < n; i++) {
        uint32_t u;
        memcpy(&u, &theta[i], 4);
        ds_put32(buf + DS_STATE_HDR_BYTES + 4 * i, u);
    }
}

int ds_state_unpack(const uint8_t *buf, size_t len, size_t n, float *theta, ds_state_info *info)
{
    if (len != DS_STATE_HDR_BYTES + 4 * n || memcmp(buf, "DSSTATE1", 8) != 0 ||
        ds_le64(buf + 8) != n)
        return -EBADMSG;
    for (int i = 56; i < DS_STATE_HDR_BYTES; i++)
        if (buf[i])
            return -EBADMSG;
    for (size_t i = 0; i < n; i++) {
        const uint32_t u = ds_le32(buf + DS_STATE_HDR_BYTES + 4 * i);
        float f;
        memcpy(&f, &u, 4);
        if (!isfinite(f))
            return -EBADMSG;
        theta[i] = f;
    }
    if (info) {
        info->step = ds_le64(buf + 16);
        info->round0 = ds_le64(buf + 24);
        info->round = ds_le64(buf + 32);
        info->rounds_per_s = (double)ds_le64(buf + 40) / 1000.0;
        info->lag_rounds = ds_le64(buf + 48);
        info->bytes = len;
    }
    return 0;
}

/* ---- server ---------------------------------------------------------------- */

void ds_state_on_req(ds_state *s, const ds_net_rx *rx)
{
    ds_wire_msg m;
    if (ds_net_decode(s->net, rx, &(ds_wire_bufs){0}, &m) != DS_DROP_NONE)
        return;
    if (m.u.state_req.offset != 0) {
        /* We serve whole snapshots only; a partial request is refused. */
        ds_log_rl(DS_LOG_WARN, "state", "STATE_REQ from %s at offset %llu refused: whole "
                  "snapshots only", rx->name, (unsigned long long)m.u.state_req.offset);
        return;
    }
    pthread_mutex_lock(&s->lock);
    int known = 0;
    for (int i = 0; i < s->n_req; i++)
        known |= s->req[i].id == rx->sender;
    if (!known && s->n_req < MAX_REQUESTERS) {
        s->req[s->n_req].id = rx->sender;
        snprintf(s->req[s->n_req].addr, sizeof(s->req[0].addr), "%s", rx->addr);
        s->n_req++;
        ds_info("state", "state requested by %s", rx->name);
    } else if (!known) {
        ds_log_rl(DS_LOG_WARN, "state", "STATE_REQ from %s dropped: %d requests waiting",
                  rx->name, MAX_REQUESTERS);
    }
    pthread_mutex_unlock(&s->lock);
}

int ds_state_pending(ds_state *s)
{
    pthread_mutex_lock(&s->lock);
    const int n = s->n_req;
    pthread_mutex_unlock(&s->lock);
    return n > 0;
}

int ds_state_serve(ds_state *s, const float *theta, uint64_t step, uint64_t round0,
                   uint64_t round, double rounds_per_s, uint64_t lag_rounds,
                   uint64_t deadline_ms)
{
    struct requester req[MAX_REQUESTERS];
    pthread_mutex_lock(&s->lock);
    const int n_req = s->n_req;
    memcpy(req, s->req, sizeof(req[0]) * (size_t)n_req);
    s->n_req = 0;
    pthread_mutex_unlock(&s->lock);
    if (!n_req)
        return 0;
    if (s->snap && atomic_load(&s->snap->refs) != 1) {
        snap_unref(s->snap); /* still lent out: leave it to its sends */
        s->snap = NULL;
    }
    if (!s->snap && !(s->snap = snap_new(s->total)))
        return -ENOMEM;
    uint8_t *snap = s->snap->data;
    ds_state_pack(snap, theta, s->n, step, round0, round, rounds_per_s, lag_rounds);
    uint8_t digest[32];
    crypto_generichash(digest, sizeof(digest), snap, s->total, NULL, 0);
    int served = 0;
    for (int i = 0; i < n_req; i++) {
        int ok = 1;
        for (size_t off = 0; off < s->total && ok; off += s->chunk) {
            const size_t len = s->total - off < s->chunk ? s->total - off : s->chunk;
            ds_wire_msg m;
            memset(&m, 0, sizeof(m));
            m.h.type = DS_MSG_STATE_CHUNK;
            m.h.round = round;
            m.h.count = (uint32_t)len;
            if (off + len < s->total)
                m.h.flags = DS_WF_MORE;
            m.u.chunk.total = s->total;
            m.u.chunk.offset = off;
            memcpy(m.u.chunk.digest, digest, 32);
            m.u.chunk.data = snap + off;
            const ds_net_send_opts o = {.deadline_ms = deadline_ms};
            atomic_fetch_add(&s->snap->refs, 1);
            int e = ds_net_send_msg_ref(s->net, req[i].id, req[i].addr, &m, &o, snap_release,
                                        s->snap);
            if (e < 0) {
                snap_unref(s->snap); /* not lent after all */
                ds_warn("state", "sending the state to %016llx failed: %s",
                        (unsigned long long)req[i].id, strerror(-e));
                ok = 0;
            }
        }
        served += ok;
    }
    ds_info("state", "served step=%llu round=%llu (%zu bytes) to %d node(s)",
            (unsigned long long)step, (unsigned long long)round, s->total, served);
    return served;
}

/* ---- client ---------------------------------------------------------------- */

int ds_state_request(ds_state *s, uint64_t peer, const char *addr, uint64_t deadline_ms)
{
    pthread_mutex_lock(&s->lock);
    if (!s->buf && !(s->buf = malloc(s->total))) {
        pthread_mutex_unlock(&s->lock);
        return -ENOMEM;
    }
    s->want_from = peer;
    s->got = 0;
    s->have_digest = 0;
    s->complete = 0;
    pthread_mutex_unlock(&s->lock);
    ds_wire_msg m;
    memset(&m, 0, sizeof(m));
    m.h.type = DS_MSG_STATE_REQ;
    m.u.state_req.offset = 0;
    m.u.state_req.length = 0;
    const ds_net_send_opts o = {.deadline_ms = deadline_ms};
    return ds_net_send_msg(s->net, peer, addr, &m, &o);
}

void ds_state_on_chunk(ds_state *s, const ds_net_rx *rx)
{
    ds_wire_msg m;
    if (ds_net_decode(s->net, rx, &(ds_wire_bufs){0}, &m) != DS_DROP_NONE)
        return;
    const ds_wire_state_chunk *c = &m.u.chunk;
    const size_t len = m.h.count;
    pthread_mutex_lock(&s->lock);
    const char *why = NULL;
    if (!s->want_from || rx->sender != s->want_from)
        why = "not asked for";
    else if (s->complete)
        why = "transfer already complete";
    else if (c->total != s->total)
        why = "size does not match this node's model";
    else if (s->have_digest && memcmp(c->digest, s->digest, 32) != 0 && c->offset == 0) {
        s->got = 0; /* a new snapshot: start over */
        memcpy(s->digest, c->digest, 32);
    } else if (s->have_digest && memcmp(c->digest, s->digest, 32) != 0)
        why = "chunk of another snapshot";
    if (!why && c->offset != s->got)
        why = "out of order";
    if (why) {
        s->dropped++;
        pthread_mutex_unlock(&s->lock);
        ds_log_rl(DS_LOG_WARN, "state", "STATE_CHUNK from %s at %llu dropped: %s", rx->name,
                  (unsigned long long)c->offset, why);
        return;
    }
    if (!s->have_digest) {
        memcpy(s->digest, c->digest, 32);
        s->have_digest = 1;
    }
    memcpy(s->buf + s->got, c->data, len);
    s->got += len;
    if (s->got == s->total) {
        s->complete = 1;
        pthread_cond_broadcast(&s->cond);
    }
    pthread_mutex_unlock(&s->lock);
}

int ds_state_wait(ds_state *s, uint64_t deadline_ms, float *theta, ds_state_info *info)
{
    const struct timespec ts = {(time_t)(deadline_ms / 1000), (long)(deadline_ms % 1000) * 1000000L};
    pthread_mutex_lock(&s->lock);
    while (!s->complete) {
        if (pthread_cond_timedwait(&s->cond, &s->lock, &ts) == ETIMEDOUT && !s->complete) {
            pthread_mutex_unlock(&s->lock);
            return -ETIMEDOUT;
        }
    }
    uint8_t digest[32];
    crypto_generichash(digest, sizeof(digest), s->buf, s->total, NULL, 0);
    int e = sodium_memcmp(digest, s->digest, 32) == 0 ? 0 : -EBADMSG;
    if (e == 0)
        e = ds_state_unpack(s->buf, s->total, s->n, theta, info);
    if (e == 0 && info)
        info->from = s->want_from;
    s->want_from = 0;
    s->complete = 0;
    s->got = 0;
    s->have_digest = 0;
    pthread_mutex_unlock(&s->lock);
    return e;
}
