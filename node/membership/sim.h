/*
 * node/membership/sim.h: a simulated network with simulated time for the
 * membership protocol (node/membership/membership.h), after the idea of Tarantool's
 * swim fakenet: N real ds_membership instances, their frames carried by an
 * in-process event queue, a millisecond clock that jumps from one event to
 * the next, faults injected by the test. One thread; everything random comes
 * from the seed, so a run is reproducible bit for bit.
 *
 * Model:
 *   - a frame sent at t arrives at t + uniform[delay_min, delay_max] + the
 *     sender's and the receiver's slow delay; it is lost with probability
 *     `drop` (or the link's own probability), when either end is crashed,
 *     or when the ends are on different sides of a partition at delivery;
 *   - a slow node (set_slow) is alive but late: everything it sends leaves
 *     `extra` ms late and everything sent to it is handled `extra` ms late
 *     (a node saturated by training, design §6);
 *   - a frozen node (freeze) is SIGSTOPped: no timers, frames to it wait;
 *     on thaw its timers run first, then the frames that waited;
 *   - a crashed node is gone for good: silent, and frames to it vanish;
 *   - rounds: every round_ms each running node gets set_round(now/round_ms).
 *
 * Every membership event is logged with its time and node; subjects are
 * mapped back to node indices. Not thread-safe; no Criterion dependency, so
 * dsbench runs the same simulations.
 */
#ifndef DS_NODE_MEMBERSHIP_SIM_H
#define DS_NODE_MEMBERSHIP_SIM_H

#include <stddef.h>
#include <stdint.h>

#include "node/membership/membership.h"

typedef struct ds_swimnet ds_swimnet;

/* The cluster name every simulated node uses (its id: ds_swimnet_cluster). */
#define DS_SWIMNET_CLUSTER "swim-fakenet"

typedef struct ds_swimnet_opts {
    uint32_t n;     /* nodes, numbered 0..n-1, created but not started */
    uint64_t seed;  /* network randomness; node i's protocol seed derives from it */
    ds_membership_cfg cfg; /* template; identity fields are set per node */
    uint32_t delay_min_ms, delay_max_ms;
    double drop;
    uint32_t round_ms; /* 0: no rounds (set_round never called) */
} ds_swimnet_opts;

/* n nodes, seed, protocol defaults, 1..10 ms delay, no loss, round_ms =
 * period_ms. */
void ds_swimnet_opts_default(ds_swimnet_opts *o, uint32_t n, uint64_t seed);

/* Returns 0, -EINVAL or -ENOMEM. The caller owns *out. */
int ds_swimnet_create(const ds_swimnet_opts *o, ds_swimnet **out);
/* NULL-safe; clears *net. */
void ds_swimnet_destroy(ds_swimnet **net);

/* Start node i as a cluster of one, or joining through the given nodes. */
int ds_swimnet_bootstrap(ds_swimnet *net, uint32_t i);
int ds_swimnet_join(ds_swimnet *net, uint32_t i, const uint32_t *seeds, size_t n_seeds);
/* Convenience: node 0 bootstraps, nodes 1..count-1 join through node 0 at
 * once, then run until every started node sees the same view of `count`
 * members at its round (checked each period). 0, or -ETIMEDOUT after
 * max_ms. */
int ds_swimnet_form(ds_swimnet *net, uint32_t count, uint64_t max_ms);

void ds_swimnet_run_until(ds_swimnet *net, uint64_t t_ms);
void ds_swimnet_run_for(ds_swimnet *net, uint64_t dt_ms);
uint64_t ds_swimnet_now(const ds_swimnet *net);
uint64_t ds_swimnet_round(const ds_swimnet *net);

/* Faults. */
void ds_swimnet_crash(ds_swimnet *net, uint32_t i);
void ds_swimnet_set_slow(ds_swimnet *net, uint32_t i, uint32_t extra_ms);
void ds_swimnet_freeze(ds_swimnet *net, uint32_t i, int frozen);
void ds_swimnet_set_side(ds_swimnet *net, uint32_t i, int side);
/* Loss probability of frames from a to b (directed). */
int ds_swimnet_set_link_drop(ds_swimnet *net, uint32_t a, uint32_t b, double p);

/* Hand a frame to node i now, as if it came from from_addr (may be NULL).
 * Returns ds_membership_recv's result. */
int ds_swimnet_inject(ds_swimnet *net, uint32_t i, const char *from_addr, const uint8_t *frame,
                      size_t len);

/* Introspection. */
uint32_t ds_swimnet_size(const ds_swimnet *net);
ds_membership *ds_swimnet_node(ds_swimnet *net, uint32_t i);
uint64_t ds_swimnet_id(const ds_swimnet *net, uint32_t i);
const char *ds_swimnet_addr(const ds_swimnet *net, uint32_t i);
const char *ds_swimnet_name(const ds_swimnet *net, uint32_t i);
const uint8_t *ds_swimnet_pk(const ds_swimnet *net, uint32_t i);
/* Index of the node with this id, or -1. */
int ds_swimnet_index(const ds_swimnet *net, uint64_t id);
/* Started, not crashed (frozen and slow nodes are up). */
int ds_swimnet_is_up(const ds_swimnet *net, uint32_t i);
/* Node i has logged DS_MEV_SELF_JOINED (bootstrapped or joined). */
int ds_swimnet_joined(const ds_swimnet *net, uint32_t i);
uint64_t ds_swimnet_cluster(const ds_swimnet *net);

typedef struct ds_swimnet_ev {
    uint64_t t;
    uint32_t node;
    enum ds_membership_event_kind kind;
    int32_t subject; /* node index of the event's member, -1 if none */
    uint32_t incarnation;
    uint64_t round, epoch, join_round;
    uint32_t view_size;
    int in_view;
} ds_swimnet_ev;

/* The log so far (borrowed until the next run/destroy). */
const ds_swimnet_ev *ds_swimnet_events(const ds_swimnet *net, size_t *n);
/* Earliest time >= since at which any node logged `kind` about subject
 * (UINT64_MAX if never). */
uint64_t ds_swimnet_first(const ds_swimnet *net, enum ds_membership_event_kind kind,
                          int32_t subject, uint64_t since);
/* When node `node` first logged kind about subject at or after since. */
uint64_t ds_swimnet_first_at(const ds_swimnet *net, uint32_t node,
                             enum ds_membership_event_kind kind, int32_t subject, uint64_t since);
/* How many events of kind about subject (any subject when -2) since then. */
size_t ds_swimnet_count(const ds_swimnet *net, enum ds_membership_event_kind kind,
                        int32_t subject, uint64_t since);

/* Do all running joined nodes (not crashed, not frozen) compute the same
 * view (members and epoch) at `round`? Returns the number of nodes that
 * disagree with node `ref` (the first running node); *G and *epoch are the
 * reference view's. */
uint32_t ds_swimnet_view_mismatch(ds_swimnet *net, uint64_t round, uint32_t *G, uint64_t *epoch);

/* Called after every round boundary (after set_round on every node). */
typedef void (*ds_swimnet_round_fn)(void *ctx, ds_swimnet *net, uint64_t round);
void ds_swimnet_on_round(ds_swimnet *net, ds_swimnet_round_fn fn, void *ctx);

typedef struct ds_swimnet_stats {
    uint64_t sent, delivered, lost, bytes;
} ds_swimnet_stats;
void ds_swimnet_stats_get(const ds_swimnet *net, ds_swimnet_stats *st);

#endif
