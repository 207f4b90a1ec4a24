/*
 * node/runtime/lag.c: the membership lag from a decaying peak of the
 * measured pace (see lag.h for the rules and why).
 */
#include "node/runtime/lag.h"

void ds_lag_init(ds_lag *l, uint64_t lag_rounds)
{
    *l = (ds_lag){.lag = lag_rounds};
}

uint64_t ds_lag_rounds(double rate)
{
    const double lag = rate * DS_LAG_SECONDS + 0.5;
    return lag < DS_LAG_MIN_ROUNDS   ? DS_LAG_MIN_ROUNDS
           : lag > DS_LAG_MAX_ROUNDS ? DS_LAG_MAX_ROUNDS
                                     : (uint64_t)lag;
}

uint64_t ds_join_lag_rounds(uint64_t cluster_lag, double snapshot_rate, uint64_t age_ms)
{
    const double rate = cluster_lag > DS_LAG_MIN_ROUNDS ? (double)cluster_lag / DS_LAG_SECONDS
                                                        : snapshot_rate;
    if (!(rate > 0))
        return 0;
    const double j = rate * DS_JOIN_LAG_MS / 1000.0 + 0.5;
    const uint64_t lag = (j < DS_JOIN_LAG_MIN_ROUNDS ? DS_JOIN_LAG_MIN_ROUNDS : (uint64_t)j) +
                         (uint64_t)(rate * (double)age_ms / 1000.0 + 0.999);
    const uint64_t full = cluster_lag ? cluster_lag : ds_lag_rounds(rate);
    return lag < full ? lag : 0;
}

int ds_lag_update(ds_lag *l, uint64_t now_ms, uint64_t round)
{
    if (!l->started) {
        l->started = 1;
        l->t0_ms = now_ms;
        l->r0 = round;
        return 0;
    }
    /* The round went back (a group member took member 0's step, rounds.c
     * take_position): the window starts again from here. Its unsigned
     * difference made a rate of 1e19 rounds/s, a lag of 2^20 rounds that
     * the decaying peak kept for good, and a death this node declared
     * took effect at round 2^20 + r, never: its group kept the dead
     * member and reduced without its chunk to the end (CI, elastic
     * group_member_killed_and_another_frozen_ring). */
    if (round < l->r0) {
        l->t0_ms = now_ms;
        l->r0 = round;
        return 0;
    }
    if (now_ms - l->t0_ms < DS_LAG_WINDOW_MS)
        return 0;
    const double rate = (double)(round - l->r0) * 1000.0 / (double)(now_ms - l->t0_ms);
    l->rate = rate;
    l->peak = rate > l->peak * 0.8 ? rate : l->peak * 0.8;
    const uint64_t lag = ds_lag_rounds(l->peak);
    int changed = 0;
    if (lag > l->lag * 5 / 4 || lag < l->lag * 3 / 4) {
        l->lag = lag;
        changed = 1;
    }
    l->t0_ms = now_ms;
    l->r0 = round;
    return changed;
}

void ds_lag_restart(ds_lag *l, uint64_t now_ms, uint64_t round)
{
    l->started = 1;
    l->t0_ms = now_ms;
    l->r0 = round;
}
