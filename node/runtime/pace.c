/*
 * node/runtime/pace.c: the joiner's pace (see pace.h for the rule and why).
 */
#include "node/runtime/pace.h"

void ds_pace_set(ds_pace *p, uint64_t now_ns, uint64_t round, double rate)
{
    p->t0_ns = now_ns;
    p->r0 = round;
    p->rate = rate;
}

uint64_t ds_pace_wait_ns(const ds_pace *p, uint64_t round, uint64_t join_round, uint64_t now_ns)
{
    if (p->rate <= 0 || round >= join_round || round <= p->r0)
        return 0;
    const uint64_t due = p->t0_ns + (uint64_t)((double)(round - p->r0) / p->rate * 1e9);
    return due > now_ns ? due - now_ns : 0;
}
