/* node/gossip/group.c: see group.h. */
#include "config.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "base/log.h"
#include "node/gossip/group.h"

enum { PHASE_CONTRIB = 0, PHASE_RESULT = 1, PHASE_LIST = 2 };
#define KEEP_MAX 64 /* messages of later reductions kept, at most */

struct kept {
    ds_gmsg m;
    float *val; /* owned */
};

struct ds_greduce {
    size_t max_n;
    uint32_t cap_G;
    float *in;      /* cap_G x (max_n / 1 + 1): the contributions to our chunk */
    size_t in_cap;  /* floats */
    float *out;     /* our reduced chunk: [contributions, values...] */
    uint8_t *got;   /* cap_G: a contribution came from member i */
    uint8_t *have;  /* cap_G: chunk i came back reduced */
    uint8_t *listed; /* cap_G: member i's sparse list came */
    float **list;   /* cap_G: member i's list, as it came (2 count floats) */
    uint32_t *list_n, *list_cap; /* cap_G: its count, and the room */
    float *pack;    /* our own list, packed: max_n floats */
    struct kept *q;
    int qn;
    ds_greduce_stats st;
};

void ds_greduce_chunk(size_t n, uint32_t G, uint32_t c, size_t *off, size_t *len)
{
    const size_t base = n / G, extra = n % G;
    *off = (size_t)c * base + (c < extra ? c : extra);
    *len = base + (c < extra ? 1 : 0);
}

int ds_greduce_create(ds_greduce **out, size_t max_n)
{
    *out = NULL;
    ds_greduce *r = calloc(1, sizeof(*r));
    if (!r)
        return -ENOMEM;
    r->max_n = max_n;
    r->out = malloc((max_n + 2) * sizeof(float));
    r->pack = malloc((max_n + 2) * sizeof(float));
    r->q = calloc(KEEP_MAX, sizeof(*r->q));
    if (!r->out || !r->q || !r->pack) {
        ds_greduce_destroy(&r);
        return -ENOMEM;
    }
    *out = r;
    return 0;
}

static void drop_kept(ds_greduce *r, int i)
{
    free(r->q[i].val);
    r->q[i] = r->q[--r->qn];
}

void ds_greduce_destroy(ds_greduce **rp)
{
    if (!rp || !*rp)
        return;
    ds_greduce *r = *rp;
    while (r->qn)
        drop_kept(r, r->qn - 1);
    free(r->q);
    free(r->in);
    free(r->out);
    free(r->pack);
    free(r->got);
    free(r->have);
    free(r->listed);
    for (uint32_t i = 0; r->list && i < r->cap_G; i++)
        free(r->list[i]);
    free(r->list);
    free(r->list_n);
    free(r->list_cap);
    free(r);
    *rp = NULL;
}

void ds_greduce_stats_get(const ds_greduce *r, ds_greduce_stats *st)
{
    *st = r->st;
}

/* Room for G members' contributions to a chunk of up to len floats. */
static int reserve(ds_greduce *r, uint32_t G, size_t len)
{
    if (G > r->cap_G) {
        uint8_t *g = realloc(r->got, G), *h = realloc(r->have, G), *l = realloc(r->listed, G);
        if (g)
            r->got = g;
        if (h)
            r->have = h;
        if (l)
            r->listed = l;
        float **ls = realloc(r->list, G * sizeof(*ls));
        if (ls)
            r->list = ls;
        uint32_t *ln = realloc(r->list_n, G * sizeof(*ln)), *lc = realloc(r->list_cap, G * sizeof(*lc));
        if (ln)
            r->list_n = ln;
        if (lc)
            r->list_cap = lc;
        if (!g || !h || !l || !ls || !ln || !lc)
            return -ENOMEM;
        for (uint32_t i = r->cap_G; i < G; i++) {
            r->list[i] = NULL;
            r->list_cap[i] = 0;
        }
        r->cap_G = G;
    }
    const size_t need = (size_t)G * (len ? len : 1);
    if (need > r->in_cap) {
        float *in = realloc(r->in, need * sizeof(float));
        if (!in)
            return -ENOMEM;
        r->in = in;
        r->in_cap = need;
    }
    return 0;
}

/* Keep a message of a later reduction (a copy); drop it when full. */
static void keep(ds_greduce *r, const ds_gmsg *m)
{
    if (r->qn == KEEP_MAX) {
        r->st.late_dropped++;
        return;
    }
    float *v = m->count ? malloc((size_t)m->count * sizeof(float)) : NULL;
    if (m->count && !v) {
        r->st.late_dropped++;
        return;
    }
    if (v)
        memcpy(v, m->val, (size_t)m->count * sizeof(float));
    r->q[r->qn].m = *m;
    r->q[r->qn].m.idx = NULL;
    r->q[r->qn].m.val = v;
    r->q[r->qn].val = v;
    r->qn++;
    r->st.kept++;
}

/* One run's state, for take(). */
struct run {
    float *vec;
    size_t n;
    uint32_t G, me;
    uint64_t tag;
    uint64_t *max_tag;
    const ds_gsparse *sp;
};

/* Use a message of this reduction. 1: it was one, 0: not ours. */
static int take(ds_greduce *r, const struct run *x, const ds_gmsg *m)
{
    if (m->type == DS_GMSG_ARED && m->from < x->G && m->round > *x->max_tag)
        *x->max_tag = m->round;
    if (m->type != DS_GMSG_ARED || m->round != x->tag || m->from >= x->G || m->from == x->me)
        return 0;
    size_t off, len;
    if (m->segment == PHASE_CONTRIB) {
        ds_greduce_chunk(x->n, x->G, x->me, &off, &len);
        if (m->count != len || r->got[m->from])
            return 0;
        memcpy(r->in + (size_t)m->from * len, m->val, len * sizeof(float));
        r->got[m->from] = 1;
        return 1;
    }
    if (m->segment == PHASE_LIST) {
        if (!x->sp || (m->count & 1) || r->listed[m->from] || m->count / 2 > x->sp->n_out)
            return 0;
        const uint32_t k = m->count / 2;
        for (uint32_t j = 0; j < k; j++) {
            uint32_t ix;
            memcpy(&ix, &m->val[j], 4);
            if (ix >= x->sp->n_out)
                return 0; /* an index out of range: the list is refused whole */
        }
        if (m->count > r->list_cap[m->from]) {
            float *nl = realloc(r->list[m->from], (size_t)m->count * sizeof(float));
            if (!nl)
                return 0;
            r->list[m->from] = nl;
            r->list_cap[m->from] = m->count;
        }
        if (m->count)
            memcpy(r->list[m->from], m->val, (size_t)m->count * sizeof(float));
        r->list_n[m->from] = k;
        r->listed[m->from] = 1;
        return 1;
    }
    if (m->segment == PHASE_RESULT) {
        ds_greduce_chunk(x->n, x->G, m->from, &off, &len);
        if (m->count != len + 1 || r->have[m->from])
            return 0;
        memcpy(x->vec + off, m->val + 1, len * sizeof(float));
        r->have[m->from] = 1;
        return 1;
    }
    return 0;
}

/* Messages kept from earlier waits: this reduction's are used, older
 * ones dropped, later ones kept. */
static void take_kept(ds_greduce *r, const struct run *x)
{
    for (int i = 0; i < r->qn;) {
        const ds_gmsg *m = &r->q[i].m;
        if (m->round > x->tag) {
            if (m->from < x->G && m->round > *x->max_tag)
                *x->max_tag = m->round;
            i++;
            continue;
        }
        if (m->round < x->tag || !take(r, x, m))
            r->st.late_dropped++;
        drop_kept(r, i);
    }
}

/* Receive until `done` holds or the deadline. 1: a stop request. */
static int wait_for(ds_greduce *r, const ds_gossip_io *io, const struct run *x,
                    const uint8_t *skip, const uint8_t *flags, uint64_t deadline)
{
    for (;;) {
        int open = 0;
        for (uint32_t i = 0; i < x->G; i++)
            open += i != x->me && !flags[i] && !(skip && skip[i]);
        if (!open)
            return 0;
        ds_gmsg m;
        const int got = io->recv(io->ctx, &m, deadline);
        if (got < 0)
            return 1;
        if (got == 0)
            return 0;
        if (m.type == DS_GMSG_ARED && m.round > x->tag) {
            if (m.from < x->G && m.round > *x->max_tag)
                *x->max_tag = m.round;
            keep(r, &m);
        }
        else if (!take(r, x, &m))
            r->st.late_dropped++;
    }
}

/* The sum of the lists that came, ours included, in member order. */
static void sum_lists(ds_greduce *r, const struct run *x)
{
    const ds_gsparse *sp = x->sp;
    memset(sp->out, 0, sp->n_out * sizeof(float));
    for (uint32_t i = 0; i < x->G; i++) {
        if (i == x->me) {
            for (uint32_t j = 0; j < sp->count; j++)
                sp->out[sp->idx[j]] += sp->val[j];
            continue;
        }
        if (!r->listed[i])
            continue;
        const float *l = r->list[i];
        const uint32_t k = r->list_n[i];
        for (uint32_t j = 0; j < k; j++) {
            uint32_t ix;
            memcpy(&ix, &l[j], 4);
            sp->out[ix] += l[k + j];
        }
    }
}

int ds_greduce_run(ds_greduce *r, const ds_gossip_io *io, float *vec, size_t n, size_t n_mean,
                   uint32_t G, uint32_t me, const uint8_t *skip, uint64_t tag,
                   uint64_t deadline_ns, const ds_gsparse *sp, ds_greduce_result *res)
{
    memset(res, 0, sizeof(*res));
    if (!G || me >= G || n > r->max_n || n_mean > n || n < G ||
        (sp && (2 * (size_t)sp->count > r->max_n || !sp->out)))
        return -EINVAL;
    r->st.reductions++;
    res->contributions = 1;
    res->max_tag = tag;
    if (G == 1) {
        res->complete = 1;
        if (sp)
            sum_lists(r, &(const struct run){vec, n, 1, 0, tag, &res->max_tag, sp});
        return 0;
    }
    size_t off, len;
    ds_greduce_chunk(n, G, me, &off, &len);
    if (reserve(r, G, len) < 0)
        return -ENOMEM;
    memset(r->got, 0, G);
    memset(r->have, 0, G);
    memset(r->listed, 0, G);
    const struct run x = {vec, n, G, me, tag, &res->max_tag, sp};
    const uint64_t t0 = io->now_ns(io->ctx);
    /* Contributions get half the time: the owners' results must still
     * reach everyone before the deadline. */
    const uint64_t half = t0 + (deadline_ns > t0 ? (deadline_ns - t0) / 2 : 0);

    /* Phase 0: chunk c to its owner c. */
    for (uint32_t c = 0; c < G; c++) {
        if (c == me || (skip && skip[c]))
            continue;
        size_t co, cl;
        ds_greduce_chunk(n, G, c, &co, &cl);
        ds_gmsg m = {.type = DS_GMSG_ARED, .from = me, .to = c, .round = tag,
                     .segment = PHASE_CONTRIB, .count = (uint32_t)cl, .val = vec + co};
        io->send(io->ctx, &m, deadline_ns);
    }
    /* Our sparse list to every member, with the chunks. */
    if (sp) {
        memcpy(r->pack, sp->idx, (size_t)sp->count * 4);
        memcpy(r->pack + sp->count, sp->val, (size_t)sp->count * sizeof(float));
        for (uint32_t c = 0; c < G; c++) {
            if (c == me || (skip && skip[c]))
                continue;
            ds_gmsg m = {.type = DS_GMSG_ARED, .from = me, .to = c, .round = tag,
                         .segment = PHASE_LIST, .count = 2 * sp->count, .val = r->pack};
            io->send(io->ctx, &m, deadline_ns);
        }
        r->listed[me] = 1;
    } else {
        memset(r->listed, 1, G); /* nothing to wait for */
    }
    memcpy(r->in + (size_t)me * len, vec + off, len * sizeof(float));
    r->got[me] = 1;
    take_kept(r, &x);
    res->stopped = wait_for(r, io, &x, skip, r->got, half);
    /* A member we waited for in vain is reported, as gossip reports a
     * partner (membership hears of it; the runtime stops waiting for it). */
    for (uint32_t i = 0; i < G && !res->stopped && io->peer_failed; i++)
        if (!r->got[i] && !(skip && skip[i]))
            io->peer_failed(io->ctx, i);

    /* Our chunk: the sum in member order, so a run is repeatable. */
    float *out = r->out, *sum = out + 1;
    uint32_t k = 0;
    memset(sum, 0, len * sizeof(float));
    for (uint32_t i = 0; i < G; i++) {
        if (!r->got[i])
            continue;
        const float *c = r->in + (size_t)i * len;
        for (size_t j = 0; j < len; j++)
            sum[j] += c[j];
        k++;
    }
    const float inv = 1.0f / (float)k;
    for (size_t j = 0; j < len && off + j < n_mean; j++)
        sum[j] *= inv;
    out[0] = (float)k;
    memcpy(vec + off, sum, len * sizeof(float));
    r->have[me] = 1;
    res->contributions = k;

    /* Phase 1: our reduced chunk to every member. */
    for (uint32_t c = 0; c < G && !res->stopped; c++) {
        if (c == me || (skip && skip[c]))
            continue;
        ds_gmsg m = {.type = DS_GMSG_ARED, .from = me, .to = c, .round = tag,
                     .segment = PHASE_RESULT, .count = (uint32_t)len + 1, .val = out};
        io->send(io->ctx, &m, deadline_ns);
    }
    if (!res->stopped)
        res->stopped = wait_for(r, io, &x, skip, r->have, deadline_ns);
    if (!res->stopped)
        res->stopped = wait_for(r, io, &x, skip, r->listed, deadline_ns);
    for (uint32_t i = 0; i < G; i++) {
        res->chunks_missing += !r->have[i];
        res->lists_missing += !r->listed[i];
    }
    if (sp)
        sum_lists(r, &x);
    res->complete = res->chunks_missing == 0 && res->lists_missing == 0;
    if (!res->complete)
        r->st.incomplete++;
    return 0;
}
