/*
 * node/membership/probe.c: SWIM failure detection with Lifeguard: probes,
 * indirect probes (ours, and those we run for others), suspicion, and the
 * local health multiplier.
 *
 * SWIM (Das, Gupta, Motivala 2002), as implemented here. Every protocol
 * period T a node probes one member: members are visited round-robin in a
 * shuffled order, re-shuffled each pass, so every member is probed by every
 * other within one pass (a bound on first detection that random choice does
 * not give). PING, then ACK within the probe timeout; else PING_REQ to k
 * other members, which PING the target and forward its ACK; no ACK by the
 * end of the period: the target is suspected. A suspicion becomes a death
 * when its timer expires; a suspected member refutes by raising its
 * incarnation (table.c).
 *
 * Lifeguard (Dadgar, Phillips, Currey 2018), switched by cfg.lifeguard:
 *   - Local Health Multiplier: a saturating counter, 0..lhm_max. A probe
 *     answered: -1. A probe failed: +1 if no indirect probe could be asked,
 *     else +1 per intermediary that sent neither ACK nor NACK (if they all
 *     NACKed, the target is the problem, not us). Refuting a suspicion about
 *     ourselves: +1. The probe period and the probe timeout are multiplied
 *     by (LHM + 1): a node too slow to see its own ACKs in time probes less
 *     and waits longer, instead of accusing healthy members.
 *   - NACKs: an intermediary that has no ACK from the target after 80% of
 *     its probe timeout tells the requester so.
 *   - Dynamic suspicion timeout: min = alpha * max(1, log10 n) * T, max =
 *     beta * min, timeout = max(min, max - (max - min) * log(C + 1) /
 *     log(K + 1)) for C independent confirmations (K = suspicion_k, or 0 when
 *     n - 2 < K). A lone accuser waits beta times longer than a crowd.
 *   - Buddy system: a suspecter PINGs the suspect at once, and a message to
 *     a suspect carries the suspicion first, so it can refute quickly.
 *   Without lifeguard the timeout is the fixed minimum, LHM stays 0, no
 *   NACKs are sent and updates go out in plain queue order: classic SWIM.
 *
 * Two additions of ours: dead members are pinged (one every
 * dead_ping_periods plain periods, round-robin, on a timer of its own that
 * local health does not stretch) for dead_retain_ms, carrying their own
 * DEAD record, so after a partition heals each side learns it was declared
 * dead, rejoins, and the two sides find each other without a seed. And
 * every sync_periods periods the whole table goes to one member
 * (anti-entropy), bounding how long an update lost to the piggyback
 * lottery stays missing.
 */
#include "config.h"

#include "node/membership/internal.h"

#include <inttypes.h>
#include <math.h>
#include <stdio.h>

/* ---- messages -------------------------------------------------------------------- */

/* PING, ACK, PING_REQ, NACK. `first`: a member whose record must lead the
 * piggyback (the buddy system, refutations, news for the dead). */
void ds_mship_emit_probe(ds_membership *m, uint8_t type, uint64_t to_id, const char *to_addr,
                         uint64_t seq, uint64_t target, member *first)
{
    ds_wire_msg msg;
    ds_mship_fill_hdr(m, &msg.h, type, to_id);
    memset(&msg.u, 0, sizeof(msg.u));
    msg.u.probe.probe_seq = seq;
    msg.u.probe.target = target;
    msg.u.probe.updates = m->tx;
    msg.h.count = type == DS_MSG_NACK ? 0
                                      : ds_mship_collect_updates(m, first, type != DS_MSG_ACK);
    switch (type) {
    case DS_MSG_PING: m->st.pings_sent++; break;
    case DS_MSG_ACK: m->st.acks_sent++; break;
    case DS_MSG_PING_REQ: m->st.ping_reqs_sent++; break;
    default: m->st.nacks_sent++; break;
    }
    ds_mship_encode_queue(m, &msg, to_id, to_addr);
}

/* The record a message to e should lead with, if any: its own bad news. */
member *ds_mship_first_for(ds_membership *m, member *e)
{
    if (!e)
        return NULL;
    if (is_gone(e))
        return e;
    if (m->cfg.lifeguard && e->state == DS_MEMBER_SUSPECT)
        return e;
    return NULL;
}

/* ---- probe order ----------------------------------------------------------------- */

void ds_mship_order_rebuild(ds_membership *m)
{
    m->order_n = m->order_pos = 0;
    for (uint32_t i = 1; i < m->cap; i++)
        if (m->tab[i].used && is_live(&m->tab[i]))
            m->order[m->order_n++] = m->tab[i].id;
    for (uint32_t i = m->order_n; i > 1; i--) {
        uint32_t j = ds_rng_below(&m->rng, i);
        uint64_t t = m->order[i - 1];
        m->order[i - 1] = m->order[j];
        m->order[j] = t;
    }
}

/* Put id into the rest of this pass: at a random place (a new member, as
 * SWIM inserts it), or next (front = 1, a gossip hint). */
void ds_mship_order_insert(ds_membership *m, uint64_t id, int front)
{
    if (m->order_n >= m->cap)
        return; /* the next pass has it */
    uint32_t span = m->order_n - m->order_pos + 1;
    uint32_t at = m->order_pos + (front ? 0 : ds_rng_below(&m->rng, span));
    memmove(&m->order[at + 1], &m->order[at], (m->order_n - at) * sizeof(m->order[0]));
    m->order[at] = id;
    m->order_n++;
}

static member *next_target(ds_membership *m)
{
    int rebuilt = 0;
    for (;;) {
        if (m->order_pos >= m->order_n) {
            if (rebuilt)
                return NULL;
            ds_mship_order_rebuild(m);
            rebuilt = 1;
            if (!m->order_n)
                return NULL;
        }
        member *e = find(m, m->order[m->order_pos++]);
        if (e && e != self_m(m) && is_live(e))
            return e;
    }
}

/* ---- local health ---------------------------------------------------------------- */

void ds_mship_lhm_add(ds_membership *m, int delta)
{
    if (!m->cfg.lifeguard)
        return;
    int64_t v = (int64_t)m->lhm + delta;
    if (v < 0)
        v = 0;
    if (v > (int64_t)m->cfg.lhm_max)
        v = m->cfg.lhm_max;
    m->lhm = (uint32_t)v;
}

/* ---- probing --------------------------------------------------------------------- */

static void suspect_by_me(ds_membership *m, member *t, uint64_t now)
{
    if (t->state == DS_MEMBER_ALIVE) {
        t->state = DS_MEMBER_SUSPECT;
        ds_mship_start_suspicion(t, m->self_id, now);
        ds_mship_bcast(m, t, m->self_id);
        m->st.suspicions++;
        ds_debug(COMP, "suspect member=%s incarnation=%" PRIu32, t->name, t->inc);
        ds_mship_push_event(m, DS_MEV_MEMBER_SUSPECTED, t, now);
        if (m->cfg.lifeguard) /* buddy system: tell the suspect now */
            ds_mship_emit_probe(m, DS_MSG_PING, t->id, t->addr, ++m->seq, 0, t);
    } else if (t->state == DS_MEMBER_SUSPECT && ds_mship_add_confirmation(t, m->self_id)) {
        ds_mship_bcast(m, t, m->self_id);
    }
}

static int pingable_dead(const ds_membership *m, const member *e, uint64_t now)
{
    return e->used && e->state == DS_MEMBER_DEAD && now - e->dead_since_ms < m->cfg.dead_retain_ms;
}

/* The next dead member after the last one pinged, in table order: every
 * dead member is pinged once per dead_ping_periods * (number dead) periods,
 * a bound that random choice does not give. */
static void ping_dead(ds_membership *m, uint64_t now)
{
    for (uint32_t k = 1; k < m->cap; k++) {
        const uint32_t i = 1 + (m->dead_cursor + k - 1) % (m->cap - 1);
        member *e = &m->tab[i];
        if (!pingable_dead(m, e, now))
            continue;
        m->dead_cursor = i;
        ds_mship_emit_probe(m, DS_MSG_PING, e->id, e->addr, ++m->seq, 0, e);
        return;
    }
}

/* Anti-entropy: our whole table to one random live member. Piggybacking
 * alone can lose an update for good (every copy used up before it reached
 * some node); this bounds how long such a gap lasts. */
static void push_table(ds_membership *m)
{
    uint32_t n = 0;
    for (uint32_t i = 1; i < m->cap; i++)
        if (m->tab[i].used && m->tab[i].state == DS_MEMBER_ALIVE)
            m->tmp[n++] = i;
    if (!n)
        return;
    const member *e = &m->tab[m->tmp[ds_rng_below(&m->rng, n)]];
    const uint64_t id = e->id;
    char addr[ADDR_SZ];
    memcpy(addr, e->addr, sizeof(addr));
    ds_mship_emit_members(m, id, addr); /* it reuses m->tmp */
}

static void start_probe(ds_membership *m, uint64_t now)
{
    const uint64_t mult = (uint64_t)m->lhm + 1;
    m->n_periods++;
    /* The first syncs come early (periods 2, 4, 8, ...): a joiner's table
     * is the seed's snapshot, which misses whoever joined at the same time,
     * and the member it pushes to answers with its own table when that is
     * larger. */
    const uint64_t np = m->n_periods, sp = m->cfg.sync_periods;
    if (sp && (np % sp == 0 || (np < sp && np >= 2 && (np & (np - 1)) == 0)))
        push_table(m);
    m->next_probe_ms = now + mult * m->cfg.period_ms;
    member *t = next_target(m);
    if (!t)
        return;
    struct probe *p = &m->pr;
    memset(p, 0, sizeof(*p));
    p->active = 1;
    p->target = t->id;
    p->seq = ++m->seq;
    p->ack_deadline_ms = now + mult * m->cfg.probe_timeout_ms;
    p->end_ms = m->next_probe_ms;
    m->st.probes++;
    ds_mship_emit_probe(m, DS_MSG_PING, t->id, t->addr, p->seq, 0, ds_mship_first_for(m, t));
}

static void send_ping_reqs(ds_membership *m, member *t)
{
    struct probe *p = &m->pr;
    p->indirect_sent = 1;
    uint32_t n = 0;
    for (uint32_t i = 1; i < m->cap; i++) {
        const member *e = &m->tab[i];
        if (e->used && e->state == DS_MEMBER_ALIVE && e->id != t->id)
            m->tmp[n++] = i;
    }
    const uint32_t k = m->cfg.indirect_k < n ? m->cfg.indirect_k : n;
    for (uint32_t i = 0; i < k; i++) {
        uint32_t j = i + ds_rng_below(&m->rng, n - i);
        uint32_t s = m->tmp[j];
        m->tmp[j] = m->tmp[i];
        m->tmp[i] = s;
        member *v = &m->tab[s];
        p->via[p->n_via++] = v->id;
        ds_mship_emit_probe(m, DS_MSG_PING_REQ, v->id, v->addr, p->seq, t->id, NULL);
    }
}

static void finish_probe(ds_membership *m, member *t, uint64_t now)
{
    struct probe *p = &m->pr;
    p->active = 0;
    if (p->acked)
        return;
    m->st.probes_failed++;
    /* Lifeguard: missing NACKs mean our own messages are not getting
     * through (or not being processed) in time. */
    ds_mship_lhm_add(m, p->n_via ? (int)(p->n_via - p->nacks) : 1);
    suspect_by_me(m, t, now);
}

void ds_mship_probe_tick(ds_membership *m, uint64_t now)
{
    struct probe *p = &m->pr;
    if (p->active) {
        member *t = find(m, p->target);
        if (!t || !is_live(t)) {
            p->active = 0; /* gone meanwhile: nothing left to learn */
        } else {
            if (!p->acked && !p->indirect_sent && now >= p->ack_deadline_ms)
                send_ping_reqs(m, t);
            if (now >= p->end_ms)
                finish_probe(m, t, now);
        }
    }
    if (!p->active && m->joined && now >= m->next_probe_ms)
        start_probe(m, now);
    /* Pinging the dead accuses nobody, so local health does not slow it:
     * a node that probed badly during a partition still finds the other
     * side soon after the heal. */
    const uint64_t dead_every = (uint64_t)m->cfg.dead_ping_periods * m->cfg.period_ms;
    if (dead_every && !m->next_dead_ping_ms) /* a random phase: nodes do not ping in lockstep */
        m->next_dead_ping_ms = now + 1 + ds_rng_below(&m->rng, dead_every);
    if (dead_every && now >= m->next_dead_ping_ms) {
        ping_dead(m, now);
        m->next_dead_ping_ms = now + dead_every;
    }
}

/* ---- suspicion ------------------------------------------------------------------- */

uint64_t ds_membership_suspicion_timeout_ms(const ds_membership_cfg *cfg, uint32_t n, uint32_t c)
{
    double scale = n > 1 ? log10((double)n) : 0.0;
    if (scale < 1.0)
        scale = 1.0;
    const double lo = cfg->suspicion_alpha * scale * (double)cfg->period_ms;
    if (!cfg->lifeguard)
        return (uint64_t)lo;
    const double hi = cfg->suspicion_beta * lo;
    uint32_t k = cfg->suspicion_k;
    if (n < 2 || n - 2 < k)
        k = 0; /* too few members to expect k confirmations */
    if (k == 0)
        return (uint64_t)lo;
    if (c > k)
        c = k;
    double t = hi - (hi - lo) * log((double)c + 1.0) / log((double)k + 1.0);
    return (uint64_t)(t < lo ? lo : t);
}

static void declare_dead(ds_membership *m, member *e, uint64_t now)
{
    e->state = DS_MEMBER_DEAD;
    e->removal_round = eff_round(m);
    e->dead_since_ms = now;
    ds_mship_clear_suspicion(e);
    ds_mship_bcast(m, e, 0);
    m->st.deaths++;
    ds_info(COMP, "dead member=%s incarnation=%" PRIu32 " removal_round=%" PRIu64, e->name, e->inc,
            e->removal_round);
    ds_membership_event *ev = ds_mship_push_event(m, DS_MEV_MEMBER_DEAD, e, now);
    if (ev)
        ev->round = e->removal_round;
}

void ds_mship_suspicion_tick(ds_membership *m, uint64_t now)
{
    const uint32_t n = n_live(m);
    for (uint32_t i = 1; i < m->cap; i++) {
        member *e = &m->tab[i];
        if (!e->used || e->state != DS_MEMBER_SUSPECT)
            continue;
        uint64_t t = ds_membership_suspicion_timeout_ms(&m->cfg, n, e->n_confirm);
        if (now >= sat_add(e->susp_start_ms, t))
            declare_dead(m, e, now);
    }
}

/* ---- indirect probes for others -------------------------------------------------- */

void ds_mship_relay_tick(ds_membership *m, uint64_t now)
{
    for (uint32_t i = 0; i < MAX_RELAYS; i++) {
        struct relay *r = &m->relays[i];
        if (!r->used)
            continue;
        if (m->cfg.lifeguard && !r->nacked && now >= r->nack_at_ms) {
            r->nacked = 1;
            ds_mship_emit_probe(m, DS_MSG_NACK, r->req_id, r->req_addr, r->req_seq, r->target,
                                NULL);
        }
        if (now >= r->expire_ms)
            r->used = 0;
    }
}

/* ---- message handlers ------------------------------------------------------------ */

void ds_mship_on_ping(ds_membership *m, const ds_wire_msg *msg, const char *from_addr, uint64_t now)
{
    ds_mship_apply_records(m, msg->u.probe.updates, msg->h.count, 0, now);
    member *snd = find(m, msg->h.sender);
    const char *to = snd ? snd->addr : from_addr;
    if (!to) {
        DROP(m, DS_MSHIP_DROP_NO_ROUTE, "type=PING sender=%016" PRIx64, msg->h.sender);
        return;
    }
    ds_mship_emit_probe(m, DS_MSG_ACK, msg->h.sender, to, msg->u.probe.probe_seq, 0,
                        ds_mship_first_for(m, snd));
}

void ds_mship_on_ack(ds_membership *m, const ds_wire_msg *msg, uint64_t now)
{
    ds_mship_apply_records(m, msg->u.probe.updates, msg->h.count, 0, now);
    const uint64_t seq = msg->u.probe.probe_seq, from = msg->h.sender;
    struct probe *p = &m->pr;
    if (p->active && seq == p->seq) {
        int ok = from == p->target;
        for (uint32_t i = 0; i < p->n_via && !ok; i++)
            ok = p->via[i] == from;
        if (ok) {
            if (!p->acked) {
                p->acked = 1;
                ds_mship_lhm_add(m, -1);
            }
            return;
        }
    }
    for (uint32_t i = 0; i < MAX_RELAYS; i++) {
        struct relay *r = &m->relays[i];
        if (r->used && r->my_seq == seq && r->target == from) {
            ds_mship_emit_probe(m, DS_MSG_ACK, r->req_id, r->req_addr, r->req_seq, 0,
                                ds_mship_first_for(m, find(m, r->req_id)));
            r->used = 0;
            return;
        }
    }
    m->st.acks_unmatched++;
}

void ds_mship_on_ping_req(ds_membership *m, const ds_wire_msg *msg, const char *from_addr,
                          uint64_t now)
{
    ds_mship_apply_records(m, msg->u.probe.updates, msg->h.count, 0, now);
    member *snd = find(m, msg->h.sender);
    const char *req_addr = snd ? snd->addr : from_addr;
    if (!req_addr) {
        DROP(m, DS_MSHIP_DROP_NO_ROUTE, "type=PING_REQ sender=%016" PRIx64, msg->h.sender);
        return;
    }
    const uint64_t target = msg->u.probe.target, seq = msg->u.probe.probe_seq;
    if (target == m->self_id) {
        ds_mship_emit_probe(m, DS_MSG_ACK, msg->h.sender, req_addr, seq, 0,
                            ds_mship_first_for(m, snd));
        return;
    }
    member *t = find(m, target);
    if (!t || !is_live(t)) {
        if (m->cfg.lifeguard) /* we cannot reach it, but we are here */
            ds_mship_emit_probe(m, DS_MSG_NACK, msg->h.sender, req_addr, seq, target, NULL);
        return;
    }
    struct relay *r = NULL;
    for (uint32_t i = 0; i < MAX_RELAYS && !r; i++)
        if (!m->relays[i].used)
            r = &m->relays[i];
    if (!r) {
        DROP(m, DS_MSHIP_DROP_RELAYS_FULL, "sender=%016" PRIx64, msg->h.sender);
        return;
    }
    memset(r, 0, sizeof(*r));
    r->used = 1;
    r->req_id = msg->h.sender;
    r->req_seq = seq;
    r->target = target;
    r->my_seq = ++m->seq;
    snprintf(r->req_addr, sizeof(r->req_addr), "%s", req_addr);
    r->nack_at_ms = now + (uint64_t)m->cfg.probe_timeout_ms * 4 / 5;
    r->expire_ms = now + m->cfg.period_ms;
    ds_mship_emit_probe(m, DS_MSG_PING, t->id, t->addr, r->my_seq, 0, ds_mship_first_for(m, t));
}

void ds_mship_on_nack(ds_membership *m, const ds_wire_msg *msg)
{
    struct probe *p = &m->pr;
    if (p->active && msg->u.probe.probe_seq == p->seq && msg->u.probe.target == p->target) {
        for (uint32_t i = 0; i < p->n_via; i++) {
            if (p->via[i] == msg->h.sender && !p->nacked[i]) {
                p->nacked[i] = 1;
                p->nacks++;
                m->st.nacks_received++;
                return;
            }
        }
    }
    m->st.acks_unmatched++;
}

/* ---- hints ----------------------------------------------------------------------- */

void ds_membership_hint(ds_membership *m, uint64_t id, uint64_t now)
{
    pthread_mutex_lock(&m->mu);
    member *e = find(m, id);
    if (m->joined && !m->leaving && e && e != self_m(m) && is_live(e) &&
        !(m->pr.active && m->pr.target == id)) {
        ds_mship_order_insert(m, id, 1);
        /* Cut the idle rest of the period short, at most once a period, and
         * never while a probe is still waiting for its answer. */
        if ((!m->pr.active || m->pr.acked) && now - m->last_early_ms >= m->cfg.period_ms &&
            m->next_probe_ms > now) {
            m->pr.active = 0;
            m->next_probe_ms = now;
            m->last_early_ms = now;
            ds_mship_probe_tick(m, now);
        }
    }
    ds_mship_unlock_and_flush(m);
}
