/*
 * node/membership/membership.h: who is in the cluster, and who is in the gossip view at
 * round r (design §6). SWIM failure detection and dissemination with
 * Lifeguard's refinements, as a pure state machine behind two seams.
 *
 * The protocol never blocks, sleeps, or starts a thread. The owner drives it:
 *
 *   - messages out: the protocol encodes complete wire frames (node/wire/wire.h:
 *     PING, ACK, PING_REQ, NACK, JOIN, MEMBERS, LEAVE; header filled, seq and
 *     protection bits zero, no tag) and hands each to io.send(to_id, to_addr,
 *     frame, len). The owner seals and transmits it (or, in tests, a fake
 *     network delays or drops it). Sends are fire-and-forget: loss is normal.
 *   - messages in: the owner calls ds_membership_recv() with each opened
 *     plaintext frame of those types (after ds_session_open, so the header's
 *     sender is authenticated), and the transport address it came from.
 *   - time: every call takes now_ms (any monotonic millisecond clock, the
 *     same one for all calls). ds_membership_tick(now) runs the timers;
 *     ds_membership_next_deadline() says when the next one is due.
 *   - rounds: ds_membership_set_round() tells the protocol which gossip round
 *     this node is at. Views are asked per round with ds_membership_view_at().
 *
 * Threading: every public function takes an internal mutex, so calls may
 * come from several threads (the failure-detector thread calls tick and
 * recv; the training thread calls set_round and view_at). io.send and
 * io.event are called after the mutex is released, on the calling thread,
 * and may call back into this module; they must not block for long.
 *
 * Views. A member enters the view at its join round and leaves it at its
 * removal round; both are "effective rounds" chosen once, by the node that
 * decides the change (the seed for a join, the leaver for a leave, the first
 * node whose suspicion timer expires for a death), as its round + lag, and
 * carried in the update so every node applies it at the same round. The
 * view at round r is the list of members whose join round <= r and whose
 * removal round (if any) > r, sorted by (name, id). The view epoch at round
 * r is the largest effective round <= r among all known changes: it grows
 * with every change set and is the same on every node that knows the same
 * changes, however late it learned them. docs/membership.md has the rules
 * for concurrent and late changes.
 *
 * Run the tests: meson test -C build membership; bench: dsbench elastic --fake.
 */
#ifndef DS_NODE_MEMBERSHIP_H
#define DS_NODE_MEMBERSHIP_H

#include <stddef.h>
#include <stdint.h>

#include "base/metric.h"
#include "node/wire/wire.h"

typedef struct ds_membership ds_membership;

/* Most member records this module decodes in one message (piggybacked
 * updates or a MEMBERS slice); a frame with more is dropped. */
#define DS_MEMBERSHIP_MAX_RECORDS 64u
/* "No round": a member not (yet) in any view, or never removed. */
#define DS_MEMBERSHIP_NO_ROUND UINT64_MAX
/* view_at's `me` when this node is not in the view at that round. */
#define DS_MEMBERSHIP_NOT_IN_VIEW UINT32_MAX

typedef struct ds_membership_cfg {
    uint64_t cluster_id; /* ds_wire_cluster_id(cluster name); frames from
                          * other clusters are dropped */
    const char *name;    /* this node: [node] name (copied) */
    const char *addr;    /* "host:port" peers reach it at (copied) */
    const char *group;   /* [node] group, "" or NULL = a group of one */
    uint8_t pk[32];      /* Ed25519 identity public key; id = ds_wire_node_id(pk) */
    uint64_t seed;       /* RNG seed: probe order, indirect probers */

    uint32_t max_members;      /* table bound, self included; 1024 */
    uint32_t period_ms;        /* SWIM protocol period T; 1000 */
    uint32_t probe_timeout_ms; /* wait for a direct ACK, < period; 300 */
    uint32_t indirect_k;       /* PING_REQ fan-out (<= 8); 3 */
    int lifeguard;             /* 1: LHM, dynamic suspicion, NACKs, buddy; 1 */
    uint32_t lhm_max;          /* local health multiplier cap; 8 */
    double suspicion_alpha;    /* min timeout = alpha * max(1, log10 n) * T; 5 */
    double suspicion_beta;     /* max timeout = beta * min (lifeguard); 6 */
    uint32_t suspicion_k;      /* confirmations that bring max down to min; 3 */
    uint32_t retransmit_mult;  /* each update is piggybacked
                                * mult * ceil(log2(n + 1)) times; 3 */
    uint32_t max_piggyback;    /* updates per message (<= 64); 8 */
    uint32_t members_per_msg;  /* records per MEMBERS slice (<= 64); 32 */
    uint32_t lag_rounds;       /* effective round = decider's round + lag; 32 */
    uint64_t max_round_ahead;  /* rounds in headers/records beyond ours + lag
                                * + this are refused; 1 << 20 */
    uint32_t join_timeout_ms;  /* first JOIN retry; doubles per attempt; 3000 */
    uint32_t join_backoff_max_ms; /* retry interval cap; 30000 */
    uint64_t join_give_up_ms;  /* no seed has let us in this long after
                                * ds_membership_join: give up (JOIN_FAILED);
                                * 0: retry forever; 0 */
    uint32_t dead_retain_ms;   /* DEAD/LEFT entries are kept (and the dead are
                                * pinged now and then, so a healed partition
                                * finds itself) this long; 300000 */
    uint32_t dead_ping_periods; /* ping one dead member (round-robin) every
                                 * this many periods of period_ms, not
                                 * stretched by local health; 4 (0: never) */
    uint32_t sync_periods;     /* push the whole table (MEMBERS) to one random
                                * member every this many periods; 16 (0: never) */
    int refute_push;           /* 1: a lifted suspicion or death is pushed at
                                * once to indirect_k members by every node
                                * that held it (not only piggybacked); 1 */
} ds_membership_cfg;

/* Defaults above; identity fields zero/NULL (the caller sets them). */
void ds_membership_cfg_default(ds_membership_cfg *cfg);

/* A snapshot of one member (no pointers: safe to keep). */
typedef struct ds_member_info {
    uint64_t id; /* ds_wire_node_id(pk) */
    uint8_t pk[32];
    char name[DS_WIRE_NAME_MAX + 1];
    char addr[DS_WIRE_ADDR_MAX + 1];
    char group[DS_WIRE_GROUP_MAX + 1];
    uint32_t incarnation;
    enum ds_member_state state;
    uint64_t join_round;    /* in views from this round; NO_ROUND: not known */
    uint64_t removal_round; /* DEAD/LEFT: out of views from this round */
} ds_member_info;

enum ds_membership_event_kind {
    /* A member appeared alive (new, or back after DEAD/LEFT). round: its
     * join round (may be NO_ROUND when only a suspicion told us of it). */
    DS_MEV_MEMBER_JOINED = 1,
    DS_MEV_MEMBER_SUSPECTED = 2,
    /* A suspicion was refuted (member.incarnation is the new one). */
    DS_MEV_MEMBER_ALIVE = 3,
    /* round: the removal round. */
    DS_MEV_MEMBER_DEAD = 4,
    DS_MEV_MEMBER_LEFT = 5,
    /* The view at this node's current round changed. round, epoch,
     * view_size, in_view (this node is in it). */
    DS_MEV_VIEW_CHANGED = 6,
    /* This node's join completed: the whole table arrived from a seed.
     * member: the seed; round: the seed's round when it answered; epoch: its
     * epoch then; view_size: members in the table; join_round: ours. The
     * owner now fetches the model state (ds_membership_members lists who). */
    DS_MEV_SELF_JOINED = 7,
    /* No answer from a seed: trying member.addr next (attempt = n, n >= 2),
     * at retry_at_ms. The owner logs it ("no reachable seed, retrying"). */
    DS_MEV_JOIN_RETRY = 8,
    /* This node was suspected and refuted with a new incarnation. */
    DS_MEV_SELF_REFUTED = 9,
    /* This node was declared dead (or left) by others while alive: it is out
     * of the view from round `round` and back in from join_round. */
    DS_MEV_SELF_REJOINED = 10,
    /* A seed answered our JOIN with "cluster finishing": it is leaving
     * (member.addr: where the answer came from; finishing: distinct seeds
     * that said so, of n_seeds). */
    DS_MEV_JOIN_FINISHING = 11,
    /* The join was given up: every seed said the cluster is finishing
     * (finishing == n_seeds), or join_give_up_ms passed without a seed
     * letting us in (attempt: JOINs sent). The node is in no cluster. */
    DS_MEV_JOIN_FAILED = 12,
};

typedef struct ds_membership_event {
    enum ds_membership_event_kind kind;
    uint64_t now_ms;
    ds_member_info member; /* the subject (self for VIEW_CHANGED, SELF_*) */
    uint64_t round;
    uint64_t epoch;
    uint64_t join_round;
    uint32_t view_size;
    int in_view;
    uint32_t attempt;
    uint64_t retry_at_ms;
    uint32_t finishing, n_seeds; /* JOIN_FINISHING, JOIN_FAILED */
} ds_membership_event;

typedef struct ds_membership_io {
    void *ctx;
    /* Transmit one frame (borrowed for the call; copy it). to_id is the
     * receiver's node id, or 0 for a seed known only by address (JOIN; the
     * frame's receiver field is then 0 too). to_addr is "host:port". */
    void (*send)(void *ctx, uint64_t to_id, const char *to_addr, const uint8_t *frame,
                 size_t len);
    /* One event (borrowed for the call). May be NULL. */
    void (*event)(void *ctx, const ds_membership_event *ev);
} ds_membership_io;

/* Why a received frame (or one record in it) was refused. */
#define DS_MSHIP_DROP_LIST(X) \
    X(MALFORMED, "malformed", "the wire decoder refused the frame") \
    X(WRONG_CLUSTER, "wrong_cluster", "frame from another cluster") \
    X(WRONG_RECEIVER, "wrong_receiver", "frame addressed to another node") \
    X(FROM_SELF, "from_self", "frame claims to come from this node") \
    X(NOT_MEMBERSHIP, "not_membership", "not a membership message type") \
    X(FORGED, "forged", "JOIN record key does not match the sender") \
    X(BAD_ROUND, "bad_round", "effective round out of range") \
    X(BAD_STATE, "bad_state", "record state not valid for this message") \
    X(NAME_CONFLICT, "name_conflict", "name taken by another live member") \
    X(TABLE_FULL, "table_full", "member table full") \
    X(NO_ROUTE, "no_route", "cannot answer: sender unknown and no address") \
    X(NOT_JOINED, "not_joined", "JOIN to a node not in a cluster yet") \
    X(UNKNOWN_SENDER, "unknown_sender", "LEAVE or NACK from a non-member") \
    X(RELAYS_FULL, "relays_full", "too many indirect probes in progress")

enum ds_mship_drop {
#define DS_MSHIP_DROP_ENUM_(e, name, text) DS_MSHIP_DROP_##e,
    DS_MSHIP_DROP_LIST(DS_MSHIP_DROP_ENUM_)
#undef DS_MSHIP_DROP_ENUM_
    DS_MSHIP_DROP__COUNT
};

/* "malformed", ... (a metric label); "?" when out of range. */
const char *ds_mship_drop_name(enum ds_mship_drop r);

/* The protocol's counters and levels (base/metric.h: one row per field
 * gives the member, its /status key, its /metrics family and its
 * docs/status.md row). Rows without a family are in /status only. */
#define DS_MSHIP_HELP_MEMBERS "Member table entries by state (self included)."
#define DS_MSHIP_HELP_MSGS "Membership messages."
#define DS_MSHIP_HELP_BYTES "Membership bytes."
#define DS_MEMBERSHIP_STATS(X) \
    X(U32, alive, "alive", "dsnode_members", GAUGE, "state", "alive", DS_MSHIP_HELP_MEMBERS) \
    X(U32, suspect, "suspect", "dsnode_members", GAUGE, "state", "suspect", \
      DS_MSHIP_HELP_MEMBERS) \
    X(U32, dead, "dead", "dsnode_members", GAUGE, "state", "dead", DS_MSHIP_HELP_MEMBERS) \
    X(U32, left, "left", "dsnode_members", GAUGE, "state", "left", DS_MSHIP_HELP_MEMBERS) \
    X(U32, lhm, "lhm", "dsnode_membership_local_health", GAUGE, NULL, NULL, \
      "Lifeguard local health multiplier (0 = healthy).") \
    X(U64, round, "round", NULL, GAUGE, NULL, NULL, "Current membership round.") \
    X(U64, epoch, "epoch", NULL, GAUGE, NULL, NULL, "View epoch of the current round.") \
    X(U32, lag, "lag_rounds", "dsnode_membership_lag_rounds", GAUGE, NULL, NULL, \
      "Rounds from a membership change's decision to its effect.") \
    X(U64, msgs_sent, "msgs_sent", "dsnode_membership_messages_total", COUNTER, "direction", \
      "sent", DS_MSHIP_HELP_MSGS) \
    X(U64, bytes_sent, "bytes_sent", "dsnode_membership_bytes_total", COUNTER, "direction", \
      "sent", DS_MSHIP_HELP_BYTES) \
    X(U64, msgs_recv, "msgs_received", "dsnode_membership_messages_total", COUNTER, \
      "direction", "received", DS_MSHIP_HELP_MSGS) \
    X(U64, bytes_recv, "bytes_received", "dsnode_membership_bytes_total", COUNTER, \
      "direction", "received", DS_MSHIP_HELP_BYTES) \
    X(U64, probes, "probes", "dsnode_membership_probes_total", COUNTER, NULL, NULL, \
      "Probes started.") \
    X(U64, probes_failed, "probes_failed", "dsnode_membership_probes_failed_total", COUNTER, \
      NULL, NULL, "Probes without an answer.") \
    X(U64, pings_sent, "pings_sent", NULL, COUNTER, NULL, NULL, "PINGs sent.") \
    X(U64, acks_sent, "acks_sent", NULL, COUNTER, NULL, NULL, "ACKs sent.") \
    X(U64, ping_reqs_sent, "ping_reqs_sent", NULL, COUNTER, NULL, NULL, \
      "PING-REQs (indirect probes) sent.") \
    X(U64, nacks_sent, "nacks_sent", NULL, COUNTER, NULL, NULL, "NACKs sent.") \
    X(U64, nacks_received, "nacks_received", NULL, COUNTER, NULL, NULL, "NACKs received.") \
    X(U64, acks_unmatched, "acks_unmatched", NULL, COUNTER, NULL, NULL, \
      "ACKs that matched no probe in progress.") \
    X(U64, joins_sent, "joins_sent", NULL, COUNTER, NULL, NULL, "JOINs sent.") \
    X(U64, joins_advanced, "joins_advanced", NULL, COUNTER, NULL, NULL, \
      "Our join round brought forward once we had the cluster's state.") \
    X(U64, members_sent, "members_sent", NULL, COUNTER, NULL, NULL, "MEMBERS answers sent.") \
    X(U64, leaves_sent, "leaves_sent", NULL, COUNTER, NULL, NULL, "LEAVEs sent.") \
    X(U64, joins_finishing, "joins_finishing", NULL, COUNTER, NULL, NULL, \
      "JOINs answered with \"cluster finishing\" (a LEAVE) because this node is leaving.") \
    X(U64, updates_sent, "updates_sent", NULL, COUNTER, NULL, NULL, \
      "Member records piggybacked on messages.") \
    X(U64, suspicions, "suspicions", "dsnode_membership_suspicions_total", COUNTER, NULL, \
      NULL, "Suspicions raised by this node's probes.") \
    X(U64, deaths, "deaths", "dsnode_membership_deaths_total", COUNTER, NULL, NULL, \
      "Deaths declared by this node's suspicion timers.") \
    X(U64, refutations, "refutations", "dsnode_membership_refutations_total", COUNTER, NULL, \
      NULL, "Suspicions about this node refuted.") \
    X(U64, rejoins, "rejoins", "dsnode_membership_rejoins_total", COUNTER, NULL, NULL, \
      "Rejoins after being declared dead or left.") \
    X(U64, deaths_doubted, "deaths_doubted", "dsnode_membership_deaths_doubted_total", COUNTER, \
      NULL, NULL, \
      "DEAD verdicts from other members about a member this node had heard from itself " \
      "within the suspicion timeout, taken as a suspicion instead.") \
    X(U64, late_changes, "late_changes", "dsnode_membership_late_changes_total", COUNTER, \
      NULL, NULL, \
      "Changes that arrived after their effective round (the current round's view " \
      "changed mid-round).")

typedef struct ds_membership_stats {
    DS_MEMBERSHIP_STATS(DS_METRIC_FIELD)
    uint64_t drops[DS_MSHIP_DROP__COUNT]; /* by enum ds_mship_drop */
    uint64_t wire[DS_DROP__COUNT];        /* decoder drops by wire reason */
} ds_membership_stats;

/* Create a protocol instance for this node (identity from cfg, copied; io
 * copied). It is in no cluster until ds_membership_bootstrap or
 * ds_membership_join. The caller owns *out (ds_membership_destroy).
 * Returns 0, -EINVAL (bad config, logged with the reason) or -ENOMEM. */
__attribute__((warn_unused_result))
int ds_membership_create(const ds_membership_cfg *cfg, const ds_membership_io *io,
                         ds_membership **out);

/* NULL-safe; clears *m. No callbacks run. */
void ds_membership_destroy(ds_membership **m);

/* This node's id (ds_wire_node_id(cfg.pk)). */
uint64_t ds_membership_self_id(const ds_membership *m);

/* Start a new cluster of one: this node is in the view from its current
 * round. Returns 0 or -EALREADY (already in a cluster or joining). */
int ds_membership_bootstrap(ds_membership *m, uint64_t now_ms);

/* Join through any of the seeds ("host:port" strings, borrowed for the
 * call; this node's own address is skipped): JOIN to one, MEMBERS back;
 * retried with backoff over the list until a seed answers
 * (DS_MEV_JOIN_RETRY each time, DS_MEV_SELF_JOINED at the end). Returns 0,
 * -EALREADY, -EINVAL (no seed other than ourselves), -ENOMEM. */
int ds_membership_join(ds_membership *m, uint64_t now_ms, const char *const *seeds,
                       size_t n_seeds);

/* Announce a graceful leave, effective at *eff_round (our round + lag):
 * state LEFT, piggybacked, and a LEAVE frame to indirect_k members. Keep
 * calling tick/recv until ds_membership_leave_done. Returns 0 (again: the
 * same round), -EINVAL when not in a cluster. */
int ds_membership_leave(ds_membership *m, uint64_t now_ms, uint64_t *eff_round);

/* 1 when a leave was announced, our round has reached its effective round,
 * and the announcement has been piggybacked its full count (or nobody is
 * left to tell): the process may exit. */
int ds_membership_leave_done(ds_membership *m);

/* This node's gossip round (normally increasing). May emit VIEW_CHANGED. */
void ds_membership_set_round(ds_membership *m, uint64_t round, uint64_t now_ms);

/* Run every timer due at now_ms: probes, indirect probes, NACKs,
 * suspicion timeouts, join retries, purges. Returns 0. */
int ds_membership_tick(ds_membership *m, uint64_t now_ms);

/* The earliest time tick() has something to do (UINT64_MAX: nothing until
 * a message or call arrives). */
uint64_t ds_membership_next_deadline(ds_membership *m);

/* One received frame (borrowed for the call): header + payload, plaintext,
 * possibly followed by the tag when its protection bits say so. from_addr:
 * the transport address it came from, or NULL. Returns 0 (handled), or
 * -EBADMSG when the frame was dropped (counted by reason in stats.drops,
 * and by wire reason in stats.wire; logged rate-limited). */
int ds_membership_recv(ds_membership *m, uint64_t now_ms, const char *from_addr,
                       const uint8_t *frame, size_t len);

/* The lag (rounds from a decision to its effective round) of the changes
 * this node decides from now on. Records already decided keep theirs, so
 * nodes may use different lags: the effective round travels in the record.
 * The runtime keeps it at a few seconds' worth of rounds, so that a change
 * reaches every member before it applies. */
void ds_membership_set_lag(ds_membership *m, uint32_t lag_rounds);
uint32_t ds_membership_lag(ds_membership *m);

/* A joiner that has the cluster's state brings its join round forward to
 * `lag_rounds` past the current round (never later than it is), and
 * pushes its record at once to every live member (a PING that leads with
 * it): the seed's join round is a full lag out, sized for a change to
 * spread by piggyback, and most of it is spent waiting. Members keep the
 * smaller of two join rounds, so the new one wins everywhere. Returns 1
 * (moved; *join_round the new round), 0 (not earlier than it is, or not
 * ours to move: we are not a live joiner yet to enter the view), or
 * -EINVAL (lag_rounds 0). docs/membership.md, "Joins". */
int ds_membership_advance_join(ds_membership *m, uint32_t lag_rounds, uint64_t now_ms,
                               uint64_t *join_round);

/* A hint from gossip/transport: `id` missed a deadline. Not a verdict: the
 * member is probed next (at most one early probe per period). */
void ds_membership_hint(ds_membership *m, uint64_t id, uint64_t now_ms);

/* The view at `round`: *G members written to out[0..cap) sorted by (name,
 * id); *me is this node's index or DS_MEMBERSHIP_NOT_IN_VIEW; *epoch the
 * view epoch at that round. Any pointer but m may be NULL (out with cap 0
 * just counts). Returns 0, or -ENOSPC when cap < G (out holds the first cap
 * entries, *G the full size). Computed from what this node knows now:
 * rounds before the current one are not kept as history. */
int ds_membership_view_at(ds_membership *m, uint64_t round, ds_member_info *out, uint32_t cap,
                          uint32_t *G, uint32_t *me, uint64_t *epoch);

/* Every member in the table (any state, self included), in table order.
 * *n receives the count; -ENOSPC when cap < *n. */
int ds_membership_members(ds_membership *m, ds_member_info *out, uint32_t cap, uint32_t *n);

/* One member by id: 0, or -ENOENT. */
int ds_membership_member(ds_membership *m, uint64_t id, ds_member_info *out);

void ds_membership_stats_get(ds_membership *m, ds_membership_stats *st);

/* Lifeguard's suspicion timeout (ms) for a cluster of n live members after
 * c independent confirmations, as this cfg computes it (without lifeguard:
 * the fixed minimum). Exposed for tests and docs. */
uint64_t ds_membership_suspicion_timeout_ms(const ds_membership_cfg *cfg, uint32_t n,
                                            uint32_t c);

#endif
