/*
 * node/runtime/pace.h: a joiner keeps the cluster's pace until its join
 * round. A pure module: the caller passes the time (now_ns) and the
 * rounds; no locks, no clock, no globals. The engine sleeps for what
 * ds_pace_wait_ns says before each step.
 *
 * The rule (docs/gossip.md, "Joining a running cluster"), and why: until
 * its join round a joiner is in nobody's view and runs its rounds alone,
 * as fast as it computes. A joiner that trained alone arrived 2.7 s ahead
 * of the others and stalled the whole cluster for 10 s (commit 5adf3a2).
 * So from each model snapshot it receives (which carries the round the
 * cluster was at and its rounds per second) it runs round r no earlier
 * than (r - snapshot round) / rate seconds after the snapshot arrived.
 * From its join round on the gossip rounds pace it like everyone else.
 *
 * Nanoseconds, not milliseconds: at 100+ rounds/s a round is a few
 * milliseconds, and the schedule would otherwise round to whole ones.
 */
#ifndef DS_NODE_RUNTIME_PACE_H
#define DS_NODE_RUNTIME_PACE_H

#include <stdint.h>

/* A zeroed ds_pace knows no pace (never waits). Owned by the caller; not
 * thread-safe. */
typedef struct ds_pace {
    uint64_t t0_ns; /* when the last snapshot arrived */
    uint64_t r0;    /* the cluster's round in it */
    double rate;    /* the cluster's rounds per second in it */
} ds_pace;

/* A snapshot of a cluster at round `round`, running `rate` rounds/s,
 * arrived at now_ns. */
void ds_pace_set(ds_pace *p, uint64_t now_ns, uint64_t round, double rate);

/* How long to wait before running round `round` (0: go now). Never waits
 * without a known pace, at or after the join round, or for a round not
 * past the snapshot's. */
uint64_t ds_pace_wait_ns(const ds_pace *p, uint64_t round, uint64_t join_round, uint64_t now_ns);

#endif
