/* node/gossip/group.c: see group.h. */
#include "config.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "base/log.h"
#include "node/gossip/group.h"

enum { PHASE_CONTRIB = 0, PHASE_RESULT = 1, PHASE_LIST = 2, PHASE_WHOLE = 3, PHASE_STEP0 = 16 };
/* An orphan chunk's contribution (run_direct): segment = PHASE_ORPHAN0 + the
 * chunk, above every ring or butterfly step. */
#define PHASE_ORPHAN0 (1u << 24)
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
    /* ring and butterfly (group.h, ds_greduce_set_algo): the schedule of
     * the run in progress, one entry per step: who sends to us, how many
     * values, where they land in inbox ([count, values...] each). */
    enum ds_greduce_algo algo;
    uint32_t *live;          /* cap_G: the members not skipped, in order */
    uint32_t *step_from;     /* steps_cap */
    size_t *step_len, *step_off;
    uint8_t *step_got;
    uint32_t steps_cap, n_steps;
    float *inbox;            /* inbox_cap floats */
    size_t inbox_cap;
    float *orig;             /* max_n: our vector as it came, for a failed run */
    float *cnt;              /* cap_G: contributions per chunk (ring) */
    int saw_direct;          /* this run took a direct-phase message */
    uint32_t direct_left;    /* reductions to run direct after a failure */
    int direct_once;         /* the next one runs direct (ds_greduce_direct_once) */
    int whole;               /* a ds_greduce_mean_all runs: PHASE_WHOLE is taken */
    /* The direct algorithm's orphan chunks (their owner skipped hard): every
     * member sends its part of one to every member, and each sums them. */
    uint8_t *orph;           /* cap_G: chunk c is an orphan in this run */
    uint32_t *orank;         /* cap_G: its place among the orphans */
    uint64_t *omask;         /* cap_G: member i's orphans, as its frames say */
    uint8_t *odone;          /* cap_G: member i's contribution came, and its
                              * parts of the orphans both of us hold */
    uint64_t mine;           /* our orphans, a bit per chunk */
    uint8_t *ogot;           /* n_orph x G: (orphan, member) came */
    size_t ogot_cap;
    float *obuf;             /* n_orph x G x omax: what came */
    size_t obuf_cap, omax;
    uint32_t n_orph;         /* 0: no orphan (orph not in use) */
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
    r->orig = malloc((max_n + 1) * sizeof(float));
    r->q = calloc(KEEP_MAX, sizeof(*r->q));
    if (!r->out || !r->q || !r->pack || !r->orig) {
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
    free(r->orig);
    free(r->live);
    free(r->cnt);
    free(r->orph);
    free(r->orank);
    free(r->omask);
    free(r->odone);
    free(r->ogot);
    free(r->obuf);
    free(r->step_from);
    free(r->step_len);
    free(r->step_off);
    free(r->step_got);
    free(r->inbox);
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

void ds_greduce_set_algo(ds_greduce *r, enum ds_greduce_algo algo)
{
    r->algo = algo == DS_GREDUCE_RING || algo == DS_GREDUCE_BUTTERFLY ? algo : DS_GREDUCE_DIRECT;
}

int ds_greduce_fit(const double *floats, const double *ms, size_t n, float *alpha,
                   float *beta)
{
    if (!n)
        return -EINVAL;
    double sx = 0, sy = 0;
    for (size_t i = 0; i < n; i++) {
        sx += floats[i];
        sy += ms[i];
    }
    const double mx = sx / (double)n, my = sy / (double)n;
    double sxx = 0, sxy = 0;
    for (size_t i = 0; i < n; i++) {
        sxx += (floats[i] - mx) * (floats[i] - mx);
        sxy += (floats[i] - mx) * (ms[i] - my);
    }
    double b = sxx > 0 ? sxy / sxx : 0, a = my - b * mx;
    if (b < 0) {
        b = 0; /* slower for fewer floats: noise; the mean alone */
        a = my;
    } else if (a < 0) {
        /* Through the origin: beta alone. */
        double xx = 0, xy = 0;
        for (size_t i = 0; i < n; i++) {
            xx += floats[i] * floats[i];
            xy += floats[i] * ms[i];
        }
        a = 0;
        b = xx > 0 ? xy / xx : 0;
    }
    *alpha = (float)a;
    *beta = (float)b;
    return 0;
}

enum ds_greduce_algo ds_greduce_pick(const ds_greduce_cost *c, size_t floats)
{
    const float x = (float)floats;
    const float d = c->alpha_ms[0] + c->beta_ms[0] * x;
    const float b = c->alpha_ms[1] + c->beta_ms[1] * x;
    return b < d ? DS_GREDUCE_BUTTERFLY : DS_GREDUCE_DIRECT;
}

void ds_greduce_direct_once(ds_greduce *r)
{
    r->direct_once = 1;
}

const char *ds_greduce_algo_name(enum ds_greduce_algo algo)
{
    switch (algo) {
    case DS_GREDUCE_DIRECT: return "direct";
    case DS_GREDUCE_RING: return "ring";
    case DS_GREDUCE_BUTTERFLY: return "butterfly";
    case DS_GREDUCE_AUTO: return "auto";
    }
    return "?";
}

/* *buf holds at least need floats (kept when it does already). */
static int grow_floats(float **buf, size_t *cap, size_t need)
{
    if (need <= *cap)
        return 0;
    float *b = realloc(*buf, need * sizeof(float));
    if (!b)
        return -ENOMEM;
    *buf = b;
    *cap = need;
    return 0;
}

/* p reallocated to `bytes`, or p itself with *fail set (p stays valid). */
static void *resized(void *p, size_t bytes, int *fail)
{
    void *q = realloc(p, bytes);
    if (!q) {
        *fail = 1;
        return p;
    }
    return q;
}

/* Room for G members' contributions to a chunk of up to len floats (and
 * the ring's and butterfly's per-member arrays). */
static int reserve(ds_greduce *r, uint32_t G, size_t len)
{
    if (G > r->cap_G) {
        int fail = 0;
        r->got = resized(r->got, G, &fail);
        r->have = resized(r->have, G, &fail);
        r->listed = resized(r->listed, G, &fail);
        r->list = resized(r->list, G * sizeof(*r->list), &fail);
        r->list_n = resized(r->list_n, G * sizeof(*r->list_n), &fail);
        r->list_cap = resized(r->list_cap, G * sizeof(*r->list_cap), &fail);
        r->live = resized(r->live, G * sizeof(*r->live), &fail);
        r->cnt = resized(r->cnt, G * sizeof(*r->cnt), &fail);
        r->orph = resized(r->orph, G, &fail);
        r->orank = resized(r->orank, G * sizeof(*r->orank), &fail);
        r->omask = resized(r->omask, G * sizeof(*r->omask), &fail);
        r->odone = resized(r->odone, G, &fail);
        if (fail)
            return -ENOMEM;
        for (uint32_t i = r->cap_G; i < G; i++) {
            r->list[i] = NULL;
            r->list_cap[i] = 0;
        }
        r->cap_G = G;
    }
    return grow_floats(&r->in, &r->in_cap, (size_t)G * (len ? len : 1));
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

/* Whether member i's part of the orphans is all here (odone): its
 * contribution to our chunk came, with its orphans (omask), and its part
 * of each orphan we both hold. A member that does not hold one of ours an
 * orphan sends its part to the owner instead: not waited for (that chunk
 * is then incomplete here). Members that hold the same orphans wait for
 * one another's parts, sent with their contributions. */
static void orphans_check(ds_greduce *r, uint32_t G, uint32_t i)
{
    int done = r->got[i];
    for (uint32_t c = 0; c < G && done; c++)
        if (r->orph[c] && (r->omask[i] >> c & 1))
            done = r->ogot[(size_t)r->orank[c] * G + i];
    r->odone[i] = (uint8_t)done;
}

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
        if (r->n_orph) {
            r->omask[m->from] = m->aux;
            orphans_check(r, x->G, m->from);
        }
        r->saw_direct = 1;
        return 1;
    }
    if (m->segment == PHASE_WHOLE) {
        if (!r->whole || m->count != x->n || r->got[m->from])
            return 0;
        memcpy(r->in + (size_t)m->from * x->n, m->val, x->n * sizeof(float));
        r->got[m->from] = 1;
        return 1;
    }
    if (r->whole)
        return 0; /* a step's frame of the same tag: not a whole vector */
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
    if (m->segment >= PHASE_ORPHAN0) {
        const uint32_t c = m->segment - PHASE_ORPHAN0;
        if (!r->n_orph || c >= x->G || !r->orph[c])
            return 0;
        ds_greduce_chunk(x->n, x->G, c, &off, &len);
        const size_t k = (size_t)r->orank[c] * x->G + m->from;
        if (m->count != len || r->ogot[k])
            return 0;
        memcpy(r->obuf + k * r->omax, m->val, len * sizeof(float));
        r->ogot[k] = 1;
        r->omask[m->from] = m->aux;
        orphans_check(r, x->G, m->from);
        r->saw_direct = 1;
        return 1;
    }
    if (m->segment >= PHASE_STEP0) {
        const uint32_t st = m->segment - PHASE_STEP0;
        if (st >= r->n_steps || m->from != r->step_from[st] || r->step_got[st] ||
            m->count != r->step_len[st] + 1)
            return 0;
        memcpy(r->inbox + r->step_off[st], m->val, (size_t)m->count * sizeof(float));
        r->step_got[st] = 1;
        return 1;
    }
    if (m->segment == PHASE_RESULT) {
        ds_greduce_chunk(x->n, x->G, m->from, &off, &len);
        /* An orphan's owner is held dead here: its result, should it
         * come, is not taken (the members sum that chunk themselves). */
        if (m->count != len + 1 || r->have[m->from] || (r->n_orph && r->orph[m->from]))
            return 0;
        memcpy(x->vec + off, m->val + 1, len * sizeof(float));
        r->have[m->from] = 1;
        r->saw_direct = 1;
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

/* A message received while waiting: one of a later reduction is kept,
 * one of this reduction used, anything else dropped and counted. */
static void use_msg(ds_greduce *r, const struct run *x, const ds_gmsg *m)
{
    if (m->type == DS_GMSG_ARED && m->round > x->tag) {
        if (m->from < x->G && m->round > *x->max_tag)
            *x->max_tag = m->round;
        keep(r, m);
    } else if (!take(r, x, m)) {
        r->st.late_dropped++;
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
        use_msg(r, x, &m);
    }
}

/* 1: member i is skipped hard (held dead, or unreachable). */
static int held(const uint8_t *skip, uint32_t i)
{
    return skip && skip[i] >= DS_GREDUCE_SKIP_ALL;
}

/* sum += v, len floats. */
static void add_to(float *sum, const float *v, size_t len)
{
    for (size_t j = 0; j < len; j++)
        sum[j] += v[j];
}

/* A chunk at off summed over k contributions: its elements below n_mean
 * become their mean (those at or past it stay sums). */
static void mean_below(float *sum, size_t off, size_t len, size_t n_mean, uint32_t k)
{
    const float inv = 1.0f / (float)k;
    for (size_t j = 0; j < len && off + j < n_mean; j++)
        sum[j] *= inv;
}

/* The sum of the lists that came, ours included, in member order; not
 * those of members skipped hard: such a member is not waited for, so its
 * list, should it come, would be in some members' sums and not others'.
 * Nor are they missing: a member held dead leaves the reduction complete
 * (its chunk an orphan in the direct algorithm, left out of the ring's
 * and the butterfly's schedule). */
static void sum_lists(ds_greduce *r, const struct run *x, const uint8_t *skip)
{
    const ds_gsparse *sp = x->sp;
    memset(sp->out, 0, sp->n_out * sizeof(float));
    for (uint32_t i = 0; i < x->G; i++) {
        if (i == x->me) {
            for (uint32_t j = 0; j < sp->count; j++)
                sp->out[sp->idx[j]] += sp->val[j];
            continue;
        }
        if (!r->listed[i] || held(skip, i))
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

/* Our sparse list (when there is one) to every member but those skipped
 * hard (group.h); with none, nobody's is waited for. */
static void send_list(ds_greduce *r, const ds_gossip_io *io, uint32_t G, uint32_t me,
                      const uint8_t *skip, uint64_t tag, uint64_t deadline, const ds_gsparse *sp)
{
    if (!sp) {
        memset(r->listed, 1, G);
        return;
    }
    memcpy(r->pack, sp->idx, (size_t)sp->count * 4);
    memcpy(r->pack + sp->count, sp->val, (size_t)sp->count * sizeof(float));
    for (uint32_t c = 0; c < G; c++) {
        if (c == me || held(skip, c))
            continue;
        ds_gmsg m = {.type = DS_GMSG_ARED, .from = me, .to = c, .round = tag,
                     .segment = PHASE_LIST, .count = 2 * sp->count, .val = r->pack};
        io->send(io->ctx, &m, deadline);
    }
    r->listed[me] = 1;
}

/* ---- ring and butterfly -------------------------------------------------- */

/* After a ring or butterfly reduction failed, this many run direct. */
#define DIRECT_AFTER_FAILURE 16

static int run_direct(ds_greduce *r, const ds_gossip_io *io, float *vec, size_t n,
                      size_t n_mean, uint32_t G, uint32_t me, const uint8_t *skip, uint64_t tag,
                      uint64_t deadline_ns, const ds_gsparse *sp, ds_greduce_result *res,
                      int fresh);

/* Room for a schedule of `steps` steps whose inbox holds `floats`. */
static int reserve_steps(ds_greduce *r, uint32_t steps, size_t floats)
{
    if (steps > r->steps_cap) {
        int fail = 0;
        r->step_from = resized(r->step_from, steps * sizeof(*r->step_from), &fail);
        r->step_len = resized(r->step_len, steps * sizeof(*r->step_len), &fail);
        r->step_off = resized(r->step_off, steps * sizeof(*r->step_off), &fail);
        r->step_got = resized(r->step_got, steps, &fail);
        if (fail)
            return -ENOMEM;
        r->steps_cap = steps;
    }
    return grow_floats(&r->inbox, &r->inbox_cap, floats);
}

/* Step st of the schedule comes from member `from` with len values. */
static void plan_step(ds_greduce *r, uint32_t st, uint32_t from, size_t len, size_t *floats)
{
    r->step_from[st] = from;
    r->step_len[st] = len;
    r->step_off[st] = *floats;
    *floats += from == UINT32_MAX ? 0 : len + 1;
}

static void send_step(const ds_gossip_io *io, uint32_t me, uint32_t to, uint64_t tag, uint32_t st,
                      const float *buf, size_t len, uint64_t deadline)
{
    ds_gmsg m = {.type = DS_GMSG_ARED, .from = me, .to = to, .round = tag,
                 .segment = PHASE_STEP0 + st, .count = (uint32_t)len + 1, .val = buf};
    io->send(io->ctx, &m, deadline);
}

/* Receive until step st's message came (1), the deadline (0), or a stop
 * (0, *stopped set); others of this reduction are taken on the way, those
 * of later ones kept. */
static int wait_step(ds_greduce *r, const ds_gossip_io *io, const struct run *x, uint32_t st,
                     uint64_t deadline, int *stopped)
{
    while (!r->step_got[st]) {
        if (r->saw_direct)
            return 0; /* a member runs direct: so do we (run_algo) */
        ds_gmsg m;
        const int got = io->recv(io->ctx, &m, deadline);
        if (got < 0) {
            *stopped = 1;
            return 0;
        }
        if (got == 0)
            return 0;
        use_msg(r, x, &m);
    }
    return 1;
}

static void scale_mean(float *v, size_t off, size_t len, size_t n_mean, float count)
{
    const float inv = 1.0f / count;
    for (size_t j = 0; j < len && off + j < n_mean; j++)
        v[j] *= inv;
}

/* Ring over the P live members (position p): P - 1 reduce-scatter steps,
 * each passing one chunk with its contribution count to the next member,
 * who adds its own; member p then holds chunk p + 1 reduced, takes the mean
 * where asked, and P - 1 all-gather steps pass the reduced chunks round.
 * Returns the chunks of the P still missing (restored from orig). */
static uint32_t ring(ds_greduce *r, const ds_gossip_io *io, const struct run *x, size_t n_mean,
                     uint32_t P, uint32_t p, uint64_t deadline, int *stopped, uint32_t *contrib)
{
    float *vec = x->vec, *out = r->out;
    const uint32_t next = r->live[(p + 1) % P], prev = r->live[(p + P - 1) % P];
    size_t off, len;
    for (uint32_t c = 0; c < P; c++)
        r->cnt[c] = 1.0f;
    for (uint32_t s = 0; s + 1 < P; s++) {
        const uint32_t cs = (p + P - s % P) % P, cr = (p + 2 * P - s - 1) % P;
        ds_greduce_chunk(x->n, P, cs, &off, &len);
        out[0] = r->cnt[cs];
        memcpy(out + 1, vec + off, len * sizeof(float));
        send_step(io, x->me, next, x->tag, s, out, len, deadline);
        if (!wait_step(r, io, x, s, deadline, stopped)) {
            /* Blame only the first step, which prev sends without waiting
             * on anyone: a later one may be late for prev's own prev. */
            if (s == 0 && !*stopped && !r->saw_direct && io->peer_failed)
                io->peer_failed(io->ctx, prev);
            memcpy(vec, r->orig, x->n * sizeof(float));
            return P;
        }
        const float *in = r->inbox + r->step_off[s];
        ds_greduce_chunk(x->n, P, cr, &off, &len);
        for (size_t j = 0; j < len; j++)
            vec[off + j] = in[1 + j] + vec[off + j];
        r->cnt[cr] += in[0];
    }
    const uint32_t own = (p + 1) % P;
    ds_greduce_chunk(x->n, P, own, &off, &len);
    scale_mean(vec + off, off, len, n_mean, r->cnt[own]);
    *contrib = (uint32_t)r->cnt[own];
    for (uint32_t s = 0; s + 1 < P; s++) {
        const uint32_t st = P - 1 + s, cs = (p + 1 + P - s % P) % P, cr = (p + P - s % P) % P;
        ds_greduce_chunk(x->n, P, cs, &off, &len);
        out[0] = r->cnt[cs];
        memcpy(out + 1, vec + off, len * sizeof(float));
        send_step(io, x->me, next, x->tag, st, out, len, deadline);
        if (!wait_step(r, io, x, st, deadline, stopped)) {
            /* The chunks not come back keep our own values. */
            for (uint32_t k = s; k + 1 < P; k++) {
                const uint32_t c = (p + P - k % P) % P;
                ds_greduce_chunk(x->n, P, c, &off, &len);
                memcpy(vec + off, r->orig + off, len * sizeof(float));
            }
            return P - 1 - s;
        }
        const float *in = r->inbox + r->step_off[st];
        ds_greduce_chunk(x->n, P, cr, &off, &len);
        memcpy(vec + off, in + 1, len * sizeof(float));
        r->cnt[cr] = in[0];
    }
    return 0;
}

/* Butterfly (recursive doubling) over the P live members: with P2 the
 * largest power of two <= P, members P2.. first hand their vector to
 * member p - P2 (step 0); then log2 P2 steps in which members p and
 * p ^ 2^k swap their whole vectors and each adds the other's (a + b and
 * b + a are the same float: the members stay identical); then the mean,
 * and the extra members get the result back (the last step). Returns the
 * chunks missing: 0, or P (our vector restored). */
static uint32_t butterfly(ds_greduce *r, const ds_gossip_io *io, const struct run *x,
                          size_t n_mean, uint32_t P, uint32_t p, uint32_t L2, uint64_t deadline,
                          int *stopped, uint32_t *contrib)
{
    float *vec = x->vec, *out = r->out;
    const size_t n = x->n;
    const uint32_t P2 = 1u << L2, rem = P - P2, post = L2 + 1;
    float count = 1.0f;
    uint32_t waited = UINT32_MAX;
    if (p >= P2) {
        out[0] = count;
        memcpy(out + 1, vec, n * sizeof(float));
        send_step(io, x->me, r->live[p - P2], x->tag, 0, out, n, deadline);
        if (!wait_step(r, io, x, post, deadline, stopped))
            goto fail; /* the result waits on everyone: nobody to blame */
        memcpy(vec, r->inbox + r->step_off[post] + 1, n * sizeof(float));
        *contrib = (uint32_t)r->inbox[r->step_off[post]];
        return 0;
    }
    if (p < rem) {
        if (!wait_step(r, io, x, 0, deadline, stopped)) {
            waited = r->live[p + P2];
            goto fail;
        }
        const float *in = r->inbox + r->step_off[0];
        for (size_t j = 0; j < n; j++)
            vec[j] = vec[j] + in[1 + j];
        count += in[0];
    }
    for (uint32_t k = 0; k < L2; k++) {
        const uint32_t q = r->live[p ^ (1u << k)];
        out[0] = count;
        memcpy(out + 1, vec, n * sizeof(float));
        send_step(io, x->me, q, x->tag, 1 + k, out, n, deadline);
        if (!wait_step(r, io, x, 1 + k, deadline, stopped)) {
            /* Blame only a first step its sender did not wait for. */
            if (k == 0 && (p ^ 1u) >= rem)
                waited = q;
            goto fail;
        }
        const float *in = r->inbox + r->step_off[1 + k];
        for (size_t j = 0; j < n; j++)
            vec[j] = vec[j] + in[1 + j];
        count = count + in[0];
    }
    scale_mean(vec, 0, n, n_mean, count);
    *contrib = (uint32_t)count;
    if (p < rem) {
        out[0] = count;
        memcpy(out + 1, vec, n * sizeof(float));
        send_step(io, x->me, r->live[p + P2], x->tag, post, out, n, deadline);
    }
    return 0;
fail:
    if (!*stopped && !r->saw_direct && io->peer_failed && waited != UINT32_MAX)
        io->peer_failed(io->ctx, waited);
    memcpy(vec, r->orig, n * sizeof(float));
    return P;
}

/* ds_greduce_run for the ring and the butterfly: the same contract, the
 * same sparse lists (sent directly, as the direct algorithm does). */
static int run_algo(ds_greduce *r, const ds_gossip_io *io, float *vec, size_t n, size_t n_mean,
                    uint32_t G, uint32_t me, const uint8_t *skip, uint64_t tag,
                    uint64_t deadline_ns, const ds_gsparse *sp, ds_greduce_result *res)
{
    uint32_t P = 0, p = 0;
    size_t doff, dlen; /* our chunk, should a member run direct (below) */
    ds_greduce_chunk(n, G, me, &doff, &dlen);
    if (reserve(r, G, dlen) < 0)
        return -ENOMEM;
    memset(r->got, 0, G);
    memset(r->have, 0, G);
    r->saw_direct = 0;
    uint32_t L2 = 0;
    int e = reserve_steps(r, 2 * G + 2, 0);
    if (e < 0)
        return e;
    for (uint32_t i = 0; i < G; i++)
        if (i == me || !(skip && skip[i])) {
            if (i == me)
                p = P;
            r->live[P++] = i;
        }
    while ((2u << L2) <= P)
        L2++;
    /* The schedule: who sends us what at each step. */
    size_t floats = 0;
    if (r->algo == DS_GREDUCE_RING) {
        r->n_steps = P > 1 ? 2 * (P - 1) : 0;
        const uint32_t prev = r->live[(p + P - 1) % P];
        for (uint32_t s = 0; s + 1 < P; s++) {
            size_t off, len;
            ds_greduce_chunk(n, P, (p + 2 * P - s - 1) % P, &off, &len);
            plan_step(r, s, prev, len, &floats);
        }
        for (uint32_t s = 0; s + 1 < P; s++) {
            size_t off, len;
            ds_greduce_chunk(n, P, (p + P - s % P) % P, &off, &len);
            plan_step(r, P - 1 + s, prev, len, &floats);
        }
    } else {
        const uint32_t P2 = 1u << L2, rem = P - P2;
        r->n_steps = L2 + 2;
        plan_step(r, 0, p < rem ? r->live[p + P2] : UINT32_MAX, n, &floats);
        for (uint32_t k = 0; k < L2; k++)
            plan_step(r, 1 + k, p < P2 ? r->live[p ^ (1u << k)] : UINT32_MAX, n, &floats);
        plan_step(r, L2 + 1, p >= P2 ? r->live[p - P2] : UINT32_MAX, n, &floats);
    }
    if ((e = reserve_steps(r, r->n_steps, floats)) < 0) {
        r->n_steps = 0;
        return e;
    }
    memset(r->step_got, 0, r->n_steps);
    memset(r->listed, 0, G);
    const struct run x = {vec, n, G, me, tag, &res->max_tag, sp};
    send_list(r, io, G, me, skip, tag, deadline_ns, sp);
    memcpy(r->orig, vec, n * sizeof(float));
    take_kept(r, &x);
    uint32_t contrib = 1, missing = 0;
    int stopped = 0;
    if (P > 1 && !r->saw_direct)
        missing = r->algo == DS_GREDUCE_RING
                      ? ring(r, io, &x, n_mean, P, p, deadline_ns, &stopped, &contrib)
                      : butterfly(r, io, &x, n_mean, P, p, L2, deadline_ns, &stopped, &contrib);
    if (r->saw_direct && !stopped) {
        /* A member runs this reduction direct (it failed one lately):
         * ours goes direct too, from our own vector, the lists already
         * sent (ds_greduce_run). */
        memcpy(vec, r->orig, n * sizeof(float));
        r->n_steps = 0;
        return 1;
    }
    res->contributions = contrib;
    res->stopped = stopped;
    if (!res->stopped)
        res->stopped = wait_for(r, io, &x, skip, r->listed, deadline_ns);
    /* Members skipped softly: their shares were never reduced, counted as
     * missing, as the direct algorithm counts their chunks. One skipped
     * hard (held dead) is not: the live members reduced everything among
     * themselves, as the direct algorithm does its orphan chunks. */
    res->chunks_missing = missing;
    for (uint32_t i = 0; i < G; i++) {
        res->chunks_missing += i != me && skip && skip[i] && !held(skip, i);
        res->lists_missing += !r->listed[i] && !held(skip, i);
    }
    if (sp)
        sum_lists(r, &x, skip);
    res->complete = res->chunks_missing == 0 && res->lists_missing == 0;
    if (!res->complete)
        r->st.incomplete++;
    r->n_steps = 0;
    return 0;
}

static int run_dispatch(ds_greduce *r, const ds_gossip_io *io, float *vec, size_t n,
                        size_t n_mean, uint32_t G, uint32_t me, const uint8_t *skip,
                        uint64_t tag, uint64_t deadline_ns, const ds_gsparse *sp,
                        ds_greduce_result *res);

/* The orphan chunks of a direct reduction: those whose owner is skipped
 * hard (a membership verdict, a transport that cannot reach it). No
 * member would reduce them, and each member would keep its own values
 * there until the owner left the view, a lag of rounds later (seconds;
 * more under load, past the end of a run in CI 56). Instead each member
 * sends its part of an orphan to every member not skipped hard and sums
 * the parts that came, in member order, as the owner would have. Set up
 * before the run (a ring member that meets such a part follows into
 * direct with it kept); with no room, none (the chunks keep the member's
 * own values, as before). */
static void orphans_begin(ds_greduce *r, size_t n, uint32_t G, uint32_t me,
                          const uint8_t *skip)
{
    r->n_orph = 0;
    r->mine = 0;
    if (!skip || G > 64 || reserve(r, G, 0) < 0)
        return;
    uint32_t k = 0;
    uint64_t mine = 0;
    for (uint32_t c = 0; c < G; c++) {
        r->orph[c] = c != me && held(skip, c);
        if (r->orph[c]) {
            r->orank[c] = k++;
            mine |= (uint64_t)1 << c;
        }
    }
    if (!k)
        return;
    const size_t omax = n / G + 1, cells = (size_t)k * G;
    if (cells > r->ogot_cap) {
        uint8_t *g = realloc(r->ogot, cells);
        if (!g)
            return;
        r->ogot = g;
        r->ogot_cap = cells;
    }
    if (grow_floats(&r->obuf, &r->obuf_cap, cells * omax) < 0)
        return;
    memset(r->ogot, 0, cells);
    memset(r->omask, 0, G * sizeof(*r->omask));
    memset(r->odone, 0, G);
    r->odone[me] = 1;
    r->omax = omax;
    r->n_orph = k;
    r->mine = mine;
}

/* Each orphan chunk (orphans_begin) as the sum of the parts that came, our
 * own included, in member order: the mean over them in [0, n_mean).
 * Marked come (have) when every member not skipped hard sent its part. */
static void orphans_sum(ds_greduce *r, float *vec, size_t n, size_t n_mean, uint32_t G,
                        uint32_t me, const uint8_t *skip, ds_greduce_result *res)
{
    float *sum = r->out + 1;
    for (uint32_t c = 0; c < G; c++) {
        if (!r->orph[c])
            continue;
        size_t off, len;
        ds_greduce_chunk(n, G, c, &off, &len);
        const uint8_t *got = r->ogot + (size_t)r->orank[c] * G;
        memset(sum, 0, len * sizeof(float));
        uint32_t k = 0, all = 1;
        for (uint32_t i = 0; i < G; i++) {
            const float *v = i == me ? vec + off
                             : got[i] ? r->obuf + ((size_t)r->orank[c] * G + i) * r->omax
                                      : NULL;
            all &= v || held(skip, i);
            if (!v)
                continue;
            add_to(sum, v, len);
            k++;
        }
        mean_below(sum, off, len, n_mean, k);
        memcpy(vec + off, sum, len * sizeof(float));
        r->have[c] = (uint8_t)all;
        res->orphans++;
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
            sum_lists(r, &(const struct run){vec, n, 1, 0, tag, &res->max_tag, sp}, NULL);
        return 0;
    }
    orphans_begin(r, n, G, me, skip);
    const int e = run_dispatch(r, io, vec, n, n_mean, G, me, skip, tag, deadline_ns, sp, res);
    r->n_orph = 0;
    return e;
}

static int run_dispatch(ds_greduce *r, const ds_gossip_io *io, float *vec, size_t n,
                        size_t n_mean, uint32_t G, uint32_t me, const uint8_t *skip,
                        uint64_t tag, uint64_t deadline_ns, const ds_gsparse *sp,
                        ds_greduce_result *res)
{
    const int once = r->direct_once;
    r->direct_once = 0;
    res->ran = DS_GREDUCE_DIRECT;
    if (r->algo != DS_GREDUCE_DIRECT && r->direct_left == 0 && !once) {
        const int e = run_algo(r, io, vec, n, n_mean, G, me, skip, tag, deadline_ns, sp, res);
        if (e == 0 && res->complete && !r->saw_direct) {
            res->ran = (int)r->algo;
            return 0;
        }
        if (e < 0)
            return e;
        /* Failed: the next reductions go direct, where a missing member
         * costs only its chunk; a member still on the ring meets our
         * contribution and follows. Following another member into direct
         * (saw_direct) is for this reduction only: when followers also
         * went direct for the next 16, each one's contributions made the
         * others follow again and arm theirs, and a group could run
         * direct for good after one failure (CI: a butterfly group of
         * three ran 300 reductions of 300 direct). */
        if (!r->saw_direct)
            r->direct_left = DIRECT_AFTER_FAILURE;
        if (e == 0)
            return 0;
        return run_direct(r, io, vec, n, n_mean, G, me, skip, tag, deadline_ns, sp, res, 0);
    }
    if (r->direct_left)
        r->direct_left--;
    return run_direct(r, io, vec, n, n_mean, G, me, skip, tag, deadline_ns, sp, res, 1);
}

/* The direct algorithm. fresh = 0: run_algo began this reduction (the
 * lists are sent, what came is kept). */
static int run_direct(ds_greduce *r, const ds_gossip_io *io, float *vec, size_t n,
                      size_t n_mean, uint32_t G, uint32_t me, const uint8_t *skip, uint64_t tag,
                      uint64_t deadline_ns, const ds_gsparse *sp, ds_greduce_result *res,
                      int fresh)
{
    size_t off, len;
    ds_greduce_chunk(n, G, me, &off, &len);
    if (reserve(r, G, len) < 0)
        return -ENOMEM;
    if (fresh) {
        memset(r->got, 0, G);
        memset(r->have, 0, G);
        memset(r->listed, 0, G);
    }
    const struct run x = {vec, n, G, me, tag, &res->max_tag, sp};
    const uint64_t t0 = io->now_ns(io->ctx);
    /* Contributions get half the time: the owners' results must still
     * reach everyone before the deadline. */
    const uint64_t half = t0 + (deadline_ns > t0 ? (deadline_ns - t0) / 2 : 0);

    /* Phase 0: chunk c to its owner c (one not waited for too, unless
     * skipped hard: our frames end its skip window on us, group.h). */
    for (uint32_t c = 0; c < G; c++) {
        size_t co, cl;
        ds_greduce_chunk(n, G, c, &co, &cl);
        if (r->n_orph && r->orph[c]) {
            /* An orphan: our part to every member (but those skipped hard). */
            for (uint32_t d = 0; d < G; d++) {
                if (d == me || held(skip, d))
                    continue;
                ds_gmsg m = {.type = DS_GMSG_ARED, .from = me, .to = d, .round = tag,
                             .segment = PHASE_ORPHAN0 + c, .count = (uint32_t)cl,
                             .aux = r->mine, .val = vec + co};
                io->send(io->ctx, &m, deadline_ns);
            }
            continue;
        }
        if (c == me || held(skip, c))
            continue;
        ds_gmsg m = {.type = DS_GMSG_ARED, .from = me, .to = c, .round = tag,
                     .segment = PHASE_CONTRIB, .count = (uint32_t)cl, .aux = r->mine,
                     .val = vec + co};
        io->send(io->ctx, &m, deadline_ns);
    }
    /* Our sparse list to every member, with the chunks (run_algo sent it
     * already when it began this reduction). */
    if (fresh)
        send_list(r, io, G, me, skip, tag, deadline_ns, sp);
    memcpy(r->in + (size_t)me * len, vec + off, len * sizeof(float));
    r->got[me] = 1;
    take_kept(r, &x);
    res->stopped = wait_for(r, io, &x, skip, r->got, half);
    if (r->n_orph && !res->stopped)
        res->stopped = wait_for(r, io, &x, skip, r->odone, half);
    /* A member we waited for in vain is reported, as gossip reports a
     * partner (membership hears of it; the runtime stops waiting for it). */
    for (uint32_t i = 0; i < G && !res->stopped && io->peer_failed; i++)
        if ((!r->got[i] || (r->n_orph && !r->odone[i])) && !(skip && skip[i]))
            io->peer_failed(io->ctx, i);
    if (r->n_orph)
        orphans_sum(r, vec, n, n_mean, G, me, skip, res);

    /* Our chunk: the sum in member order, so a run is repeatable. */
    float *out = r->out, *sum = out + 1;
    uint32_t k = 0;
    memset(sum, 0, len * sizeof(float));
    for (uint32_t i = 0; i < G; i++) {
        if (!r->got[i])
            continue;
        add_to(sum, r->in + (size_t)i * len, len);
        k++;
    }
    mean_below(sum, off, len, n_mean, k);
    out[0] = (float)k;
    memcpy(vec + off, sum, len * sizeof(float));
    r->have[me] = 1;
    res->contributions = k;

    /* Phase 1: our reduced chunk to every member (but those skipped hard). */
    for (uint32_t c = 0; c < G && !res->stopped; c++) {
        if (c == me || held(skip, c))
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
        res->lists_missing += !r->listed[i] && !held(skip, i);
    }
    if (sp)
        sum_lists(r, &x, skip);
    res->complete = res->chunks_missing == 0 && res->lists_missing == 0;
    if (!res->complete)
        r->st.incomplete++;
    return 0;
}

/* ---- the mean of whole vectors (the final sync) ------------------------- */

int ds_greduce_mean_all(ds_greduce *r, const ds_gossip_io *io, float *vec, size_t n,
                        uint32_t G, uint32_t me, const uint8_t *skip, uint64_t tag,
                        uint64_t deadline_ns, ds_greduce_result *res)
{
    memset(res, 0, sizeof(*res));
    if (!G || me >= G || n > r->max_n || !n || (size_t)G * n > DS_GREDUCE_WHOLE_MAX)
        return -EINVAL;
    r->st.reductions++;
    res->contributions = 1;
    res->max_tag = tag;
    res->ran = DS_GREDUCE_DIRECT;
    if (G == 1) {
        res->complete = 1;
        return 0;
    }
    if (reserve(r, G, n) < 0)
        return -ENOMEM;
    /* Waited for: every member not skipped hard, a soft skip too (a member
     * that is only slow sends to every member alike, and a member waited
     * for by one and not by another would be in one's mean only). have[]
     * holds the members left out: skipped hard, their vectors never used
     * even when they come. */
    uint8_t *out_of = r->have;
    for (uint32_t i = 0; i < G; i++)
        out_of[i] = i != me && held(skip, i);
    memset(r->got, 0, G);
    r->got[me] = 1;
    for (uint32_t c = 0; c < G; c++) {
        if (c == me || out_of[c])
            continue;
        ds_gmsg m = {.type = DS_GMSG_ARED, .from = me, .to = c, .round = tag,
                     .segment = PHASE_WHOLE, .count = (uint32_t)n, .val = vec};
        io->send(io->ctx, &m, deadline_ns);
    }
    memcpy(r->in + (size_t)me * n, vec, n * sizeof(float));
    const struct run x = {vec, n, G, me, tag, &res->max_tag, NULL};
    r->whole = 1;
    take_kept(r, &x);
    res->stopped = wait_for(r, io, &x, out_of, r->got, deadline_ns);
    r->whole = 0;
    if (res->stopped)
        return 0;
    for (uint32_t i = 0; i < G && io->peer_failed; i++)
        if (!r->got[i] && !out_of[i])
            io->peer_failed(io->ctx, i);
    /* The sum in member order over the members that came (and were not
     * left out): members that had the same ones hold the same bytes. */
    float *sum = r->orig;
    memset(sum, 0, n * sizeof(float));
    uint32_t k = 0;
    for (uint32_t i = 0; i < G; i++) {
        if (!r->got[i] || out_of[i])
            continue;
        add_to(sum, r->in + (size_t)i * n, n);
        k++;
    }
    mean_below(sum, 0, n, n, k);
    memcpy(vec, sum, n * sizeof(float));
    res->contributions = k;
    res->chunks_missing = G - k;
    res->complete = k == G;
    if (!res->complete)
        r->st.incomplete++;
    return 0;
}
