/*
 * node/membership/membership.c: SWIM failure detection and dissemination with
 * Lifeguard, plus views that change only at effective rounds.
 *
 * SWIM (Das, Gupta, Motivala 2002), as implemented here. Every protocol
 * period T a node probes one member: members are visited round-robin in a
 * shuffled order, re-shuffled each pass, so every member is probed by every
 * other within one pass (a bound on first detection that random choice does
 * not give). PING, then ACK within the probe timeout; else PING_REQ to k
 * other members, which PING the target and forward its ACK; no ACK by the
 * end of the period: the target is suspected. A suspicion becomes a death
 * when its timer expires; a suspected member refutes by raising its
 * incarnation. Updates (member records) ride on every PING, ACK and PING_REQ,
 * least-sent first, newest first among equals, each about
 * mult * ceil(log2(n + 1)) times.
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
 * Departures from the papers, and why:
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
 *   - Dead members are pinged now and then (one every dead_ping_periods
 *     periods) for dead_retain_ms, carrying their own DEAD record: after a
 *     partition heals each side learns it was declared dead, rejoins, and
 *     the two sides find each other without a seed.
 *
 * Views: see membership.h. A change's effective round is decided once, by
 * one node, and travels in the record; all nodes evaluate the same pure
 * function of their tables, so once they know the same records they agree
 * on every view and epoch at every round from then on.
 *
 * Table lookups are linear scans: tables are at most a few thousand members
 * and a message carries at most 64 records, so a hash would buy little.
 */
#include "config.h"

#include "node/membership/membership.h"

#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <pthread.h>
#include <sodium.h>
#include <stdlib.h>
#include <string.h>

#include "base/log.h"
#include "base/rng.h"

#define COMP "membership"
#define NO_ROUND DS_MEMBERSHIP_NO_ROUND
#define LEAVE_DIRECT 32 /* members told of our leave directly, at most */
#define MAX_RECORDS DS_MEMBERSHIP_MAX_RECORDS
#define MAX_INDIRECT 8u
#define MAX_CONFIRM 16u
#define MAX_RELAYS 64u
#define MAX_REFUTE_TO 8u
#define ADDR_SZ (DS_WIRE_ADDR_MAX + 1)

/* ---- state ------------------------------------------------------------------ */

typedef struct member {
    int used;
    uint64_t id;
    uint8_t pk[32];
    char name[DS_WIRE_NAME_MAX + 1];
    char addr[ADDR_SZ];
    char group[DS_WIRE_GROUP_MAX + 1];
    uint32_t inc;
    uint8_t state; /* enum ds_member_state; its value is the precedence rank */
    /* In views during [join_round, removal_round), from its latest record
     * only, so nodes holding the same records agree whatever they saw
     * before. join 0: since before anything we know of. */
    uint64_t join_round, removal_round;
    /* Suspicion: timer start (local clock), first suspecter, confirmers. */
    uint64_t susp_start_ms;
    uint64_t susp_origin;
    uint64_t confirm[MAX_CONFIRM];
    uint32_t n_confirm;
    uint64_t dead_since_ms;
    /* Dissemination: one queued update per member, the member's current
     * record; a newer update replaces it and restarts its count. */
    int bcast;
    uint32_t bcast_sent;
    uint64_t bcast_order;
    uint64_t bcast_origin; /* carried in a SUSPECT record */
    uint64_t picked;       /* collect_updates() generation */
} member;

struct probe {
    int active, acked, indirect_sent;
    uint64_t target, seq;
    uint64_t ack_deadline_ms, end_ms;
    uint64_t via[MAX_INDIRECT];
    uint8_t nacked[MAX_INDIRECT];
    uint32_t n_via, nacks;
};

/* An indirect probe we run for a requester. */
struct relay {
    int used, nacked;
    uint64_t req_id, req_seq, target, my_seq;
    char req_addr[ADDR_SZ];
    uint64_t nack_at_ms, expire_ms;
};

struct outmsg {
    uint64_t to_id;
    char to_addr[ADDR_SZ];
    uint8_t *frame;
    size_t len;
};

struct outq {
    struct outmsg *v;
    size_t n, cap;
};

struct evq {
    ds_membership_event *v;
    size_t n, cap;
};

struct ds_membership {
    pthread_mutex_t mu;
    ds_membership_cfg cfg;
    char name[DS_WIRE_NAME_MAX + 1];
    char addr[ADDR_SZ];
    char group[DS_WIRE_GROUP_MAX + 1];
    ds_membership_io io;
    uint64_t self_id;
    ds_rng rng;

    member *tab; /* tab[0] is this node */
    uint32_t cap;
    uint32_t *tmp; /* cap scratch slot indices */
    uint64_t bcast_clock, pick_gen;

    uint64_t round;      /* this node's gossip round (set_round) */
    uint64_t seen_round; /* highest round heard from members (bounded) */
    uint64_t epoch_floor;

    int joined, joining, leaving;

    struct probe pr;
    uint64_t next_probe_ms, last_early_ms, n_periods, last_pushback_ms;
    uint32_t lhm;
    uint64_t *order;
    uint32_t order_n, order_pos;
    struct relay relays[MAX_RELAYS];
    uint64_t seq;

    char (*seeds)[ADDR_SZ];
    size_t n_seeds, seed_next;
    uint32_t attempt;
    uint64_t join_retry_ms, join_wait_ms;
    uint64_t js_sender, js_round;
    uint32_t js_total, js_have;
    uint8_t *js_bits;

    uint32_t refute_inc, n_refuted_to;
    uint64_t refuted_to[MAX_REFUTE_TO];

    int view_known, view_in;
    uint64_t view_epoch, view_fp;
    uint32_t view_G;

    struct outq out;
    struct evq ev;

    ds_wire_limits lim;
    ds_wire_member rx[MAX_RECORDS];
    ds_wire_member tx[MAX_RECORDS];
    ds_drop_counters wire_drops;
    ds_membership_stats st;
};

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

/* Count and log (rate-limited: peers drive this path). */
#define DROP(m, reason, fmt, ...) \
    do { \
        enum ds_mship_drop dr_ = (reason); \
        (m)->st.drops[dr_]++; \
        /* A JOIN that reaches a node still founding or joining is the \
         * expected start-up race (the joiner retries): info, not warn. */ \
        ds_log_rl(dr_ == DS_MSHIP_DROP_NOT_JOINED ? DS_LOG_INFO : DS_LOG_WARN, COMP, \
                  "drop reason=%s (%s) " fmt, mship_drop_names[dr_], \
                  mship_drop_texts[dr_], ##__VA_ARGS__); \
    } while (0)

/* ---- small helpers ------------------------------------------------------------ */

static uint64_t max64(uint64_t a, uint64_t b)
{
    return a > b ? a : b;
}

static uint64_t sat_add(uint64_t a, uint64_t b)
{
    return a > UINT64_MAX - b ? UINT64_MAX : a + b;
}

static member *self_m(ds_membership *m)
{
    return &m->tab[0];
}

static int is_live(const member *e)
{
    return e->state == DS_MEMBER_ALIVE || e->state == DS_MEMBER_SUSPECT;
}

static int is_gone(const member *e)
{
    return e->state == DS_MEMBER_DEAD || e->state == DS_MEMBER_LEFT;
}

static member *find(ds_membership *m, uint64_t id)
{
    for (uint32_t i = 0; i < m->cap; i++)
        if (m->tab[i].used && m->tab[i].id == id)
            return &m->tab[i];
    return NULL;
}

static uint32_t n_live(ds_membership *m)
{
    uint32_t n = 0;
    for (uint32_t i = 0; i < m->cap; i++)
        n += m->tab[i].used && is_live(&m->tab[i]);
    return n;
}

/* The round a change decided now is measured from: ours, or the highest
 * heard from the members when we are behind (a node just resumed from a
 * pause must not schedule changes in the cluster's past). */
static uint64_t decide_round(ds_membership *m)
{
    return max64(m->round, m->seen_round);
}

static uint64_t eff_round(ds_membership *m)
{
    return sat_add(decide_round(m), m->cfg.lag_rounds);
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

static int printable_str(const char *s, size_t max, int allow_empty)
{
    size_t n = strnlen(s, max + 1);
    if (n > max || (n == 0 && !allow_empty))
        return 0;
    for (size_t i = 0; i < n; i++)
        if ((unsigned char)s[i] < 0x21 || (unsigned char)s[i] > 0x7e)
            return 0;
    return 1;
}

static int in_view(const member *e, uint64_t r)
{
    return e->join_round != NO_ROUND && e->join_round <= r &&
           (e->removal_round == NO_ROUND || r < e->removal_round);
}

/* A purged member's change rounds: fold them into the floor so the epochs
 * of rounds we have reached do not move. Only rounds already passed are
 * folded, and those are below every current round, so nodes that purge at
 * different times still compute the same epochs. */
static void fold_change(ds_membership *m, uint64_t c)
{
    if (c != NO_ROUND && c <= m->round && c > m->epoch_floor)
        m->epoch_floor = c;
}

static uint64_t epoch_at(ds_membership *m, uint64_t r)
{
    uint64_t e = m->epoch_floor;
    for (uint32_t i = 0; i < m->cap; i++) {
        const member *x = &m->tab[i];
        if (!x->used)
            continue;
        const uint64_t c[2] = {x->join_round, x->removal_round};
        for (int k = 0; k < 2; k++)
            if (c[k] != NO_ROUND && c[k] <= r && c[k] > e)
                e = c[k];
    }
    return e;
}

static void info_of(const member *e, ds_member_info *o)
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

/* ---- output queues --------------------------------------------------------------- */

static ds_membership_event *push_event(ds_membership *m, enum ds_membership_event_kind kind,
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
        info_of(e, &ev->member);
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
static void unlock_and_flush(ds_membership *m)
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

/* ---- records and encoding -------------------------------------------------------- */

/* The wire record of e. table = 1: MEMBERS meaning (effective_round is the
 * join round of a live member, the removal round of a gone one); table = 0:
 * update meaning (a SUSPECT record carries its suspecter's id instead). */
static void record_of(const member *e, ds_wire_member *r, int table)
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

static void bcast(ds_membership *m, member *e, uint64_t origin)
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

/* Fill m->tx with up to max_piggyback updates: `first` (when given) leads,
 * then our own record (with_self), then the least-sent, newest first.
 * Returns the count. */
static uint32_t collect_updates(ds_membership *m, member *first, int with_self)
{
    const uint32_t lim = m->cfg.max_piggyback;
    const uint32_t limit = retransmit_limit(m);
    const uint64_t gen = ++m->pick_gen;
    uint32_t n = 0;
    if (first && first->used) {
        record_of(first, &m->tx[n++], 0);
        first->picked = gen;
        count_sent(first, limit);
    }
    member *s = self_m(m);
    if (with_self && n < lim && s->picked != gen && s->join_round != NO_ROUND) {
        /* Not counted against its broadcast: an extra copy, so that whoever
         * we probe learns of us even after every queued copy of our join
         * has been used up (a join storm can exhaust them). */
        record_of(s, &m->tx[n++], 0);
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
        record_of(best, &m->tx[n++], 0);
        count_sent(best, limit);
    }
    m->st.updates_sent += n;
    return n;
}

static void fill_hdr(ds_membership *m, ds_wire_hdr *h, uint8_t type, uint64_t to_id)
{
    memset(h, 0, sizeof(*h));
    h->type = type;
    h->cluster = m->cfg.cluster_id;
    h->sender = m->self_id;
    h->receiver = to_id;
    h->round = m->round;
    h->epoch = (uint32_t)epoch_at(m, m->round);
}

static void encode_queue(ds_membership *m, ds_wire_msg *msg, uint64_t to_id, const char *to_addr)
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

/* PING, ACK, PING_REQ, NACK. `first`: a member whose record must lead the
 * piggyback (the buddy system, refutations, news for the dead). */
static void emit_probe(ds_membership *m, uint8_t type, uint64_t to_id, const char *to_addr,
                       uint64_t seq, uint64_t target, member *first)
{
    ds_wire_msg msg;
    fill_hdr(m, &msg.h, type, to_id);
    memset(&msg.u, 0, sizeof(msg.u));
    msg.u.probe.probe_seq = seq;
    msg.u.probe.target = target;
    msg.u.probe.updates = m->tx;
    msg.h.count = type == DS_MSG_NACK ? 0
                                      : collect_updates(m, first, type != DS_MSG_ACK);
    switch (type) {
    case DS_MSG_PING: m->st.pings_sent++; break;
    case DS_MSG_ACK: m->st.acks_sent++; break;
    case DS_MSG_PING_REQ: m->st.ping_reqs_sent++; break;
    default: m->st.nacks_sent++; break;
    }
    encode_queue(m, &msg, to_id, to_addr);
}

/* The record a message to e should lead with, if any: its own bad news. */
static member *first_for(ds_membership *m, member *e)
{
    if (!e)
        return NULL;
    if (is_gone(e))
        return e;
    if (m->cfg.lifeguard && e->state == DS_MEMBER_SUSPECT)
        return e;
    return NULL;
}

static void emit_members(ds_membership *m, uint64_t to_id, const char *to_addr)
{
    uint32_t total = 0;
    for (uint32_t i = 0; i < m->cap; i++)
        if (m->tab[i].used)
            m->tmp[total++] = i;
    const uint32_t per = m->cfg.members_per_msg;
    for (uint32_t first = 0; first < total; first += per) {
        uint32_t n = total - first < per ? total - first : per;
        ds_wire_msg msg;
        fill_hdr(m, &msg.h, DS_MSG_MEMBERS, to_id);
        memset(&msg.u, 0, sizeof(msg.u));
        for (uint32_t i = 0; i < n; i++)
            record_of(&m->tab[m->tmp[first + i]], &m->tx[i], 1);
        msg.h.count = n;
        msg.u.members.round_now = m->round;
        msg.u.members.total = total;
        msg.u.members.first = first;
        msg.u.members.members = m->tx;
        m->st.members_sent++;
        encode_queue(m, &msg, to_id, to_addr);
    }
}

/* ---- table ------------------------------------------------------------------------ */

static void clear_suspicion(member *e)
{
    e->susp_start_ms = 0;
    e->susp_origin = 0;
    e->n_confirm = 0;
}

static void start_suspicion(member *e, uint64_t origin, uint64_t now)
{
    e->susp_start_ms = now;
    e->susp_origin = origin;
    e->n_confirm = 0;
}

/* 1 when origin is a new independent suspecter of e. */
static int add_confirmation(member *e, uint64_t origin)
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
    fold_change(m, e->join_round);
    fold_change(m, e->removal_round);
    memset(e, 0, sizeof(*e));
}

/* Forget DEAD/LEFT members whose removal has passed and whose retention is
 * over (force: the oldest such member regardless of retention, to make room).
 * Returns 1 when a slot was freed. */
static int purge(ds_membership *m, uint64_t now, int force)
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
        if (!purge(m, now, 1))
            break;
    }
    return NULL;
}

/* 1 when another live member (or we) already uses this name. */
static int name_taken(ds_membership *m, const char *name, uint64_t id)
{
    for (uint32_t i = 0; i < m->cap; i++) {
        const member *e = &m->tab[i];
        if (e->used && e->id != id && is_live(e) && !strcmp(e->name, name))
            return 1;
    }
    return 0;
}

static void set_identity(member *e, const ds_wire_member *u)
{
    e->id = u->id;
    memcpy(e->pk, u->pk, 32);
    memcpy(e->name, u->name, sizeof(e->name));
    memcpy(e->addr, u->addr, sizeof(e->addr));
    memcpy(e->group, u->group, sizeof(e->group));
}

static member *new_member(ds_membership *m, const ds_wire_member *u, uint64_t now)
{
    member *e = alloc_member(m, now);
    if (!e)
        return NULL;
    memset(e, 0, sizeof(*e));
    e->used = 1;
    set_identity(e, u);
    e->join_round = e->removal_round = NO_ROUND;
    return e;
}

/* ---- probe order ------------------------------------------------------------------- */

static void order_rebuild(ds_membership *m)
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
static void order_insert(ds_membership *m, uint64_t id, int front)
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
            order_rebuild(m);
            rebuilt = 1;
            if (!m->order_n)
                return NULL;
        }
        member *e = find(m, m->order[m->order_pos++]);
        if (e && e != self_m(m) && is_live(e))
            return e;
    }
}

/* ---- local health -------------------------------------------------------------------- */

static void lhm_add(ds_membership *m, int delta)
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

/* ---- applying records ---------------------------------------------------------------- */

/* Push e's record to up to indirect_k random live members now (PINGs that
 * lead with it), instead of waiting for it to ride the next probes: used
 * when a suspicion or a not-yet-effective death is lifted, where every
 * holder of a timer must hear it before the timer runs out. Each node
 * pushes a given refutation once, when it first learns it. */
static void push_now(ds_membership *m, member *e)
{
    if (!m->cfg.refute_push)
        return;
    uint32_t n = 0;
    for (uint32_t i = 1; i < m->cap; i++) {
        const member *x = &m->tab[i];
        if (x->used && x->state == DS_MEMBER_ALIVE && x != e)
            m->tmp[n++] = i;
    }
    const uint32_t k = m->cfg.indirect_k < n ? m->cfg.indirect_k : n;
    for (uint32_t i = 0; i < k; i++) {
        uint32_t j = i + ds_rng_below(&m->rng, n - i);
        uint32_t t = m->tmp[j];
        m->tmp[j] = m->tmp[i];
        m->tmp[i] = t;
        emit_probe(m, DS_MSG_PING, m->tab[t].id, m->tab[t].addr, ++m->seq, 0, e);
    }
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
    emit_probe(m, DS_MSG_PING, o->id, o->addr, ++m->seq, 0, s);
}

/* Our new incarnation, told to everyone who may be timing us out. */
static void refute(ds_membership *m, uint32_t over_inc, uint64_t origin, uint64_t now)
{
    member *s = self_m(m);
    s->inc = over_inc + 1;
    bcast(m, s, 0);
    m->st.refutations++;
    lhm_add(m, 1); /* Lifeguard: having to refute is a sign of our own slowness */
    ds_debug(COMP, "refute incarnation=%" PRIu32, s->inc);
    push_event(m, DS_MEV_SELF_REFUTED, s, now);
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
            bcast(m, s, 0);
        } else if (u->incarnation == s->inc && s->state == DS_MEMBER_ALIVE &&
                   u->effective_round != NO_ROUND && u->effective_round < s->join_round) {
            /* Two members admitted us (a JOIN retried to another seed) and
             * decided different join rounds: the smaller wins on every
             * member, so it must win here too, or we would enter the view
             * later than the others count us in it. */
            ds_info(COMP, "our join round moved from %" PRIu64 " to %" PRIu64, s->join_round,
                    u->effective_round);
            s->join_round = u->effective_round;
            bcast(m, s, 0);
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
        /* Out of the view since the removal round: back in, with a new
         * incarnation, at a join round after it. */
        uint64_t j = eff_round(m);
        if (j <= u->effective_round)
            j = u->effective_round + 1;
        s->inc = u->incarnation + 1;
        s->state = DS_MEMBER_ALIVE;
        s->join_round = j;
        s->removal_round = NO_ROUND;
        bcast(m, s, 0);
        m->st.rejoins++;
        ds_info(COMP, "declared %s at removal round %" PRIu64 " while alive: rejoining "
                "incarnation=%" PRIu32 " join_round=%" PRIu64,
                u->state == DS_MEMBER_DEAD ? "dead" : "left", u->effective_round, s->inc, j);
        ds_membership_event *ev = push_event(m, DS_MEV_SELF_REJOINED, s, now);
        if (ev)
            ev->round = u->effective_round;
        push_now(m, s);
        break;
    }
}

/* Someone still spreads an older record of e than ours: spread ours again
 * (once: not while it is still queued), or the stale one could be the last
 * word some node hears. */
static void correct(ds_membership *m, member *e)
{
    if (!e->bcast)
        bcast(m, e, e->state == DS_MEMBER_SUSPECT ? e->susp_origin : 0);
}

/* The core merge. Precedence: higher incarnation wins; at equal
 * incarnation ALIVE < SUSPECT < DEAD < LEFT; at equal incarnation and
 * state, the smaller effective round wins (so two deciders converge on one
 * round) and a SUSPECT from a new suspecter is a confirmation. */
static void apply_record(ds_membership *m, const ds_wire_member *u, int table, uint64_t now)
{
    if (u->id == m->self_id) {
        apply_self(m, u, table, now);
        return;
    }
    const uint64_t origin = (!table && u->state == DS_MEMBER_SUSPECT) ? u->effective_round : 0;
    member *e = find(m, u->id);
    const int was_in = e ? in_view(e, m->round) : 0;

    if (!e) {
        if (name_taken(m, u->name, u->id)) {
            DROP(m, DS_MSHIP_DROP_NAME_CONFLICT, "name=%s id=%016" PRIx64, u->name, u->id);
            return;
        }
        e = new_member(m, u, now);
        if (!e) {
            DROP(m, DS_MSHIP_DROP_TABLE_FULL, "name=%s max_members=%" PRIu32, u->name, m->cap);
            return;
        }
        e->inc = u->incarnation;
        e->state = u->state;
        switch (u->state) {
        case DS_MEMBER_ALIVE:
            e->join_round = u->effective_round;
            push_event(m, DS_MEV_MEMBER_JOINED, e, now);
            order_insert(m, e->id, 0);
            break;
        case DS_MEMBER_SUSPECT:
            /* A piggybacked suspicion does not say when the suspect joined.
             * Someone probed it, so it has been around: in our views from
             * before anything we know (0) until a refutation or a table
             * gives its join round. */
            e->join_round = table && u->effective_round != NO_ROUND ? u->effective_round : 0;
            start_suspicion(e, origin, now);
            push_event(m, DS_MEV_MEMBER_JOINED, e, now);
            push_event(m, DS_MEV_MEMBER_SUSPECTED, e, now);
            order_insert(m, e->id, 0);
            break;
        default:
            /* Gone, but in the views until its removal round. */
            e->join_round = 0;
            e->removal_round = u->effective_round;
            e->dead_since_ms = now;
            break;
        }
        if (!table)
            bcast(m, e, origin);
    } else {
        const int newer = u->incarnation > e->inc ||
                          (u->incarnation == e->inc && u->state > e->state);
        if (newer) {
            const uint8_t old = e->state;
            const int was_gone = is_gone(e);
            const uint32_t old_inc = e->inc;
            if (strcmp(u->name, e->name) && name_taken(m, u->name, u->id)) {
                DROP(m, DS_MSHIP_DROP_NAME_CONFLICT, "name=%s id=%016" PRIx64, u->name, u->id);
                return;
            }
            set_identity(e, u);
            e->inc = u->incarnation;
            switch (u->state) {
            case DS_MEMBER_ALIVE:
                /* A refutation keeps its join round (and cancels a removal
                 * that has not happened yet); a rejoin brings a new one
                 * after its removal. Either way the record says it all. */
                e->join_round = u->effective_round;
                e->removal_round = NO_ROUND;
                e->state = DS_MEMBER_ALIVE;
                clear_suspicion(e);
                if (was_gone) {
                    push_event(m, DS_MEV_MEMBER_JOINED, e, now);
                    order_insert(m, e->id, 0);
                } else if (old == DS_MEMBER_SUSPECT) {
                    push_event(m, DS_MEV_MEMBER_ALIVE, e, now);
                }
                if (!table && old != DS_MEMBER_ALIVE)
                    push_now(m, e); /* others may be timing it out too */
                break;
            case DS_MEMBER_SUSPECT:
                if (was_gone) {
                    e->removal_round = NO_ROUND;
                    e->join_round = table && u->effective_round != NO_ROUND ? u->effective_round
                                                                            : 0;
                    push_event(m, DS_MEV_MEMBER_JOINED, e, now);
                    order_insert(m, e->id, 0);
                } else if (table && u->effective_round != NO_ROUND) {
                    e->join_round = u->effective_round;
                }
                e->state = DS_MEMBER_SUSPECT;
                start_suspicion(e, origin, now);
                push_event(m, DS_MEV_MEMBER_SUSPECTED, e, now);
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
                clear_suspicion(e);
                e->dead_since_ms = now;
                ds_membership_event *ev = push_event(
                    m, u->state == DS_MEMBER_DEAD ? DS_MEV_MEMBER_DEAD : DS_MEV_MEMBER_LEFT, e, now);
                if (ev)
                    ev->round = e->removal_round;
                break;
            }
            }
            bcast(m, e, origin);
        } else if (u->incarnation == e->inc && u->state == e->state) {
            switch (u->state) {
            case DS_MEMBER_SUSPECT:
                if (!table && add_confirmation(e, origin))
                    bcast(m, e, origin);
                break;
            case DS_MEMBER_ALIVE:
                if (u->effective_round < e->join_round) {
                    e->join_round = u->effective_round;
                    bcast(m, e, 0);
                } else if (u->effective_round > e->join_round) {
                    correct(m, e);
                }
                break;
            default:
                if (u->effective_round < e->removal_round) {
                    e->removal_round = u->effective_round;
                    bcast(m, e, 0);
                } else if (u->effective_round > e->removal_round) {
                    correct(m, e);
                }
                break;
            }
        } else {
            correct(m, e); /* the sender is behind us */
        }
    }
    if (!table && m->joined && in_view(e, m->round) != was_in) {
        m->st.late_changes++;
        ds_log_rl(DS_LOG_INFO, COMP, "late change: member=%s state=%d round=%" PRIu64, e->name,
                  (int)e->state, m->round);
    }
}

/* Effective rounds a record may carry: at most lag + max_round_ahead past
 * what we know of the cluster's round. */
static int record_round_ok(ds_membership *m, const ds_wire_member *u, int table)
{
    const uint64_t bound = sat_add(eff_round(m), m->cfg.max_round_ahead);
    switch (u->state) {
    case DS_MEMBER_SUSPECT:
        return !table || u->effective_round == NO_ROUND || u->effective_round <= bound;
    default:
        return u->effective_round <= bound;
    }
}

static void apply_records(ds_membership *m, const ds_wire_member *recs, uint32_t n, int table,
                          uint64_t now)
{
    for (uint32_t i = 0; i < n; i++) {
        if (!record_round_ok(m, &recs[i], table)) {
            DROP(m, DS_MSHIP_DROP_BAD_ROUND, "member=%s state=%u round=%" PRIu64, recs[i].name,
                 recs[i].state, recs[i].effective_round);
            continue;
        }
        apply_record(m, &recs[i], table, now);
    }
}

/* ---- probing ------------------------------------------------------------------------- */

static void suspect_by_me(ds_membership *m, member *t, uint64_t now)
{
    if (t->state == DS_MEMBER_ALIVE) {
        t->state = DS_MEMBER_SUSPECT;
        start_suspicion(t, m->self_id, now);
        bcast(m, t, m->self_id);
        m->st.suspicions++;
        ds_debug(COMP, "suspect member=%s incarnation=%" PRIu32, t->name, t->inc);
        push_event(m, DS_MEV_MEMBER_SUSPECTED, t, now);
        if (m->cfg.lifeguard) /* buddy system: tell the suspect now */
            emit_probe(m, DS_MSG_PING, t->id, t->addr, ++m->seq, 0, t);
    } else if (t->state == DS_MEMBER_SUSPECT && add_confirmation(t, m->self_id)) {
        bcast(m, t, m->self_id);
    }
}

static void ping_dead(ds_membership *m, uint64_t now)
{
    uint32_t n = 0;
    for (uint32_t i = 1; i < m->cap; i++) {
        const member *e = &m->tab[i];
        if (e->used && e->state == DS_MEMBER_DEAD && now - e->dead_since_ms < m->cfg.dead_retain_ms)
            m->tmp[n++] = i;
    }
    if (!n)
        return;
    member *e = &m->tab[m->tmp[ds_rng_below(&m->rng, n)]];
    emit_probe(m, DS_MSG_PING, e->id, e->addr, ++m->seq, 0, e);
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
    emit_members(m, id, addr); /* emit_members reuses m->tmp */
}

static void start_probe(ds_membership *m, uint64_t now)
{
    const uint64_t mult = (uint64_t)m->lhm + 1;
    m->n_periods++;
    if (m->cfg.dead_ping_periods && m->n_periods % m->cfg.dead_ping_periods == 0)
        ping_dead(m, now);
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
    emit_probe(m, DS_MSG_PING, t->id, t->addr, p->seq, 0, first_for(m, t));
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
        emit_probe(m, DS_MSG_PING_REQ, v->id, v->addr, p->seq, t->id, NULL);
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
    lhm_add(m, p->n_via ? (int)(p->n_via - p->nacks) : 1);
    suspect_by_me(m, t, now);
}

static void probe_tick(ds_membership *m, uint64_t now)
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
}

static void declare_dead(ds_membership *m, member *e, uint64_t now)
{
    e->state = DS_MEMBER_DEAD;
    e->removal_round = eff_round(m);
    e->dead_since_ms = now;
    clear_suspicion(e);
    bcast(m, e, 0);
    m->st.deaths++;
    ds_info(COMP, "dead member=%s incarnation=%" PRIu32 " removal_round=%" PRIu64, e->name, e->inc,
            e->removal_round);
    ds_membership_event *ev = push_event(m, DS_MEV_MEMBER_DEAD, e, now);
    if (ev)
        ev->round = e->removal_round;
}

static void suspicion_tick(ds_membership *m, uint64_t now)
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

static void relay_tick(ds_membership *m, uint64_t now)
{
    for (uint32_t i = 0; i < MAX_RELAYS; i++) {
        struct relay *r = &m->relays[i];
        if (!r->used)
            continue;
        if (m->cfg.lifeguard && !r->nacked && now >= r->nack_at_ms) {
            r->nacked = 1;
            emit_probe(m, DS_MSG_NACK, r->req_id, r->req_addr, r->req_seq, r->target, NULL);
        }
        if (now >= r->expire_ms)
            r->used = 0;
    }
}

/* ---- joining ------------------------------------------------------------------------- */

static void send_join(ds_membership *m)
{
    const char *seed = m->seeds[m->seed_next++ % m->n_seeds];
    ds_wire_msg msg;
    fill_hdr(m, &msg.h, DS_MSG_JOIN, 0);
    memset(&msg.u, 0, sizeof(msg.u));
    record_of(self_m(m), &msg.u.join, 1);
    msg.u.join.state = DS_MEMBER_ALIVE;
    msg.u.join.effective_round = 0;
    m->st.joins_sent++;
    encode_queue(m, &msg, 0, seed);
}

static void join_tick(ds_membership *m, uint64_t now)
{
    if (!m->joining || m->joined || now < m->join_retry_ms)
        return;
    m->attempt++;
    const char *seed = m->seeds[m->seed_next % m->n_seeds];
    m->join_wait_ms = m->join_wait_ms * 2 < m->cfg.join_backoff_max_ms
                          ? m->join_wait_ms * 2
                          : m->cfg.join_backoff_max_ms;
    m->join_retry_ms = now + m->join_wait_ms;
    ds_membership_event *ev = push_event(m, DS_MEV_JOIN_RETRY, self_m(m), now);
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
    bcast(m, s, 0);
    order_rebuild(m);
    /* Start probing somewhere inside the first period, so nodes that joined
     * together do not probe in lockstep. */
    m->next_probe_ms = now + ds_rng_below(&m->rng, m->cfg.period_ms);
    member *seed = find(m, h->sender);
    ds_membership_event *ev = push_event(m, DS_MEV_SELF_JOINED, seed ? seed : s, now);
    if (ev) {
        ev->round = ms->round_now;
        ev->epoch = h->epoch;
        ev->view_size = ms->total;
        ev->join_round = s->join_round;
    }
    ds_info(COMP, "joined through %s: members=%" PRIu32 " round=%" PRIu64 " join_round=%" PRIu64,
            seed ? seed->name : "?", ms->total, ms->round_now, s->join_round);
}

/* ---- message handlers ------------------------------------------------------------------ */

static void on_ping(ds_membership *m, const ds_wire_msg *msg, const char *from_addr, uint64_t now)
{
    apply_records(m, msg->u.probe.updates, msg->h.count, 0, now);
    member *snd = find(m, msg->h.sender);
    const char *to = snd ? snd->addr : from_addr;
    if (!to) {
        DROP(m, DS_MSHIP_DROP_NO_ROUTE, "type=PING sender=%016" PRIx64, msg->h.sender);
        return;
    }
    emit_probe(m, DS_MSG_ACK, msg->h.sender, to, msg->u.probe.probe_seq, 0, first_for(m, snd));
}

static void on_ack(ds_membership *m, const ds_wire_msg *msg, uint64_t now)
{
    apply_records(m, msg->u.probe.updates, msg->h.count, 0, now);
    const uint64_t seq = msg->u.probe.probe_seq, from = msg->h.sender;
    struct probe *p = &m->pr;
    if (p->active && seq == p->seq) {
        int ok = from == p->target;
        for (uint32_t i = 0; i < p->n_via && !ok; i++)
            ok = p->via[i] == from;
        if (ok) {
            if (!p->acked) {
                p->acked = 1;
                lhm_add(m, -1);
            }
            return;
        }
    }
    for (uint32_t i = 0; i < MAX_RELAYS; i++) {
        struct relay *r = &m->relays[i];
        if (r->used && r->my_seq == seq && r->target == from) {
            emit_probe(m, DS_MSG_ACK, r->req_id, r->req_addr, r->req_seq, 0,
                       first_for(m, find(m, r->req_id)));
            r->used = 0;
            return;
        }
    }
    m->st.acks_unmatched++;
}

static void on_ping_req(ds_membership *m, const ds_wire_msg *msg, const char *from_addr,
                        uint64_t now)
{
    apply_records(m, msg->u.probe.updates, msg->h.count, 0, now);
    member *snd = find(m, msg->h.sender);
    const char *req_addr = snd ? snd->addr : from_addr;
    if (!req_addr) {
        DROP(m, DS_MSHIP_DROP_NO_ROUTE, "type=PING_REQ sender=%016" PRIx64, msg->h.sender);
        return;
    }
    const uint64_t target = msg->u.probe.target, seq = msg->u.probe.probe_seq;
    if (target == m->self_id) {
        emit_probe(m, DS_MSG_ACK, msg->h.sender, req_addr, seq, 0, first_for(m, snd));
        return;
    }
    member *t = find(m, target);
    if (!t || !is_live(t)) {
        if (m->cfg.lifeguard) /* we cannot reach it, but we are here */
            emit_probe(m, DS_MSG_NACK, msg->h.sender, req_addr, seq, target, NULL);
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
    emit_probe(m, DS_MSG_PING, t->id, t->addr, r->my_seq, 0, first_for(m, t));
}

static void on_nack(ds_membership *m, const ds_wire_msg *msg)
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

static void on_join(ds_membership *m, const ds_wire_msg *msg, uint64_t now)
{
    const ds_wire_member *u = &msg->u.join;
    if (!m->joined || m->leaving) {
        DROP(m, DS_MSHIP_DROP_NOT_JOINED, "joiner=%s", u->name);
        return;
    }
    if (u->id != msg->h.sender) {
        DROP(m, DS_MSHIP_DROP_FORGED, "joiner=%s record_id=%016" PRIx64 " sender=%016" PRIx64,
             u->name, u->id, msg->h.sender);
        return;
    }
    if (u->state != DS_MEMBER_ALIVE) {
        DROP(m, DS_MSHIP_DROP_BAD_STATE, "joiner=%s state=%u", u->name, u->state);
        return;
    }
    member *e = find(m, u->id);
    if (!e || is_gone(e) || strcmp(e->name, u->name)) {
        if (name_taken(m, u->name, u->id)) {
            DROP(m, DS_MSHIP_DROP_NAME_CONFLICT, "joiner=%s", u->name);
            return;
        }
    }
    if (!e) {
        e = new_member(m, u, now);
        if (!e) {
            DROP(m, DS_MSHIP_DROP_TABLE_FULL, "joiner=%s max_members=%" PRIu32, u->name, m->cap);
            return;
        }
        e->inc = u->incarnation;
        e->state = DS_MEMBER_ALIVE;
        e->join_round = eff_round(m);
        order_insert(m, e->id, 0);
        bcast(m, e, 0);
        push_event(m, DS_MEV_MEMBER_JOINED, e, now);
        ds_info(COMP, "join member=%s addr=%s join_round=%" PRIu64, e->name, e->addr,
                e->join_round);
    } else if (is_gone(e)) {
        /* Back before its removal took effect: cancel the removal, keep the
         * join round. After it: a new join round, after the removal. */
        const uint64_t removal = e->removal_round;
        set_identity(e, u);
        e->inc = u->incarnation > e->inc ? u->incarnation : e->inc + 1;
        e->state = DS_MEMBER_ALIVE;
        e->removal_round = NO_ROUND;
        if (removal <= decide_round(m) || e->join_round == NO_ROUND) {
            uint64_t j = eff_round(m);
            e->join_round = j <= removal ? removal + 1 : j;
        }
        clear_suspicion(e);
        order_insert(m, e->id, 0);
        bcast(m, e, 0);
        push_event(m, DS_MEV_MEMBER_JOINED, e, now);
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
        set_identity(e, u);
        if (e->state == DS_MEMBER_SUSPECT) {
            e->state = DS_MEMBER_ALIVE;
            clear_suspicion(e);
            push_event(m, DS_MEV_MEMBER_ALIVE, e, now);
        }
        if (e->inc != old_inc)
            bcast(m, e, 0);
    }
    emit_members(m, e->id, e->addr);
}

static void on_members(ds_membership *m, const ds_wire_msg *msg, uint64_t now)
{
    const ds_wire_members *ms = &msg->u.members;
    for (uint32_t i = 0; i < msg->h.count; i++) {
        if (!record_round_ok(m, &ms->members[i], 1)) {
            DROP(m, DS_MSHIP_DROP_BAD_ROUND, "member=%s round=%" PRIu64, ms->members[i].name,
                 ms->members[i].effective_round);
            continue;
        }
        apply_record(m, &ms->members[i], 1, now);
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
            emit_members(m, id, addr);
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

static void on_leave(ds_membership *m, const ds_wire_msg *msg, uint64_t now)
{
    member *snd = find(m, msg->h.sender);
    if (!snd) {
        DROP(m, DS_MSHIP_DROP_UNKNOWN_SENDER, "type=LEAVE sender=%016" PRIx64, msg->h.sender);
        return;
    }
    ds_wire_member u;
    record_of(snd, &u, 1);
    u.state = DS_MEMBER_LEFT;
    u.incarnation = msg->u.leave.incarnation;
    u.effective_round = msg->u.leave.effective_round;
    if (!record_round_ok(m, &u, 0)) {
        DROP(m, DS_MSHIP_DROP_BAD_ROUND, "type=LEAVE member=%s round=%" PRIu64, u.name,
             u.effective_round);
        return;
    }
    apply_record(m, &u, 0, now);
}

/* Track the cluster's round from members' headers, bounded so that one
 * confused member cannot push every decision into the far future. */
static void note_round(ds_membership *m, const ds_wire_msg *msg)
{
    const member *snd = find(m, msg->h.sender);
    if (msg->h.type == DS_MSG_MEMBERS && m->joining && !m->joined) {
        m->seen_round = max64(m->seen_round, msg->u.members.round_now);
        return;
    }
    if (!snd || !is_live(snd))
        return;
    const uint64_t cap = sat_add(decide_round(m), m->cfg.max_round_ahead);
    m->seen_round = max64(m->seen_round, msg->h.round < cap ? msg->h.round : cap);
}

/* ---- view tracking -------------------------------------------------------------------- */

static void view_summary(ds_membership *m, uint64_t r, uint32_t *G, uint64_t *fp, int *in)
{
    uint32_t g = 0;
    uint64_t f = 0;
    for (uint32_t i = 0; i < m->cap; i++) {
        const member *e = &m->tab[i];
        if (e->used && in_view(e, r)) {
            g++;
            uint64_t z = e->id;
            f += ds_splitmix64_step(&z);
        }
    }
    *G = g;
    *fp = f;
    *in = in_view(self_m(m), r);
}

static void check_view(ds_membership *m, uint64_t now)
{
    if (!m->joined)
        return;
    uint32_t G;
    uint64_t fp;
    int in;
    view_summary(m, m->round, &G, &fp, &in);
    const uint64_t epoch = epoch_at(m, m->round);
    if (m->view_known && G == m->view_G && fp == m->view_fp && in == m->view_in &&
        epoch == m->view_epoch)
        return;
    m->view_known = 1;
    m->view_G = G;
    m->view_fp = fp;
    m->view_in = in;
    m->view_epoch = epoch;
    ds_membership_event *ev = push_event(m, DS_MEV_VIEW_CHANGED, self_m(m), now);
    if (ev) {
        ev->epoch = epoch;
        ev->view_size = G;
        ev->in_view = in;
    }
}

/* ---- public API ------------------------------------------------------------------------ */

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
    ds_membership_event *ev = push_event(m, DS_MEV_SELF_JOINED, s, now_ms);
    if (ev) {
        ev->view_size = 1;
        ev->epoch = epoch_at(m, m->round);
    }
    check_view(m, now_ms);
out:
    unlock_and_flush(m);
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
    m->attempt = 1;
    m->join_wait_ms = m->cfg.join_timeout_ms;
    m->join_retry_ms = now_ms + m->join_wait_ms;
    send_join(m);
out:
    unlock_and_flush(m);
    return rc;
}

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
        bcast(m, s, 0);
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
            fill_hdr(m, &msg.h, DS_MSG_LEAVE, m->tab[t].id);
            memset(&msg.u, 0, sizeof(msg.u));
            msg.u.leave.effective_round = s->removal_round;
            msg.u.leave.incarnation = s->inc;
            m->st.leaves_sent++;
            encode_queue(m, &msg, m->tab[t].id, m->tab[t].addr);
        }
        ds_info(COMP, "leave announced: removal_round=%" PRIu64, s->removal_round);
        check_view(m, now_ms);
    }
    if (eff)
        *eff = s->removal_round;
out:
    unlock_and_flush(m);
    return rc;
}

int ds_membership_leave_done(ds_membership *m)
{
    pthread_mutex_lock(&m->mu);
    int done = m->leaving && m->round >= self_m(m)->removal_round;
    pthread_mutex_unlock(&m->mu);
    return done;
}

void ds_membership_set_round(ds_membership *m, uint64_t round, uint64_t now_ms)
{
    pthread_mutex_lock(&m->mu);
    m->round = round;
    check_view(m, now_ms);
    unlock_and_flush(m);
}

int ds_membership_tick(ds_membership *m, uint64_t now)
{
    pthread_mutex_lock(&m->mu);
    join_tick(m, now);
    if (m->joined) {
        probe_tick(m, now);
        relay_tick(m, now);
        suspicion_tick(m, now);
        purge(m, now, 0);
    }
    check_view(m, now);
    unlock_and_flush(m);
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
    if (m->joining && !m->joined)
        AT(m->join_retry_ms);
    if (m->joined) {
        const struct probe *p = &m->pr;
        if (p->active) {
            if (!p->acked && !p->indirect_sent)
                AT(p->ack_deadline_ms);
            AT(p->end_ms);
        } else {
            AT(m->next_probe_ms);
        }
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
    note_round(m, &msg);
    switch (h->type) {
    case DS_MSG_PING: on_ping(m, &msg, from_addr, now); break;
    case DS_MSG_ACK: on_ack(m, &msg, now); break;
    case DS_MSG_PING_REQ: on_ping_req(m, &msg, from_addr, now); break;
    case DS_MSG_NACK: on_nack(m, &msg); break;
    case DS_MSG_JOIN: on_join(m, &msg, now); break;
    case DS_MSG_MEMBERS: on_members(m, &msg, now); break;
    case DS_MSG_LEAVE: on_leave(m, &msg, now); break;
    default: break;
    }
out:
    check_view(m, now);
    unlock_and_flush(m);
    return rc;
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

void ds_membership_hint(ds_membership *m, uint64_t id, uint64_t now)
{
    pthread_mutex_lock(&m->mu);
    member *e = find(m, id);
    if (m->joined && !m->leaving && e && e != self_m(m) && is_live(e) &&
        !(m->pr.active && m->pr.target == id)) {
        order_insert(m, id, 1);
        /* Cut the idle rest of the period short, at most once a period, and
         * never while a probe is still waiting for its answer. */
        if ((!m->pr.active || m->pr.acked) && now - m->last_early_ms >= m->cfg.period_ms &&
            m->next_probe_ms > now) {
            m->pr.active = 0;
            m->next_probe_ms = now;
            m->last_early_ms = now;
            probe_tick(m, now);
        }
    }
    unlock_and_flush(m);
}

static int member_cmp(const member *a, const member *b)
{
    int c = strcmp(a->name, b->name);
    if (c)
        return c;
    return a->id < b->id ? -1 : a->id > b->id;
}

/* Insertion sort of slot indices by (name, id): views are small and this
 * needs no global context for qsort. */
static void sort_slots(ds_membership *m, uint32_t *v, uint32_t n)
{
    for (uint32_t i = 1; i < n; i++) {
        uint32_t x = v[i], j = i;
        while (j > 0 && member_cmp(&m->tab[v[j - 1]], &m->tab[x]) > 0) {
            v[j] = v[j - 1];
            j--;
        }
        v[j] = x;
    }
}

int ds_membership_view_at(ds_membership *m, uint64_t round, ds_member_info *out, uint32_t cap,
                          uint32_t *G, uint32_t *me, uint64_t *epoch)
{
    pthread_mutex_lock(&m->mu);
    uint32_t g = 0;
    for (uint32_t i = 0; i < m->cap; i++)
        if (m->tab[i].used && in_view(&m->tab[i], round))
            m->tmp[g++] = i;
    sort_slots(m, m->tmp, g);
    uint32_t mine = DS_MEMBERSHIP_NOT_IN_VIEW;
    for (uint32_t i = 0; i < g; i++) {
        if (m->tmp[i] == 0)
            mine = i;
        if (out && i < cap)
            info_of(&m->tab[m->tmp[i]], &out[i]);
    }
    if (G)
        *G = g;
    if (me)
        *me = mine;
    if (epoch)
        *epoch = epoch_at(m, round);
    pthread_mutex_unlock(&m->mu);
    return out && cap < g ? -ENOSPC : 0;
}

int ds_membership_members(ds_membership *m, ds_member_info *out, uint32_t cap, uint32_t *n)
{
    pthread_mutex_lock(&m->mu);
    uint32_t k = 0;
    for (uint32_t i = 0; i < m->cap; i++) {
        if (!m->tab[i].used)
            continue;
        if (out && k < cap)
            info_of(&m->tab[i], &out[k]);
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
        info_of(e, out);
    pthread_mutex_unlock(&m->mu);
    return e ? 0 : -ENOENT;
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
    st->epoch = epoch_at(m, m->round);
    pthread_mutex_unlock(&m->mu);
}
