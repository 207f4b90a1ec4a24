/*
 * node/membership/internal.h: the state of a membership instance and what
 * the files of node/membership share. Not part of the API: include it only
 * from the .c files of node/membership.
 *
 * The module is split by concern, all files working on one struct
 * ds_membership under its mutex:
 *
 *   membership.c  the API's frame: create/destroy, tick, recv and its
 *                 dispatch, next deadline, stats; the output queues that
 *                 hold frames and events until the mutex is released
 *   table.c       the member table and its updates: records in and out,
 *                 the merge rules (ds_mship_apply_record), dissemination
 *                 by piggyback, refutation of suspicions about ourselves
 *   probe.c       SWIM probes, indirect probes and the relays that run
 *                 them, suspicion timers, Lifeguard's local health
 *   join.c        joining through a seed, admitting joiners, leaving
 *   view.c        effective rounds, the epoch, the view for a round
 *
 * Locking: every function declared here expects m->mu held by its caller
 * (the public entry points take it); none of them calls io.send or
 * io.event: frames and events are queued (ds_mship_encode_queue,
 * ds_mship_push_event) and delivered by ds_mship_unlock_and_flush.
 */
#ifndef DS_NODE_MEMBERSHIP_INTERNAL_H
#define DS_NODE_MEMBERSHIP_INTERNAL_H

#include <pthread.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "base/log.h"
#include "base/rng.h"
#include "node/membership/membership.h"

#define COMP "membership"
#define NO_ROUND DS_MEMBERSHIP_NO_ROUND
#define LEAVE_DIRECT 32 /* members told of our leave directly, at most */
#define MAX_RECORDS DS_MEMBERSHIP_MAX_RECORDS
#define MAX_INDIRECT 8u
#define MAX_CONFIRM 16u
#define MAX_RELAYS 64u
#define MAX_REFUTE_TO 8u
#define MAX_FINISHING 16u /* seeds remembered as "cluster finishing" */
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
    /* When a frame from this member itself last reached us (0: never):
     * direct evidence that it is alive, which a DEAD verdict from a third
     * member does not override (table.c, doubt_death). */
    uint64_t heard_ms;
    /* Dissemination: one queued update per member, the member's current
     * record; a newer update replaces it and restarts its count. */
    int bcast;
    uint32_t bcast_sent;
    uint64_t bcast_order;
    uint64_t bcast_origin; /* carried in a SUSPECT record */
    uint64_t picked;       /* ds_mship_collect_updates() generation */
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
    uint64_t next_dead_ping_ms; /* own timer: not stretched by local health */
    uint32_t dead_cursor;       /* tab slot of the dead member pinged last */
    uint32_t lhm;
    uint64_t *order;
    uint32_t order_n, order_pos;
    struct relay relays[MAX_RELAYS];
    uint64_t seq;

    char (*seeds)[ADDR_SZ];
    size_t n_seeds, seed_next;
    uint32_t attempt;
    uint64_t join_retry_ms, join_wait_ms, join_start_ms;
    uint64_t finishing[MAX_FINISHING]; /* seeds that answered "finishing" */
    uint32_t n_finishing;
    uint64_t js_sender, js_round;
    uint32_t js_total, js_have;
    uint8_t *js_bits;

    /* Paused (SIGSTOP, a stall) past the suspicion timeout: rejoin with a
     * new join round on the next frame from a member, once its header has
     * told us the cluster's round (membership.c, ds_mship_rejoin). */
    int rejoin_pending;
    uint64_t paused_ms;

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

/* Text of a drop reason (membership.c, beside the names). */
const char *ds_mship_drop_text(enum ds_mship_drop r);

/* Count and log (rate-limited per call site: peers drive this path). */
#define DROP(m, reason, fmt, ...) \
    do { \
        enum ds_mship_drop dr_ = (reason); \
        (m)->st.drops[dr_]++; \
        /* A JOIN that reaches a node still founding or joining is the \
         * expected start-up race (the joiner retries): info, not warn. */ \
        ds_log_rl(dr_ == DS_MSHIP_DROP_NOT_JOINED ? DS_LOG_INFO : DS_LOG_WARN, COMP, \
                  "drop reason=%s (%s) " fmt, ds_mship_drop_name(dr_), \
                  ds_mship_drop_text(dr_), ##__VA_ARGS__); \
    } while (0)

/* ---- small helpers (the caller holds m->mu) --------------------------------------- */

static inline uint64_t max64(uint64_t a, uint64_t b)
{
    return a > b ? a : b;
}

static inline uint64_t sat_add(uint64_t a, uint64_t b)
{
    return a > UINT64_MAX - b ? UINT64_MAX : a + b;
}

static inline member *self_m(ds_membership *m)
{
    return &m->tab[0];
}

static inline int is_live(const member *e)
{
    return e->state == DS_MEMBER_ALIVE || e->state == DS_MEMBER_SUSPECT;
}

static inline int is_gone(const member *e)
{
    return e->state == DS_MEMBER_DEAD || e->state == DS_MEMBER_LEFT;
}

static inline member *find(ds_membership *m, uint64_t id)
{
    for (uint32_t i = 0; i < m->cap; i++)
        if (m->tab[i].used && m->tab[i].id == id)
            return &m->tab[i];
    return NULL;
}

static inline uint32_t n_live(ds_membership *m)
{
    uint32_t n = 0;
    for (uint32_t i = 0; i < m->cap; i++)
        n += m->tab[i].used && is_live(&m->tab[i]);
    return n;
}

/* The round a change decided now is measured from: ours, or the highest
 * heard from the members when we are behind (a node just resumed from a
 * pause must not schedule changes in the cluster's past). */
static inline uint64_t decide_round(ds_membership *m)
{
    return max64(m->round, m->seen_round);
}

static inline uint64_t eff_round(ds_membership *m)
{
    return sat_add(decide_round(m), m->cfg.lag_rounds);
}

static inline int printable_str(const char *s, size_t max, int allow_empty)
{
    size_t n = strnlen(s, max + 1);
    if (n > max || (n == 0 && !allow_empty))
        return 0;
    for (size_t i = 0; i < n; i++)
        if ((unsigned char)s[i] < 0x21 || (unsigned char)s[i] > 0x7e)
            return 0;
    return 1;
}

/* In the view at round r: joined at or before r, not removed by r. */
static inline int in_view(const member *e, uint64_t r)
{
    return e->join_round != NO_ROUND && e->join_round <= r &&
           (e->removal_round == NO_ROUND || r < e->removal_round);
}

/* ---- membership.c: output queues --------------------------------------------------- */

/* Queue an event about e (may be NULL) for delivery after unlock; the
 * caller may fill more fields in the returned event (NULL: out of memory,
 * logged, the event is lost). */
ds_membership_event *ds_mship_push_event(ds_membership *m, enum ds_membership_event_kind kind,
                                         const member *e, uint64_t now);
/* A header from this node to to_id, at our round and its epoch. */
void ds_mship_fill_hdr(ds_membership *m, ds_wire_hdr *h, uint8_t type, uint64_t to_id);
/* Encode msg and queue the frame for io.send after unlock (lost, and
 * logged, if it cannot be encoded). */
void ds_mship_encode_queue(ds_membership *m, ds_wire_msg *msg, uint64_t to_id,
                           const char *to_addr);
/* Release m->mu, then deliver the queued frames and events, in order. */
void ds_mship_unlock_and_flush(ds_membership *m);

/* ---- table.c: the member table and its updates ------------------------------------- */

void ds_mship_info_of(const member *e, ds_member_info *o);
/* The wire record of e. table = 1: MEMBERS meaning (effective_round is the
 * join round of a live member, the removal round of a gone one); table = 0:
 * update meaning (a SUSPECT record carries its suspecter's id instead). */
void ds_mship_record_of(const member *e, ds_wire_member *r, int table);
/* Queue e's current record for piggybacking (restarting its count). */
void ds_mship_bcast(ds_membership *m, member *e, uint64_t origin);
/* Fill m->tx with the updates for one message; returns their count. */
uint32_t ds_mship_collect_updates(ds_membership *m, member *first, int with_self);
/* Our whole table to one member, in MEMBERS slices. */
void ds_mship_emit_members(ds_membership *m, uint64_t to_id, const char *to_addr);
/* e's record, led with by a PING to every other live member now (a join
 * brought forward: its short lag leaves no time for the piggyback). */
void ds_mship_push_all(ds_membership *m, member *e);
void ds_mship_clear_suspicion(member *e);
void ds_mship_start_suspicion(member *e, uint64_t origin, uint64_t now);
/* 1 when origin is a new independent suspecter of e. */
int ds_mship_add_confirmation(member *e, uint64_t origin);
/* Forget gone members past their retention (force: the oldest, for room);
 * 1 when a slot was freed. */
int ds_mship_purge(ds_membership *m, uint64_t now, int force);
/* 1 when another live member (or we) already uses this name. */
int ds_mship_name_taken(ds_membership *m, const char *name, uint64_t id);
void ds_mship_set_identity(member *e, const ds_wire_member *u);
/* A new slot with u's identity, in no view yet; NULL when the table is full. */
member *ds_mship_new_member(ds_membership *m, const ds_wire_member *u, uint64_t now);
/* Merge one record (table: it came in MEMBERS) into the table. */
void ds_mship_apply_record(ds_membership *m, const ds_wire_member *u, int table, uint64_t now);
/* 1 when the record's effective round is within what we accept. */
int ds_mship_record_round_ok(ds_membership *m, const ds_wire_member *u, int table);
/* Back into the cluster with incarnation over_inc + 1 and a new join round
 * after `after` (a removal round; 0: none known), as a fresh joiner:
 * SELF_REJOINED tells the owner to fetch the state and shadow until then. */
void ds_mship_rejoin(ds_membership *m, uint32_t over_inc, uint64_t after, uint64_t now,
                     const char *why);
/* Merge piggybacked records, dropping those with rounds out of range. */
void ds_mship_apply_records(ds_membership *m, const ds_wire_member *recs, uint32_t n, int table,
                            uint64_t now);

/* ---- probe.c: probes, suspicion, local health -------------------------------------- */

/* PING, ACK, PING_REQ or NACK with piggybacked updates, `first` leading. */
void ds_mship_emit_probe(ds_membership *m, uint8_t type, uint64_t to_id, const char *to_addr,
                         uint64_t seq, uint64_t target, member *first);
/* The record a message to e should lead with, if any: its own bad news. */
member *ds_mship_first_for(ds_membership *m, member *e);
void ds_mship_order_rebuild(ds_membership *m);
void ds_mship_order_insert(ds_membership *m, uint64_t id, int front);
void ds_mship_lhm_add(ds_membership *m, int delta);
void ds_mship_probe_tick(ds_membership *m, uint64_t now);
void ds_mship_suspicion_tick(ds_membership *m, uint64_t now);
void ds_mship_relay_tick(ds_membership *m, uint64_t now);
void ds_mship_on_ping(ds_membership *m, const ds_wire_msg *msg, const char *from_addr,
                      uint64_t now);
void ds_mship_on_ack(ds_membership *m, const ds_wire_msg *msg, uint64_t now);
void ds_mship_on_ping_req(ds_membership *m, const ds_wire_msg *msg, const char *from_addr,
                          uint64_t now);
void ds_mship_on_nack(ds_membership *m, const ds_wire_msg *msg);

/* ---- join.c: joining, admitting, leaving -------------------------------------------- */

void ds_mship_join_tick(ds_membership *m, uint64_t now);
void ds_mship_on_join(ds_membership *m, const ds_wire_msg *msg, uint64_t now);
void ds_mship_on_members(ds_membership *m, const ds_wire_msg *msg, uint64_t now);
void ds_mship_on_leave(ds_membership *m, const ds_wire_msg *msg, const char *from_addr,
                       uint64_t now);
/* When the join gives up (join_give_up_ms), or UINT64_MAX. */
uint64_t ds_mship_join_deadline(const ds_membership *m);

/* ---- view.c: rounds, epochs, views --------------------------------------------------- */

/* Fold a purged member's change round into the epoch floor. */
void ds_mship_fold_change(ds_membership *m, uint64_t c);
/* The view epoch at round r. */
uint64_t ds_mship_epoch_at(ds_membership *m, uint64_t r);
/* Track the cluster's round from a received header (bounded). */
void ds_mship_note_round(ds_membership *m, const ds_wire_msg *msg);
/* Emit VIEW_CHANGED when the view at our round differs from the last one. */
void ds_mship_check_view(ds_membership *m, uint64_t now);

#endif
