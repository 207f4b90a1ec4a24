/*
 * node/membership/table.c: the member table and its updates: records in
 * and out, the rules that merge a record into the table, dissemination by
 * piggyback, and refuting what others say about this node.
 *
 * Updates (member records) ride on every PING, ACK and PING_REQ,
 * least-sent first, newest first among equals, each about
 * mult * ceil(log2(n + 1)) times (classic SWIM dissemination; without
 * Lifeguard in plain queue order). One queued update per member, its
 * current record: a newer record replaces it and restarts its count.
 *
 * Departures from the SWIM and Lifeguard papers, and why:
 *   - Independent confirmations need the suspecter's id, and wire.h's member
 *     record has no field for it. A suspicion changes no view, so in a
 *     piggybacked SUSPECT record effective_round carries the suspecter's
 *     node id instead (in MEMBERS it keeps its table meaning, the join
 *     round). docs/membership.md has the table.
 *   - A refutation also goes straight to the suspecters it names, not only
 *     by piggyback: dissemination rides on probes alone (no separate gossip
 *     messages), so waiting for the epidemic would cost periods.
 *   - A DEAD or LEFT record is final for its incarnation: the member comes
 *     back only with a higher incarnation and a new join round after the
 *     removal round. So every node sees the same sequence of views whatever
 *     order the updates arrive in.
 *
 * Table lookups are linear scans: tables are at most a few thousand members
 * and a message carries at most 64 records, so a hash would buy little.
 */
#include "config.h"

#include "node/membership/internal.h"

#include <errno.h>
#include <inttypes.h>

/* ---- records and dissemination --------------------------------------------------- */

void ds_mship_info_of(const member *e, ds_member_info *o)
{
    memset(o, 0, sizeof(*o));
    o->id = e->id;
    memcpy(o->pk, e->pk, 32);
    memcpy(o->name, e->name, sizeof(o->name));
    memcpy(o->addr, e->addr, sizeof(o->addr));
    memcpy(o->group, e->group, sizeof(o->group));
    o->incarnation = e->inc;
    o->state = (enum ds_member_state)e->state;
    o->join_round = e->join_round;
    o->removal_round = e->removal_round;
}

/* The wire record of e. table = 1: MEMBERS meaning (effective_round is the
 * join round of a live member, the removal round of a gone one); table = 0:
 * update meaning (a SUSPECT record carries its suspecter's id instead). */
void ds_mship_record_of(const member *e, ds_wire_member *r, int table)
{
    memset(r, 0, sizeof(*r));
    r->id = e->id;
    memcpy(r->pk, e->pk, 32);
    r->incarnation = e->inc;
    r->state = e->state;
    memcpy(r->name, e->name, sizeof(r->name));
    memcpy(r->addr, e->addr, sizeof(r->addr));
    memcpy(r->group, e->group, sizeof(r->group));
    switch (e->state) {
    case DS_MEMBER_ALIVE:
        r->effective_round = e->join_round;
        break;
    case DS_MEMBER_SUSPECT:
        r->effective_round = table ? e->join_round : e->bcast_origin;
        break;
    default:
        r->effective_round = e->removal_round;
        break;
    }
}

void ds_mship_bcast(ds_membership *m, member *e, uint64_t origin)
{
    e->bcast = 1;
    e->bcast_sent = 0;
    e->bcast_order = ++m->bcast_clock;
    e->bcast_origin = origin;
}

static void count_sent(member *e, uint32_t limit)
{
    if (!e->bcast)
        return;
    if (++e->bcast_sent >= limit)
        e->bcast = 0;
}

static uint32_t ceil_log2(uint32_t n)
{
    uint32_t k = 0;
    while (k < 32 && (1ull << k) < n)
        k++;
    return k;
}

static uint32_t retransmit_limit(ds_membership *m)
{
    uint32_t l = m->cfg.retransmit_mult * ceil_log2(n_live(m) + 1);
    return l ? l : 1;
}

/* Fill m->tx with up to max_piggyback updates: `first` (when given) leads,
 * then our own record (with_self), then the least-sent, newest first.
 * Returns the count. */
uint32_t ds_mship_collect_updates(ds_membership *m, member *first, int with_self)
{
    const uint32_t lim = m->cfg.max_piggyback;
    const uint32_t limit = retransmit_limit(m);
    const uint64_t gen = ++m->pick_gen;
    uint32_t n = 0;
    if (first && first->used) {
        ds_mship_record_of(first, &m->tx[n++], 0);
        first->picked = gen;
        count_sent(first, limit);
    }
    member *s = self_m(m);
    if (with_self && n < lim && s->picked != gen && s->join_round != NO_ROUND) {
        /* Not counted against its broadcast: an extra copy, so that whoever
         * we probe learns of us even after every queued copy of our join
         * has been used up (a join storm can exhaust them). */
        ds_mship_record_of(s, &m->tx[n++], 0);
        s->picked = gen;
    }
    while (n < lim) {
        member *best = NULL;
        for (uint32_t i = 0; i < m->cap; i++) {
            member *e = &m->tab[i];
            if (!e->used || !e->bcast || e->picked == gen)
                continue;
            if (!best || e->bcast_sent < best->bcast_sent ||
                (e->bcast_sent == best->bcast_sent && e->bcast_order > best->bcast_order))
                best = e;
        }
        if (!best)
            break;
        best->picked = gen;
        ds_mship_record_of(best, &m->tx[n++], 0);
        count_sent(best, limit);
    }
    m->st.updates_sent += n;
    return n;
}

void ds_mship_emit_members(ds_membership *m, uint64_t to_id, const char *to_addr)
{
    uint32_t total = 0;
    for (uint32_t i = 0; i < m->cap; i++)
        if (m->tab[i].used)
            m->tmp[total++] = i;
    const uint32_t per = m->cfg.members_per_msg;
    for (uint32_t first = 0; first < total; first += per) {
        uint32_t n = total - first < per ? total - first : per;
        ds_wire_msg msg;
        ds_mship_fill_hdr(m, &msg.h, DS_MSG_MEMBERS, to_id);
        memset(&msg.u, 0, sizeof(msg.u));
        for (uint32_t i = 0; i < n; i++)
            ds_mship_record_of(&m->tab[m->tmp[first + i]], &m->tx[i], 1);
        msg.h.count = n;
        msg.u.members.round_now = m->round;
        msg.u.members.total = total;
        msg.u.members.first = first;
        msg.u.members.members = m->tx;
        m->st.members_sent++;
        ds_mship_encode_queue(m, &msg, to_id, to_addr);
    }
}

/* ---- table ----------------------------------------------------------------------- */

void ds_mship_clear_suspicion(member *e)
{
    e->susp_start_ms = 0;
    e->susp_origin = 0;
    e->n_confirm = 0;
}

void ds_mship_start_suspicion(member *e, uint64_t origin, uint64_t now)
{
    e->susp_start_ms = now;
    e->susp_origin = origin;
    e->n_confirm = 0;
}

/* 1 when origin is a new independent suspecter of e. */
int ds_mship_add_confirmation(member *e, uint64_t origin)
{
    if (origin == 0 || origin == e->susp_origin)
        return 0;
    if (e->susp_origin == 0) {
        e->susp_origin = origin;
        return 1;
    }
    for (uint32_t i = 0; i < e->n_confirm; i++)
        if (e->confirm[i] == origin)
            return 0;
    if (e->n_confirm >= MAX_CONFIRM)
        return 0;
    e->confirm[e->n_confirm++] = origin;
    return 1;
}

static void free_member(ds_membership *m, member *e)
{
    ds_mship_fold_change(m, e->join_round);
    ds_mship_fold_change(m, e->removal_round);
    memset(e, 0, sizeof(*e));
}

/* Forget DEAD/LEFT members whose removal has passed and whose retention is
 * over (force: the oldest such member regardless of retention, to make room).
 * Returns 1 when a slot was freed. */
int ds_mship_purge(ds_membership *m, uint64_t now, int force)
{
    member *oldest = NULL;
    int freed = 0;
    for (uint32_t i = 1; i < m->cap; i++) {
        member *e = &m->tab[i];
        if (!e->used || !is_gone(e) || e->removal_round > m->round)
            continue;
        if (!force && now - e->dead_since_ms >= m->cfg.dead_retain_ms) {
            free_member(m, e);
            freed = 1;
        } else if (!oldest || e->dead_since_ms < oldest->dead_since_ms) {
            oldest = e;
        }
    }
    if (force && oldest) {
        free_member(m, oldest);
        freed = 1;
    }
    return freed;
}

static member *alloc_member(ds_membership *m, uint64_t now)
{
    for (int pass = 0; pass < 2; pass++) {
        for (uint32_t i = 1; i < m->cap; i++)
            if (!m->tab[i].used)
                return &m->tab[i];
        if (!ds_mship_purge(m, now, 1))
            break;
    }
    return NULL;
}

/* 1 when another live member (or we) already uses this name. */
int ds_mship_name_taken(ds_membership *m, const char *name, uint64_t id)
{
    for (uint32_t i = 0; i < m->cap; i++) {
        const member *e = &m->tab[i];
        if (e->used && e->id != id && is_live(e) && !strcmp(e->name, name))
            return 1;
    }
    return 0;
}

void ds_mship_set_identity(member *e, const ds_wire_member *u)
{
    e->id = u->id;
    memcpy(e->pk, u->pk, 32);
    memcpy(e->name, u->name, sizeof(e->name));
    memcpy(e->addr, u->addr, sizeof(e->addr));
    memcpy(e->group, u->group, sizeof(e->group));
}

member *ds_mship_new_member(ds_membership *m, const ds_wire_member *u, uint64_t now)
{
    member *e = alloc_member(m, now);
    if (!e)
        return NULL;
    memset(e, 0, sizeof(*e));
    e->used = 1;
    ds_mship_set_identity(e, u);
    e->join_round = e->removal_round = NO_ROUND;
    return e;
}

/* ---- applying records ------------------------------------------------------------ */

/* Push e's record now, as PINGs that lead with it, to k random live
 * members other than e (UINT32_MAX: to all of them, in table order),
 * instead of waiting for it to ride the next probes. */
static void push_to(ds_membership *m, member *e, uint32_t k)
{
    const int all = k == UINT32_MAX;
    uint32_t n = 0;
    for (uint32_t i = 1; i < m->cap; i++) {
        const member *x = &m->tab[i];
        if (x->used && x->state == DS_MEMBER_ALIVE && x != e)
            m->tmp[n++] = i;
    }
    if (k > n)
        k = n;
    for (uint32_t i = 0; i < k; i++) {
        if (!all) {
            uint32_t j = i + ds_rng_below(&m->rng, n - i);
            uint32_t t = m->tmp[j];
            m->tmp[j] = m->tmp[i];
            m->tmp[i] = t;
        }
        const member *x = &m->tab[m->tmp[i]];
        ds_mship_emit_probe(m, DS_MSG_PING, x->id, x->addr, ++m->seq, 0, e);
    }
}

/* To up to indirect_k members: used when a suspicion or a not-yet-effective
 * death is lifted, where every holder of a timer must hear it before the
 * timer runs out. Each node pushes a given refutation once, when it first
 * learns it. */
static void push_now(ds_membership *m, member *e)
{
    if (m->cfg.refute_push)
        push_to(m, e, m->cfg.indirect_k);
}

void ds_mship_push_all(ds_membership *m, member *e)
{
    push_to(m, e, UINT32_MAX);
}

static void refute_direct(ds_membership *m, uint64_t origin)
{
    member *s = self_m(m);
    if (origin == 0 || origin == m->self_id)
        return;
    if (m->refute_inc != s->inc) {
        m->refute_inc = s->inc;
        m->n_refuted_to = 0;
    }
    for (uint32_t i = 0; i < m->n_refuted_to; i++)
        if (m->refuted_to[i] == origin)
            return;
    if (m->n_refuted_to >= MAX_REFUTE_TO)
        return;
    member *o = find(m, origin);
    if (!o)
        return;
    m->refuted_to[m->n_refuted_to++] = origin;
    ds_mship_emit_probe(m, DS_MSG_PING, o->id, o->addr, ++m->seq, 0, s);
}

/* Our new incarnation, told to everyone who may be timing us out. */
static void refute(ds_membership *m, uint32_t over_inc, uint64_t origin, uint64_t now)
{
    member *s = self_m(m);
    s->inc = over_inc + 1;
    ds_mship_bcast(m, s, 0);
    m->st.refutations++;
    ds_mship_lhm_add(m, 1); /* Lifeguard: having to refute is a sign of our own slowness */
    ds_debug(COMP, "refute incarnation=%" PRIu32, s->inc);
    ds_mship_push_event(m, DS_MEV_SELF_REFUTED, s, now);
    refute_direct(m, origin);
    push_now(m, s);
}

/* Someone holds a record about us that is not "alive at our incarnation". */
static void apply_self(ds_membership *m, const ds_wire_member *u, int table, uint64_t now)
{
    member *s = self_m(m);
    if (!m->joined) {
        /* Only the seed's table tells a joiner its incarnation and join round. */
        if (table && u->state == DS_MEMBER_ALIVE && u->incarnation >= s->inc) {
            s->inc = u->incarnation;
            s->join_round = u->effective_round;
        }
        return;
    }
    if (m->leaving)
        return; /* our LEFT record outranks anything at our incarnation */
    switch (u->state) {
    case DS_MEMBER_ALIVE:
        if (u->incarnation > s->inc) {
            /* A record from an earlier life of this key: outbid it. */
            s->inc = u->incarnation + 1;
            ds_mship_bcast(m, s, 0);
        } else if (u->incarnation == s->inc && s->state == DS_MEMBER_ALIVE &&
                   u->effective_round != NO_ROUND && u->effective_round < s->join_round) {
            /* Two members admitted us (a JOIN retried to another seed) and
             * decided different join rounds: the smaller wins on every
             * member, so it must win here too, or we would enter the view
             * later than the others count us in it. */
            ds_info(COMP, "our join round moved from %" PRIu64 " to %" PRIu64, s->join_round,
                    u->effective_round);
            s->join_round = u->effective_round;
            ds_mship_bcast(m, s, 0);
        }
        break;
    case DS_MEMBER_SUSPECT:
        if (u->incarnation >= s->inc)
            refute(m, u->incarnation, table ? 0 : u->effective_round, now);
        else if (!table)
            refute_direct(m, u->effective_round);
        break;
    default: /* DEAD, LEFT */
        if (u->incarnation < s->inc)
            break;
        if (u->effective_round > decide_round(m)) {
            /* The removal has not taken effect anywhere we know of: a higher
             * incarnation cancels it, and we never leave the view. */
            ds_info(COMP, "declared %s for removal round %" PRIu64 ": cancelled by refutation",
                    u->state == DS_MEMBER_DEAD ? "dead" : "left", u->effective_round);
            refute(m, u->incarnation, 0, now);
            break;
        }
        const uint32_t live = n_live(m); /* ourselves included */
        if (u->state == DS_MEMBER_DEAD && live > 1) {
            /* Removed already, but we trained on with live partners the
             * whole time (a partition's other side declared us dead): our
             * model is as current as theirs, and our partners hold us in
             * their views. Refute, as Lifeguard and memberlist do: the
             * higher incarnation puts us back at once on every node (a late
             * change there). Rejoining instead took us out of our own
             * partners' views until the new join round, leaving a member of
             * a 2|2 split alone in its view at the heal. */
            ds_info(COMP, "declared dead for removal round %" PRIu64 " while training with %" PRIu32
                    " live partner(s): refuting", u->effective_round, live - 1);
            refute(m, u->incarnation, 0, now);
            break;
        }
        /* Out of the view since the removal round, alone (or declared left):
         * our model is our own, from no one else's data since then. Back in
         * with a new incarnation at a join round after the removal, with the
         * cluster's state. */
        ds_mship_rejoin(m, u->incarnation, u->effective_round, now,
                        u->state == DS_MEMBER_DEAD ? "declared dead while alive"
                                                   : "declared left while alive");
        break;
    }
}

void ds_mship_rejoin(ds_membership *m, uint32_t over_inc, uint64_t after, uint64_t now,
                     const char *why)
{
    member *s = self_m(m);
    uint64_t j = eff_round(m);
    if (j <= after)
        j = after + 1;
    s->inc = (over_inc > s->inc ? over_inc : s->inc) + 1;
    s->state = DS_MEMBER_ALIVE;
    s->join_round = j;
    s->removal_round = NO_ROUND;
    m->rejoin_pending = 0;
    ds_mship_bcast(m, s, 0);
    m->st.rejoins++;
    ds_info(COMP, "%s: rejoining incarnation=%" PRIu32 " join_round=%" PRIu64 " (out since %" PRIu64
            ")", why, s->inc, j, after);
    ds_membership_event *ev = ds_mship_push_event(m, DS_MEV_SELF_REJOINED, s, now);
    if (ev) {
        ev->round = after ? after : decide_round(m);
        ev->join_round = j;
    }
    push_now(m, s);
}

/* Someone still spreads an older record of e than ours: spread ours again
 * (once: not while it is still queued), or the stale one could be the last
 * word some node hears. */
static void correct(ds_membership *m, member *e)
{
    if (!e->bcast)
        ds_mship_bcast(m, e, e->state == DS_MEMBER_SUSPECT ? e->susp_origin : 0);
}

/* A record of a member we do not know: it enters the table as the record
 * says. NULL when it was refused (counted and logged). */
static member *admit_record(ds_membership *m, const ds_wire_member *u, int table,
                            uint64_t origin, uint64_t now)
{
    if (ds_mship_name_taken(m, u->name, u->id)) {
        DROP(m, DS_MSHIP_DROP_NAME_CONFLICT, "name=%s id=%016" PRIx64, u->name, u->id);
        return NULL;
    }
    member *e = ds_mship_new_member(m, u, now);
    if (!e) {
        DROP(m, DS_MSHIP_DROP_TABLE_FULL, "name=%s max_members=%" PRIu32, u->name, m->cap);
        return NULL;
    }
    e->inc = u->incarnation;
    e->state = u->state;
    switch (u->state) {
    case DS_MEMBER_ALIVE:
        e->join_round = u->effective_round;
        ds_mship_push_event(m, DS_MEV_MEMBER_JOINED, e, now);
        ds_mship_order_insert(m, e->id, 0);
        break;
    case DS_MEMBER_SUSPECT:
        /* A piggybacked suspicion does not say when the suspect joined.
         * Someone probed it, so it has been around: in our views from
         * before anything we know (0) until a refutation or a table
         * gives its join round. */
        e->join_round = table && u->effective_round != NO_ROUND ? u->effective_round : 0;
        ds_mship_start_suspicion(e, origin, now);
        ds_mship_push_event(m, DS_MEV_MEMBER_JOINED, e, now);
        ds_mship_push_event(m, DS_MEV_MEMBER_SUSPECTED, e, now);
        ds_mship_order_insert(m, e->id, 0);
        break;
    default:
        /* Gone, but in the views until its removal round. */
        e->join_round = 0;
        e->removal_round = u->effective_round;
        e->dead_since_ms = now;
        break;
    }
    if (!table)
        ds_mship_bcast(m, e, origin);
    return e;
}

/* A record that outranks ours for e (a higher incarnation, or a later state
 * at the same one): it replaces ours. 0 when it was refused (counted and
 * logged). */
static int apply_newer(ds_membership *m, member *e, const ds_wire_member *u, int table,
                       uint64_t origin, uint64_t now)
{
    const uint8_t old = e->state;
    const int was_gone = is_gone(e);
    const uint32_t old_inc = e->inc;
    if (strcmp(u->name, e->name) && ds_mship_name_taken(m, u->name, u->id)) {
        DROP(m, DS_MSHIP_DROP_NAME_CONFLICT, "name=%s id=%016" PRIx64, u->name, u->id);
        return 0;
    }
    ds_mship_set_identity(e, u);
    e->inc = u->incarnation;
    switch (u->state) {
    case DS_MEMBER_ALIVE:
        /* A refutation keeps its join round (and cancels a removal that
         * has not happened yet); a rejoin brings a new one after its
         * removal. Either way the record says it all. A member we held
         * alive comes back under a new incarnation (only an ALIVE record
         * with a higher one gets here): a restart, or a refutation of a
         * suspicion we had not heard of. It is alive again, as it is to
         * whoever took its JOIN (join.c), so every node sees the event. */
        e->join_round = u->effective_round;
        e->removal_round = NO_ROUND;
        e->state = DS_MEMBER_ALIVE;
        ds_mship_clear_suspicion(e);
        if (was_gone) {
            ds_mship_push_event(m, DS_MEV_MEMBER_JOINED, e, now);
            ds_mship_order_insert(m, e->id, 0);
        } else {
            ds_mship_push_event(m, DS_MEV_MEMBER_ALIVE, e, now);
        }
        if (!table && old != DS_MEMBER_ALIVE)
            push_now(m, e); /* others may be timing it out too */
        break;
    case DS_MEMBER_SUSPECT:
        if (was_gone) {
            e->removal_round = NO_ROUND;
            e->join_round = table && u->effective_round != NO_ROUND ? u->effective_round : 0;
            ds_mship_push_event(m, DS_MEV_MEMBER_JOINED, e, now);
            ds_mship_order_insert(m, e->id, 0);
        } else if (table && u->effective_round != NO_ROUND) {
            e->join_round = u->effective_round;
        }
        e->state = DS_MEMBER_SUSPECT;
        ds_mship_start_suspicion(e, origin, now);
        ds_mship_push_event(m, DS_MEV_MEMBER_SUSPECTED, e, now);
        break;
    default: { /* DEAD, LEFT */
        if (was_gone && u->incarnation == old_inc) {
            /* LEFT over DEAD: keep the earlier removal. */
            if (u->effective_round < e->removal_round)
                e->removal_round = u->effective_round;
        } else {
            if (was_gone) /* died again in a life we never saw start */
                e->join_round = 0;
            e->removal_round = u->effective_round;
        }
        e->state = u->state;
        ds_mship_clear_suspicion(e);
        e->dead_since_ms = now;
        ds_membership_event *ev = ds_mship_push_event(
            m, u->state == DS_MEMBER_DEAD ? DS_MEV_MEMBER_DEAD : DS_MEV_MEMBER_LEFT, e, now);
        if (ev)
            ev->round = e->removal_round;
        break;
    }
    }
    ds_mship_bcast(m, e, origin);
    return 1;
}

/* Lifeguard's rule for a verdict against direct evidence: a DEAD record
 * about a live member that sent us a frame itself within the minimum
 * suspicion timeout is not applied. After a partition heals, the other side
 * spreads DEAD for every member it lost, including ones we reached the whole
 * time; applying those would split healthy members apart. It becomes a
 * suspicion at the record's incarnation instead, timed by us and sent to the
 * member at once, so that it refutes with a higher incarnation (which
 * outranks the DEAD record everywhere) or, if it really is gone, our own
 * timer declares it dead one timeout later. 1 when the record was taken as
 * a suspicion. */
static int doubt_death(ds_membership *m, member *e, const ds_wire_member *u, uint64_t now)
{
    if (u->state != DS_MEMBER_DEAD || !is_live(e) || !e->heard_ms)
        return 0;
    const uint64_t fresh = ds_membership_suspicion_timeout_ms(&m->cfg, n_live(m), UINT32_MAX);
    if (now - e->heard_ms >= fresh)
        return 0;
    m->st.deaths_doubted++;
    ds_log_rl(DS_LOG_INFO, COMP,
              "dead verdict about member=%s incarnation=%" PRIu32 " doubted: heard from it %" PRIu64
              " ms ago; suspecting it instead",
              e->name, u->incarnation, now - e->heard_ms);
    const int fresh_suspicion = e->state != DS_MEMBER_SUSPECT || u->incarnation > e->inc;
    if (u->incarnation > e->inc)
        e->inc = u->incarnation;
    if (fresh_suspicion) {
        e->state = DS_MEMBER_SUSPECT;
        ds_mship_start_suspicion(e, m->self_id, now);
        ds_mship_bcast(m, e, m->self_id);
        ds_mship_push_event(m, DS_MEV_MEMBER_SUSPECTED, e, now);
        ds_mship_emit_probe(m, DS_MSG_PING, e->id, e->addr, ++m->seq, 0, e);
    }
    return 1;
}

/* A record at e's own incarnation and state: a new suspecter confirms a
 * suspicion; of two effective rounds the smaller wins, and a sender still
 * spreading the larger one is corrected. */
static void apply_same(ds_membership *m, member *e, const ds_wire_member *u, int table,
                       uint64_t origin)
{
    switch (u->state) {
    case DS_MEMBER_SUSPECT:
        if (!table && ds_mship_add_confirmation(e, origin))
            ds_mship_bcast(m, e, origin);
        break;
    case DS_MEMBER_ALIVE:
        if (u->effective_round < e->join_round) {
            e->join_round = u->effective_round;
            ds_mship_bcast(m, e, 0);
        } else if (u->effective_round > e->join_round) {
            correct(m, e);
        }
        break;
    default:
        if (u->effective_round < e->removal_round) {
            e->removal_round = u->effective_round;
            ds_mship_bcast(m, e, 0);
        } else if (u->effective_round > e->removal_round) {
            correct(m, e);
        }
        break;
    }
}

/* The core merge. Precedence: higher incarnation wins; at equal
 * incarnation ALIVE < SUSPECT < DEAD < LEFT; at equal incarnation and
 * state, the smaller effective round wins (so two deciders converge on one
 * round) and a SUSPECT from a new suspecter is a confirmation. */
void ds_mship_apply_record(ds_membership *m, const ds_wire_member *u, int table, uint64_t now)
{
    if (u->id == m->self_id) {
        apply_self(m, u, table, now);
        return;
    }
    const uint64_t origin = (!table && u->state == DS_MEMBER_SUSPECT) ? u->effective_round : 0;
    member *e = find(m, u->id);
    const int was_in = e ? in_view(e, m->round) : 0;

    if (!e) {
        e = admit_record(m, u, table, origin, now);
        if (!e)
            return;
    } else if (u->incarnation > e->inc || (u->incarnation == e->inc && u->state > e->state)) {
        if (doubt_death(m, e, u, now))
            return;
        if (!apply_newer(m, e, u, table, origin, now))
            return;
    } else if (u->incarnation == e->inc && u->state == e->state) {
        apply_same(m, e, u, table, origin);
    } else {
        correct(m, e); /* the sender is behind us */
    }
    if (!table && m->joined && in_view(e, m->round) != was_in) {
        m->st.late_changes++;
        ds_log_rl(DS_LOG_INFO, COMP, "late change: member=%s state=%d round=%" PRIu64, e->name,
                  (int)e->state, m->round);
    }
}

/* Effective rounds a record may carry: at most lag + max_round_ahead past
 * what we know of the cluster's round. */
int ds_mship_record_round_ok(ds_membership *m, const ds_wire_member *u, int table)
{
    const uint64_t bound = sat_add(eff_round(m), m->cfg.max_round_ahead);
    switch (u->state) {
    case DS_MEMBER_SUSPECT:
        return !table || u->effective_round == NO_ROUND || u->effective_round <= bound;
    default:
        return u->effective_round <= bound;
    }
}

void ds_mship_apply_records(ds_membership *m, const ds_wire_member *recs, uint32_t n, int table,
                            uint64_t now)
{
    for (uint32_t i = 0; i < n; i++) {
        if (!ds_mship_record_round_ok(m, &recs[i], table)) {
            DROP(m, DS_MSHIP_DROP_BAD_ROUND, "member=%s state=%u round=%" PRIu64, recs[i].name,
                 recs[i].state, recs[i].effective_round);
            continue;
        }
        ds_mship_apply_record(m, &recs[i], table, now);
    }
}

/* ---- snapshots ------------------------------------------------------------------- */

int ds_membership_members(ds_membership *m, ds_member_info *out, uint32_t cap, uint32_t *n)
{
    pthread_mutex_lock(&m->mu);
    uint32_t k = 0;
    for (uint32_t i = 0; i < m->cap; i++) {
        if (!m->tab[i].used)
            continue;
        if (out && k < cap)
            ds_mship_info_of(&m->tab[i], &out[k]);
        k++;
    }
    if (n)
        *n = k;
    pthread_mutex_unlock(&m->mu);
    return k > cap ? -ENOSPC : 0;
}

int ds_membership_member(ds_membership *m, uint64_t id, ds_member_info *out)
{
    pthread_mutex_lock(&m->mu);
    member *e = find(m, id);
    if (e && out)
        ds_mship_info_of(e, out);
    pthread_mutex_unlock(&m->mu);
    return e ? 0 : -ENOENT;
}
