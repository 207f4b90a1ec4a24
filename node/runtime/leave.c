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
    return 1;
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
