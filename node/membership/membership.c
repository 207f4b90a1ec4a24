/*
 * node/membership/membership.c: the frame of the membership module (see
 * membership.h for the API and docs/membership.md for the protocol): an
 * instance's life cycle, the two calls its owner drives it with (tick for
 * the timers, recv for frames), the next deadline, the statistics, and the
 * output queues.
 *
 * Every public function takes the instance's mutex. What a call produces,
 * frames to send and events to report, is queued while it holds the mutex
 * and handed to io.send and io.event only after it is released
 * (ds_mship_unlock_and_flush), in the order it was produced: a callback
 * may then call back into the module, or block briefly, without
 * deadlocking it or stalling other threads.
 *
 * A received frame is checked here before any handler sees it: the wire
 * decoder, under this module's own limits (at most 64 records a message, a
 * MEMBERS table no larger than ours), then the type, the cluster, a sender
 * other than ourselves and a receiver that is us (or 0 for a JOIN). Each
 * refusal is one ds_mship_drop reason, counted and logged rate-limited.
 *
 * The protocol itself is split by concern (internal.h lists the files):
 * the member table and its updates, probes and suspicion, joining and
 * leaving, and views.
 */
#include "config.h"

#include "node/membership/internal.h"

#include <errno.h>
#include <inttypes.h>
#include <sodium.h>
#include <stdio.h>
#include <stdlib.h>

static const char *const mship_drop_names[] = {
#define DS_MSHIP_DROP_NAME_(e, name, text) name,
    DS_MSHIP_DROP_LIST(DS_MSHIP_DROP_NAME_)
#undef DS_MSHIP_DROP_NAME_
};
static const char *const mship_drop_texts[] = {
#define DS_MSHIP_DROP_TEXT_(e, name, text) text,
    DS_MSHIP_DROP_LIST(DS_MSHIP_DROP_TEXT_)
#undef DS_MSHIP_DROP_TEXT_
};
static_assert(sizeof(mship_drop_names) / sizeof(mship_drop_names[0]) == DS_MSHIP_DROP__COUNT,
              "drop names");

const char *ds_mship_drop_name(enum ds_mship_drop r)
{
    return (unsigned)r < DS_MSHIP_DROP__COUNT ? mship_drop_names[r] : "?";
}

const char *ds_mship_drop_text(enum ds_mship_drop r)
{
    return (unsigned)r < DS_MSHIP_DROP__COUNT ? mship_drop_texts[r] : "?";
}

/* ---- output queues --------------------------------------------------------------- */

ds_membership_event *ds_mship_push_event(ds_membership *m, enum ds_membership_event_kind kind,
                                         const member *e, uint64_t now)
{
    if (m->ev.n == m->ev.cap) {
        size_t nc = m->ev.cap ? 2 * m->ev.cap : 16;
        ds_membership_event *v = realloc(m->ev.v, nc * sizeof(*v));
        if (!v) {
            ds_log_rl(DS_LOG_WARN, COMP, "event lost: out of memory kind=%d", (int)kind);
            return NULL;
        }
        m->ev.v = v;
        m->ev.cap = nc;
    }
    ds_membership_event *ev = &m->ev.v[m->ev.n++];
    memset(ev, 0, sizeof(*ev));
    ev->kind = kind;
    ev->now_ms = now;
    if (e)
        ds_mship_info_of(e, &ev->member);
    ev->round = m->round;
    ev->join_round = e ? e->join_round : NO_ROUND;
    return ev;
}

static void push_frame(ds_membership *m, uint64_t to_id, const char *to_addr, uint8_t *frame,
                       size_t len)
{
    if (m->out.n == m->out.cap) {
        size_t nc = m->out.cap ? 2 * m->out.cap : 16;
        struct outmsg *v = realloc(m->out.v, nc * sizeof(*v));
        if (!v) {
            ds_log_rl(DS_LOG_WARN, COMP, "frame lost: out of memory");
            free(frame);
            return;
        }
        m->out.v = v;
        m->out.cap = nc;
    }
    struct outmsg *o = &m->out.v[m->out.n++];
    o->to_id = to_id;
    snprintf(o->to_addr, sizeof(o->to_addr), "%s", to_addr);
    o->frame = frame;
    o->len = len;
    m->st.msgs_sent++;
    m->st.bytes_sent += len;
}

/* Unlock, then run the callbacks of what this call produced, in order. */
void ds_mship_unlock_and_flush(ds_membership *m)
{
    struct outq oq = m->out;
    struct evq eq = m->ev;
    memset(&m->out, 0, sizeof(m->out));
    memset(&m->ev, 0, sizeof(m->ev));
    const ds_membership_io io = m->io;
    pthread_mutex_unlock(&m->mu);
    for (size_t i = 0; i < oq.n; i++) {
        if (io.send)
            io.send(io.ctx, oq.v[i].to_id, oq.v[i].to_addr, oq.v[i].frame, oq.v[i].len);
        free(oq.v[i].frame);
    }
    free(oq.v);
    for (size_t i = 0; i < eq.n; i++)
        if (io.event)
            io.event(io.ctx, &eq.v[i]);
    free(eq.v);
}

void ds_mship_fill_hdr(ds_membership *m, ds_wire_hdr *h, uint8_t type, uint64_t to_id)
{
    memset(h, 0, sizeof(*h));
    h->type = type;
    h->cluster = m->cfg.cluster_id;
    h->sender = m->self_id;
    h->receiver = to_id;
    h->round = m->round;
    h->epoch = (uint32_t)ds_mship_epoch_at(m, m->round);
}

void ds_mship_encode_queue(ds_membership *m, ds_wire_msg *msg, uint64_t to_id, const char *to_addr)
{
    size_t want = ds_wire_encoded_size(msg), len = 0;
    uint8_t *buf = want ? malloc(want) : NULL;
    int rc = buf ? ds_wire_encode(buf, want, msg, &len) : (want ? -ENOMEM : -EINVAL);
    if (rc) {
        /* Our own records are validated on the way in, so this is a bug or
         * memory exhaustion; either way the frame is lost, like any loss. */
        ds_log_rl(DS_LOG_ERROR, COMP, "cannot encode %s: %s", ds_msg_type_name(msg->h.type),
                  strerror(-rc));
        free(buf);
        return;
    }
    push_frame(m, to_id, to_addr, buf, len);
}

/* ---- life cycle ------------------------------------------------------------------ */

void ds_membership_cfg_default(ds_membership_cfg *c)
{
    memset(c, 0, sizeof(*c));
    c->max_members = 1024;
    c->period_ms = 1000;
    c->probe_timeout_ms = 300;
    c->indirect_k = 3;
    c->lifeguard = 1;
    c->lhm_max = 8;
    c->suspicion_alpha = 5.0;
    c->suspicion_beta = 6.0;
    c->suspicion_k = 3;
    c->retransmit_mult = 3;
    c->max_piggyback = 8;
    c->members_per_msg = 32;
    c->lag_rounds = 32;
    c->max_round_ahead = 1u << 20;
    c->join_timeout_ms = 3000;
    c->join_backoff_max_ms = 30000;
    c->dead_retain_ms = 300000;
    c->dead_ping_periods = 4;
    c->sync_periods = 16;
    c->refute_push = 1;
}

static int cfg_check(const ds_membership_cfg *c)
{
    const char *why = NULL;
    if (!c->name || !printable_str(c->name, DS_WIRE_NAME_MAX, 0))
        why = "name must be 1..63 printable characters without spaces";
    else if (!c->addr || !printable_str(c->addr, DS_WIRE_ADDR_MAX, 0))
        why = "addr must be 1..127 printable characters";
    else if (c->group && !printable_str(c->group, DS_WIRE_GROUP_MAX, 1))
        why = "group must be 0..31 printable characters";
    else if (c->max_members < 2 || c->max_members > 65536)
        why = "max_members must be in 2..65536";
    else if (!c->period_ms || !c->probe_timeout_ms || c->probe_timeout_ms >= c->period_ms)
        why = "need 0 < probe_timeout_ms < period_ms";
    else if (c->indirect_k > MAX_INDIRECT)
        why = "indirect_k must be <= 8";
    else if (c->lhm_max > 64)
        why = "lhm_max must be <= 64";
    else if (!(c->suspicion_alpha > 0) || !(c->suspicion_beta >= 1) || c->suspicion_k > MAX_CONFIRM)
        why = "need suspicion_alpha > 0, suspicion_beta >= 1, suspicion_k <= 16";
    else if (!c->retransmit_mult)
        why = "retransmit_mult must be >= 1";
    else if (!c->max_piggyback || c->max_piggyback > MAX_RECORDS || !c->members_per_msg ||
             c->members_per_msg > MAX_RECORDS)
        why = "max_piggyback and members_per_msg must be in 1..64";
    else if (!c->join_timeout_ms || c->join_backoff_max_ms < c->join_timeout_ms)
        why = "need 0 < join_timeout_ms <= join_backoff_max_ms";
    if (why) {
        ds_error(COMP, "bad membership config: %s", why);
        return -EINVAL;
    }
    return 0;
}

int ds_membership_create(const ds_membership_cfg *cfg, const ds_membership_io *io,
                         ds_membership **out)
{
    if (!cfg || !io || !out)
        return -EINVAL;
    *out = NULL;
    int rc = cfg_check(cfg);
    if (rc)
        return rc;
    if (sodium_init() < 0) /* node ids hash with BLAKE2b */
        return -ENOMEM;
    ds_membership *m = calloc(1, sizeof(*m));
    if (!m)
        return -ENOMEM;
    m->cfg = *cfg;
    m->io = *io;
    snprintf(m->name, sizeof(m->name), "%s", cfg->name);
    snprintf(m->addr, sizeof(m->addr), "%s", cfg->addr);
    snprintf(m->group, sizeof(m->group), "%s", cfg->group ? cfg->group : "");
    m->cfg.name = m->name;
    m->cfg.addr = m->addr;
    m->cfg.group = m->group;
    m->cap = cfg->max_members;
    m->tab = calloc(m->cap, sizeof(*m->tab));
    m->tmp = calloc(m->cap, sizeof(*m->tmp));
    m->order = calloc(m->cap, sizeof(*m->order));
    m->js_bits = calloc((m->cap + 7) / 8, 1);
    if (!m->tab || !m->tmp || !m->order || !m->js_bits)
        goto fail_alloc;
    if (pthread_mutex_init(&m->mu, NULL))
        goto fail_alloc;

    ds_rng_seed(&m->rng, ds_rng_hash_str(cfg->seed, m->name));
    m->self_id = ds_wire_node_id(cfg->pk);
    m->seq = ds_rng_next(&m->rng) >> 16; /* a restarted node does not reuse seqs */
    ds_wire_limits_default(&m->lim);
    m->lim.max_members = MAX_RECORDS;
    m->lim.max_cluster = m->cap;
    m->lim.max_payload = 16 + MAX_RECORDS * DS_WIRE_MEMBER_SIZE;

    member *s = &m->tab[0];
    s->used = 1;
    s->id = m->self_id;
    memcpy(s->pk, cfg->pk, 32);
    memcpy(s->name, m->name, sizeof(s->name));
    memcpy(s->addr, m->addr, sizeof(s->addr));
    memcpy(s->group, m->group, sizeof(s->group));
    s->state = DS_MEMBER_ALIVE;
    s->join_round = s->removal_round = NO_ROUND;
    *out = m;
    return 0;

fail_alloc:
    free(m->tab);
    free(m->tmp);
    free(m->order);
    free(m->js_bits);
    free(m);
    return -ENOMEM;
}

void ds_membership_destroy(ds_membership **pm)
{
    if (!pm || !*pm)
        return;
    ds_membership *m = *pm;
    for (size_t i = 0; i < m->out.n; i++)
        free(m->out.v[i].frame);
    free(m->out.v);
    free(m->ev.v);
    free(m->seeds);
    free(m->tab);
    free(m->tmp);
    free(m->order);
    free(m->js_bits);
    pthread_mutex_destroy(&m->mu);
    free(m);
    *pm = NULL;
}

uint64_t ds_membership_self_id(const ds_membership *m)
{
    return m->self_id;
}

void ds_membership_set_lag(ds_membership *m, uint32_t lag_rounds)
{
    pthread_mutex_lock(&m->mu);
    m->cfg.lag_rounds = lag_rounds ? lag_rounds : 1;
    pthread_mutex_unlock(&m->mu);
}

uint32_t ds_membership_lag(ds_membership *m)
{
    pthread_mutex_lock(&m->mu);
    const uint32_t lag = m->cfg.lag_rounds;
    pthread_mutex_unlock(&m->mu);
    return lag;
}

/* ---- driving it ------------------------------------------------------------------ */

/* A timer that ran far past its time means this process was stopped
 * (SIGSTOP, a stall): long enough, and the others have declared us dead
 * and gone on without us; our parameters are stale too. So we rejoin as a
 * fresh joiner would, instead of refuting and being put back at once (a
 * late change on every node, and our stale model mixed into theirs). The
 * rejoin waits for the first frame from a member: its header tells us the
 * cluster's round, which our new join round must follow. */
static void check_paused(ds_membership *m, uint64_t now)
{
    if (!m->joined || m->leaving || m->rejoin_pending)
        return;
    const struct probe *p = &m->pr;
    const uint64_t due = p->active ? p->end_ms : m->next_probe_ms;
    if (!due || now <= due)
        return;
    const uint64_t late = now - due;
    if (late < ds_membership_suspicion_timeout_ms(&m->cfg, n_live(m), UINT32_MAX))
        return;
    m->rejoin_pending = 1;
    m->paused_ms = late;
    ds_warn(COMP, "this node was stopped for about %" PRIu64 " ms, past the suspicion timeout: "
            "rejoining as a new member", late);
}

int ds_membership_tick(ds_membership *m, uint64_t now)
{
    pthread_mutex_lock(&m->mu);
    check_paused(m, now);
    ds_mship_join_tick(m, now);
    if (m->joined) {
        ds_mship_probe_tick(m, now);
        ds_mship_relay_tick(m, now);
        ds_mship_suspicion_tick(m, now);
        ds_mship_purge(m, now, 0);
    }
    ds_mship_check_view(m, now);
    ds_mship_unlock_and_flush(m);
    return 0;
}

uint64_t ds_membership_next_deadline(ds_membership *m)
{
    pthread_mutex_lock(&m->mu);
    uint64_t t = UINT64_MAX;
#define AT(x) \
    do { \
        uint64_t x_ = (x); \
        if (x_ < t) \
            t = x_; \
    } while (0)
    if (m->joining && !m->joined) {
        AT(m->join_retry_ms);
        AT(ds_mship_join_deadline(m));
    }
    if (m->joined) {
        const struct probe *p = &m->pr;
        if (p->active) {
            if (!p->acked && !p->indirect_sent)
                AT(p->ack_deadline_ms);
            AT(p->end_ms);
        } else {
            AT(m->next_probe_ms);
        }
        if (m->cfg.dead_ping_periods)
            AT(m->next_dead_ping_ms);
        for (uint32_t i = 0; i < MAX_RELAYS; i++) {
            const struct relay *r = &m->relays[i];
            if (!r->used)
                continue;
            if (m->cfg.lifeguard && !r->nacked)
                AT(r->nack_at_ms);
            AT(r->expire_ms);
        }
        const uint32_t n = n_live(m);
        for (uint32_t i = 1; i < m->cap; i++) {
            const member *e = &m->tab[i];
            if (!e->used)
                continue;
            if (e->state == DS_MEMBER_SUSPECT)
                AT(sat_add(e->susp_start_ms,
                           ds_membership_suspicion_timeout_ms(&m->cfg, n, e->n_confirm)));
            else if (is_gone(e) && e->removal_round <= m->round)
                AT(sat_add(e->dead_since_ms, m->cfg.dead_retain_ms));
        }
    }
#undef AT
    pthread_mutex_unlock(&m->mu);
    return t;
}

static int is_membership_type(unsigned t)
{
    return t == DS_MSG_PING || t == DS_MSG_ACK || t == DS_MSG_PING_REQ || t == DS_MSG_NACK ||
           t == DS_MSG_JOIN || t == DS_MSG_MEMBERS || t == DS_MSG_LEAVE;
}

int ds_membership_recv(ds_membership *m, uint64_t now, const char *from_addr,
                       const uint8_t *frame, size_t len)
{
    pthread_mutex_lock(&m->mu);
    /* A node stopped past its death can find, at its wake, the suspicion
     * about itself waiting in its socket: noticing the stop only at the
     * next tick would refute it first (docs/membership.md). */
    check_paused(m, now);
    int rc = -EBADMSG;
    m->st.msgs_recv++;
    m->st.bytes_recv += len;
    const ds_wire_bufs bufs = {.members = m->rx, .members_cap = MAX_RECORDS};
    ds_wire_msg msg;
    if (!frame) {
        DROP(m, DS_MSHIP_DROP_MALFORMED, "len=%zu (no frame)", len);
        goto out;
    }
    if (ds_wire_decode(frame, len, &m->lim, &bufs, &msg, &m->wire_drops) != DS_DROP_NONE) {
        m->st.drops[DS_MSHIP_DROP_MALFORMED]++; /* the decoder has logged it */
        goto out;
    }
    const ds_wire_hdr *h = &msg.h;
    if (!is_membership_type(h->type)) {
        DROP(m, DS_MSHIP_DROP_NOT_MEMBERSHIP, "type=%s", ds_msg_type_name(h->type));
        goto out;
    }
    if (h->cluster != m->cfg.cluster_id) {
        DROP(m, DS_MSHIP_DROP_WRONG_CLUSTER, "type=%s cluster=%016" PRIx64,
             ds_msg_type_name(h->type), h->cluster);
        goto out;
    }
    if (h->sender == m->self_id) {
        DROP(m, DS_MSHIP_DROP_FROM_SELF, "type=%s", ds_msg_type_name(h->type));
        goto out;
    }
    if (h->receiver != m->self_id && !(h->receiver == 0 && h->type == DS_MSG_JOIN)) {
        DROP(m, DS_MSHIP_DROP_WRONG_RECEIVER, "type=%s receiver=%016" PRIx64,
             ds_msg_type_name(h->type), h->receiver);
        goto out;
    }
    rc = 0;
    ds_mship_note_round(m, &msg);
    member *snd = find(m, h->sender);
    if (snd) /* the net layer checked the sender against its session */
        snd->heard_ms = now;
    if (m->rejoin_pending && snd && is_live(snd) && h->type != DS_MSG_JOIN)
        ds_mship_rejoin(m, self_m(m)->inc, 0, now, "stopped past the suspicion timeout");
    switch (h->type) {
    case DS_MSG_PING: ds_mship_on_ping(m, &msg, from_addr, now); break;
    case DS_MSG_ACK: ds_mship_on_ack(m, &msg, now); break;
    case DS_MSG_PING_REQ: ds_mship_on_ping_req(m, &msg, from_addr, now); break;
    case DS_MSG_NACK: ds_mship_on_nack(m, &msg); break;
    case DS_MSG_JOIN: ds_mship_on_join(m, &msg, now); break;
    case DS_MSG_MEMBERS: ds_mship_on_members(m, &msg, now); break;
    case DS_MSG_LEAVE: ds_mship_on_leave(m, &msg, from_addr, now); break;
    default: break;
    }
out:
    ds_mship_check_view(m, now);
    ds_mship_unlock_and_flush(m);
    return rc;
}

void ds_membership_stats_get(ds_membership *m, ds_membership_stats *st)
{
    pthread_mutex_lock(&m->mu);
    *st = m->st;
    for (int r = 0; r < DS_DROP__COUNT; r++)
        st->wire[r] = ds_drop_get(&m->wire_drops, (enum ds_drop_reason)r);
    st->lhm = m->lhm;
    st->alive = st->suspect = st->dead = st->left = 0;
    for (uint32_t i = 0; i < m->cap; i++) {
        const member *e = &m->tab[i];
        if (!e->used)
            continue;
        switch (e->state) {
        case DS_MEMBER_ALIVE: st->alive++; break;
        case DS_MEMBER_SUSPECT: st->suspect++; break;
        case DS_MEMBER_DEAD: st->dead++; break;
        default: st->left++; break;
        }
    }
    st->round = m->round;
    st->epoch = ds_mship_epoch_at(m, m->round);
    st->lag = m->cfg.lag_rounds;
    pthread_mutex_unlock(&m->mu);
}
