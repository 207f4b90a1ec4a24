/*
 * node/gossip/latency.c: the adaptive deadline and the slow-partner rule
 * (see latency.h for the rules and why). Small rings and a sort of at
 * most DS_GLAT_ROUNDS values per question: it is asked once per round.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "node/gossip/latency.h"

void ds_glat_cfg_default(ds_glat_cfg *cfg, int timeout_ms, int floor_ms)
{
    const uint64_t ceil = (uint64_t)(timeout_ms > 0 ? timeout_ms : 1) * 1000000u;
    const uint64_t floor = (uint64_t)(floor_ms > 0 ? floor_ms : DS_GLAT_FLOOR_MS) * 1000000u;
    cfg->ceil_ns = ceil;
    cfg->floor_ns = floor < ceil ? floor : ceil;
    cfg->factor = 4.0;
    cfg->slow_ratio = 3.0;
    cfg->clear_ratio = 1.5;
    cfg->floor_slow_ns = 5000000u; /* 5 ms */
    cfg->min_samples = 4;
    cfg->share_factor = 2.0;
    cfg->share_up = 1.25;
}

int ds_glat_init(ds_glat *t, const ds_glat_cfg *cfg)
{
    if (!t || !cfg || cfg->floor_ns > cfg->ceil_ns || cfg->factor < 1.0 ||
        cfg->clear_ratio <= 1.0 || cfg->clear_ratio > cfg->slow_ratio || cfg->share_factor <= 0 ||
        cfg->share_up <= 1.0)
        return -EINVAL;
    memset(t, 0, sizeof(*t));
    t->cfg = *cfg;
    return 0;
}

void ds_glat_free(ds_glat *t)
{
    if (!t)
        return;
    free(t->peer);
    t->peer = NULL;
    t->G = 0;
}

int ds_glat_set_view(ds_glat *t, uint32_t G)
{
    struct ds_glat_peer *p = calloc(G ? G : 1, sizeof(*p));
    if (!p)
        return -ENOMEM;
    for (uint32_t i = 0; i < G; i++)
        p[i].share = 1.0f;
    free(t->peer);
    t->peer = p;
    t->G = G;
    return 0;
}

void ds_glat_round(ds_glat *t, uint64_t wait_ns)
{
    t->round[t->pos] = wait_ns;
    t->pos = (t->pos + 1) % DS_GLAT_ROUNDS;
    if (t->n < DS_GLAT_ROUNDS)
        t->n++;
}

void ds_glat_peer(ds_glat *t, uint32_t peer, uint64_t ns)
{
    if (peer >= t->G)
        return;
    struct ds_glat_peer *p = &t->peer[peer];
    p->s[p->pos] = ns;
    p->pos = (p->pos + 1) % DS_GLAT_PEER;
    if (p->n < DS_GLAT_PEER)
        p->n++;
    p->fresh++;
}

void ds_glat_period(ds_glat *t, uint64_t period_ns)
{
    t->period[t->ppos] = period_ns;
    t->ppos = (t->ppos + 1) % DS_GLAT_ROUNDS;
    if (t->pn < DS_GLAT_ROUNDS)
        t->pn++;
}

static int cmp_u64(const void *a, const void *b)
{
    const uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return x < y ? -1 : x > y;
}

/* The lower median of n values (n >= 1), on a copy. */
static uint64_t median(const uint64_t *v, uint32_t n)
{
    uint64_t c[DS_GLAT_ROUNDS > DS_GLAT_PEER ? DS_GLAT_ROUNDS : DS_GLAT_PEER];
    memcpy(c, v, n * sizeof(*v));
    qsort(c, n, sizeof(*c), cmp_u64);
    return c[(n - 1) / 2];
}

uint64_t ds_glat_deadline_ns(const ds_glat *t)
{
    if (t->n < t->cfg.min_samples)
        return t->cfg.ceil_ns;
    const double d = t->cfg.factor * (double)median(t->round, t->n);
    if (d <= (double)t->cfg.floor_ns)
        return t->cfg.floor_ns;
    if (d >= (double)t->cfg.ceil_ns)
        return t->cfg.ceil_ns;
    return (uint64_t)d;
}

uint64_t ds_glat_peer_median(const ds_glat *t, uint32_t peer)
{
    if (peer >= t->G || t->peer[peer].n == 0)
        return 0;
    return median(t->peer[peer].s, t->peer[peer].n);
}

uint64_t ds_glat_peer_mean(const ds_glat *t, uint32_t peer)
{
    if (peer >= t->G || t->peer[peer].n == 0)
        return 0;
    const struct ds_glat_peer *p = &t->peer[peer];
    uint64_t s = 0;
    for (uint32_t i = 0; i < p->n; i++)
        s += p->s[i];
    return s / p->n;
}

/* The verdict without hysteresis' memory: ratio is the threshold. */
static int slower_than(const ds_glat *t, uint32_t peer, double ratio)
{
    if (peer >= t->G || t->peer[peer].n < t->cfg.min_samples)
        return 0;
    const uint64_t mine = ds_glat_peer_mean(t, peer);
    if (mine <= t->cfg.floor_slow_ns)
        return 0;
    /* The median of all partners' means, this one's included: a
     * straggler is a minority. When most partners look slow, this node is
     * the one ahead of the others in rounds (after a partition heals, the
     * half behind answers late from rounds it has not reached), and not
     * waiting for them would only take it further ahead, alone. */
    uint64_t all[DS_GLAT_ROUNDS];
    uint32_t k = 0;
    for (uint32_t i = 0; i < t->G && k < DS_GLAT_ROUNDS; i++)
        if (t->peer[i].n >= t->cfg.min_samples)
            all[k++] = ds_glat_peer_mean(t, i);
    if (k < 2)
        return 0;
    return (double)mine > ratio * (double)median(all, k);
}

int ds_glat_slow(ds_glat *t, uint32_t peer)
{
    if (peer >= t->G)
        return 0;
    struct ds_glat_peer *p = &t->peer[peer];
    p->slow = slower_than(t, peer, p->slow ? t->cfg.clear_ratio : t->cfg.slow_ratio);
    return p->slow;
}

float ds_glat_peer_share(const ds_glat *t, uint32_t peer)
{
    return peer < t->G ? t->peer[peer].share : 1.0f;
}

float ds_glat_share(ds_glat *t, uint32_t peer)
{
    if (peer >= t->G)
        return 1.0f;
    struct ds_glat_peer *p = &t->peer[peer];
    if (p->n < t->cfg.min_samples || t->pn < t->cfg.min_samples || p->fresh < DS_GLAT_PEER / 2)
        return p->share;
    p->fresh = 0;
    uint64_t target = (uint64_t)(t->cfg.share_factor * (double)median(t->period, t->pn));
    if (target < t->cfg.floor_slow_ns)
        target = t->cfg.floor_slow_ns;
    const double mean = (double)ds_glat_peer_mean(t, peer);
    if (mean > (double)target) {
        double f = (double)target / mean;
        p->share *= (float)(f < 0.5 ? 0.5 : f);
        if (p->share < DS_GLAT_SHARE_MIN)
            p->share = DS_GLAT_SHARE_MIN;
    } else if (mean < 0.5 * (double)target) {
        p->share *= (float)t->cfg.share_up;
        if (p->share > 1.0f)
            p->share = 1.0f;
    }
    return p->share;
}

int ds_glat_ahead(uint64_t mine, uint64_t *rounds, uint32_t n, uint64_t slack)
{
    if (n < 2)
        return 0;
    qsort(rounds, n, sizeof(*rounds), cmp_u64);
    const uint64_t med = rounds[(n - 1) / 2];
    return mine > med && mine - med > slack;
}
