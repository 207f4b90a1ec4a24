/*
 * sparsify/sparsify.c: the sparsifier object, the seven methods of design §4
 * and error feedback.
 *
 * Every method is one or two streaming passes of the selection kernels
 * (kernels/select.h) plus a few scalars of state. The rules follow the
 * authors' published code (SAGE, MiCRO and DEFT: github.com/kljp/micro,
 * gradient_reducers.py), with these departures, each for a reason:
 *
 * - Threshold start (design §4). The authors start SAGE, MiCRO and the hard
 *   threshold at 1/(2 sqrt(k)), which assumes gradient-scale values; our
 *   gossip accumulator holds parameter drift, about lr times smaller, where
 *   MiCRO's 0.5%-per-call steering would take hundreds of calls to arrive.
 *   We start from the exact k-th largest |v| of the first call (MiCRO's own
 *   first version did, and its code keeps that line commented out).
 *   DS_START_PUBLISHED restores 1/(2 sqrt(k)).
 * - k = round(d n), at least 1, for every method; the authors truncate
 *   (int(d n)) in most places and round in none. One rule for all methods
 *   keeps the target the same whichever method runs.
 * - SAGE in one pass. The authors count the entries over delta*alpha (the
 *   "examined" density), then select over delta_t = delta*alpha*beta*gamma
 *   in a second pass. beta = 2/(1 + exp(d - d_exam)) with d_exam >= 0 is
 *   at least 2/(1 + exp(d)), and gamma at least 0.95, so delta_t is never
 *   below delta*alpha*0.95*2/(1+exp(d)). We compact over that lower bound
 *   while counting over delta*alpha in the same pass, then filter the
 *   (few) compacted entries at delta_t: the same selection, one read of
 *   the vector instead of two.
 * - SAGE within +-10% of k, every call. SAGE's own rule moves the
 *   threshold by the sampled mean's ratio (alpha, a few % of noise each
 *   call, which compounds) and by beta, which corrects a miss by only
 *   (d_exam - d)/2 in absolute density (0.05% per call for a 2x miss at
 *   0.1%): on one array called again and again it lands at 0.4-1.5x its
 *   target (docs/sparsify.md), and issue 17 asks for +-10% at every size
 *   and density. So when the rule's count falls outside [0.9k, 1.1k], the
 *   call takes the k largest of its candidates (the entries over the
 *   lowest threshold the rule can reach, already compacted by the one
 *   pass: a radix select over a little more than k entries) and keeps that threshold
 *   for the next call; with fewer than 0.9k candidates (the rule aimed far
 *   too high: a jump of the vector's scale) it reads the vector once more
 *   for its exact k-th largest, as a threshold start does. Counted in
 *   totals.banded.
 * - MiCRO within +-10% of k, every call, the same way. MiCRO's own rule
 *   aims at the same band (x1.005 over 1.1k, x0.995 under 0.909k) but
 *   moves at most 0.5% a call, so while training moves the vector's scale
 *   (5x in the first few hundred steps) it sends 0.14-3.9x its target, and
 *   a cluster's bytes per node varied 19% between 2 and 8 nodes (issue 17
 *   asks for +-10%). Over the band the call keeps the k largest of what
 *   its one pass kept (a radix select over those); under it, the same
 *   when the pass's candidates (every entry over delta x micro_cand, kept
 *   beside the count over delta) hold k or more, else it reads the vector
 *   again for its exact k-th largest (totals.reread). Either threshold is
 *   the delta the rule steers from next. Counted in totals.banded.
 * - SAGE samples: the authors draw with Python's random.randrange and size
 *   the sample by Slovin's formula (e = 0.05: n / (1 + n e^2), under 400)
 *   on the first call. We draw positions with SplitMix64 from the
 *   configured seed (reproducible), size the sample from each call's n
 *   (the same number while n does not change), and skip NaN / Inf samples.
 *   A zero sampled mean (an all-zero stretch) leaves alpha at 1 instead of
 *   dividing by zero.
 * - MiCRO's empty selection: the authors send one filler index when the
 *   threshold selects nothing, because their all-gather cannot carry an
 *   empty list. Our messages can, so an empty selection stays empty.
 * - Thresholds are floats compared as magnitude keys (kernels/select.h),
 *   exactly "|v| >= delta" in float; a threshold that would be 0 is raised
 *   to the smallest positive float so that zeros are never "selected" by a
 *   threshold method. A threshold that leaves the finite positive range
 *   (a vector of zeros for many calls, say) triggers a new threshold start,
 *   counted in totals.starts.
 *
 * Device memory. Created with a device table (the CUDA one,
 * kernels/select.h), a sparsifier takes vectors, idx, val and residuals in
 * that device's memory and touches them only through the table: every pass
 * above is a kernel, the top-k's refining histograms and its final cut
 * are kernels too (topk.c), and what the host decides from comes back as
 * tallies, histograms, norms and means. What stays on the host is the
 * sparsifier's own state: thresholds, the generator, random's bitmap,
 * DEFT's unit offsets (uploaded once, at create and at each new cut, for
 * the norms kernel) and per-unit k. Two places copy a little: SAGE's
 * sample positions go up with absmean_at (400 at most), and random draws
 * its k indices on the host, uploads them, gathers on the device and
 * downloads the k values to drop NaN / Inf (k entries each way, never n).
 * The selection is the CPU path's, bit for bit (tests/test_sparsify.c runs
 * both on the same input). A call ends with the table's sync, so a failed
 * kernel is -EIO and the call changes no state.
 */
#include "config.h"

#include <errno.h>
#include <float.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/cpu.h"
#include "sparsify/internal.h"

/* "ds-spars" read big-endian: keeps these streams apart from others fed
 * the same seed. */
#define SP_RNG_DOMAIN 0x64732d7370617273ull
#define SAGE_MAX_SAMPLES 400

#define METHOD_NAME_(e, v, name) [e] = name,
static const char *const method_names[DS_SPARSIFY_N_METHODS] = {
    DS_SPARSIFY_METHODS(METHOD_NAME_)
};
#undef METHOD_NAME_
/* Tables indexed by method (method_names, methods[] below) need each
 * method's value to be its position in DS_SPARSIFY_METHODS. */
#define METHOD_POS_(e, v, name) POS_##e,
enum { DS_SPARSIFY_METHODS(METHOD_POS_) };
#undef METHOD_POS_
#define METHOD_AT_POS_(e, v, name) \
    _Static_assert((int)e == (int)POS_##e, #e " is not at its position");
DS_SPARSIFY_METHODS(METHOD_AT_POS_)
#undef METHOD_AT_POS_

const char *ds_sparsify_method_name(int method)
{
    if (method < 0 || method >= DS_SPARSIFY_N_METHODS)
        return NULL;
    return method_names[method];
}

int ds_sparsify_method_parse(const char *s)
{
    if (!s)
        return -EINVAL;
    for (int m = 0; m < DS_SPARSIFY_N_METHODS; m++)
        if (!strcmp(s, method_names[m]))
            return m;
    return -EINVAL;
}

void ds_sparsify_cfg_defaults(ds_sparsify_cfg *c, enum ds_sparsify_method method)
{
    memset(c, 0, sizeof(*c));
    c->method = method;
    c->start = DS_START_KTH;
}

size_t ds_sparsify_k(size_t n, double density)
{
    if (n == 0)
        return 0;
    const double x = floor(density * (double)n + 0.5);
    if (!(x >= 1.0))
        return 1;
    if (x >= (double)n)
        return n;
    return (size_t)x;
}

size_t ds_sparsify_capacity(const ds_sparsifier *s, size_t n, double density)
{
    const size_t k = ds_sparsify_k(n, density);
    switch (s->cfg.method) {
    case DS_SPARSIFY_RANDOM:
    case DS_SPARSIFY_TOPK:
        return k;
    case DS_SPARSIFY_DEFT:
        return k + s->n_units < n ? k + s->n_units : n;
    default:
        return n;
    }
}

/* Candidates for m_micro: the pass keeps the entries over delta x
 * micro_cand as well as counting those over delta (the top of the file).
 * The ratio follows how far the rule has been missing: down when a call's
 * candidates held fewer than k (a second read), up when they held more
 * than MICRO_CAND_MAX x k (writes for nothing). */
#define MICRO_CAND_START 0.75f
#define MICRO_CAND_MIN (1.0f / 64.0f)
#define MICRO_CAND_MAX 4

/* ---- object ------------------------------------------------------------- */

static int check_units(const uint32_t *off, size_t n_units, size_t n)
{
    if (n_units == 0 || off[0] != 0 || off[n_units] != n)
        return -EINVAL;
    for (size_t u = 0; u < n_units; u++)
        if (off[u + 1] < off[u])
            return -EINVAL;
    return 0;
}

/* A device table names its device and has every kernel the methods use. */
static int device_table_ok(const ds_select_ops *o)
{
    return o->device >= 0 && o->count && o->compact && o->filter && o->filter_ties && o->hist &&
           o->hist_sub && o->norms && o->absmean_at && o->gather && o->scatter_add &&
           o->zero_at && o->accumulate && o->alloc && o->free && o->upload && o->download &&
           o->sync;
}

int ds_sparsifier_create(ds_sparsifier **out, const ds_sparsify_cfg *cfg, size_t n_max,
                         const ds_select_ops *ops)
{
    if (!out)
        return -EINVAL;
    *out = NULL;
    if (!cfg || (unsigned)cfg->method >= DS_SPARSIFY_N_METHODS)
        return -EINVAL;
    if (n_max > UINT32_MAX)
        return -EOVERFLOW;
    if (ops && ops->kind != DS_BACKEND_CPU && !device_table_ok(ops))
        return -EINVAL;
    if (!(cfg->threshold >= 0.0f) || !isfinite(cfg->threshold))
        return -EINVAL;
    if (cfg->start != DS_START_KTH && cfg->start != DS_START_PUBLISHED)
        return -EINVAL;
    if (cfg->method == DS_SPARSIFY_DEFT && cfg->unit_off &&
        check_units(cfg->unit_off, cfg->n_units, n_max) < 0)
        return -EINVAL;

    ds_sparsifier *s = calloc(1, sizeof(*s));
    if (!s)
        return -ENOMEM;
    int ret = -ENOMEM;
    s->cfg = *cfg;
    s->n_max = n_max;
    if (ops)
        s->ops = *ops;
    else
        ds_select_ops_init(&s->ops, ds_cpu_flags());
    s->dev = s->ops.kind != DS_BACKEND_CPU;
    s->rng = cfg->seed ^ SP_RNG_DOMAIN;
    s->micro_cand = MICRO_CAND_START;

    if (cfg->method == DS_SPARSIFY_DEFT) {
        s->n_units = cfg->unit_off ? cfg->n_units : 1;
        const size_t ubytes = (s->n_units + 1) * sizeof(*s->units);
        s->units = malloc(ubytes);
        s->norms = malloc(s->n_units * sizeof(*s->norms));
        s->k_unit = malloc(s->n_units * sizeof(*s->k_unit));
        if (!s->units || !s->norms || !s->k_unit)
            goto fail;
        if (cfg->unit_off) {
            memcpy(s->units, cfg->unit_off, ubytes);
        } else {
            s->units[0] = 0;
            s->units[1] = (uint32_t)n_max;
        }
        s->cfg.unit_off = s->units;
        s->cfg.n_units = s->n_units;
        /* The norms kernel reads the offsets from the table's memory. */
        s->units_k = s->units;
        if (s->dev) {
            s->units_k = s->ops.alloc(ubytes);
            if (!s->units_k)
                goto fail;
            if (s->ops.upload(s->units_k, s->units, ubytes) < 0) {
                ret = -EIO;
                goto fail;
            }
        }
    } else {
        s->cfg.unit_off = NULL;
        s->cfg.n_units = 0;
    }
    if (cfg->method == DS_SPARSIFY_RANDOM) {
        s->bitmap = calloc(n_max / 64 + 1, sizeof(*s->bitmap));
        if (!s->bitmap)
            goto fail;
    }
    *out = s;
    return 0;

fail:
    ds_sparsifier_destroy(&s);
    return ret;
}

void ds_sparsifier_destroy(ds_sparsifier **sp)
{
    if (!sp || !*sp)
        return;
    ds_sparsifier *s = *sp;
    if (s->dev) {
        s->ops.free(s->units_k);
        s->ops.free(s->g_units_k);
    }
    free(s->units);
    free(s->norms);
    free(s->k_unit);
    free(s->g_units);
    free(s->g_norms);
    free(s->g_sq);
    free(s->g_k);
    free(s->g_bin);
    free(s->bitmap);
    ds_sp_free(s, s->cand_idx);
    ds_sp_free(s, s->cand_val);
    free(s->h_idx);
    free(s->h_val);
    free(s);
    *sp = NULL;
}

void ds_sparsifier_reset(ds_sparsifier *s)
{
    if (!s)
        return;
    s->started = 0;
    s->delta = 0.0f;
    s->mean_prev = 0.0;
    s->micro_ratio = 0.0;
    s->micro_fed = 0;
    s->micro_group_count = 0;
    s->micro_k_group = 0;
    s->micro_cand = MICRO_CAND_START;
    s->g_fed = 0;
}

void ds_sparsifier_state_get(const ds_sparsifier *s, ds_sparsify_state *out)
{
    *out = (ds_sparsify_state){
        .rng = s->rng, .started = s->started, .delta = s->delta, .mean_prev = s->mean_prev,
        .micro_ratio = s->micro_ratio, .micro_fed = s->micro_fed,
        .micro_group_count = s->micro_group_count, .micro_k_group = s->micro_k_group};
}

void ds_sparsifier_state_set(ds_sparsifier *s, const ds_sparsify_state *in)
{
    s->rng = in->rng;
    s->started = in->started;
    s->delta = in->delta;
    s->mean_prev = in->mean_prev;
    s->micro_ratio = in->micro_ratio;
    s->micro_fed = in->micro_fed;
    s->micro_group_count = (size_t)in->micro_group_count;
    s->micro_k_group = (size_t)in->micro_k_group;
}

enum ds_sparsify_method ds_sparsifier_method(const ds_sparsifier *s)
{
    return s->cfg.method;
}

float ds_sparsifier_threshold(const ds_sparsifier *s)
{
    if (s->cfg.method == DS_SPARSIFY_THRESHOLD && s->cfg.threshold > 0.0f)
        return s->cfg.threshold;
    return s->started ? s->delta : 0.0f;
}

void ds_sparsifier_totals(const ds_sparsifier *s, ds_sparsify_totals *t)
{
    *t = s->totals;
}

int ds_sp_check(const ds_sparsifier *s, const float *v, size_t n, double density,
                const uint32_t *idx, const float *val)
{
    if (!s)
        return -EINVAL;
    if (n > UINT32_MAX)
        return -EOVERFLOW;
    if (!(density > 0.0) || !(density <= 1.0))
        return -EINVAL;
    if (n > 0 && (!v || !idx || !val))
        return -EINVAL;
    if (n > s->n_max)
        return -EINVAL;
    return 0;
}

void ds_sp_account(ds_sparsifier *s, ds_sparsify_result *res, size_t n, size_t k, size_t count,
                   size_t nonfinite, float threshold)
{
    s->totals.calls++;
    s->totals.elements += n;
    s->totals.selected += count;
    s->totals.nonfinite += nonfinite;
    s->totals.calls_with_nonfinite += nonfinite > 0;
    if (res) {
        res->n = n;
        res->k = k;
        res->count = count;
        res->nonfinite = nonfinite;
        res->threshold = threshold;
        res->density = n ? (double)count / (double)n : 0.0;
    }
}

/* ---- helpers ------------------------------------------------------------ */

/* The largest float <= x, as a magnitude key (x >= 0). */
static uint32_t key_floor(double x)
{
    if (!(x > 0.0))
        return 0;
    if (x >= (double)FLT_MAX)
        return ds_sel_key(FLT_MAX);
    float f = (float)x;
    if ((double)f > x)
        f = nextafterf(f, 0.0f);
    return ds_sel_key(f);
}

/* A usable threshold: positive and finite. */
static int threshold_ok(float t)
{
    return t > 0.0f && t <= FLT_MAX;
}

/* Raise a threshold of 0 (or a denormal that rounds there) to the smallest
 * positive float, so "|v| >= t" never selects zeros. */
static float positive(float t)
{
    return t > 0.0f ? t : FLT_TRUE_MIN;
}

/* The threshold start (see the top of the file). */
static int start_threshold(ds_sparsifier *s, const float *v, size_t n, size_t k, float *delta)
{
    float t;
    if (s->cfg.start == DS_START_PUBLISHED) {
        t = (float)(1.0 / (2.0 * sqrt((double)k)));
    } else {
        uint32_t key;
        int ret = ds_sp_kth_key(s, v, n, k, &key);
        if (ret < 0)
            return ret;
        t = ds_sel_key_value(key);
    }
    *delta = positive(t);
    return 0;
}

/* Sampled mean |v|: Slovin's sample size for e = 0.05, positions drawn
 * uniformly with replacement. */
static double sampled_mean(ds_sparsifier *s, const float *v, size_t n)
{
    uint32_t pos[SAGE_MAX_SAMPLES];
    size_t ns = (size_t)((double)n / (1.0 + (double)n * 0.0025));
    if (ns < 1)
        ns = 1;
    if (ns > SAGE_MAX_SAMPLES)
        ns = SAGE_MAX_SAMPLES;
    for (size_t j = 0; j < ns; j++)
        pos[j] = ds_sp_below(&s->rng, n);
    size_t used;
    return s->ops.absmean_at(v, pos, ns, &used);
}

/* ---- methods -------------------------------------------------------------
 * Each selects from v[0..n), n >= 1, writing base-relative indices, and
 * reports count, nonfinite and the threshold. State changes only once
 * nothing can fail any more. */

typedef struct call {
    const float *v;
    size_t n;
    uint32_t base;
    double d;
    size_t k;
    uint32_t *idx;
    float *val;
    size_t cap;
    size_t count, nonfinite;
    float threshold;
} call;

static int m_none(ds_sparsifier *s, call *c)
{
    ds_sel_tally tl;
    s->ops.compact(c->v, c->n, 0, 0, c->base, c->idx, c->val, c->cap, &tl);
    c->count = tl.kept;
    c->nonfinite = tl.nonfinite;
    return 0;
}

/* Floyd's algorithm: for j = n-k .. n-1 draw t in [0, j]; take t, or j
 * when t is taken already. Every k-subset comes out equally likely, after
 * k draws. A bitmap of n bits holds the set and, scanned word by word,
 * yields it in increasing order into out[0..k) (and is left zero). */
static size_t random_draw(ds_sparsifier *s, size_t n, size_t k, uint32_t *out)
{
    uint64_t *bm = s->bitmap;
    for (size_t j = n - k; j < n; j++) {
        const uint32_t t = ds_sp_below(&s->rng, (uint64_t)j + 1);
        const uint64_t bit = 1ull << (t & 63);
        if (bm[t >> 6] & bit)
            bm[j >> 6] |= 1ull << (j & 63);
        else
            bm[t >> 6] |= bit;
    }
    size_t cnt = 0;
    for (size_t w = 0; w <= (n - 1) >> 6; w++) {
        uint64_t x = bm[w];
        bm[w] = 0;
        while (x) {
            out[cnt++] = (uint32_t)(w * 64 + (size_t)__builtin_ctzll(x));
            x &= x - 1;
        }
    }
    return cnt;
}

/* Drop the draws that hit NaN / Inf, and make the indices base-relative,
 * in place (host memory); returns how many remain, *bad how many went. */
static size_t random_keep_finite(uint32_t *idx, float *val, size_t cnt, uint32_t base,
                                 size_t *bad)
{
    size_t j = 0, nf = 0;
    for (size_t i = 0; i < cnt; i++) {
        const int fin = ds_sel_key(val[i]) < DS_SEL_KEY_INF;
        idx[j] = base + idx[i];
        val[j] = val[i];
        j += (size_t)fin;
        nf += (size_t)!fin;
    }
    *bad = nf;
    return j;
}

/* Host room for `need` draws and their values (random on a device). */
static int host_reserve(ds_sparsifier *s, size_t need)
{
    if (need <= s->h_cap)
        return 0;
    uint32_t *ni = malloc(need * sizeof(*ni));
    float *nv = malloc(need * sizeof(*nv));
    if (!ni || !nv) {
        free(ni);
        free(nv);
        return -ENOMEM;
    }
    free(s->h_idx);
    free(s->h_val);
    s->h_idx = ni;
    s->h_val = nv;
    s->h_cap = need;
    return 0;
}

/* random with v, idx and val on a device: the draws are made here, go up,
 * the values are gathered there and come down (k of them) to be checked
 * for NaN / Inf; what is sent goes up again only when that or the base
 * changed it. */
static int m_random_dev(ds_sparsifier *s, call *c)
{
    int ret = host_reserve(s, c->k);
    if (ret < 0)
        return ret;
    const size_t cnt = random_draw(s, c->n, c->k, s->h_idx);
    ret = s->ops.upload(c->idx, s->h_idx, cnt * sizeof(*c->idx));
    if (ret == 0) {
        s->ops.gather(c->val, c->v, c->idx, cnt);
        ret = s->ops.download(s->h_val, c->val, cnt * sizeof(*c->val));
    }
    if (ret < 0)
        return ret;
    const size_t j = random_keep_finite(s->h_idx, s->h_val, cnt, c->base, &c->nonfinite);
    if (j != cnt || c->base)
        ret = s->ops.upload(c->idx, s->h_idx, j * sizeof(*c->idx));
    if (ret == 0 && j != cnt)
        ret = s->ops.upload(c->val, s->h_val, j * sizeof(*c->val));
    c->count = j;
    return ret;
}

static int m_random(ds_sparsifier *s, call *c)
{
    if (s->dev)
        return m_random_dev(s, c);
    const size_t cnt = random_draw(s, c->n, c->k, c->idx);
    s->ops.gather(c->val, c->v, c->idx, cnt);
    c->count = random_keep_finite(c->idx, c->val, cnt, c->base, &c->nonfinite);
    return 0;
}

static int m_topk(ds_sparsifier *s, call *c)
{
    uint32_t kth;
    int ret = ds_sp_topk(s, c->v, c->n, c->k, c->base, c->idx, c->val, c->cap, &c->count, &kth,
                         &c->nonfinite);
    c->threshold = ds_sel_key_value(kth);
    return ret;
}

static int m_threshold(ds_sparsifier *s, call *c)
{
    float delta;
    if (s->cfg.threshold > 0.0f) {
        delta = s->cfg.threshold;
    } else if (s->started && threshold_ok(s->delta)) {
        delta = s->delta;
    } else {
        int ret = start_threshold(s, c->v, c->n, c->k, &delta);
        if (ret < 0)
            return ret;
        s->totals.starts++;
    }
    ds_sel_tally tl;
    const uint32_t t = ds_sel_key(delta);
    s->ops.compact(c->v, c->n, t, t, c->base, c->idx, c->val, c->cap, &tl);
    c->count = tl.kept;
    c->nonfinite = tl.nonfinite;
    c->threshold = delta;
    s->delta = delta;
    s->started = 1;
    return 0;
}

static int m_sage(ds_sparsifier *s, call *c)
{
    const double m = sampled_mean(s, c->v, c->n);
    ds_sel_tally tl;
    float exam = 0.0f;
    if (s->started) {
        const double alpha = (m > 0.0 && s->mean_prev > 0.0) ? m / s->mean_prev : 1.0;
        exam = (float)((double)s->delta * alpha);
    }
    if (!s->started || !threshold_ok(exam)) {
        float delta;
        int ret = start_threshold(s, c->v, c->n, c->k, &delta);
        if (ret < 0)
            return ret;
        const uint32_t t = ds_sel_key(delta);
        s->ops.compact(c->v, c->n, t, t, c->base, c->idx, c->val, c->cap, &tl);
        c->count = tl.kept;
        c->nonfinite = tl.nonfinite;
        c->threshold = delta;
        s->totals.starts++;
        s->delta = delta;
        s->mean_prev = m;
        s->started = 1;
        return 0;
    }

    /* One pass: compact over the lowest delta_t can reach, count over
     * delta*alpha (see the top of the file). cap >= n holds everything. */
    const double d = c->d;
    const double lo = (double)exam * 0.95 * 2.0 / (1.0 + exp(d));
    const uint32_t t_lo = key_floor(lo);
    s->ops.compact(c->v, c->n, t_lo, ds_sel_key(exam), c->base, c->idx, c->val, c->cap, &tl);

    const double d_exam = (double)tl.counted / (double)c->n;
    const double beta = 2.0 / (1.0 + exp(d - d_exam));
    const double ratio = d_exam / d;
    const double gamma = ratio < 0.1 ? 0.95 : ratio > 10.0 ? 1.05 : 1.0;
    double next = (double)exam * beta * gamma;
    if (next > (double)FLT_MAX)
        next = (double)FLT_MAX;
    float delta = (float)next;
    /* delta >= lo by the bounds above; the float rounding of each may not
     * agree in the last bit, and the candidates cover only >= t_lo. */
    uint32_t t = ds_sel_key(delta);
    if (t < t_lo) {
        t = t_lo;
        delta = ds_sel_key_value(t);
    }
    /* Within +-10% of k (the top of the file). */
    const size_t k = c->k, band_lo = k - k / 10, band_hi = k + k / 10;
    size_t at_t = 0;
    if (s->dev) {
        /* The candidates are finite (compacted), so "counted" is at_t. */
        ds_sel_tally ct;
        s->ops.count(c->val, tl.kept, t, &ct);
        at_t = ct.counted;
    } else {
        for (size_t i = 0; i < tl.kept; i++)
            at_t += ds_sel_key(c->val[i]) >= t;
    }
    float next_delta = delta;
    if (at_t < band_lo || at_t > band_hi) {
        if (tl.kept > k) {
            uint32_t kth;
            int ret = ds_sp_kth_key(s, c->val, tl.kept, k, &kth);
            if (ret < 0)
                return ret;
            /* Never 0: zeros are not selected by a threshold. */
            delta = next_delta = positive(ds_sel_key_value(kth > t_lo ? kth : t_lo));
            t = ds_sel_key(delta);
        } else if (tl.kept >= band_lo) {
            delta = next_delta = positive(ds_sel_key_value(t_lo));
            t = ds_sel_key(delta);
        } else {
            /* Too few candidates: the exact k-th of the whole vector, a
             * second read (a threshold start, counted as a band call). */
            int ret = start_threshold(s, c->v, c->n, k, &delta);
            if (ret < 0)
                return ret;
            s->ops.compact(c->v, c->n, ds_sel_key(delta), ds_sel_key(delta), c->base, c->idx,
                           c->val, c->cap, &tl);
            c->count = tl.kept;
            c->nonfinite = tl.nonfinite;
            c->threshold = delta;
            s->delta = delta;
            s->mean_prev = m;
            s->totals.banded++;
            s->totals.reread++;
            return 0;
        }
        s->totals.banded++;
    }
    c->count = s->ops.filter(c->idx, c->val, tl.kept, t);
    c->nonfinite = tl.nonfinite;
    c->threshold = delta;
    s->delta = next_delta;
    s->mean_prev = m;
    return 0;
}

static uint32_t micro_cand_key(const ds_sparsifier *s, float delta)
{
    const float low = delta * s->micro_cand;
    return low > 0.0f ? ds_sel_key(low) : 0;
}

static int m_micro(ds_sparsifier *s, call *c)
{
    float delta = 0.0f;
    if (s->started) {
        double e = s->micro_ratio;
        if (s->micro_fed && s->micro_k_group > 0)
            e = (double)s->micro_group_count / (double)s->micro_k_group;
        const double sf = e > 1.1 ? 1.005 : e > 0.909 ? 1.00125 : 0.995;
        delta = (float)((double)s->delta * sf);
    }
    if (!s->started || !threshold_ok(delta)) {
        int ret = start_threshold(s, c->v, c->n, c->k, &delta);
        if (ret < 0)
            return ret;
        s->totals.starts++;
    }
    /* One pass: the rule's selection (>= t) counted, the candidates
     * (>= tc <= t) kept; the buffers hold n (cap >= n, the capacity). */
    ds_sel_tally tl;
    uint32_t t = ds_sel_key(delta), tc = micro_cand_key(s, delta);
    s->ops.compact(c->v, c->n, tc, t, c->base, c->idx, c->val, c->cap, &tl);
    size_t cand = tl.kept, count = tl.counted;
    const size_t nonfinite = tl.nonfinite;
    /* Runaway guard (ours, not the authors'): MiCRO moves its threshold by
     * at most 0.5% per call, so when the vector's scale changes by orders
     * of magnitude -- accumulated drift after a first call on one step's
     * drift, or a model transfer -- it would send far too much (or too
     * little) for hundreds of calls. When a call keeps more than
     * DS_SPARSIFY_RUNAWAY x k, or fewer than k / DS_SPARSIFY_RUNAWAY,
     * restart from this call's exact k-th largest |v|, as on a first call. */
    if (s->started && c->k >= DS_SPARSIFY_RUNAWAY &&
        (count > DS_SPARSIFY_RUNAWAY * c->k || count * DS_SPARSIFY_RUNAWAY < c->k)) {
        int ret = start_threshold(s, c->v, c->n, c->k, &delta);
        if (ret < 0)
            return ret;
        s->totals.starts++;
        t = tc = ds_sel_key(delta);
        s->ops.compact(c->v, c->n, t, t, c->base, c->idx, c->val, c->cap, &tl);
        cand = count = tl.kept;
    }
    /* Within +-10% of k (the top of the file): over the band, the k
     * largest of the candidates; under it, the same when the candidates
     * hold k or more (all entries over tc are there, so the k-th largest
     * of the candidates is the vector's), else the exact k-th largest of
     * the whole vector (a second read). Either way the selection is the
     * one a second read would give, bit for bit. The threshold found
     * steers on. */
    const size_t k = c->k, band_lo = k - k / 10, band_hi = k + k / 10;
    if (s->started && (count < band_lo || count > band_hi)) {
        uint32_t kth;
        if (count > band_hi || cand >= k) {
            int ret = ds_sp_kth_key(s, c->val, cand, k, &kth);
            if (ret < 0)
                return ret;
            delta = positive(ds_sel_key_value(kth));
            t = ds_sel_key(delta);
        } else {
            int ret = ds_sp_kth_key(s, c->v, c->n, k, &kth);
            if (ret < 0)
                return ret;
            delta = positive(ds_sel_key_value(kth));
            t = tc = ds_sel_key(delta);
            s->ops.compact(c->v, c->n, t, t, c->base, c->idx, c->val, c->cap, &tl);
            cand = tl.kept;
            s->totals.reread++;
            s->micro_cand = fmaxf(s->micro_cand * 0.75f, MICRO_CAND_MIN);
        }
        s->totals.banded++;
    }
    if (cand > MICRO_CAND_MAX * k && s->micro_cand < 1.0f)
        s->micro_cand = fminf(s->micro_cand * 1.05f, 1.0f);
    count = tc < t ? s->ops.filter(c->idx, c->val, cand, t) : cand;
    c->count = count;
    c->nonfinite = nonfinite;
    c->threshold = delta;
    s->delta = delta;
    s->started = 1;
    s->micro_ratio = (double)count / (double)c->k;
    s->micro_fed = 0;
    return 0;
}

static int m_deft(ds_sparsifier *s, call *c)
{
    s->ops.norms(c->v, s->units_k, s->n_units, s->norms);
    long long sum = ds_deft_alloc(s->units, s->n_units, s->norms, c->k, s->k_unit);
    if (sum < 0)
        return (int)sum;
    if ((size_t)sum > c->cap)
        return -ENOBUFS; /* not reached: sum <= min(n, k + units) <= cap */
    size_t count = 0, nonfinite = 0;
    for (size_t u = 0; u < s->n_units; u++) {
        const uint32_t off = s->units[u];
        size_t got, nf;
        uint32_t kth;
        int ret = ds_sp_topk(s, c->v + off, s->units[u + 1] - off, s->k_unit[u], c->base + off,
                             c->idx + count, c->val + count, c->cap - count, &got, &kth, &nf);
        if (ret < 0)
            return ret;
        count += got;
        nonfinite += nf;
    }
    c->count = count;
    c->nonfinite = nonfinite;
    return 0;
}

typedef int (*method_fn)(ds_sparsifier *s, call *c);
static const method_fn methods[DS_SPARSIFY_N_METHODS] = {
    m_none, m_random, m_topk, m_threshold, m_sage, m_micro, m_deft,
};

/* Run the method on v[0..n) (already checked) and account for it. */
static int run(ds_sparsifier *s, const float *v, size_t n, uint32_t base, double density,
               uint32_t *idx, float *val, size_t cap, ds_sparsify_result *res)
{
    call c = {
        .v = v, .n = n, .base = base, .d = density, .k = ds_sparsify_k(n, density),
        .idx = idx, .val = val, .cap = cap,
    };
    if (n > 0) {
        /* On a device a kernel can fail after the method moved its state
         * on; the table's sync says so, and the call is undone. */
        ds_sparsify_state saved;
        ds_sparsify_totals saved_totals;
        if (s->dev) {
            ds_sparsifier_state_get(s, &saved);
            saved_totals = s->totals;
        }
        int ret = methods[s->cfg.method](s, &c);
        if (ret == 0 && s->dev && s->ops.sync() < 0)
            ret = -EIO;
        if (ret < 0) {
            if (s->dev) {
                ds_sparsifier_state_set(s, &saved);
                s->totals = saved_totals;
            }
            s->totals.rejected++;
            return ret;
        }
    }
    ds_sp_account(s, res, n, c.k, c.count, c.nonfinite, c.threshold);
    return 0;
}

/* residual += g in the sparsifier's memory: ds_ef_accumulate on the host,
 * the table's kernel (queued, before the selection that reads it) on a
 * device. */
static void accumulate(ds_sparsifier *s, float *residual, const float *g, size_t n)
{
    if (s->dev)
        s->ops.accumulate(residual, g, n);
    else
        ds_ef_accumulate(residual, g, n);
}

int ds_sparsify_select(ds_sparsifier *s, const float *v, size_t n, double density,
                       uint32_t *idx, float *val, size_t cap, ds_sparsify_result *res)
{
    int ret = ds_sp_check(s, v, n, density, idx, val);
    if (!ret && s->cfg.method == DS_SPARSIFY_DEFT && n != s->units[s->n_units])
        ret = -EINVAL;
    if (!ret && cap < ds_sparsify_capacity(s, n, density))
        ret = -ENOBUFS;
    if (ret < 0) {
        if (s)
            s->totals.rejected++;
        return ret;
    }
    if (s->cfg.method == DS_SPARSIFY_MICRO)
        s->micro_k_group = ds_sparsify_k(n, density);
    return run(s, v, n, 0, density, idx, val, cap, res);
}

/* ---- group level: MiCRO (the pure chunk rule is in group.c) -------------- */

/* What ds_micro_select_owned refuses, without counting it: 0 with the
 * owned chunk in *off, *len, or a negative errno. */
static int micro_owned_check(const ds_sparsifier *s, const float *v, size_t n, unsigned G,
                             unsigned r, uint64_t t, double density, const uint32_t *idx,
                             const float *val, size_t cap, size_t *off, size_t *len)
{
    int ret = ds_sp_check(s, v, n, density, idx, val);
    if (ret < 0)
        return ret;
    if (G == 0 || r >= G)
        return -EINVAL;
    if (s->cfg.method == DS_SPARSIFY_DEFT)
        return -EINVAL; /* deft's units span the whole segment */
    ds_micro_chunk(n, G, r, t, off, len);
    return cap < ds_sparsify_capacity(s, *len, density) ? -ENOBUFS : 0;
}

int ds_micro_select_owned(ds_sparsifier *s, const float *v, size_t n, unsigned G, unsigned r,
                          uint64_t t, double density, uint32_t *idx, float *val, size_t cap,
                          ds_sparsify_result *res)
{
    size_t off = 0, len = 0;
    const int ret = micro_owned_check(s, v, n, G, r, t, density, idx, val, cap, &off, &len);
    if (ret < 0) {
        if (s)
            s->totals.rejected++;
        return ret;
    }
    s->micro_k_group = ds_sparsify_k(n, density);
    return run(s, v + off, len, (uint32_t)off, density, idx, val, cap, res);
}

int ds_micro_ef_step(ds_sparsifier *s, float *residual, const float *g, size_t n, unsigned G,
                     unsigned r, uint64_t t, double density, uint32_t *idx, float *val,
                     size_t cap, ds_sparsify_result *res)
{
    /* As ds_ef_step: everything the selection would refuse is checked
     * before the residual is touched. */
    size_t off, len;
    int ret = ds_sp_check(s, residual, n, density, idx, val);
    if (!ret && n > 0 && !g)
        ret = -EINVAL;
    if (!ret)
        ret = micro_owned_check(s, residual, n, G, r, t, density, idx, val, cap, &off, &len);
    if (ret < 0) {
        if (s)
            s->totals.rejected++;
        return ret;
    }
    accumulate(s, residual, g, n);
    ds_sparsify_result rr;
    ret = ds_micro_select_owned(s, residual, n, G, r, t, density, idx, val, cap, &rr);
    if (ret < 0)
        return ret;
    s->ops.zero_at(residual, idx, rr.count);
    if (res)
        *res = rr;
    return 0;
}

void ds_micro_feedback(ds_sparsifier *s, size_t group_count)
{
    if (!s)
        return;
    s->micro_fed = 1;
    s->micro_group_count = group_count;
}

/* ---- group level: DEFT's selection (the pure rules are in group.c) ------- */

int ds_deft_select_owned(ds_sparsifier *s, const float *v, const uint32_t *unit_off,
                         size_t n_units, const size_t *k_unit, const uint32_t *bin, unsigned G,
                         unsigned r, uint64_t t, uint32_t *idx, float *val, size_t cap,
                         ds_sparsify_result *res)
{
    int ret = 0;
    if (!s)
        return -EINVAL;
    if (!unit_off || !k_unit || !bin || !idx || !val || G == 0 || r >= G || n_units == 0)
        ret = -EINVAL;
    else if (check_units(unit_off, n_units, unit_off[n_units]) < 0 || !v)
        ret = -EINVAL;
    else if (unit_off[n_units] > s->n_max)
        ret = -EINVAL;
    const uint32_t mine = (uint32_t)((t % G + r) % G);
    size_t need = 0, k_total = 0;
    for (size_t u = 0; !ret && u < n_units; u++) {
        const size_t len = unit_off[u + 1] - unit_off[u];
        if (bin[u] == mine)
            need += k_unit[u] < len ? k_unit[u] : len;
        else if (bin[u] == DS_DEFT_COMMON)
            need += len;
        else if (bin[u] >= G)
            ret = -EINVAL;
    }
    if (!ret && need > cap)
        ret = -ENOBUFS;
    if (ret < 0) {
        s->totals.rejected++;
        return ret;
    }
    k_total = need;
    size_t count = 0, nonfinite = 0;
    for (size_t u = 0; u < n_units; u++) {
        if (bin[u] != mine && bin[u] != DS_DEFT_COMMON)
            continue;
        const uint32_t off = unit_off[u];
        const size_t len = unit_off[u + 1] - off;
        const size_t k = bin[u] == DS_DEFT_COMMON ? len : k_unit[u];
        size_t got, nf;
        uint32_t kth;
        ret = ds_sp_topk(s, v + off, len, k, off, idx + count, val + count, cap - count, &got,
                         &kth, &nf);
        if (ret < 0) {
            s->totals.rejected++;
            return ret;
        }
        count += got;
        nonfinite += nf;
    }
    if (s->dev && s->ops.sync() < 0) {
        s->totals.rejected++;
        return -EIO;
    }
    ds_sp_account(s, res, unit_off[n_units], k_total, count, nonfinite, 0.0f);
    return 0;
}

/* ---- group level: DEFT with error feedback, one member's step ------------- */

/* Cut s's layers for a group of G (kept until G changes; a new cut forgets
 * the fed-back norms, which were per unit of the old one). 0, -EINVAL or
 * -ENOMEM. */
static int deft_cut(ds_sparsifier *s, unsigned G)
{
    if (s->cfg.method != DS_SPARSIFY_DEFT || G == 0)
        return -EINVAL;
    if (s->g_units && s->g_G == G)
        return 0;
    const size_t cap = s->n_units * G + 1;
    uint32_t *units = malloc(cap * sizeof(*units));
    double *norms = malloc(cap * sizeof(*norms)), *sq = malloc(cap * sizeof(*sq));
    size_t *k = malloc(cap * sizeof(*k));
    uint32_t *bin = malloc(cap * sizeof(*bin));
    size_t nu = 0;
    int ret = units && norms && sq && k && bin ? 0 : -ENOMEM;
    if (!ret)
        ret = ds_deft_units(s->units, s->n_units, G, units, cap, &nu);
    if (ret == -ENOBUFS)
        ret = -EINVAL; /* not reached: at most G parts a layer */
    /* The norms kernel reads the cut from the table's memory. */
    uint32_t *units_k = units;
    if (!ret && s->dev) {
        units_k = s->ops.alloc((nu + 1) * sizeof(*units_k));
        if (!units_k)
            ret = -ENOMEM;
        else if (s->ops.upload(units_k, units, (nu + 1) * sizeof(*units)) < 0)
            ret = -EIO;
    }
    if (ret < 0) {
        if (s->dev && units_k != units)
            s->ops.free(units_k);
        free(units);
        free(norms);
        free(sq);
        free(k);
        free(bin);
        return ret;
    }
    if (s->dev)
        s->ops.free(s->g_units_k);
    s->g_units_k = units_k;
    free(s->g_units);
    free(s->g_norms);
    free(s->g_sq);
    free(s->g_k);
    free(s->g_bin);
    s->g_units = units;
    s->g_norms = norms;
    s->g_sq = sq;
    s->g_k = k;
    s->g_bin = bin;
    s->g_n_units = nu;
    s->g_G = G;
    s->g_fed = 0;
    return 0;
}

size_t ds_deft_group_units(ds_sparsifier *s, unsigned G)
{
    if (!s || deft_cut(s, G) < 0)
        return 0;
    return s->g_n_units;
}

int ds_deft_ef_step(ds_sparsifier *s, float *residual, const float *g, size_t n, unsigned G,
                    unsigned r, uint64_t t, double density, uint32_t *idx, float *val,
                    size_t cap, float *sq_norms, ds_sparsify_result *res)
{
    if (!s)
        return -EINVAL;
    int ret = ds_sp_check(s, residual, n, density, idx, val);
    if (!ret && ((n > 0 && !g) || r >= G || s->cfg.method != DS_SPARSIFY_DEFT))
        ret = -EINVAL;
    if (!ret && n != s->units[s->n_units])
        ret = -EINVAL;
    if (!ret)
        ret = deft_cut(s, G);
    /* The allocation and the bins come from the group's norms of the last
     * step (the same floats on every member), or from the units' lengths:
     * every member reaches the same ones without a message. */
    const size_t nu = s->g_n_units;
    for (size_t u = 0; !ret && u < nu; u++)
        s->g_norms[u] = s->g_fed ? sqrt(s->g_sq[u])
                                 : (double)(s->g_units[u + 1] - s->g_units[u]);
    const size_t k = ds_sparsify_k(n, density);
    if (!ret) {
        const long long sum = ds_deft_alloc(s->g_units, nu, s->g_norms, k, s->g_k);
        ret = sum < 0 ? (int)sum : ds_deft_pack(s->g_units, s->g_k, nu, G, s->g_bin, NULL);
    }
    if (!ret) {
        const uint32_t mine = (uint32_t)((t % G + r) % G);
        size_t need = 0;
        for (size_t u = 0; u < nu; u++)
            if (s->g_bin[u] == mine)
                need += s->g_k[u];
        if (need > cap)
            ret = -ENOBUFS;
    }
    if (ret < 0) {
        s->totals.rejected++;
        return ret;
    }
    accumulate(s, residual, g, n);
    /* This member's part of the next step's norms: its residual's, what
     * the authors' worker takes the norms of (gradient + memory). */
    if (sq_norms) {
        s->ops.norms(residual, s->g_units_k, nu, s->g_norms);
        for (size_t u = 0; u < nu; u++)
            sq_norms[u] = (float)(s->g_norms[u] * s->g_norms[u]);
    }
    ds_sparsify_result rr;
    ret = ds_deft_select_owned(s, residual, s->g_units, nu, s->g_k, s->g_bin, G, r, t, idx, val,
                               cap, &rr);
    if (ret < 0)
        return ret;
    s->ops.zero_at(residual, idx, rr.count);
    if (res)
        *res = rr;
    return 0;
}

void ds_deft_feedback(ds_sparsifier *s, unsigned G, const float *sq_norms, size_t n_units)
{
    if (!s || !sq_norms || deft_cut(s, G) < 0 || n_units != s->g_n_units)
        return;
    /* Anything but finite and >= 0 (a member's overflow, NaN) falls back to
     * the lengths; every member reads the same floats, so all fall back. */
    for (size_t u = 0; u < n_units; u++)
        if (!(sq_norms[u] >= 0.0f) || !isfinite(sq_norms[u])) {
            s->g_fed = 0;
            return;
        }
    for (size_t u = 0; u < n_units; u++)
        s->g_sq[u] = sq_norms[u];
    s->g_fed = 1;
}

/* ---- error feedback ------------------------------------------------------ */

void ds_ef_accumulate(float *residual, const float *g, size_t n)
{
    for (size_t i = 0; i < n; i++)
        residual[i] = residual[i] + g[i];
}

int ds_ef_zero(float *residual, size_t n, const uint32_t *idx, size_t count)
{
    if (count == 0)
        return 0;
    if (!residual || !idx)
        return -EINVAL;
    for (size_t j = 1; j < count; j++)
        if (idx[j] <= idx[j - 1])
            return -EINVAL;
    if (idx[count - 1] >= n)
        return -ERANGE;
    ds_sel_zero_at_c(residual, idx, count);
    return 0;
}

int ds_ef_step(ds_sparsifier *s, float *residual, const float *g, size_t n, double density,
               uint32_t *idx, float *val, size_t cap, ds_sparsify_result *res)
{
    /* Check everything a select would before touching the residual, so a
     * refused call changes nothing. Past this point only -ENOMEM can come
     * back, and then the residual holds g + old residual with nothing sent:
     * no mass is lost either way. */
    int ret = ds_sp_check(s, residual, n, density, idx, val);
    if (!ret && n > 0 && !g)
        ret = -EINVAL;
    if (!ret && s->cfg.method == DS_SPARSIFY_DEFT && n != s->units[s->n_units])
        ret = -EINVAL;
    if (!ret && cap < ds_sparsify_capacity(s, n, density))
        ret = -ENOBUFS;
    if (ret < 0) {
        if (s)
            s->totals.rejected++;
        return ret;
    }
    accumulate(s, residual, g, n);
    ds_sparsify_result r;
    ret = ds_sparsify_select(s, residual, n, density, idx, val, cap, &r);
    if (ret < 0)
        return ret;
    s->ops.zero_at(residual, idx, r.count);
    if (res)
        *res = r;
    return 0;
}
