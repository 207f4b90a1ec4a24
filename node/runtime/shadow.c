/*
 * node/runtime/shadow.c: when a shadowing joiner fetches and when it stops
 * (see shadow.h for the rules and why).
 */
#include "node/runtime/shadow.h"

uint64_t ds_shadow_margin(double rate)
{
    return 4 + (uint64_t)(rate * 0.05);
}

int ds_shadow_next(const ds_pace *p, uint64_t round, uint64_t join_round, uint64_t now_ns,
                   double *wait_s)
{
    const uint64_t margin = ds_shadow_margin(p->rate);
    /* Time until the cluster, at its pace since the last snapshot, is
     * `margin` rounds before our join round: the next fetch must land
     * by then. */
    double slack_s = 1e9;
    if (p->rate > 0 && join_round > p->r0 + margin)
        slack_s = (double)(join_round - margin - p->r0) / p->rate -
                  (double)(now_ns - p->t0_ns) * 1e-9;
    if (round + margin >= join_round || slack_s <= DS_SHADOW_FETCH_S)
        return 0;
    double w = slack_s - DS_SHADOW_FETCH_S;
    *wait_s = w > DS_SHADOW_EVERY_S ? DS_SHADOW_EVERY_S : w;
    return 1;
}

uint64_t ds_shadow_join_round(uint64_t ours, uint64_t seen)
{
    /* UINT64_MAX (unknown) is never the smaller. */
    return seen < ours ? seen : ours;
}

int ds_shadow_fetched(int *failures, int ok)
{
    *failures = ok ? 0 : *failures + 1;
    return *failures >= DS_SHADOW_TRIES;
}
