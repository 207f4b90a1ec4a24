/*
 * node/gossip/gossip.h: the gossip engine (design §2 and 5): segments, the local
 * drift accumulator, sparse pairwise mixing or the paper's dense crossover
 * rule, round pacing with deadlines, and the AllReduce-SGD baseline.
 *
 * The engine talks to its peers only through ds_gossip_io (a seam, as in
 * STYLE's "protocol logic behind seams"): node/gossip/gossip_net.c implements it
 * over the secured libfabric layer, node/gossip/fake.c over in-process
 * mailboxes, so the mixing rules are tested on a fake network with
 * failures injected. The seam carries the clock too: the engine reads the
 * time only through it.
 *
 * A round, as data flows (buffers are host memory, n_params floats each):
 *
 *   begin(theta):     acc += theta - snap        local drift since the last mix
 *                     snap = theta               the round snapshot
 *                     per segment s with a target: S = sparsify(acc[s]),
 *                     stash acc[S], acc[S] = 0, REQ values = snap[S]
 *   exchange(io):     send every REQ; answer every REQ received from
 *                     snap; delta += w (theirs - mine) per finished
 *                     exchange; wait at most the adaptive deadline
 *                     (latency.h), never over gossip.timeout_ms; answer
 *                     REQs of past rounds, apply late replies
 *   end(theta):       theta += delta, snap += delta, delta = 0;
 *                     failed exchanges give their stash back to acc
 *
 * exchange() touches only snap (read), acc at received indices, delta and
 * its own buffers, so it may run on a communication thread while the main
 * thread computes the next gradient and steps theta (gossip.overlap): the
 * result is x_{t+1} = x_t - lr g(x_t) + mix_delta(x_t), the snapshot
 * semantics of design §5. With snap advanced by delta in end(), the next
 * begin() sees exactly the optimizer's drift, never the mixing's.
 *
 * Pairwise mixing conserves the sum of all models exactly for any S: both
 * sides add w * (x_b - x_a) with opposite signs, computed from the same two
 * floats (IEEE subtraction is sign-symmetric), so only the final additions
 * to theta round.
 */
#ifndef DS_NODE_GOSSIP_H
#define DS_NODE_GOSSIP_H

#include <stddef.h>
#include <stdint.h>

#include "base/clock.h"
#include "base/metric.h"
#include "conf/choices.h" /* enum ds_mix: gossip.mix's list */
#include "node/train/model.h"
#include "sparsify/sparsify.h"
#include "topology/topology.h"

/* Gossip-level message kinds (the wire layer maps them to its types). */
enum ds_gmsg_type {
    DS_GMSG_REQ = 1,   /* round, segment, S (idx), initiator's snap[S] */
    DS_GMSG_RESP = 2,  /* round, segment, responder's snap[S] (count = |S|) */
    DS_GMSG_STALE = 3, /* round, segment: "that round is over here" */
    DS_GMSG_CROSS = 4, /* round, segment, the whole segment (dense crossover) */
    DS_GMSG_ARED = 5,  /* all-reduce chunk: round = step, segment = ring step */
};

/* One message as the engine sees it. Arrays are borrowed: for send, for the
 * call; for recv, until the next recv. */
typedef struct ds_gmsg {
    uint8_t type;
    uint32_t from, to;  /* view indices */
    uint64_t epoch, round;
    uint64_t round_now; /* the sender's current round (filled by the engine;
                         * differs from round only in STALE) */
    uint32_t segment;
    uint32_t seg_len;   /* REQ, CROSS: the segment's length (for encoding) */
    uint32_t count;     /* entries in idx (REQ) and val */
    uint32_t held_us;   /* RESP: how long its REQ waited, queued at the
                         * responder, while the responder itself waited on
                         * other partners (docs/gossip.md, slow partners) */
    uint64_t aux;       /* ARED: the sender's orphan chunks in a direct
                         * reduction, a bit per member (group.c); 0 else */
    uint8_t vfmt;       /* REQ, RESP, CROSS: enum ds_value_format the values
                         * go on the wire in (set by the engine; val already
                         * holds exactly what that format carries) */
    const uint32_t *idx;
    const float *val;
} ds_gmsg;

/* Every deadline below is on the io's own clock, now_ns: the engine reads
 * no clock of its own, so a test's io can run rounds on a clock it
 * controls (node/gossip/fake.c) and assert on that clock instead of on
 * elapsed wall time. All four functions are called on the thread running
 * the engine's exchange() or allreduce(). */
typedef struct ds_gossip_io {
    void *ctx;
    /* Hand m to the transport for m->to. Must not block past deadline_ns.
     * 0, or a negative errno: the exchange fails. */
    int (*send)(void *ctx, const ds_gmsg *m, uint64_t deadline_ns);
    /* Next gossip message for this node, waiting until deadline_ns:
     * 1 with *m filled, 0 at the deadline, a negative errno on failure. */
    int (*recv)(void *ctx, ds_gmsg *m, uint64_t deadline_ns);
    /* A peer missed a deadline (membership hears of it). May be NULL. */
    void (*peer_failed)(void *ctx, uint32_t peer);
    /* A peer's frame carried another view epoch than this round's: the
     * two do not know the same members (membership may compare notes with
     * it). Not a failure. May be NULL. */
    void (*peer_view_differs)(void *ctx, uint32_t peer);
    /* Now, in nanoseconds, on the clock the deadlines are on. Required. */
    uint64_t (*now_ns)(void *ctx);
} ds_gossip_io;

/* The real clock for an io that runs on the network: CLOCK_MONOTONIC
 * (base/clock.h), ctx unused. */
static inline uint64_t ds_gossip_monotonic_ns(void *ctx)
{
    (void)ctx;
    return ds_now_ns();
}

typedef struct ds_gossip_cfg {
    enum ds_topo_kind topology;
    enum ds_mix mix;
    float weight;               /* pairwise w, (0, 0.5] */
    int segments;               /* 0 = one per layer; at most n_params (else -EINVAL) */
    enum ds_sparsify_method method;
    double density;
    int error_feedback;         /* 0: acc restarts from zero every round */
    enum ds_value_format value_format; /* sparsify.value_format: values on the wire */
    float threshold;            /* sparsify.threshold (0 = automatic) */
    uint64_t seed;              /* cluster seed: topology and sparsifier streams */
    uint64_t node_seed;         /* this node's own streams (random sparsifier) */
    int timeout_ms;
    int min_wait_ms;            /* the adaptive deadline's floor; 0 = DS_GLAT_FLOOR_MS */
} ds_gossip_cfg;

typedef struct ds_gseg {
    size_t off, len;
} ds_gseg;

/* The engine's counters (base/metric.h: one row per field gives the
 * member, its /status key, its /metrics family and its docs/status.md
 * row). An exchange is one segment's REQ/RESP (or CROSS) with one peer. */
#define DS_GOSSIP_HELP_XCHG "Exchanges this node initiated, by outcome."
#define DS_GOSSIP_HELP_STALE "STALE replies."
#define DS_GOSSIP_HELP_VALUES "Parameter values exchanged."
#define DS_GOSSIP_HELP_BYTES \
    "Gossip payload counted as raw u32 indices and f32 values, before the wire codes the " \
    "indices (so it can exceed the transport's bytes)."
#define DS_GOSSIP_STATS(X) \
    X(U64, rounds, "rounds", "dsnode_gossip_rounds_total", COUNTER, NULL, NULL, \
      "Gossip rounds taken part in.") \
    X(U64, exchanges_ok, "exchanges_ok", "dsnode_gossip_exchanges_total", COUNTER, "outcome", \
      "ok", DS_GOSSIP_HELP_XCHG) \
    X(U64, exchanges_failed, "exchanges_failed", "dsnode_gossip_exchanges_total", COUNTER, \
      "outcome", "failed", DS_GOSSIP_HELP_XCHG) \
    X(U64, answered, "answered", "dsnode_gossip_answered_total", COUNTER, NULL, NULL, \
      "Requests answered (REQs answered, CROSS received).") \
    X(U64, missed, "missed", "dsnode_gossip_missed_total", COUNTER, NULL, NULL, \
      "Expected requests that never came.") \
    X(U64, skipped, "skipped", "dsnode_gossip_exchanges_total", COUNTER, "outcome", \
      "skipped", DS_GOSSIP_HELP_XCHG) \
    X(U64, stale_sent, "stale_sent", "dsnode_gossip_stale_total", COUNTER, "direction", \
      "sent", DS_GOSSIP_HELP_STALE) \
    X(U64, stale_received, "stale_received", "dsnode_gossip_stale_total", COUNTER, \
      "direction", "received", DS_GOSSIP_HELP_STALE) \
    X(U64, late, "late", "dsnode_gossip_late_total", COUNTER, NULL, NULL, \
      "Replies for a round already over.") \
    X(U64, queued, "queued", "dsnode_gossip_queued_total", COUNTER, NULL, NULL, \
      "Messages for a future round, kept.") \
    X(U64, dropped, "dropped", "dsnode_gossip_dropped_total", COUNTER, NULL, NULL, \
      "Gossip messages dropped (malformed, unexpected, over the queue bound).") \
    X(U64, timeouts, "timeouts", "dsnode_gossip_timeouts_total", COUNTER, NULL, NULL, \
      "Exchange phases that waited out their whole deadline.") \
    X(U64, late_applied, "late_applied", "dsnode_gossip_late_applied_total", COUNTER, NULL, \
      NULL, "Replies applied in a later round than their request's (kept open).") \
    X(U64, late_lost, "late_lost", "dsnode_gossip_late_lost_total", COUNTER, NULL, NULL, \
      "Exchanges kept open that were given up without an answer.") \
    X(U64, deferred, "deferred", "dsnode_gossip_deferred_total", COUNTER, NULL, NULL, \
      "Requests sent empty: an earlier one to that partner was still open.") \
    X(U64, paced, "paced", "dsnode_gossip_paced_total", COUNTER, NULL, NULL, \
      "Rounds held back: this node was over 8 rounds ahead of its view's median.") \
    X(NS, pace_ns, "pace_s", "dsnode_gossip_pace_seconds_total", COUNTER, NULL, NULL, \
      "Time held back so (inside wait_s).") \
    X(U32, slow_peers, "slow_peers", "dsnode_gossip_slow_peers", GAUGE, NULL, NULL, \
      "Partners this round does not wait for because they are slow.") \
    X(U32, trimmed_peers, "trimmed_peers", "dsnode_gossip_trimmed_peers", GAUGE, NULL, NULL, \
      "Partners whose exchanges carry only a share of k: their link cannot keep up.") \
    X(U64, trimmed, "trimmed", "dsnode_gossip_trimmed_total", COUNTER, NULL, NULL, \
      "Requests that carried only a share of what was selected (a slow link).") \
    X(NS, deadline_ns, "deadline_s", "dsnode_gossip_deadline_seconds", GAUGE, NULL, NULL, \
      "This round's adaptive wait deadline.") \
    X(U64, interrupted, "interrupted", "dsnode_gossip_interrupted_total", COUNTER, NULL, NULL, \
      "Exchanges whose waits a stop request ended early.") \
    X(U64, values_sent, "values_sent", "dsnode_gossip_values_total", COUNTER, "direction", \
      "sent", DS_GOSSIP_HELP_VALUES) \
    X(U64, values_received, "values_received", "dsnode_gossip_values_total", COUNTER, \
      "direction", "received", DS_GOSSIP_HELP_VALUES) \
    X(U64, bytes_sent, "payload_bytes_sent", "dsnode_gossip_payload_bytes_total", COUNTER, \
      "direction", "sent", DS_GOSSIP_HELP_BYTES) \
    X(U64, bytes_received, "payload_bytes_received", "dsnode_gossip_payload_bytes_total", \
      COUNTER, "direction", "received", DS_GOSSIP_HELP_BYTES) \
    X(NS, wait_ns, "wait_s", "dsnode_gossip_wait_seconds_total", COUNTER, NULL, NULL, \
      "Time spent waiting inside gossip exchanges.") \
    X(NS, max_wait_ns, "max_round_s", "dsnode_gossip_max_round_seconds", GAUGE, NULL, NULL, \
      "Longest single exchange phase (exchange() or all-reduce) so far.")

typedef struct ds_gossip_stats {
    DS_GOSSIP_STATS(DS_METRIC_FIELD)
} ds_gossip_stats;

typedef struct ds_gossip ds_gossip;

/* An exchange with a partner whose link cannot keep up carries only a
 * share of what the sparsifier selected (latency.h, ds_glat_share): of
 * idx/stash[0..count) (segment indices, in order, and their acc
 * values), keep the ceil(share x count) entries of largest |stash| (at
 * least one), in their order, compacted to the front; ties at the
 * threshold keep the first ones. Returns how many are kept (count itself
 * when share >= 1 or count < 2). scratch holds count floats. What is not
 * kept is simply not sent: the caller has not zeroed acc yet, so it
 * leaves with a later exchange. */
size_t ds_gossip_trim(uint32_t *idx, float *stash, size_t count, float share, float *scratch);

/* Cut n parameters into segments: one per layer when want == 0, else
 * `want` near-equal contiguous ranges whose cuts move to a layer boundary
 * when one lies within a quarter of a segment. out holds max(want,
 * n_layers) entries. Returns the number of segments or -EINVAL. */
int ds_gossip_segments(const ds_layer *layers, int n_layers, size_t n, int want, ds_gseg *out);

/* Create an engine for a model of n_params floats laid out as `layers`,
 * starting from theta (host memory, borrowed for the call: acc = 0,
 * snap = theta). The caller owns *out; free with ds_gossip_destroy.
 * Returns 0, -EINVAL or -ENOMEM. */
int ds_gossip_create(ds_gossip **out, const ds_gossip_cfg *cfg, const ds_layer *layers,
                     int n_layers, size_t n_params, const float *theta)
    __attribute__((warn_unused_result));

/* NULL-safe; clears the caller's pointer. */
void ds_gossip_destroy(ds_gossip **g);

/* Start over from theta (host memory): snap = theta, acc = delta = 0,
 * every sparsifier's state forgotten. After a model transfer. */
void ds_gossip_reset(ds_gossip *g, const float *theta);

/* Set the view: G participants, this node is `me`, at view epoch `epoch`.
 * Takes effect at the next begin(). Returns 0 or -EINVAL / -ENOMEM. */
int ds_gossip_set_view(ds_gossip *g, uint32_t G, uint32_t me, uint64_t epoch);

/* For the next round only (set_view clears it): do not initiate to view
 * index `peer` and do not wait for it -- a peer known to be unresponsive.
 * Whatever it still sends is served. Returns 0 or -EINVAL. */
int ds_gossip_set_skip(ds_gossip *g, uint32_t peer);

/* For the next round only, softer: initiate to view index `peer` as usual
 * (it expects our request and would otherwise wait for it) but do not
 * wait for its reply or its request -- a peer that missed a deadline
 * lately. A reply that comes while the round is still open is used; a
 * missing one fails that exchange without reporting the peer again.
 * Returns 0 or -EINVAL. */
int ds_gossip_set_nowait(ds_gossip *g, uint32_t peer);

/* Hierarchy (design §5): for the next round only (set_view resets it to
 * 1 and 0), this node is member `member` of a group of `size` whose view
 * index is `me`: it initiates and expects exchanges only for the segments
 * s with s mod size == member (ds_topo_hier_owner) and forgets its drift
 * in the others. The participants are then groups, and with two of them
 * and the pairwise mix each segment is exchanged once, by the initiator
 * ds_topo_pair_initiator names (the other group answers). Returns 0 or
 * -EINVAL. */
int ds_gossip_set_share(ds_gossip *g, uint32_t member, uint32_t size);

/* The round's delta (n floats): what end() will add to theta and snap.
 * Between exchange() and end() only, on the thread that owns theta: the
 * group sums its members' deltas there so that every member adds the
 * same. */
float *ds_gossip_delta(ds_gossip *g);

/* theta += delta, snap += delta, delta = 0: the part of end() that
 * changes the model, for a node that took no round of its own while its
 * group's delta came (then delta was filled through ds_gossip_delta). */
void ds_gossip_apply(ds_gossip *g, float *theta);

/* Round `round`, in three parts (see the top of this file). begin and end
 * run on the thread that owns theta; exchange may run on another thread
 * between them. A full round is ds_gossip_round. */
int ds_gossip_begin(ds_gossip *g, const float *theta, uint64_t round);
int ds_gossip_exchange(ds_gossip *g, const ds_gossip_io *io);
void ds_gossip_end(ds_gossip *g, float *theta);
int ds_gossip_round(ds_gossip *g, float *theta, uint64_t round, const ds_gossip_io *io);

/* AllReduce-SGD baseline: replace grad (n floats, host) by the mean over
 * the view's G nodes with a ring reduce-scatter + all-gather, tagged with
 * `step`. A ring step that misses its deadline aborts the reduction: grad
 * then holds this node's own gradient (documented in docs/gossip.md) and
 * the return is -ETIMEDOUT. */
int ds_gossip_allreduce(ds_gossip *g, float *grad, size_t n, uint64_t step,
                        const ds_gossip_io *io);

const ds_gossip_stats *ds_gossip_get_stats(const ds_gossip *g);

/* The mean of partner `peer`'s recent exchange samples, what the slow
 * rule compares (latency.h): round trips less the time the partner held
 * the REQ while it waited on others. 0 without samples. The round's
 * thread only (tests). */
uint64_t ds_gossip_partner_link_ns(const ds_gossip *g, uint32_t peer);
int ds_gossip_n_segments(const ds_gossip *g);
const ds_gseg *ds_gossip_segment(const ds_gossip *g, int s);
/* This round's target of segment s (== me: none), after begin(). */
uint32_t ds_gossip_target(const ds_gossip *g, int s);
/* What this round did for segment s (after begin; final after end). */
enum ds_gossip_outcome {
    DS_GOUT_NONE = 0,     /* nothing initiated (no partner this round) */
    DS_GOUT_PENDING = 1,
    DS_GOUT_OK = 2,
    DS_GOUT_FAILED = 3,   /* timed out, refused, STALE */
    DS_GOUT_SKIPPED = 4,  /* not tried: peer unresponsive */
};
typedef struct ds_gossip_xinfo {
    uint32_t target;            /* view index; == me: none */
    enum ds_gossip_outcome outcome;
    uint64_t bytes;             /* payload of our REQ (indices + values) */
    uint64_t latency_ns;        /* ok only (else 0): REQ sent to RESP received
                                 * (pairwise), or the CROSS's send (crossover) */
    uint32_t n_in;              /* initiators to us */
    const uint32_t *in_from;    /* their view indices; valid until begin() */
} ds_gossip_xinfo;
int ds_gossip_xinfo_get(const ds_gossip *g, int s, ds_gossip_xinfo *out);

/* For a thread other than the round's (the status page): a consistent
 * copy of the counters (st, may be NULL) and of the first max_x segments'
 * exchanges (x, may be NULL), as of the last begin, exchange, end,
 * all-reduce or reset. x[s].in_from points into in_from (max_x x in_cap
 * entries, owned by the caller), which holds the first min(n_in, in_cap)
 * of them. The getters
 * above read the live fields: the round's thread only. */
void ds_gossip_report(ds_gossip *g, ds_gossip_stats *st, ds_gossip_xinfo *x, int max_x,
                      uint32_t *in_from, uint32_t in_cap);

/* For a thread other than the round's (the status page, while the
 * client waits for an overlapped round): how many peers the exchange in
 * progress still waits for (those it waits for at all: not skipped, slow
 * or ahead), as of its last message; their view indices, each once, into
 * peers (the first min(n, cap, 16)). 0 when no exchange is waiting. */
int ds_gossip_waiting(ds_gossip *g, uint32_t *peers, int cap);

/* Read access for status and tests. */
const float *ds_gossip_acc(const ds_gossip *g);
/* For checkpoints (node/runtime/checkpoint.c), between rounds only (after
 * end; delta is zero then): the accumulator (the error-feedback residual)
 * and the round snapshot, n_params floats each, writable; segment s's
 * sparsifier (NULL for the dense crossover). A caller that writes them
 * restores a saved state; exchanges kept open past their round are not
 * part of it (ds_gossip_drop_late forgets them). */
float *ds_gossip_acc_mut(ds_gossip *g);
float *ds_gossip_snap_mut(ds_gossip *g);
ds_sparsifier *ds_gossip_sparsifier(ds_gossip *g, int s);
void ds_gossip_drop_late(ds_gossip *g);


#endif
