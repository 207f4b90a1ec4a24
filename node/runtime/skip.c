/*
 * node/runtime/skip.c: the skip windows (see skip.h for the rules and
 * why). A linear table of at most 64 peers: it is consulted once per view
 * member per round, and holds only the peers that misbehaved lately.
 */
#include <errno.h>

#include "node/runtime/skip.h"

/* The entry of `id`, or -1. */
static int find(const ds_skip_table *t, uint64_t id)
{
    for (int i = 0; i < t->n; i++)
        if (t->ids[i] == id)
            return i;
    return -1;
}

/* The entry of `id`, a new one, or -ENOSPC. *fresh: it is new. */
static int entry(ds_skip_table *t, uint64_t id, int *fresh)
{
    int i = find(t, id);
    *fresh = i < 0;
    if (!*fresh)
        return i;
    i = t->n;
    if (t->n == DS_SKIP_MAX)
        return -ENOSPC;
    t->ids[i] = id;
    t->until[i] = 0;
    t->until_ms[i] = 0;
    t->fails[i] = 0;
    t->hard[i] = 0;
    t->n++;
    return i;
}

int ds_skip_missed(ds_skip_table *t, uint64_t id, uint64_t round, uint64_t now_ms, int hard)
{
    int fresh;
    const int i = entry(t, id, &fresh);
    if (i < 0)
        return i;
    const uint32_t f = t->fails[i] < DS_SKIP_MAX_DOUBLINGS ? t->fails[i] : DS_SKIP_MAX_DOUBLINGS;
    const uint64_t until = round + 1 + ((uint64_t)DS_SKIP_ROUNDS << f);
    t->fails[i]++;
    if (until > t->until[i])
        t->until[i] = until;
    if (now_ms + t->min_ms > t->until_ms[i])
        t->until_ms[i] = now_ms + t->min_ms;
    if (hard)
        t->hard[i] = 1;
    return fresh;
}

int ds_skip_hold(ds_skip_table *t, uint64_t id)
{
    int fresh;
    const int i = entry(t, id, &fresh);
    if (i < 0)
        return i;
    t->until[i] = UINT64_MAX;
    t->hard[i] = 1;
    return fresh;
}

void ds_skip_heard(ds_skip_table *t, uint64_t id)
{
    const int i = find(t, id);
    if (i < 0)
        return;
    t->n--;
    t->ids[i] = t->ids[t->n];
    t->until[i] = t->until[t->n];
    t->until_ms[i] = t->until_ms[t->n];
    t->fails[i] = t->fails[t->n];
    t->hard[i] = t->hard[t->n];
}

enum ds_skip_verdict ds_skip_check(const ds_skip_table *t, uint64_t id, uint64_t round,
                                   uint64_t now_ms)
{
    const int i = find(t, id);
    if (i < 0 || (round >= t->until[i] && now_ms >= t->until_ms[i]))
        return DS_SKIP_WAIT;
    return t->hard[i] ? DS_SKIP_ALL : DS_SKIP_NOWAIT;
}

int ds_skip_listed(const ds_skip_table *t, uint64_t id)
{
    return find(t, id) >= 0;
}
