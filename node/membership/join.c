/*
 * node/membership/join.c: joining a cluster, admitting joiners, and
 * leaving.
 *
 * Joining: a node sends its own record in a JOIN to one seed at a time,
 * retried with a doubling backoff over the seed list until one answers
 * with its whole table in MEMBERS slices; the join is complete when every
 * slice of one answer has arrived and the table lists us. The seed decides
 * our join round (its round + lag) once, and that round travels in our
 * record, so every member counts us in the view from the same round. A
 * node may also found a cluster of one (bootstrap).
 *
 * Admitting: a JOIN is accepted only from the key it names, with a name no
 * other live member uses; a member that comes back before its removal
 * takes effect keeps its join round, one that comes back after gets a new
 * one after the removal. MEMBERS also serves anti-entropy: a node that
 * receives a smaller table than its own answers with its own (push-pull,
 * at most once a period).
 *
 * Leaving: the leaver decides its removal round (its round + lag), marks
 * itself LEFT, tells up to LEAVE_DIRECT members directly and lets the
 * rest hear it by piggyback; it may exit once its round has reached the
 * removal round.
 */
#include "config.h"

#include "node/membership/internal.h"

#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>

/* ---- joining --------------------------------------------------------------------- */

static void send_join(ds_membership *m)
{
    const char *seed = m->seeds[m->seed_next++ % m->n_seeds];
    ds_wire_msg msg;
    ds_mship_fill_hdr(m, &msg.h, DS_MSG_JOIN, 0);
    memset(&msg.u, 0, sizeof(msg.u));
    ds_mship_record_of(self_m(m), &msg.u.join, 1);
    msg.u.join.state = DS_MEMBER_ALIVE;
    msg.u.join.effective_round = 0;
    m->st.joins_sent++;
    ds_mship_encode_queue(m, &msg, 0, seed);
}

uint64_t ds_mship_join_deadline(const ds_membership *m)
{
    return m->cfg.join_give_up_ms ? sat_add(m->join_start_ms, m->cfg.join_give_up_ms)
                                   : UINT64_MAX;
}

/* Stop joining: no seed let us in, and none will. The owner ends the node. */
static void give_up_join(ds_membership *m, uint64_t now)
{
    m->joining = 0;
    const int all_finishing = m->n_finishing >= m->n_seeds;
    if (all_finishing)
        ds_warn(COMP, "join given up: all %zu seed(s) answered \"cluster finishing\"",
                m->n_seeds);
    else
        ds_warn(COMP, "join given up: no seed let us in within %" PRIu64 " ms (%" PRIu32
                " attempts, %" PRIu32 " of %zu seeds finishing)",
                m->cfg.join_give_up_ms, m->attempt, m->n_finishing, m->n_seeds);
    ds_membership_event *ev = ds_mship_push_event(m, DS_MEV_JOIN_FAILED, self_m(m), now);
    if (ev) {
        ev->attempt = m->attempt;
        ev->finishing = m->n_finishing;
        ev->n_seeds = (uint32_t)m->n_seeds;
    }
}

void ds_mship_join_tick(ds_membership *m, uint64_t now)
{
    if (!m->joining || m->joined)
        return;
    if (now >= ds_mship_join_deadline(m)) {
        give_up_join(m, now);
        return;
    }
    if (now < m->join_retry_ms)
        return;
    m->attempt++;
    const char *seed = m->seeds[m->seed_next % m->n_seeds];
    m->join_wait_ms = m->join_wait_ms * 2 < m->cfg.join_backoff_max_ms
                          ? m->join_wait_ms * 2
                          : m->cfg.join_backoff_max_ms;
    m->join_retry_ms = now + m->join_wait_ms;
    ds_membership_event *ev = ds_mship_push_event(m, DS_MEV_JOIN_RETRY, self_m(m), now);
    if (ev) {
        snprintf(ev->member.addr, sizeof(ev->member.addr), "%s", seed);
        ev->attempt = m->attempt;
        ev->retry_at_ms = m->join_retry_ms;
    }
    /* The first retries are the expected race with a founder starting
     * at the same time (node/runtime/run.c says the same at the same level). */
    ds_log_rl(m->attempt <= 4 ? DS_LOG_INFO : DS_LOG_WARN, COMP,
              "no answer from a seed yet: attempt=%" PRIu32 " seed=%s "
              "next_retry_in_ms=%" PRIu64, m->attempt, seed, m->join_wait_ms);
    send_join(m);
}

static void complete_join(ds_membership *m, const ds_wire_hdr *h, const ds_wire_members *ms,
                          uint64_t now)
{
    member *s = self_m(m);
    if (s->join_round == NO_ROUND)
        return; /* the seed's table lacks us (full?): keep retrying */
    m->joined = 1;
    m->joining = 0;
    m->epoch_floor = max64(m->epoch_floor, h->epoch);
    m->seen_round = max64(m->seen_round, ms->round_now);
    ds_mship_bcast(m, s, 0);
    ds_mship_order_rebuild(m);
    /* Start probing somewhere inside the first period, so nodes that joined
     * together do not probe in lockstep. */
    m->next_probe_ms = now + ds_rng_below(&m->rng, m->cfg.period_ms);
    member *seed = find(m, h->sender);
    ds_membership_event *ev = ds_mship_push_event(m, DS_MEV_SELF_JOINED, seed ? seed : s, now);
    if (ev) {
        ev->round = ms->round_now;
        ev->epoch = h->epoch;
        ev->view_size = ms->total;
        ev->join_round = s->join_round;
    }
    ds_info(COMP, "joined through %s: members=%" PRIu32 " round=%" PRIu64 " join_round=%" PRIu64,
            seed ? seed->name : "?", ms->total, ms->round_now, s->join_round);
}

int ds_membership_bootstrap(ds_membership *m, uint64_t now_ms)
{
    pthread_mutex_lock(&m->mu);
    int rc = 0;
    if (m->joined || m->joining) {
        rc = -EALREADY;
        goto out;
    }
    member *s = self_m(m);
    m->joined = 1;
    s->join_round = m->round;
    m->next_probe_ms = now_ms;
    ds_info(COMP, "bootstrap: a cluster of one from round %" PRIu64, m->round);
    ds_membership_event *ev = ds_mship_push_event(m, DS_MEV_SELF_JOINED, s, now_ms);
    if (ev) {
        ev->view_size = 1;
        ev->epoch = ds_mship_epoch_at(m, m->round);
    }
    ds_mship_check_view(m, now_ms);
out:
    ds_mship_unlock_and_flush(m);
    return rc;
}

int ds_membership_join(ds_membership *m, uint64_t now_ms, const char *const *seeds,
                       size_t n_seeds)
{
    pthread_mutex_lock(&m->mu);
    int rc = 0;
    if (m->joined || m->joining) {
        rc = -EALREADY;
        goto out;
    }
    size_t n = 0;
    for (size_t i = 0; i < n_seeds; i++)
        n += seeds[i] && strcmp(seeds[i], m->addr) && printable_str(seeds[i], DS_WIRE_ADDR_MAX, 0);
    if (!n) {
        ds_error(COMP, "join: no seed address other than our own (%s)", m->addr);
        rc = -EINVAL;
        goto out;
    }
    free(m->seeds);
    m->seeds = calloc(n, sizeof(*m->seeds));
    if (!m->seeds) {
        rc = -ENOMEM;
        goto out;
    }
    m->n_seeds = 0;
    for (size_t i = 0; i < n_seeds; i++)
        if (seeds[i] && strcmp(seeds[i], m->addr) && printable_str(seeds[i], DS_WIRE_ADDR_MAX, 0))
            snprintf(m->seeds[m->n_seeds++], ADDR_SZ, "%s", seeds[i]);
    m->seed_next = ds_rng_below(&m->rng, (uint32_t)m->n_seeds);
    m->joining = 1;
    m->join_start_ms = now_ms;
    m->n_finishing = 0;
    m->attempt = 1;
    m->join_wait_ms = m->cfg.join_timeout_ms;
    m->join_retry_ms = now_ms + m->join_wait_ms;
    ds_info(COMP, "joining through %zu seed(s), giving up after %" PRIu64 " ms", m->n_seeds,
            m->cfg.join_give_up_ms);
    send_join(m);
out:
    ds_mship_unlock_and_flush(m);
    return rc;
}

/* ---- admitting ------------------------------------------------------------------- */

/* A JOIN reached us while we leave: the cluster is finishing (every node
 * leaves when its training ends). Say so with a LEAVE to the joiner, so it
 * stops retrying us instead of waiting out its backoff. */
static void answer_finishing(ds_membership *m, const ds_wire_member *u)
{
    const member *s = self_m(m);
    ds_wire_msg msg;
    ds_mship_fill_hdr(m, &msg.h, DS_MSG_LEAVE, u->id);
    memset(&msg.u, 0, sizeof(msg.u));
    msg.u.leave.effective_round = s->removal_round;
    msg.u.leave.incarnation = s->inc;
    m->st.joins_finishing++;
    ds_log_rl(DS_LOG_INFO, COMP, "join from %s (%s) answered: cluster finishing, we leave at "
              "round %" PRIu64, u->name, u->addr, s->removal_round);
    ds_mship_encode_queue(m, &msg, u->id, u->addr);
}

void ds_mship_on_join(ds_membership *m, const ds_wire_msg *msg, uint64_t now)
{
    const ds_wire_member *u = &msg->u.join;
    if (!m->joined) {
        DROP(m, DS_MSHIP_DROP_NOT_JOINED, "joiner=%s", u->name);
        return;
    }
    if (u->id != msg->h.sender) {
        DROP(m, DS_MSHIP_DROP_FORGED, "joiner=%s record_id=%016" PRIx64 " sender=%016" PRIx64,
             u->name, u->id, msg->h.sender);
        return;
    }
    if (m->leaving) {
        answer_finishing(m, u);
        return;
    }
    if (u->state != DS_MEMBER_ALIVE) {
        DROP(m, DS_MSHIP_DROP_BAD_STATE, "joiner=%s state=%u", u->name, u->state);
        return;
    }
    member *e = find(m, u->id);
    if (!e || is_gone(e) || strcmp(e->name, u->name)) {
        if (ds_mship_name_taken(m, u->name, u->id)) {
            DROP(m, DS_MSHIP_DROP_NAME_CONFLICT, "joiner=%s", u->name);
            return;
        }
    }
    if (!e) {
        e = ds_mship_new_member(m, u, now);
        if (!e) {
            DROP(m, DS_MSHIP_DROP_TABLE_FULL, "joiner=%s max_members=%" PRIu32, u->name, m->cap);
            return;
        }
        e->inc = u->incarnation;
        e->state = DS_MEMBER_ALIVE;
        e->join_round = eff_round(m);
        ds_mship_order_insert(m, e->id, 0);
        ds_mship_bcast(m, e, 0);
        ds_mship_push_event(m, DS_MEV_MEMBER_JOINED, e, now);
        ds_info(COMP, "join member=%s addr=%s join_round=%" PRIu64, e->name, e->addr,
                e->join_round);
    } else if (is_gone(e)) {
        /* Back before its removal took effect: cancel the removal, keep the
         * join round. After it: a new join round, after the removal. */
        const uint64_t removal = e->removal_round;
        ds_mship_set_identity(e, u);
        e->inc = u->incarnation > e->inc ? u->incarnation : e->inc + 1;
        e->state = DS_MEMBER_ALIVE;
        e->removal_round = NO_ROUND;
        if (removal <= decide_round(m) || e->join_round == NO_ROUND) {
            uint64_t j = eff_round(m);
            e->join_round = j <= removal ? removal + 1 : j;
        }
        ds_mship_clear_suspicion(e);
        ds_mship_order_insert(m, e->id, 0);
        ds_mship_bcast(m, e, 0);
        ds_mship_push_event(m, DS_MEV_MEMBER_JOINED, e, now);
        ds_info(COMP, "rejoin member=%s incarnation=%" PRIu32 " join_round=%" PRIu64, e->name,
                e->inc, e->join_round);
    } else {
        /* Already a member: a retried JOIN, or a restart before anyone
         * noticed. A new address, or a suspicion to clear, needs a new
         * incarnation; the join round stays. */
        const int moved = strcmp(e->addr, u->addr) || strcmp(e->name, u->name) ||
                          strcmp(e->group, u->group);
        const uint32_t old_inc = e->inc;
        if (moved || e->state == DS_MEMBER_SUSPECT)
            e->inc = u->incarnation > e->inc ? u->incarnation : e->inc + 1;
        else if (u->incarnation > e->inc)
            e->inc = u->incarnation;
        ds_mship_set_identity(e, u);
        if (e->state == DS_MEMBER_SUSPECT) {
            e->state = DS_MEMBER_ALIVE;
            ds_mship_clear_suspicion(e);
            ds_mship_push_event(m, DS_MEV_MEMBER_ALIVE, e, now);
        } else if (e->inc != old_inc) {
            /* Restarted (or moved) before anyone suspected it: alive again
             * under its new incarnation, as it would be after a suspicion. */
            ds_mship_push_event(m, DS_MEV_MEMBER_ALIVE, e, now);
        }
        if (e->inc != old_inc)
            ds_mship_bcast(m, e, 0);
    }
    ds_mship_emit_members(m, e->id, e->addr);
}

void ds_mship_on_members(ds_membership *m, const ds_wire_msg *msg, uint64_t now)
{
    const ds_wire_members *ms = &msg->u.members;
    for (uint32_t i = 0; i < msg->h.count; i++) {
        if (!ds_mship_record_round_ok(m, &ms->members[i], 1)) {
            DROP(m, DS_MSHIP_DROP_BAD_ROUND, "member=%s round=%" PRIu64, ms->members[i].name,
                 ms->members[i].effective_round);
            continue;
        }
        ds_mship_apply_record(m, &ms->members[i], 1, now);
    }
    if (m->joined) {
        /* Push-pull: the pusher lacks records we have; answer with our
         * table (at most once a period, so two nodes cannot ping-pong). */
        uint32_t ours = 0;
        for (uint32_t i = 0; i < m->cap; i++)
            ours += m->tab[i].used;
        member *snd = find(m, msg->h.sender);
        if (snd && is_live(snd) && ms->first + msg->h.count == ms->total && ours > ms->total &&
            now - m->last_pushback_ms >= m->cfg.period_ms) {
            m->last_pushback_ms = now;
            const uint64_t id = snd->id;
            char addr[ADDR_SZ];
            memcpy(addr, snd->addr, sizeof(addr));
            ds_mship_emit_members(m, id, addr);
        }
        return;
    }
    if (!m->joining)
        return;
    if (msg->h.sender != m->js_sender || ms->round_now != m->js_round ||
        ms->total != m->js_total) {
        m->js_sender = msg->h.sender;
        m->js_round = ms->round_now;
        m->js_total = ms->total;
        m->js_have = 0;
        memset(m->js_bits, 0, (m->cap + 7) / 8);
    }
    for (uint32_t i = ms->first; i < ms->first + msg->h.count && i < m->cap; i++) {
        if (!(m->js_bits[i / 8] & (1u << (i % 8)))) {
            m->js_bits[i / 8] |= (uint8_t)(1u << (i % 8));
            m->js_have++;
        }
    }
    if (m->js_have >= ms->total || m->js_have >= m->cap)
        complete_join(m, &msg->h, ms, now);
}

/* ---- leaving --------------------------------------------------------------------- */

int ds_membership_leave(ds_membership *m, uint64_t now_ms, uint64_t *eff)
{
    pthread_mutex_lock(&m->mu);
    int rc = 0;
    member *s = self_m(m);
    if (!m->joined) {
        rc = -EINVAL;
        goto out;
    }
    if (!m->leaving) {
        m->leaving = 1;
        s->state = DS_MEMBER_LEFT;
        s->removal_round = eff_round(m);
        if (s->join_round != NO_ROUND && s->removal_round <= s->join_round)
            s->removal_round = s->join_round + 1;
        ds_mship_bcast(m, s, 0);
        /* Told directly: members that may still be running rounds, the
         * lingering leavers included, up to LEAVE_DIRECT of them (the rest
         * by piggyback). When every node finishes together each lingers
         * until it knows all the others leave (node/runtime/run.c), and a leaver
         * that exits a second later has no time left to piggyback: with
         * 3 direct frames, nodes of a 6-node run lingered the full 10 s. */
        uint32_t n = 0;
        for (uint32_t i = 1; i < m->cap; i++) {
            const member *e = &m->tab[i];
            if (e->used && (e->state == DS_MEMBER_ALIVE || e->state == DS_MEMBER_SUSPECT ||
                            (e->state == DS_MEMBER_LEFT && e->removal_round != NO_ROUND &&
                             e->removal_round > m->round)))
                m->tmp[n++] = i;
        }
        const uint32_t k = LEAVE_DIRECT < n ? LEAVE_DIRECT : n;
        for (uint32_t i = 0; i < k; i++) {
            uint32_t j = i + ds_rng_below(&m->rng, n - i);
            uint32_t t = m->tmp[j];
            m->tmp[j] = m->tmp[i];
            m->tmp[i] = t;
            ds_wire_msg msg;
            ds_mship_fill_hdr(m, &msg.h, DS_MSG_LEAVE, m->tab[t].id);
            memset(&msg.u, 0, sizeof(msg.u));
            msg.u.leave.effective_round = s->removal_round;
            msg.u.leave.incarnation = s->inc;
            m->st.leaves_sent++;
            ds_mship_encode_queue(m, &msg, m->tab[t].id, m->tab[t].addr);
        }
        ds_info(COMP, "leave announced: removal_round=%" PRIu64, s->removal_round);
        ds_mship_check_view(m, now_ms);
    }
    if (eff)
        *eff = s->removal_round;
out:
    ds_mship_unlock_and_flush(m);
    return rc;
}

int ds_membership_advance_join(ds_membership *m, uint32_t lag_rounds, uint64_t now_ms,
                               uint64_t *join_round)
{
    if (!lag_rounds)
        return -EINVAL;
    pthread_mutex_lock(&m->mu);
    member *s = self_m(m);
    const uint64_t j = sat_add(decide_round(m), lag_rounds);
    int moved = 0;
    if (m->joined && !m->leaving && s->state == DS_MEMBER_ALIVE && s->join_round != NO_ROUND &&
        j < s->join_round && s->join_round > m->round) {
        ds_info(COMP, "join round brought forward from %" PRIu64 " to %" PRIu64
                " (round %" PRIu64 "), told to every live member",
                s->join_round, j, decide_round(m));
        s->join_round = j;
        ds_mship_bcast(m, s, 0);
        ds_mship_push_all(m, s);
        m->st.joins_advanced++;
        ds_mship_check_view(m, now_ms);
        moved = 1;
    }
    if (join_round)
        *join_round = s->join_round;
    ds_mship_unlock_and_flush(m);
    return moved;
}

int ds_membership_leave_done(ds_membership *m)
{
    pthread_mutex_lock(&m->mu);
    int done = m->leaving && m->round >= self_m(m)->removal_round;
    pthread_mutex_unlock(&m->mu);
    return done;
}

/* A LEAVE while we are still joining: a seed answered our JOIN with
 * "cluster finishing". Once every seed has said so, give up at once. */
static void on_finishing(ds_membership *m, uint64_t sender, const char *from_addr, uint64_t now)
{
    for (uint32_t i = 0; i < m->n_finishing; i++)
        if (m->finishing[i] == sender)
            return;
    if (m->n_finishing < MAX_FINISHING)
        m->finishing[m->n_finishing++] = sender;
    ds_debug(COMP, "seed %s answers: cluster finishing (%" PRIu32 " of %zu seeds)",
            from_addr ? from_addr : "?", m->n_finishing, m->n_seeds);
    ds_membership_event *ev = ds_mship_push_event(m, DS_MEV_JOIN_FINISHING, self_m(m), now);
    if (ev) {
        snprintf(ev->member.addr, sizeof(ev->member.addr), "%s", from_addr ? from_addr : "?");
        ev->finishing = m->n_finishing;
        ev->n_seeds = (uint32_t)m->n_seeds;
    }
    if (m->n_finishing >= m->n_seeds || m->n_finishing >= MAX_FINISHING)
        give_up_join(m, now);
    else
        m->join_retry_ms = now; /* ask the next seed now, not after the backoff */
}

void ds_mship_on_leave(ds_membership *m, const ds_wire_msg *msg, const char *from_addr,
                       uint64_t now)
{
    if (m->joining && !m->joined) {
        on_finishing(m, msg->h.sender, from_addr, now);
        return;
    }
    member *snd = find(m, msg->h.sender);
    if (!snd) {
        DROP(m, DS_MSHIP_DROP_UNKNOWN_SENDER, "type=LEAVE sender=%016" PRIx64, msg->h.sender);
        return;
    }
    ds_wire_member u;
    ds_mship_record_of(snd, &u, 1);
    u.state = DS_MEMBER_LEFT;
    u.incarnation = msg->u.leave.incarnation;
    u.effective_round = msg->u.leave.effective_round;
    if (!ds_mship_record_round_ok(m, &u, 0)) {
        DROP(m, DS_MSHIP_DROP_BAD_ROUND, "type=LEAVE member=%s round=%" PRIu64, u.name,
             u.effective_round);
        return;
    }
    ds_mship_apply_record(m, &u, 0, now);
}
