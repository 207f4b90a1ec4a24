/*
 * node/runtime/leave.c: lingering and draining at the end of a run (see
 * leave.h for the rules and why).
 */
#include "node/runtime/leave.h"

int ds_linger_start(ds_linger *l, int leaving, int signalled, uint64_t current_round,
                    uint64_t leave_round, uint64_t now_ms)
{
    if (!leaving || signalled)
        return 0;
    l->next_round = current_round + 1;
    l->leave_round = leave_round;
    l->until_ms = now_ms + DS_LINGER_MS;
    l->base_round = l->base_ns = l->round_ns = 0;
    return 1;
}

void ds_linger_pace(ds_linger *l, uint64_t base_round, uint64_t base_ns, uint64_t round_ns)
{
    l->base_round = base_round;
    l->base_ns = base_ns;
    l->round_ns = round_ns;
}

uint64_t ds_linger_wait_ns(const ds_linger *l, uint64_t now_ns)
{
    if (!l->round_ns || l->next_round <= l->base_round)
        return 0;
    const uint64_t k = l->next_round - l->base_round;
    if (k > UINT64_MAX / l->round_ns)
        return UINT64_MAX;
    const uint64_t at = l->base_ns + k * l->round_ns;
    return at > now_ns ? at - now_ns : 0;
}

void ds_round_clock_tick(ds_round_clock *c, uint64_t round, uint64_t now_ns)
{
    const uint32_t i = c->n % DS_ROUND_CLOCK;
    c->round[i] = round;
    c->ns[i] = now_ns;
    c->n++;
}

uint64_t ds_round_clock_pace(const ds_round_clock *c, uint64_t max_ns, uint64_t *last_round,
                             uint64_t *last_ns)
{
    if (!c->n)
        return 0;
    const uint32_t newest = (c->n - 1) % DS_ROUND_CLOCK;
    const uint32_t oldest = c->n < DS_ROUND_CLOCK ? 0 : c->n % DS_ROUND_CLOCK;
    *last_round = c->round[newest];
    *last_ns = c->ns[newest];
    if (c->n < 2 || c->round[newest] <= c->round[oldest] || c->ns[newest] <= c->ns[oldest])
        return 0;
    const uint64_t pace =
        (c->ns[newest] - c->ns[oldest]) / (c->round[newest] - c->round[oldest]);
    return pace < max_ns ? pace : max_ns;
}

int ds_linger_more(const ds_linger *l, int signals, uint64_t now_ms)
{
    return l->next_round < l->leave_round && signals < 2 && now_ms < l->until_ms;
}

int ds_leave_others_count_on_us(const ds_member_info *all, uint32_t n, uint64_t self_id)
{
    for (uint32_t i = 0; i < n; i++)
        if (all[i].id != self_id &&
            (all[i].state == DS_MEMBER_ALIVE || all[i].state == DS_MEMBER_SUSPECT))
            return 1;
    return 0;
}

uint64_t ds_leave_drain_until(int signalled, uint64_t now_ms)
{
    return now_ms + (signalled ? DS_DRAIN_SIGNALLED_MS : DS_DRAIN_MS);
}
