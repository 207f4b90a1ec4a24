/*
 * node/runtime/shadow.h: a joiner shadows the cluster before its join
 * round. A pure module: the caller passes the time (now_ns), the rounds
 * and the outcome of each fetch; no locks, no clock, no globals. The
 * engine asks ds_shadow_next before each step while it shadows, sleeps and
 * fetches as told, and reports each fetch to ds_shadow_fetched.
 *
 * The rules (docs/gossip.md, "Joining a running cluster"), and why:
 * - Until its join round a joiner is in nobody's view, and steps it trains
 *   alone only drift from the cluster's model. So it does not train: it
 *   takes a fresh snapshot of the cluster's model, step and rounds every
 *   half second (DS_SHADOW_EVERY_S), and trains only the last few rounds
 *   before its join round, at the cluster's pace (pace.h). Before this, a
 *   joiner that trained alone was 3.5 pt behind the others 200 steps
 *   after joining (commit 5adf3a2). "The last few" is a margin of
 *   4 rounds + 5% of the pace (commit cb1b72e).
 * - The last snapshot must land before that margin: one that landed after
 *   the join round had every partner of ours wait out its timeout while
 *   we were still fetching, and the cluster stalled 10 to 28 s at 8 nodes.
 *   So the wait before the next fetch shrinks to fit, allowing
 *   DS_SHADOW_FETCH_S for the fetch itself (17-46 ms measured at 8 nodes
 *   on loopback, 310 ms for the first one, which sets up the connection),
 *   and when no fetch fits any more the joiner trains the remaining rounds
 *   itself (commit 3f33fb9).
 * - When two members admitted us (a JOIN retried to a second seed) with
 *   different join rounds, the smaller wins, on our own table too: it did
 *   not, and the others counted us in the view 25 rounds before we came
 *   (commit 3f33fb9).
 * - After DS_SHADOW_TRIES failed fetches in a row the cluster may be gone
 *   (it finished, or we were cut off): the joiner goes on alone from the
 *   last state it has.
 */
#ifndef DS_NODE_RUNTIME_SHADOW_H
#define DS_NODE_RUNTIME_SHADOW_H

#include <stdint.h>

#include "node/runtime/pace.h"

#define DS_SHADOW_EVERY_S 0.5
#define DS_SHADOW_FETCH_S 0.15
#define DS_SHADOW_TRIES 3

/* How many rounds before its join round a joiner stops shadowing and
 * trains: 4 + 5% of the cluster's pace (rounds/s). */
uint64_t ds_shadow_margin(double rate);

/* Still shadowing at round `round` (our join round join_round, the
 * cluster's pace p at now_ns). Returns 1: wait *wait_s seconds, then
 * fetch a fresh snapshot; 0: stop shadowing and train from here. */
int ds_shadow_next(const ds_pace *p, uint64_t round, uint64_t join_round, uint64_t now_ns,
                   double *wait_s);

/* Our join round, given the one `seen` in our own member table now
 * (DS_MEMBERSHIP_NO_ROUND, UINT64_MAX, when unknown): the smaller wins. */
uint64_t ds_shadow_join_round(uint64_t ours, uint64_t seen);

/* A fetch ended (ok: a snapshot arrived). *failures counts the failures
 * in a row. Returns 1 when shadowing must stop (DS_SHADOW_TRIES in a
 * row), else 0. */
int ds_shadow_fetched(int *failures, int ok);

#endif
