/*
 * node/runtime/lag.h: how many rounds a membership change (join, leave,
 * death) waits before it applies, sized from the pace this node measures.
 * A pure module: the caller passes the time (now_ms) and the round; no
 * locks, no clock, no globals. The engine calls ds_lag_update after each
 * training step and tells membership the new lag when it returns 1.
 *
 * The rules (docs/gossip.md, "The lag"), and why:
 * - The lag is DS_LAG_SECONDS' worth of rounds, never below 32 and never
 *   above 2^20. At tens of rounds a second a fixed 32 rounds was shorter
 *   than SWIM needs to tell every member (a join reached 8 nodes in
 *   1.5 s), and nodes ran rounds on different views (commit 5adf3a2).
 * - The pace is measured over windows of at least 2 s, and the lag is
 *   sized from a peak of it that decays by a fifth per window, not from
 *   the last window: the rounds right after a crash wait out their
 *   timeouts until the suspicion spreads, and a lag sized from that stall
 *   (32 rounds) was under half a second once the rounds ran again, so
 *   members applied the death late (commit 3f33fb9).
 * - Membership is told only when the lag moves by more than a quarter, so
 *   the noise of the measurement does not change it every window.
 */
#ifndef DS_NODE_RUNTIME_LAG_H
#define DS_NODE_RUNTIME_LAG_H

#include <stdint.h>

#define DS_LAG_SECONDS 5
#define DS_LAG_MIN_ROUNDS 32
#define DS_LAG_MAX_ROUNDS (1u << 20)
#define DS_LAG_WINDOW_MS 2000

/* A joiner that has the cluster's state brings its join round forward to
 * this many rounds ahead (membership pushes it to every member at once):
 * DS_JOIN_LAG_MS of the cluster's pace, at least DS_JOIN_LAG_MIN_ROUNDS.
 * The pace is the cluster's peak (its lag / DS_LAG_SECONDS) when its lag
 * is above the floor, else the snapshot's rate. Plus the rounds the
 * cluster ran since the snapshot may have been taken (age_ms: since we
 * asked for it): the round we know is the snapshot's, and members ahead of
 * it by the transfer time learned of a join round brought forward to it
 * after they had passed it (elastic test, 6 processes on 2 cores: a member
 * at step 890 without the joiner whose round was 881). Returns 0 (keep the join
 * round the seed gave) when neither is known, or when the result is not
 * shorter than the cluster's lag. Why: the seed's join round is a full
 * lag (5 s) out, sized for a change to spread by piggyback; a joiner was
 * in the view about 6 s after it started (or never, when it joined a fast
 * cluster late in its run), and issue 17 asks for 2 s. Why a quarter of a
 * second: the push reaches every member in milliseconds here, and the
 * round needs only that and the spread of the members' rounds; with half a
 * second a joiner of 3 nodes on this 2-core machine was in the view 1.85 to
 * 2.40 s after its process started (dsbench elastic --nodes 3), of which
 * the wait for the round was the largest part after the start-up itself. */
#define DS_JOIN_LAG_MS 250
#define DS_JOIN_LAG_MIN_ROUNDS 4
uint64_t ds_join_lag_rounds(uint64_t cluster_lag, double snapshot_rate, uint64_t age_ms);

/* Owned by the caller; not thread-safe. */
typedef struct ds_lag {
    int started;
    uint64_t t0_ms, r0; /* the current window: its start and round then */
    double peak;        /* rounds/s the lag is sized for (decaying peak) */
    double rate;        /* rounds/s over the last finished window */
    uint64_t lag;       /* rounds: what membership was last told */
} ds_lag;

/* The lag for a pace of `rate` rounds/s: DS_LAG_SECONDS of rounds within
 * [DS_LAG_MIN_ROUNDS, DS_LAG_MAX_ROUNDS]. */
uint64_t ds_lag_rounds(double rate);

/* Start with membership's initial lag (lag_rounds). */
void ds_lag_init(ds_lag *l, uint64_t lag_rounds);

/* The node is at round `round` at time now_ms. The first call starts the
 * first window; a window of at least DS_LAG_WINDOW_MS ends at the next
 * call, updating l->rate and l->peak. Returns 1 when l->lag changed
 * (membership must be told), else 0. */
int ds_lag_update(ds_lag *l, uint64_t now_ms, uint64_t round);

/* The node's round moved by itself, not by the pace (a group member took
 * member 0's step: forward or back by the rounds they were apart): the
 * window starts again at (now_ms, round), the peak and the lag stay.
 * Without it a jump forward of 200 rounds counted as 100 rounds/s more
 * for a window, and a jump back as 10^19 (ds_lag_update guards that one
 * too). */
void ds_lag_restart(ds_lag *l, uint64_t now_ms, uint64_t round);

#endif
