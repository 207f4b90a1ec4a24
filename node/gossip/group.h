/*
 * node/gossip/group.h: the reduction inside a group (design §5,
 * "Hierarchy"): every member ends with the same vector, the sum (or the
 * mean) of the members' vectors, computed by one member per chunk.
 *
 * The algorithm is a direct reduce-scatter then all-gather: the vector is
 * cut into G near-equal chunks and member c owns chunk c. Every member
 * sends chunk c of its vector to member c (phase 0); member c adds what
 * reached it, in member order, and sends the reduced chunk with the
 * number of contributions to every member (phase 1). Bytes per member are
 * those of a ring all-reduce, 2 (G-1)/G of the vector, in two message
 * latencies instead of 2 (G-1); and a member that is dead or frozen costs
 * only its own contribution and its own chunk, never the chain of a ring.
 *
 * Identity: every member receives each chunk from its one owner, so all
 * members that complete hold the same bytes. A chunk whose owner did not
 * answer by the deadline keeps the member's own values; the result then
 * says the reduction was incomplete here (the group re-syncs, group.c's
 * caller: node/runtime/rounds.c).
 *
 * Orphans: a chunk whose owner this member skips hard (held dead by
 * membership, or unreachable) has nobody to reduce it. Each member sends
 * its part of it to every member not skipped hard (segment PHASE_ORPHAN0
 * + the chunk), and each sums the parts that came, in member order, as
 * the owner would have. Every contribution frame carries its sender's
 * orphans (ds_gmsg.aux, a bit per member: G <= 64, else no orphans), and
 * a member waits only for parts of the orphans both hold. A member held
 * dead costs nothing of the result: with it, a reduction whose every
 * other part came is complete (its list is neither summed nor missing),
 * in the ring and the butterfly too, which leave it out of their
 * schedule. Members that hold the same members dead and got the same
 * frames hold the same bytes; one that differs on an owner differs in
 * that chunk and says incomplete. An owner's result for a chunk this
 * member holds an orphan is not taken.
 *
 * Messages are DS_GMSG_ARED over an io of their own (the group's view:
 * index = member), tagged with `tag`: round = tag, segment = phase.
 * Messages of a later tag are kept (bounded); earlier ones are dropped
 * and counted. The largest tag seen is reported: members that fell apart
 * (a joiner, a reduction missed) meet again by taking the largest.
 *
 * A member whose contribution did not come by the first half of the
 * deadline (and was waited for) is reported through io->peer_failed.
 *
 * Thread safety: one thread at a time per ds_greduce.
 */
#ifndef DS_NODE_GOSSIP_GROUP_H
#define DS_NODE_GOSSIP_GROUP_H

#include <stddef.h>
#include <stdint.h>

#include "conf/choices.h"
#include "node/gossip/gossip.h"

typedef struct ds_greduce ds_greduce;

/* A sparse list each member adds to the reduction: (idx, val) pairs
 * gathered from every member (one message each way, sent with the chunks)
 * and summed in member order into out (n_out floats, zeroed first), so
 * every member that has every list holds the same sum. The pairs travel
 * as 2 count floats: the indices' bits, then the values. */
typedef struct ds_gsparse {
    const uint32_t *idx;
    const float *val;
    uint32_t count;
    float *out;
    size_t n_out;
} ds_gsparse;

typedef struct ds_greduce_result {
    uint32_t contributions;  /* in the chunk this member owns (itself included) */
    uint32_t chunks_missing; /* chunks whose reduced values never came */
    uint32_t lists_missing;  /* sparse lists that never came */
    uint32_t orphans;        /* chunks this member summed itself, their owner
                              * skipped hard (direct: see Orphans) */
    int complete;            /* every chunk (and list) from every member not
                              * skipped hard (held dead: see Orphans) */
    int stopped;             /* the io reported a stop: nobody to blame */
    uint64_t max_tag;        /* the largest tag seen from a member (or tag) */
    int ran;                 /* the algorithm this reduction ran (enum
                              * ds_greduce_algo): the one set, or direct
                              * after a failure or to follow a member */
} ds_greduce_result;

/* The reducer's counters, cumulative. */
typedef struct ds_greduce_stats {
    uint64_t reductions, incomplete, late_dropped, kept;
} ds_greduce_stats;

/* max_n: the longest vector it will reduce. The caller owns *out. 0 or
 * -ENOMEM. */
int ds_greduce_create(ds_greduce **out, size_t max_n) __attribute__((warn_unused_result));

/* NULL-safe; clears the caller's pointer. */
void ds_greduce_destroy(ds_greduce **r);

/* skip[] values (ds_greduce_run): a member not waited for is still sent
 * our frames (direct: our contribution, our reduced chunk, our list), so
 * that its own skip window on us ends when it hears from us; one skipped
 * hard (a transport that cannot reach it, a membership verdict) is sent
 * nothing. Two members that stopped waiting for each other and also
 * stopped sending never heard from each other again: the two survivors
 * of a group of three each reduced alone for the rest of a run
 * (docs/gossip.md, "Groups", failures). The values are
 * node/runtime/skip.h's verdicts. */
enum { DS_GREDUCE_SKIP_WAIT = 0, DS_GREDUCE_SKIP_NOWAIT = 1, DS_GREDUCE_SKIP_ALL = 2 };

/* Reduce vec (n floats, n <= max_n) over G members, this one `me`:
 * elements [0, n_mean) become the mean over the contributions that
 * reached their chunk's owner, the rest their sum. sp (may be NULL):
 * this member's sparse list, gathered and summed as ds_gsparse says (count
 * at most max_n / 2). skip (G entries, may be NULL; values above): members
 * not waited for, neither their contribution nor their chunk (a chunk not
 * waited for keeps this member's values, or the owner's if it came in
 * time), the ring and the butterfly leave them out of their schedule.
 * Waits until deadline_ns on io's clock at most. Returns 0 with *res
 * filled, or -EINVAL. */
int ds_greduce_run(ds_greduce *r, const ds_gossip_io *io, float *vec, size_t n, size_t n_mean,
                   uint32_t G, uint32_t me, const uint8_t *skip, uint64_t tag,
                   uint64_t deadline_ns, const ds_gsparse *sp, ds_greduce_result *res);

void ds_greduce_stats_get(const ds_greduce *r, ds_greduce_stats *st);

/* The algorithm of the dense part (group.allreduce), the same on every
 * member; the sparse lists always go directly to every member.
 *   direct     reduce-scatter then all-gather, member c owning chunk c
 *              (above): 2 message latencies, 2 (G-1)/G of the vector
 *   ring       over the members not skipped: P - 1 reduce-scatter steps
 *              passing one chunk (with its count) to the next member,
 *              then P - 1 all-gather steps: 2 (P-1) latencies, the
 *              direct algorithm's bytes, one message at a time a member
 *   butterfly  recursive doubling: log2 P steps in which members swap
 *              and add whole vectors (P not a power of two: the extra
 *              members hand theirs in first and get the result back):
 *              the fewest latencies, log2 P vectors a member
 * In all three every member that completes holds the same bytes. A ring or
 * butterfly step that does not come by the deadline ends the run for this
 * member with its own vector (the ring keeps the reduced chunks that
 * already came back), and the result says incomplete. The member waited
 * for is reported only when it owed a message it sends without waiting on
 * anyone (the ring's first step, the butterfly's hand-in and first swap),
 * never for a step late because of someone upstream. Members must agree
 * on who is skipped, or their schedules differ. So after a ring or
 * butterfly reduction that did not complete, the next 16 run direct,
 * where a missing member costs only its chunk and half the deadline; and
 * a member on the ring or the butterfly that meets a direct contribution
 * of the same reduction restores its vector and runs that reduction
 * direct too: the group follows any member that runs direct within one
 * reduction (docs/gossip.md). */
enum ds_greduce_algo {
    DS_GREDUCE_DIRECT = DS_GROUP_ALLREDUCE_DIRECT,
    DS_GREDUCE_RING = DS_GROUP_ALLREDUCE_RING,
    DS_GREDUCE_BUTTERFLY = DS_GROUP_ALLREDUCE_BUTTERFLY,
    /* group.allreduce = auto is the runtime's (node/runtime/rounds.c): it
     * sets one of the three above before each reduction. Set here, it
     * runs direct. */
    DS_GREDUCE_AUTO = DS_GROUP_ALLREDUCE_AUTO,
};
void ds_greduce_set_algo(ds_greduce *r, enum ds_greduce_algo algo);

/* The next reduction runs direct whatever the algorithm: the caller knows
 * a member is in doubt (it missed a deadline and has not been heard from
 * since). A ring or butterfly waits on every step of every member, so one
 * frozen member costs the whole group a deadline, and members that differ
 * on whom to skip run different schedules; direct costs only the doubted
 * member's chunk, and members still on the ring follow it (above). */
void ds_greduce_direct_once(ds_greduce *r);
const char *ds_greduce_algo_name(enum ds_greduce_algo algo);

/* group.allreduce = auto with group.overlap: a reduction's time as
 * alpha + beta * floats for direct [0] and the butterfly [1], fitted to a
 * group's own reductions of several lengths (the layers' buckets and the
 * step's own), so each length gets the algorithm the model says is
 * faster: latency-bound small buckets and bandwidth-bound large ones may
 * differ (docs/gossip.md, "Layer by layer"). */
typedef struct ds_greduce_cost {
    float alpha_ms[2];  /* a reduction's fixed cost */
    float beta_ms[2];   /* its cost per float */
} ds_greduce_cost;

/* Least squares of ms[i] = alpha + beta * floats[i] over n samples:
 * beta and alpha are kept non-negative (a negative slope or intercept is
 * noise: the other is refitted alone); samples of one length only give
 * beta = 0 and alpha their mean. 0, or -EINVAL without samples. */
int ds_greduce_fit(const double *floats, const double *ms, size_t n, float *alpha,
                   float *beta);

/* The model's algorithm for a reduction of `floats`: DS_GREDUCE_DIRECT or
 * DS_GREDUCE_BUTTERFLY, direct on a tie. The same floats give the same
 * answer on every member. */
enum ds_greduce_algo ds_greduce_pick(const ds_greduce_cost *c, size_t floats);

/* The mean of the members' whole vectors, for the last reduction of a
 * run (the final sync, node/runtime/rounds.c): each member sends all of
 * vec to every member not skipped hard, waits until deadline_ns for every
 * such member (one skipped softly too: a member only slow sends to every
 * member alike), and sets vec to the mean, summed in member order, of
 * the vectors that came, its own included; a member skipped hard is left
 * out even when its vector comes. No member owns a part, so a member that
 * is dead, or still in the view but gone, costs no part of the result:
 * the members that had the same vectors hold the same bytes (the direct
 * algorithm would leave a dead owner's chunk as each member's own).
 * res: contributions (the vectors averaged), chunks_missing (the members
 * whose vector is not in it), complete (all G). Bytes: G - 1 vectors out
 * and in per member, against 2 (G - 1) / G of one for the others; G * n
 * at most DS_GREDUCE_WHOLE_MAX floats (room for every member's vector),
 * else -EINVAL: the caller then runs ds_greduce_run. 0, -EINVAL or
 * -ENOMEM. */
#define DS_GREDUCE_WHOLE_MAX ((size_t)16 << 20)
int ds_greduce_mean_all(ds_greduce *r, const ds_gossip_io *io, float *vec, size_t n,
                        uint32_t G, uint32_t me, const uint8_t *skip, uint64_t tag,
                        uint64_t deadline_ns, ds_greduce_result *res);

/* Chunk c of n cut into G near-equal ranges (the one cut both the owner
 * and the members use). */
void ds_greduce_chunk(size_t n, uint32_t G, uint32_t c, size_t *off, size_t *len);

#endif
