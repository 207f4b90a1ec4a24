/*
 * tests/test_sparsify.c: the sparsifiers of design §4 (sparsify/sparsify.h).
 *
 * - topk returns exactly the k largest |v|, ties to the lower index,
 *   against a sort-based oracle, with every kernel variant;
 * - every method returns sorted, unique, in-range indices whose values are
 *   v's, never a NaN / Inf, never more than its stated capacity;
 * - SAGE and MiCRO hold the target density within +-10% on average after
 *   warm-up: over 300 calls of a drifting synthetic stream, and (suite
 *   sparsify_train, in meson's slow suite: 750 training steps, 3 s here
 *   and 17 s in the sanitizer build) over 300 steps of a real stream, the
 *   parameter drift (and the gradients) of the 784-256-256-10 MLP training
 *   on Fashion-MNIST, generated here by the real trainer
 *   (node/train/train.h);
 * - DEFT: per-unit k sums to k within the number of units; the packing's
 *   heaviest bin is within 4/3 of the optimum (found by brute force);
 * - MiCRO's chunks partition the vector at every step and rotate;
 * - error feedback conserves mass bit for bit;
 * - bad input is refused, counted, and changes nothing;
 * - on a device table every method, ds_ef_step and the group steps select
 *   what the CPU path selects, index and value, with the same state,
 *   totals and residuals, over rounds that make the rules steer, band and
 *   restart: on a fake device (the C kernels behind pointers the host
 *   cannot dereference, so a stray host access crashes) always, and on
 *   CUDA when a device answers (skipped otherwise).
 * Run: meson test -C build sparsify sparsify_train --verbose
 */
#include <criterion/criterion.h>
#include <errno.h>
#include <float.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/cpu.h"
#include "node/train/train.h"
#include "sparsify/sparsify.h"
#include "testutil.h"

#define NM DS_SPARSIFY_N_METHODS

static int variants(ds_select_ops *out, const char **names)
{
    static const unsigned masks[] = {0, DS_CPU_AVX2, DS_CPU_ALL};
    static const char *mnames[] = {"ref", "avx2", "avx512"};
    const unsigned have = ds_cpu_detect();
    int n = 0;
    for (int i = 0; i < 3; i++) {
        if ((i == 1 && !(have & DS_CPU_AVX2)) || (i == 2 && !(have & DS_CPU_AVX512)))
            continue;
        ds_select_ops_init(&out[n], masks[i] & have);
        names[n++] = mnames[i];
    }
    return n;
}

static double gauss(uint64_t *s)
{
    const double u1 = ((ds_t_next(s) >> 11) + 0.5) * (1.0 / 9007199254740992.0);
    const double u2 = (ds_t_next(s) >> 11) * (1.0 / 9007199254740992.0);
    return sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2);
}

/* Gradient-like: Gaussian times a per-entry scale spread over two decades,
 * a few NaN / Inf when `salt`. */
static void fill_grad(float *v, size_t n, uint64_t seed, int salt)
{
    uint64_t s = seed;
    for (size_t i = 0; i < n; i++) {
        v[i] = (float)(gauss(&s) * 1e-3 * exp(2.3 * ((double)(i * 2654435761u % 1000) / 1000.0)));
        if (salt && ds_t_next(&s) % 211 == 0)
            v[i] = (ds_t_next(&s) & 1) ? NAN : ((ds_t_next(&s) & 1) ? INFINITY : -INFINITY);
    }
}

static size_t count_nonfinite(const float *v, size_t n)
{
    size_t c = 0;
    for (size_t i = 0; i < n; i++)
        c += !isfinite(v[i]);
    return c;
}

/* Sorted, unique, in range, values are v's, all finite. */
static int valid_selection(const char *what, const float *v, size_t n, const uint32_t *idx,
                           const float *val, size_t count)
{
    for (size_t j = 0; j < count; j++) {
        if (idx[j] >= n || (j && idx[j] <= idx[j - 1]) || memcmp(&val[j], &v[idx[j]], 4) ||
            !isfinite(val[j])) {
            cr_log_error("%s: entry %zu of %zu: idx %u (prev %u, n %zu) val %g v %g", what, j,
                         count, idx[j], j ? idx[j - 1] : 0, n, val[j], idx[j] < n ? v[idx[j]] : 0.0f);
            return 0;
        }
    }
    return 1;
}

/* ---- the top-k oracle: a full sort, which the real thing never does ---- */

typedef struct kv {
    uint32_t key, i;
} kv;

static int kv_cmp(const void *a, const void *b)
{
    const kv *x = a, *y = b;
    if (x->key != y->key)
        return x->key < y->key ? 1 : -1;
    return x->i < y->i ? -1 : x->i > y->i;
}

static int u32_cmp(const void *a, const void *b)
{
    const uint32_t x = *(const uint32_t *)a, y = *(const uint32_t *)b;
    return x < y ? -1 : x > y;
}

static size_t oracle_topk(const float *v, size_t n, size_t k, uint32_t *out)
{
    kv *a = malloc((n + 1) * sizeof(*a));
    size_t m = 0;
    for (size_t i = 0; i < n; i++)
        if (isfinite(v[i]))
            a[m++] = (kv){ds_sel_key(v[i]), (uint32_t)i};
    qsort(a, m, sizeof(*a), kv_cmp);
    const size_t c = k < m ? k : m;
    for (size_t j = 0; j < c; j++)
        out[j] = a[j].i;
    qsort(out, c, sizeof(*out), u32_cmp);
    free(a);
    return c;
}

static ds_sparsifier *make(enum ds_sparsify_method m, size_t n, const ds_select_ops *ops)
{
    ds_sparsify_cfg c;
    ds_sparsify_cfg_defaults(&c, m);
    c.seed = 12345;
    ds_sparsifier *s = NULL;
    cr_assert_eq(ds_sparsifier_create(&s, &c, n, ops), 0);
    return s;
}

Test(sparsify, method_names_round_trip)
{
    for (int m = 0; m < NM; m++)
        cr_expect_eq(ds_sparsify_method_parse(ds_sparsify_method_name(m)), m);
    cr_expect_eq(ds_sparsify_method_parse("topK"), -EINVAL);
    cr_expect_eq(ds_sparsify_method_parse(NULL), -EINVAL);
    cr_expect_null(ds_sparsify_method_name(NM));
    cr_expect_eq(ds_sparsify_k(0, 0.5), 0u);
    cr_expect_eq(ds_sparsify_k(10, 0.01), 1u);
    cr_expect_eq(ds_sparsify_k(1000, 0.0105), 11u);
    cr_expect_eq(ds_sparsify_k(1000, 1.0), 1000u);
}

Test(sparsify, topk_is_exact_with_ties_to_lower_index)
{
    ds_select_ops ops[3];
    const char *names[3];
    const int nv = variants(ops, names);
    const size_t sizes[] = {1, 2, 3, 17, 100, 1001, 4099, 65537};
    for (int vi = 0; vi < nv; vi++) {
        for (size_t si = 0; si < sizeof(sizes) / sizeof(sizes[0]); si++) {
            const size_t n = sizes[si];
            float *v = malloc(n * sizeof(float)), *val = malloc(n * sizeof(float));
            uint32_t *idx = malloc(n * sizeof(uint32_t)), *want = malloc(n * sizeof(uint32_t));
            fill_grad(v, n, 7 + si, 1);
            /* Quantize most entries so that many magnitudes tie. */
            for (size_t i = 0; i < n; i++)
                if (isfinite(v[i]) && i % 5)
                    v[i] = roundf(v[i] * 256.0f) / 256.0f;
            ds_sparsifier *s = make(DS_SPARSIFY_TOPK, n, &ops[vi]);
            const size_t ks[] = {1, 2, n / 100 + 1, n / 3 + 1, n > 1 ? n - 1 : 1, n};
            for (int ki = 0; ki < 6; ki++) {
                const size_t k = ks[ki] < n ? ks[ki] : n;
                const double d = (double)k / (double)n;
                cr_assert_eq(ds_sparsify_k(n, d), k);
                ds_sparsify_result r;
                cr_assert_eq(ds_sparsify_select(s, v, n, d, idx, val, k, &r), 0);
                const size_t c = oracle_topk(v, n, k, want);
                cr_expect_eq(r.count, c, "%s n=%zu k=%zu count %zu want %zu", names[vi], n, k, r.count, c);
                cr_expect(memcmp(idx, want, c * sizeof(uint32_t)) == 0, "%s n=%zu k=%zu: sets differ",
                          names[vi], n, k);
                cr_expect(valid_selection("topk", v, n, idx, val, r.count));
                cr_expect_eq(r.nonfinite, count_nonfinite(v, n));
                /* The reported threshold is the k-th magnitude: the smallest selected. */
                uint32_t lo = UINT32_MAX;
                for (size_t j = 0; j < r.count; j++)
                    lo = ds_sel_key(val[j]) < lo ? ds_sel_key(val[j]) : lo;
                if (r.count)
                    cr_expect_eq(ds_sel_key(r.threshold), lo);
            }
            ds_sparsifier_destroy(&s);
            cr_expect_null(s);
            free(v);
            free(val);
            free(idx);
            free(want);
        }
    }
}

Test(sparsify, topk_on_degenerate_vectors)
{
    /* All equal, all zero, all NaN but three, a single huge value. */
    const size_t n = 1000;
    float *v = malloc(n * sizeof(float)), *val = malloc(n * sizeof(float));
    uint32_t *idx = malloc(n * sizeof(uint32_t));
    ds_sparsifier *s = make(DS_SPARSIFY_TOPK, n, NULL);
    ds_sparsify_result r;
    for (size_t i = 0; i < n; i++)
        v[i] = (i & 1) ? 0.5f : -0.5f;
    cr_assert_eq(ds_sparsify_select(s, v, n, 0.01, idx, val, 10, &r), 0);
    cr_expect_eq(r.count, 10u);
    for (uint32_t j = 0; j < 10; j++)
        cr_expect_eq(idx[j], j, "ties go to the lowest indices");
    memset(v, 0, n * sizeof(float));
    cr_assert_eq(ds_sparsify_select(s, v, n, 0.01, idx, val, 10, &r), 0);
    cr_expect_eq(r.count, 10u);
    cr_expect_eq(idx[9], 9u);
    for (size_t i = 0; i < n; i++)
        v[i] = NAN;
    v[5] = 1;
    v[500] = -2;
    v[999] = 0;
    cr_assert_eq(ds_sparsify_select(s, v, n, 0.01, idx, val, 10, &r), 0);
    cr_expect_eq(r.count, 3u);
    cr_expect_eq(r.nonfinite, n - 3);
    cr_expect(idx[0] == 5 && idx[1] == 500 && idx[2] == 999);
    ds_sparsifier_destroy(&s);
    free(v);
    free(val);
    free(idx);
}

Test(sparsify, every_method_returns_sorted_unique_in_range)
{
    const size_t sizes[] = {1, 5, 64, 1001, 70001};
    const double dens[] = {1e-4, 0.01, 0.3, 1.0};
    for (int m = 0; m < NM; m++) {
        for (size_t si = 0; si < sizeof(sizes) / sizeof(sizes[0]); si++) {
            const size_t n = sizes[si];
            float *v = malloc(n * sizeof(float)), *val = malloc(n * sizeof(float));
            uint32_t *idx = malloc(n * sizeof(uint32_t));
            ds_sparsifier *s = make(m, n, NULL);
            for (int di = 0; di < 4; di++) {
                for (int call = 0; call < 4; call++) {
                    fill_grad(v, n, 1000 * si + 10 * di + call, 1);
                    const size_t cap = ds_sparsify_capacity(s, n, dens[di]);
                    ds_sparsify_result r;
                    cr_assert_eq(ds_sparsify_select(s, v, n, dens[di], idx, val, cap, &r), 0);
                    cr_expect_leq(r.count, cap);
                    cr_expect(valid_selection(ds_sparsify_method_name(m), v, n, idx, val, r.count),
                              "%s n=%zu d=%g call %d", ds_sparsify_method_name(m), n, dens[di], call);
                    if (m != DS_SPARSIFY_RANDOM)
                        cr_expect_eq(r.nonfinite, count_nonfinite(v, n), "%s nonfinite", ds_sparsify_method_name(m));
                    cr_expect_eq(r.n, n);
                    cr_expect_eq(r.k, ds_sparsify_k(n, dens[di]));
                }
            }
            ds_sparsify_totals t;
            ds_sparsifier_totals(s, &t);
            cr_expect_eq(t.calls, 16u);
            cr_expect_eq(t.rejected, 0u);
            ds_sparsifier_destroy(&s);
            free(v);
            free(val);
            free(idx);
        }
    }
}

Test(sparsify, none_sends_every_finite_entry)
{
    const size_t n = 3001;
    float v[3001], val[3001];
    uint32_t idx[3001];
    fill_grad(v, n, 3, 1);
    ds_sparsifier *s = make(DS_SPARSIFY_NONE, n, NULL);
    ds_sparsify_result r;
    cr_assert_eq(ds_sparsify_select(s, v, n, 0.01, idx, val, n, &r), 0);
    cr_expect_eq(r.count + r.nonfinite, n);
    cr_expect_gt(r.nonfinite, 0u);
    ds_sparsifier_destroy(&s);
}

Test(sparsify, random_draws_k_uniformly_and_reproducibly)
{
    const size_t n = 100, k = 10, calls = 20000;
    float v[100], val[100];
    uint32_t idx[100], first[10];
    for (size_t i = 0; i < n; i++)
        v[i] = 1.0f + (float)i;
    ds_sparsifier *s = make(DS_SPARSIFY_RANDOM, n, NULL);
    unsigned hits[100] = {0};
    for (size_t c = 0; c < calls; c++) {
        ds_sparsify_result r;
        cr_assert_eq(ds_sparsify_select(s, v, n, 0.1, idx, val, k, &r), 0);
        cr_assert_eq(r.count, k);
        cr_assert(valid_selection("random", v, n, idx, val, r.count));
        if (c == 0)
            memcpy(first, idx, sizeof(first));
        for (size_t j = 0; j < k; j++)
            hits[idx[j]]++;
    }
    /* Each index is drawn with probability k/n: 2000 +- 42.4 (binomial sd);
     * 6 sd either way. */
    for (size_t i = 0; i < n; i++)
        cr_expect(hits[i] > 2000 - 255 && hits[i] < 2000 + 255, "index %zu drawn %u times", i, hits[i]);
    /* Same seed, same draws; another seed, other draws. */
    ds_sparsifier *s2 = make(DS_SPARSIFY_RANDOM, n, NULL);
    ds_sparsify_result r;
    cr_assert_eq(ds_sparsify_select(s2, v, n, 0.1, idx, val, k, &r), 0);
    cr_expect(memcmp(idx, first, sizeof(first)) == 0);
    ds_sparsify_cfg c;
    ds_sparsify_cfg_defaults(&c, DS_SPARSIFY_RANDOM);
    c.seed = 99;
    ds_sparsifier *s3 = NULL;
    cr_assert_eq(ds_sparsifier_create(&s3, &c, n, NULL), 0);
    cr_assert_eq(ds_sparsify_select(s3, v, n, 0.1, idx, val, k, &r), 0);
    cr_expect(memcmp(idx, first, sizeof(first)) != 0);
    /* NaN draws are dropped and counted. */
    for (size_t i = 0; i < n; i += 2)
        v[i] = NAN;
    cr_assert_eq(ds_sparsify_select(s3, v, n, 0.5, idx, val, 50, &r), 0);
    cr_expect_eq(r.count + r.nonfinite, 50u);
    cr_expect_gt(r.nonfinite, 0u);
    cr_expect(valid_selection("random nan", v, n, idx, val, r.count));
    ds_sparsifier_destroy(&s);
    ds_sparsifier_destroy(&s2);
    ds_sparsifier_destroy(&s3);
}

Test(sparsify, threshold_fixed_start_and_published)
{
    const size_t n = 10007;
    float *v = malloc(n * sizeof(float)), *val = malloc(n * sizeof(float));
    uint32_t *idx = malloc(n * sizeof(uint32_t)), *want = malloc(n * sizeof(uint32_t));
    fill_grad(v, n, 17, 0);
    ds_sparsify_result r;

    /* Configured lambda: exactly |v| >= lambda. */
    ds_sparsify_cfg c;
    ds_sparsify_cfg_defaults(&c, DS_SPARSIFY_THRESHOLD);
    c.threshold = 0.004f;
    ds_sparsifier *s = NULL;
    cr_assert_eq(ds_sparsifier_create(&s, &c, n, NULL), 0);
    cr_assert_eq(ds_sparsify_select(s, v, n, 0.01, idx, val, n, &r), 0);
    size_t want_n = 0;
    for (size_t i = 0; i < n; i++)
        want_n += fabsf(v[i]) >= 0.004f;
    cr_expect_eq(r.count, want_n);
    cr_expect_eq(r.threshold, 0.004f);
    ds_sparsifier_destroy(&s);

    /* Threshold start: the first call's exact k-th |v|, kept afterwards. */
    s = make(DS_SPARSIFY_THRESHOLD, n, NULL);
    cr_expect_eq(ds_sparsifier_threshold(s), 0.0f);
    const size_t k = ds_sparsify_k(n, 0.01);
    cr_assert_eq(ds_sparsify_select(s, v, n, 0.01, idx, val, n, &r), 0);
    const size_t c0 = oracle_topk(v, n, k, want);
    float kth = INFINITY;
    for (size_t j = 0; j < c0; j++)
        kth = fminf(kth, fabsf(v[want[j]]));
    cr_expect_eq(r.threshold, kth);
    cr_expect_eq(r.count, k, "distinct magnitudes: exactly k at the k-th value");
    fill_grad(v, n, 18, 0);
    cr_assert_eq(ds_sparsify_select(s, v, n, 0.01, idx, val, n, &r), 0);
    cr_expect_eq(r.threshold, kth);
    ds_sparsify_totals t;
    ds_sparsifier_totals(s, &t);
    cr_expect_eq(t.starts, 1u);
    ds_sparsifier_destroy(&s);

    /* The authors' start, for every threshold method. */
    const int ms[] = {DS_SPARSIFY_THRESHOLD, DS_SPARSIFY_SAGE, DS_SPARSIFY_MICRO};
    for (int i = 0; i < 3; i++) {
        ds_sparsify_cfg_defaults(&c, ms[i]);
        c.start = DS_START_PUBLISHED;
        cr_assert_eq(ds_sparsifier_create(&s, &c, n, NULL), 0);
        cr_assert_eq(ds_sparsify_select(s, v, n, 0.01, idx, val, n, &r), 0);
        cr_expect_eq(r.threshold, (float)(1.0 / (2.0 * sqrt((double)k))));
        ds_sparsifier_destroy(&s);
    }
    free(v);
    free(val);
    free(idx);
    free(want);
}

/* ---- target tracking ----------------------------------------------------- */

/* Mean achieved density of calls [warm, calls) relative to the target,
 * and the lowest and highest count of one call relative to its k. */
typedef struct track {
    double sum;
    int n;
    double lo, hi;
} track;

static void track_add(track *t, int call, int warm, const ds_sparsify_result *r, double d)
{
    if (call >= warm) {
        const double x = r->density / d, xk = (double)r->count / (double)r->k;
        t->lo = t->n == 0 || xk < t->lo ? xk : t->lo;
        t->hi = t->n == 0 || xk > t->hi ? xk : t->hi;
        t->sum += x;
        t->n++;
    }
}

static double track_mean(const track *t)
{
    return t->n ? t->sum / t->n : 0.0;
}

/* A drifting synthetic stream: fresh Gaussian-like values every call, with
 * per-entry scales over two decades, a tenth of the entries three times
 * louder (the heavier tail real gradients have), and an overall scale that
 * follows a slow wave and a trend. The scale changes by at most ~0.35% per
 * call: the pace the real MLP's ideal threshold keeps once training is past
 * its first few hundred steps, and inside what both rules are built for
 * (MiCRO moves its threshold by at most 0.5% per call; SAGE follows the
 * mean of |v|). The shape stays put on purpose: SAGE's beta moves the
 * threshold by about (d_exam - d) / 2 per call, nothing at d = 0.1%, so a
 * tail that grows faster than the mean is not corrected (docs/sparsify.md
 * has the measurement). */
static void drift_stream(float *v, size_t n, int t, uint64_t seed)
{
    uint64_t s = seed * 1000003u + (uint64_t)t;
    const double scale = exp(0.2 * sin(6.283185307179586 * t / 500.0)) * (1.0 + 0.001 * t);
    const double heavy = 0.10;
    for (size_t i = 0; i < n; i++) {
        double g = gauss(&s);
        if ((double)(ds_t_next(&s) >> 11) * (1.0 / 9007199254740992.0) < heavy)
            g *= 3.0;
        v[i] = (float)(g * 1e-3 * scale * exp(2.3 * ((double)(i * 2654435761u % 1000) / 1000.0)));
    }
}

Test(sparsify, sage_and_micro_track_a_drifting_stream, .timeout = 120)
{
    const size_t n = 100003;
    const int warm = 50, calls = warm + 300;
    const double dens[] = {0.01, 0.001};
    float *v = malloc(n * sizeof(float)), *val = malloc(n * sizeof(float));
    uint32_t *idx = malloc(n * sizeof(uint32_t));
    for (int di = 0; di < 2; di++) {
        const double d = dens[di];
        ds_sparsifier *sage = make(DS_SPARSIFY_SAGE, n, NULL), *micro = make(DS_SPARSIFY_MICRO, n, NULL);
        track ts = {0}, tm = {0};
        for (int t = 0; t < calls; t++) {
            drift_stream(v, n, t, 1);
            ds_sparsify_result r;
            cr_assert_eq(ds_sparsify_select(sage, v, n, d, idx, val, n, &r), 0);
            track_add(&ts, t, warm, &r, d);
            cr_assert_eq(ds_sparsify_select(micro, v, n, d, idx, val, n, &r), 0);
            track_add(&tm, t, warm, &r, d);
        }
        cr_log_info("drifting stream d=%g: sage %.3f (calls %.3f-%.3f), micro %.3f (%.3f-%.3f) "
                    "of target", d, track_mean(&ts), ts.lo, ts.hi, track_mean(&tm), tm.lo, tm.hi);
        /* The stream is seeded and the rules are deterministic, so every
         * run measures the same: SAGE 0.992 at 1% and 0.997 at 0.1%, every
         * call within 0.900-1.100 (its +-10% band, sparsify.c); MiCRO
         * 0.993 at 1% and 0.994 at 0.1%, also every call in its band (its
         * own rule, without the band: 0.968 and 0.969, calls 0.71-1.36;
         * docs/sparsify.md). +-10% is the
         * tracking the rules are built for, and leaves 3 pt of room at the
         * closest mean. SAGE's own rule, without the band, ran 1.10x at
         * 0.1% with calls down to 0.24x: its 400-sample mean carries a few
         * % of noise into every threshold and beta is too weak to pull it
         * back (docs/sparsify.md). */
        cr_expect(fabs(track_mean(&ts) - 1.0) <= 0.10, "sage d=%g mean density %.3f of target", d, track_mean(&ts));
        cr_expect(ts.lo >= 0.9 && ts.hi <= 1.1,
                  "sage d=%g: a call at %.3f-%.3f of target, outside its band", d, ts.lo, ts.hi);
        cr_expect(fabs(track_mean(&tm) - 1.0) <= 0.10, "micro d=%g mean density %.3f of target", d, track_mean(&tm));
        cr_expect(tm.lo >= 0.9 && tm.hi <= 1.1,
                  "micro d=%g: a call at %.3f-%.3f of target, outside its band", d, tm.lo, tm.hi);
        ds_sparsify_totals tt;
        ds_sparsifier_totals(micro, &tt);
        cr_log_info("micro d=%g: %llu of %d calls banded, %llu read the vector twice", d,
                    (unsigned long long)tt.banded, calls, (unsigned long long)tt.reread);
        ds_sparsifier_destroy(&sage);
        ds_sparsifier_destroy(&micro);
    }
    free(v);
    free(val);
    free(idx);
}

/* MiCRO's band from its candidates (sparsify.c): the pass keeps the
 * entries over a fraction of the threshold, and a call under the band
 * takes its k-th largest from them instead of reading the vector again.
 * An error-feedback stream (acc += g, the selection sent and zeroed) whose
 * scale moves, jumps 50x at one call and carries NaNs: every call's
 * selection must still be exactly "every finite entry at or over the
 * threshold it reports", in index order, inside +-10% of k once started;
 * and the band calls must almost never read the vector twice (0 of 221 at
 * 1%, 13 of 262 at 0.1% when this was written; before the candidates,
 * every call under the band did). */
Test(sparsify, micro_bands_from_its_candidates, .timeout = 120)
{
    const size_t n = 65537;
    const double dens[] = {0.01, 0.001};
    float *acc = calloc(n, sizeof(float)), *val = malloc(n * sizeof(float));
    uint32_t *idx = malloc(n * sizeof(uint32_t));
    for (int di = 0; di < 2; di++) {
        const double d = dens[di];
        const size_t k = ds_sparsify_k(n, d);
        ds_sparsifier *s = make(DS_SPARSIFY_MICRO, n, NULL);
        uint64_t st = 99 + (uint64_t)di;
        for (int t = 0; t < 300; t++) {
            const double sc = exp(0.5 * sin(t / 40.0)) * (1.0 + 0.01 * t) * (t == 150 ? 50.0 : 1.0);
            for (size_t i = 0; i < n; i++) {
                acc[i] += (float)(gauss(&st) * 1e-3 * sc * (double)(1 + i % 7));
                if (ds_t_next(&st) % 5003 == 0)
                    acc[i] = NAN;
            }
            ds_sparsify_result r;
            cr_assert_eq(ds_sparsify_select(s, acc, n, d, idx, val, n, &r), 0);
            const uint32_t tk = ds_sel_key(r.threshold);
            size_t want = 0, j = 0;
            for (size_t i = 0; i < n; i++) {
                if (!isfinite(acc[i]) || ds_sel_key(acc[i]) < tk)
                    continue;
                want++;
                cr_assert(j < r.count && idx[j] == i && val[j] == acc[i],
                          "d=%g call %d: entry %zu of the threshold set is not selection[%zu]", d, t,
                          i, j);
                j++;
            }
            cr_assert_eq(r.count, want, "d=%g call %d: %zu selected, %zu over the threshold", d, t,
                         r.count, want);
            if (t > 0)
                cr_assert(r.count >= k - k / 10 && r.count <= k + k / 10,
                          "d=%g call %d: %zu selected for k = %zu", d, t, r.count, k);
            for (size_t m = 0; m < r.count; m++)
                acc[idx[m]] = 0.0f;
            for (size_t i = 0; i < n; i++)
                if (isnan(acc[i]))
                    acc[i] = 0.0f;
        }
        ds_sparsify_totals tt;
        ds_sparsifier_totals(s, &tt);
        cr_log_info("micro d=%g: %llu of 300 calls banded, %llu read the vector twice", d,
                    (unsigned long long)tt.banded, (unsigned long long)tt.reread);
        cr_expect(tt.banded >= 30, "d=%g: only %llu calls banded: the stream does not test the band",
                  d, (unsigned long long)tt.banded);
        cr_expect(tt.reread * 10 <= tt.banded, "d=%g: %llu of %llu band calls read the vector twice",
                  d, (unsigned long long)tt.reread, (unsigned long long)tt.banded);
        ds_sparsifier_destroy(&s);
    }
    free(acc);
    free(val);
    free(idx);
}

/* The real stream: the MLP's training on Fashion-MNIST, one segment per
 * layer as the gossip layer cuts it (design §2). Gossip level: acc +=
 * theta_after - theta_before, select from acc, acc[S] = 0. Group level:
 * residual = g + residual, select, residual[S] = 0 (ds_ef_step).
 *
 * Warm-up is 450 steps, then 300 calls are measured. Both rules start from
 * the exact k-th value and are right at step 0, but the stream then moves
 * faster than they can follow: on the drift stream momentum builds up and
 * the ideal threshold grows 5-7x within 20 steps; on the gradient stream
 * the gradients shrink about 5x within the first few hundred steps.
 * MiCRO's threshold moves at most 0.5% per call (ln 5 / ln 1.005 = 323
 * calls). Measured over steps [0, 150): MiCRO sends 1.5-3.9x the target on
 * the drift stream and 0.14-0.63x on the gradient stream; over [150, 450)
 * 0.63-0.96x; from 450 on all within 10% (docs/sparsify.md).
 *
 * The bound, +-10% per layer: seeded data and initialisation make every
 * run on one kernel variant the same. Measured with DS_KERNELS=avx512 and
 * avx2 (identical): 0.952-1.090, the closest SAGE's drift on fc3 (1.090);
 * with ref: 0.955-1.075. fc3 has 2570 values, so k = 26 and one value per
 * call is 4% of the target: the 1 pt left there is a fraction of one
 * value per call, which is why the last layer, not the rule, sits near
 * the bound.
 *
 * 750 training steps: its own suite, in meson's slow suite. */
Test(sparsify_train, sage_and_micro_track_real_mlp_training, .timeout = 600)
{
    ds_train_cfg cfg;
    ds_train_cfg_defaults(&cfg);
    cfg.backend = DS_OPS_CPU;
    cfg.init_seed = 3;
    cfg.data_seed = 4;
    ds_trainer tr;
    char err[512];
    int ret = ds_trainer_init(&tr, &cfg, err, sizeof(err));
    cr_assert_eq(ret, 0, "trainer: %s", err);
    cr_assert_eq(tr.model.n_layers, 3);
    cr_assert_eq(tr.n_params, (size_t)(784 * 256 + 256 + 256 * 256 + 256 + 256 * 10 + 10));
    const size_t np = tr.n_params;
    const int warm = 450, steps = warm + 300;
    const double d = 0.01;
    enum { SAGE, MICRO, NMETH };
    enum { DRIFT, GRAD, NLEVEL };
    float *before = malloc(np * sizeof(float)), *delta = malloc(np * sizeof(float));
    float *acc[NLEVEL][NMETH];
    ds_sparsifier *sp[NLEVEL][NMETH][DS_MODEL_MAX_LAYERS];
    track tk[NLEVEL][NMETH][DS_MODEL_MAX_LAYERS];
    memset(tk, 0, sizeof(tk));
    float *val = malloc(np * sizeof(float));
    uint32_t *idx = malloc(np * sizeof(uint32_t));
    for (int lv = 0; lv < NLEVEL; lv++)
        for (int m = 0; m < NMETH; m++) {
            acc[lv][m] = calloc(np, sizeof(float));
            for (int l = 0; l < tr.model.n_layers; l++)
                sp[lv][m][l] = make(m == SAGE ? DS_SPARSIFY_SAGE : DS_SPARSIFY_MICRO, tr.model.layer[l].len, NULL);
        }
    for (int step = 0; step < steps; step++) {
        double loss;
        cr_assert_eq(ds_trainer_compute_grad(&tr, &loss, NULL), 0);
        memcpy(before, tr.theta, np * sizeof(float));
        ds_trainer_apply_grad(&tr);
        for (size_t i = 0; i < np; i++)
            delta[i] = tr.theta[i] - before[i];
        for (int lv = 0; lv < NLEVEL; lv++)
            for (int m = 0; m < NMETH; m++)
                for (int l = 0; l < tr.model.n_layers; l++) {
                    const size_t off = tr.model.layer[l].off, len = tr.model.layer[l].len;
                    const float *in = lv == DRIFT ? delta + off : tr.grad + off;
                    ds_sparsify_result r;
                    cr_assert_eq(ds_ef_step(sp[lv][m][l], acc[lv][m] + off, in, len, d, idx, val, len, &r), 0);
                    track_add(&tk[lv][m][l], step, warm, &r, d);
                }
        /* DEFT's allocation on the real gradients, over the MLP's units for
         * groups of 1 to 8: the per-unit k sums to k within the units. */
        if (step % 50 == 0) {
            uint32_t layers[DS_MODEL_MAX_LAYERS + 1];
            for (int l = 0; l < tr.model.n_layers; l++)
                layers[l] = (uint32_t)tr.model.layer[l].off;
            layers[tr.model.n_layers] = (uint32_t)np;
            for (unsigned G = 1; G <= 8; G++) {
                uint32_t units[64];
                size_t nu, ku[64];
                double norms[64];
                cr_assert_eq(ds_deft_units(layers, (size_t)tr.model.n_layers, G, units, 64, &nu), 0);
                ds_sel_norms_c(tr.grad, units, nu, norms);
                const double dd[] = {0.001, 0.01, 0.1};
                for (int di = 0; di < 3; di++) {
                    const size_t k = ds_sparsify_k(np, dd[di]);
                    const long long sum = ds_deft_alloc(units, nu, norms, k, ku);
                    cr_expect(llabs(sum - (long long)k) <= (long long)nu, "step %d G=%u d=%g: sum %lld k %zu units %zu",
                              step, G, dd[di], sum, k, nu);
                }
            }
        }
    }
    const char *lname[] = {"drift", "gradient"}, *mname[] = {"sage", "micro"};
    for (int lv = 0; lv < NLEVEL; lv++)
        for (int m = 0; m < NMETH; m++)
            for (int l = 0; l < tr.model.n_layers; l++) {
                const double mean = track_mean(&tk[lv][m][l]);
                cr_log_info("real %s stream, %s, layer %s (%zu): mean density %.3f of target", lname[lv],
                            mname[m], tr.model.layer[l].name, tr.model.layer[l].len, mean);
                cr_expect(fabs(mean - 1.0) <= 0.10, "real %s stream, %s, layer %s: mean density %.3f of target",
                          lname[lv], mname[m], tr.model.layer[l].name, mean);
                ds_sparsifier_destroy(&sp[lv][m][l]);
            }
    for (int lv = 0; lv < NLEVEL; lv++)
        for (int m = 0; m < NMETH; m++)
            free(acc[lv][m]);
    free(before);
    free(delta);
    free(val);
    free(idx);
    ds_trainer_fini(&tr);
}

/* ---- DEFT ---------------------------------------------------------------- */

/* The MLP's layer table (weights and bias together) and a few others. */
static const uint32_t mlp_layers[] = {0, 200960, 200960 + 65792, 200960 + 65792 + 2570};

Test(sparsify, deft_units_cut_large_layers)
{
    uint32_t u[64];
    size_t nu;
    cr_assert_eq(ds_deft_units(mlp_layers, 3, 4, u, 64, &nu), 0);
    /* n/G = 67330: fc1 is cut into 4, fc2 (65792) and fc3 stay whole. */
    cr_expect_eq(nu, 6u);
    cr_expect(u[0] == 0 && u[1] == 50240 && u[4] == 200960 && u[5] == 200960 + 65792 && u[6] == mlp_layers[3]);
    cr_assert_eq(ds_deft_units(mlp_layers, 3, 1, u, 64, &nu), 0);
    cr_expect_eq(nu, 3u);
    cr_expect_eq(ds_deft_units(mlp_layers, 3, 4, u, 6, &nu), -ENOBUFS);
    cr_expect_eq(ds_deft_units(mlp_layers, 3, 0, u, 64, &nu), -EINVAL);
    const uint32_t odd[] = {0, 7, 7, 10};
    cr_assert_eq(ds_deft_units(odd, 3, 3, u, 64, &nu), 0);
    cr_expect_eq(nu, 5u); /* 7 > 10/3: cut into 3,2,2; the empty layer and 3 stay */
    cr_expect(u[1] == 3 && u[2] == 5 && u[3] == 7 && u[4] == 7 && u[5] == 10);
}

Test(sparsify, deft_per_unit_k_sums_to_k)
{
    /* Layer tables like real models' (a few big weight layers, small bias
     * or norm layers), norms like real gradients': sqrt(len) times a
     * per-layer scale within a factor e of each other either way. The real
     * MLP's units are checked with its real gradients in the training
     * test below. */
    uint64_t s = 5;
    for (int trial = 0; trial < 500; trial++) {
        uint32_t off[40];
        double norms[40];
        size_t k_unit[40];
        const size_t nu = 1 + ds_t_next(&s) % 30;
        off[0] = 0;
        for (size_t u = 0; u < nu; u++) {
            const uint32_t len = (ds_t_next(&s) & 1) ? 1 + (uint32_t)(ds_t_next(&s) % 300000)
                                                     : 1 + (uint32_t)(ds_t_next(&s) % 600);
            off[u + 1] = off[u] + len;
            norms[u] = sqrt((double)len) * exp(2.0 * (((ds_t_next(&s) >> 11) * (1.0 / 9007199254740992.0)) - 0.5));
        }
        const double dd[] = {0.001, 0.01};
        for (int di = 0; di < 2; di++) {
            const size_t k = ds_sparsify_k(off[nu], dd[di]);
            const long long sum = ds_deft_alloc(off, nu, norms, k, k_unit);
            cr_assert_geq(sum, 0);
            long long check = 0;
            for (size_t u = 0; u < nu; u++) {
                cr_expect_leq(k_unit[u], (size_t)(off[u + 1] - off[u]));
                cr_expect_geq(k_unit[u], 1u);
                check += (long long)k_unit[u];
            }
            cr_expect_eq(check, sum);
            cr_expect(llabs(sum - (long long)k) <= (long long)nu, "trial %d d=%g: sum %lld k %zu units %zu",
                      trial, dd[di], sum, k, nu);
        }
    }
    /* The rule itself, by hand: norms 3, 1 over k = 8 -> 6, then 2. */
    const uint32_t off2[] = {0, 100, 200};
    const double n2[] = {1.0, 3.0};
    size_t k2[2];
    cr_expect_eq(ds_deft_alloc(off2, 2, n2, 8, k2), 8);
    cr_expect(k2[1] == 6 && k2[0] == 2);
    const double bad[] = {1.0, NAN};
    cr_expect_eq(ds_deft_alloc(off2, 2, bad, 8, k2), -EINVAL);
    /* Where the authors' rule falls short: a unit late in norm order but
     * short cannot take its share, and nobody after it can. len 1000 /
     * norm 100 takes trunc(900 * 100/101) = 891, the 5-entry unit would
     * get 9 and is capped at 5: the authors stop at 896 of 900; the 4 left
     * go back to the first unit. Zero norms get the floor of one entry
     * each, and then the remainder in unit order. */
    const uint32_t off3[] = {0, 1000, 1005};
    const double n3[] = {100.0, 1.0};
    size_t k3[2];
    cr_expect_eq(ds_deft_alloc(off3, 2, n3, 900, k3), 900);
    cr_expect(k3[0] == 895 && k3[1] == 5, "%zu %zu", k3[0], k3[1]);
    const double n4[] = {0.0, 0.0};
    cr_expect_eq(ds_deft_alloc(off3, 2, n4, 900, k3), 900);
    cr_expect(k3[0] == 899 && k3[1] == 1);
    /* Fewer entries than k: everything. */
    cr_expect_eq(ds_deft_alloc(off3, 2, n3, 5000, k3), 1005);
}

/* Optimal makespan by trying every assignment (small instances only). */
static double opt_makespan(const double *cost, size_t m, unsigned G)
{
    double best = INFINITY;
    size_t total = 1;
    for (size_t i = 0; i < m; i++)
        total *= G;
    for (size_t code = 0; code < total; code++) {
        double load[8] = {0};
        size_t c = code;
        for (size_t i = 0; i < m; i++) {
            load[c % G] += cost[i];
            c /= G;
        }
        double mx = 0;
        for (unsigned b = 0; b < G; b++)
            mx = fmax(mx, load[b]);
        best = fmin(best, mx);
    }
    return best;
}

Test(sparsify, deft_packing_within_lpt_bound, .timeout = 120)
{
    uint64_t s = 9;
    for (int trial = 0; trial < 300; trial++) {
        const unsigned G = 2 + (unsigned)(ds_t_next(&s) % 3);
        const size_t m = 3 + ds_t_next(&s) % (G == 4 ? 6 : 8);
        uint32_t off[16];
        size_t k_unit[16];
        uint32_t bin[16];
        double load[8], cost[16];
        off[0] = 0;
        for (size_t u = 0; u < m; u++) {
            off[u + 1] = off[u] + 10 + (uint32_t)(ds_t_next(&s) % 5000);
            k_unit[u] = 1 + ds_t_next(&s) % 9;
            const double len = off[u + 1] - off[u];
            cost[u] = k_unit[u] > 1 ? len * log2((double)k_unit[u]) : len;
        }
        cr_assert_eq(ds_deft_pack(off, k_unit, m, G, bin, load), 0);
        double mx = 0, sum = 0, check[8] = {0};
        for (size_t u = 0; u < m; u++) {
            cr_assert_lt(bin[u], G);
            check[bin[u]] += cost[u];
        }
        for (unsigned b = 0; b < G; b++) {
            cr_expect(ds_t_close_d(check[b], load[b], 1e-9, 1e-12));
            mx = fmax(mx, load[b]);
            sum += load[b];
        }
        const double opt = opt_makespan(cost, m, G);
        cr_expect_leq(mx, (4.0 / 3.0 - 1.0 / (3.0 * G)) * opt * (1 + 1e-12),
                      "trial %d: LPT %.1f opt %.1f (G=%u m=%zu)", trial, mx, opt, G, m);
        cr_expect_geq(mx, sum / G * (1 - 1e-12));
    }
    /* A unit sent whole (k == len) has a bin and costs its length: one
     * member sends it, not every member. */
    const uint32_t off[] = {0, 10, 20};
    const size_t ku[] = {10, 3};
    uint32_t bin[2];
    double load[2];
    cr_assert_eq(ds_deft_pack(off, ku, 2, 2, bin, load), 0);
    cr_expect_neq(bin[0], DS_DEFT_COMMON);
    cr_expect_neq(bin[0], bin[1], "two units, two bins");
    cr_expect(load[bin[0]] == 10.0, "the whole unit costs its length: %g", load[bin[0]]);
    cr_expect(fabs(load[bin[1]] - 10.0 * log2(3.0)) < 1e-9);
}

Test(sparsify, deft_selects_exact_topk_per_unit)
{
    const uint32_t units[] = {0, 1000, 1010, 5000, 5001, 9000};
    const size_t nu = 5, n = 9000;
    ds_sparsify_cfg c;
    ds_sparsify_cfg_defaults(&c, DS_SPARSIFY_DEFT);
    c.unit_off = units;
    c.n_units = nu;
    ds_sparsifier *s = NULL;
    cr_assert_eq(ds_sparsifier_create(&s, &c, n, NULL), 0);
    float *v = malloc(n * sizeof(float)), *val = malloc(n * sizeof(float));
    uint32_t *idx = malloc(n * sizeof(uint32_t)), *want = malloc(n * sizeof(uint32_t));
    fill_grad(v, n, 44, 1);
    for (uint32_t i = 1010; i < 5000; i++)
        v[i] *= 10.0f; /* a loud layer gets more of k */
    const double d = 0.02;
    ds_sparsify_result r;
    cr_assert_eq(ds_sparsify_select(s, v, n, d, idx, val, ds_sparsify_capacity(s, n, d), &r), 0);
    cr_expect(valid_selection("deft", v, n, idx, val, r.count));
    /* Recompute the allocation and each unit's top-k independently. */
    double norms[5];
    size_t ku[5];
    ds_sel_norms_c(v, units, nu, norms);
    const long long sum = ds_deft_alloc(units, nu, norms, ds_sparsify_k(n, d), ku);
    cr_expect_gt(ku[2], ku[0] * 3);
    size_t at = 0;
    for (size_t u = 0; u < nu; u++) {
        const size_t cu = oracle_topk(v + units[u], units[u + 1] - units[u], ku[u], want);
        for (size_t j = 0; j < cu; j++)
            cr_expect_eq(idx[at + j], units[u] + want[j], "unit %zu entry %zu", u, j);
        at += cu;
    }
    cr_expect_eq(r.count, at);
    cr_expect_leq((long long)at, sum);
    /* A length that is not the units' is refused. */
    cr_expect_eq(ds_sparsify_select(s, v, n - 1, d, idx, val, n, &r), -EINVAL);
    ds_sparsifier_destroy(&s);
    /* Units that do not cover n_max are refused at create. */
    cr_expect_eq(ds_sparsifier_create(&s, &c, n + 1, NULL), -EINVAL);
    cr_expect_null(s);
    free(v);
    free(val);
    free(idx);
    free(want);
}

Test(sparsify, deft_group_members_cover_the_selection)
{
    /* Three members, the MLP's layers: every owned unit is selected by
     * exactly one member, common units by all, each with its exact top-k. */
    const unsigned G = 3;
    uint32_t units[32];
    size_t nu;
    cr_assert_eq(ds_deft_units(mlp_layers, 3, G, units, 32, &nu), 0);
    const size_t n = mlp_layers[3];
    float *v = malloc(n * sizeof(float)), *val = malloc(n * sizeof(float));
    uint32_t *idx = malloc(n * sizeof(uint32_t));
    unsigned char *seen = calloc(n, 1);
    fill_grad(v, n, 55, 0);
    ds_sparsifier *s = make(DS_SPARSIFY_TOPK, n, NULL);
    double norms[32];
    size_t ku[32];
    uint32_t bin[32];
    ds_sel_norms_c(v, units, nu, norms);
    const long long sum = ds_deft_alloc(units, nu, norms, ds_sparsify_k(n, 0.01), ku);
    cr_assert_gt(sum, 0);
    cr_assert_eq(ds_deft_pack(units, ku, nu, G, bin, NULL), 0);
    for (uint64_t t = 5; t < 7; t++) {
        memset(seen, 0, n);
        size_t total = 0;
        for (unsigned r = 0; r < G; r++) {
            ds_sparsify_result res;
            cr_assert_eq(ds_deft_select_owned(s, v, units, nu, ku, bin, G, r, t, idx, val, n, &res), 0);
            cr_expect(valid_selection("deft owned", v, n, idx, val, res.count));
            for (size_t j = 0; j < res.count; j++)
                seen[idx[j]]++;
            total += res.count;
        }
        cr_expect_eq((long long)total, sum, "t=%llu: members selected %zu, allocation %lld", (unsigned long long)t, total, sum);
        for (size_t i = 0; i < n; i++)
            if (seen[i] > 1) {
                cr_expect_fail("index %zu selected by %u members", i, seen[i]);
                break;
            }
    }
    /* Rotation: member r at t+1 selects what member r+1 selected at t. */
    uint32_t *i2 = malloc(n * sizeof(uint32_t));
    ds_sparsify_result a, b;
    cr_assert_eq(ds_deft_select_owned(s, v, units, nu, ku, bin, G, 0, 8, idx, val, n, &a), 0);
    cr_assert_eq(ds_deft_select_owned(s, v, units, nu, ku, bin, G, 1, 7, i2, val, n, &b), 0);
    cr_expect(a.count == b.count && memcmp(idx, i2, a.count * sizeof(uint32_t)) == 0);
    cr_expect_eq(ds_deft_select_owned(s, v, units, nu, ku, bin, G, 3, 7, i2, val, n, &b), -EINVAL);
    cr_expect_eq(ds_deft_select_owned(s, v, units, nu, ku, bin, G, 0, 7, i2, val, 1, &b), -ENOBUFS);
    ds_sparsifier_destroy(&s);
    free(v);
    free(val);
    free(idx);
    free(i2);
    free(seen);
}

/* ---- MiCRO group level ---------------------------------------------------- */

Test(sparsify, micro_chunks_partition_and_rotate)
{
    const size_t ns[] = {0, 1, 5, 1000, 1003};
    for (size_t ni = 0; ni < 5; ni++)
        for (unsigned G = 1; G <= 7; G++)
            for (uint64_t t = 0; t < 9; t++) {
                const size_t n = ns[ni];
                size_t covered = 0;
                size_t offs[8], lens[8];
                for (unsigned r = 0; r < G; r++) {
                    ds_micro_chunk(n, G, r, t, &offs[r], &lens[r]);
                    covered += lens[r];
                    cr_expect_leq(offs[r] + lens[r], n);
                    cr_expect(lens[r] == n / G || lens[r] == n / G + 1);
                    size_t o2, l2;
                    ds_micro_chunk(n, G, (r + 1) % G, t, &o2, &l2);
                    size_t o3, l3;
                    ds_micro_chunk(n, G, r, t + 1, &o3, &l3);
                    cr_expect(o2 == o3 && l2 == l3, "rotation n=%zu G=%u r=%u t=%llu", n, G, r, (unsigned long long)t);
                }
                cr_expect_eq(covered, n);
                for (unsigned a = 0; a < G; a++)
                    for (unsigned b = a + 1; b < G; b++)
                        cr_expect(lens[a] == 0 || lens[b] == 0 || offs[a] + lens[a] <= offs[b] ||
                                  offs[b] + lens[b] <= offs[a]);
            }
}

Test(sparsify, micro_owned_selects_inside_its_chunk)
{
    const size_t n = 50021;
    const unsigned G = 4;
    float *v = malloc(n * sizeof(float)), *val = malloc(n * sizeof(float));
    uint32_t *idx = malloc(n * sizeof(uint32_t));
    ds_sparsifier *m[4];
    for (unsigned r = 0; r < G; r++)
        m[r] = make(DS_SPARSIFY_MICRO, n, NULL);
    track tk = {0};
    for (int t = 0; t < 200; t++) {
        drift_stream(v, n, t, 3);
        size_t group = 0;
        for (unsigned r = 0; r < G; r++) {
            ds_sparsify_result res;
            cr_assert_eq(ds_micro_select_owned(m[r], v, n, G, r, (uint64_t)t, 0.01, idx, val, n, &res), 0);
            size_t off, len;
            ds_micro_chunk(n, G, r, (uint64_t)t, &off, &len);
            cr_expect(valid_selection("micro owned", v, n, idx, val, res.count));
            cr_expect(res.count == 0 || (idx[0] >= off && idx[res.count - 1] < off + len));
            group += res.count;
        }
        /* The authors steer every member by the group's count. */
        for (unsigned r = 0; r < G; r++)
            ds_micro_feedback(m[r], group);
        if (t >= 50) {
            tk.sum += (double)group / (double)ds_sparsify_k(n, 0.01);
            tk.n++;
        }
    }
    cr_log_info("micro group of 4: mean density %.3f of target", track_mean(&tk));
    /* Seeded stream, deterministic rule: every run measures 1.023
     * (docs/sparsify.md). +-10% is the single rule's bound above: the
     * group's feedback must track as well as one member alone. */
    cr_expect(fabs(track_mean(&tk) - 1.0) <= 0.10, "group density %.3f of target", track_mean(&tk));
    ds_sparsify_result res;
    cr_expect_eq(ds_micro_select_owned(m[0], v, n, G, G, 0, 0.01, idx, val, n, &res), -EINVAL);
    cr_expect_eq(ds_micro_select_owned(m[0], v, n, 0, 0, 0, 0.01, idx, val, n, &res), -EINVAL);
    for (unsigned r = 0; r < G; r++)
        ds_sparsifier_destroy(&m[r]);
    free(v);
    free(val);
    free(idx);
}

/* ---- error feedback -------------------------------------------------------- */

Test(sparsify, error_feedback_conserves_mass_bit_for_bit)
{
    const size_t n = 20011;
    float *g = malloc(n * sizeof(float)), *res = calloc(n, sizeof(float)), *old = malloc(n * sizeof(float));
    float *val = malloc(n * sizeof(float)), *sent = malloc(n * sizeof(float));
    uint32_t *idx = malloc(n * sizeof(uint32_t));
    for (int m = 0; m < NM; m++) {
        ds_sparsifier *s = make(m, n, NULL);
        memset(res, 0, n * sizeof(float));
        for (int step = 0; step < 20; step++) {
            fill_grad(g, n, 100 * m + step, 0);
            memcpy(old, res, n * sizeof(float));
            ds_sparsify_result r;
            cr_assert_eq(ds_ef_step(s, res, g, n, 0.02, idx, val, n, &r), 0);
            memset(sent, 0, n * sizeof(float));
            for (size_t j = 0; j < r.count; j++)
                sent[idx[j]] = val[j];
            size_t bad = 0;
            for (size_t i = 0; i < n; i++) {
                const float want = g[i] + old[i];
                const float got = sent[i] + res[i];
                /* Exactly one of the two is zero: the sum is the other. */
                bad += memcmp(&got, &want, sizeof(float)) != 0 || (sent[i] != 0.0f && res[i] != 0.0f);
            }
            cr_expect_eq(bad, 0u, "%s step %d: %zu entries break sent + residual == g + old",
                         ds_sparsify_method_name(m), step, bad);
        }
        ds_sparsifier_destroy(&s);
    }
    free(g);
    free(res);
    free(old);
    free(val);
    free(sent);
    free(idx);
}

/* A member's MiCRO step (ds_micro_ef_step): sent + new residual == g +
 * old residual bit for bit, the selection inside the owned chunk only,
 * and a refused call changes nothing. */
Test(sparsify, micro_ef_step_conserves_mass_inside_its_chunk)
{
    const size_t n = 20011;
    const unsigned G = 4, me = 1;
    float *g = malloc(n * sizeof(float)), *res = calloc(n, sizeof(float)), *old = malloc(n * sizeof(float));
    float *val = malloc(n * sizeof(float)), *sent = malloc(n * sizeof(float));
    uint32_t *idx = malloc(n * sizeof(uint32_t));
    ds_sparsifier *s = make(DS_SPARSIFY_MICRO, n, NULL);
    for (int step = 0; step < 20; step++) {
        fill_grad(g, n, 300 + step, 0);
        memcpy(old, res, n * sizeof(float));
        ds_sparsify_result r;
        size_t off, len;
        ds_micro_chunk(n, G, me, (uint64_t)step, &off, &len);
        cr_assert_eq(ds_micro_ef_step(s, res, g, n, G, me, (uint64_t)step, 0.02, idx, val, len,
                                      &r), 0);
        cr_assert_gt(r.count, 0);
        memset(sent, 0, n * sizeof(float));
        size_t outside = 0, bad = 0;
        for (size_t j = 0; j < r.count; j++) {
            sent[idx[j]] = val[j];
            outside += idx[j] < off || idx[j] >= off + len;
        }
        for (size_t i = 0; i < n; i++) {
            const float want = g[i] + old[i];
            const float got = sent[i] + res[i];
            bad += memcmp(&got, &want, sizeof(float)) != 0 || (sent[i] != 0.0f && res[i] != 0.0f);
        }
        cr_expect_eq(outside, 0u, "step %d: %zu outside chunk [%zu, +%zu)", step, outside, off, len);
        cr_expect_eq(bad, 0u, "step %d: %zu entries break sent + residual == g + old", step, bad);
    }
    memcpy(old, res, n * sizeof(float));
    cr_expect_eq(ds_micro_ef_step(s, res, g, n, G, G, 0, 0.02, idx, val, n, NULL), -EINVAL);
    cr_expect_eq(ds_micro_ef_step(s, res, g, n, 0, 0, 0, 0.02, idx, val, n, NULL), -EINVAL);
    cr_expect_eq(ds_micro_ef_step(s, res, g, n, G, me, 0, 0.02, idx, val, 10, NULL), -ENOBUFS);
    cr_expect_eq(ds_micro_ef_step(s, res, NULL, n, G, me, 0, 0.02, idx, val, n, NULL), -EINVAL);
    cr_expect_eq(memcmp(old, res, n * sizeof(float)), 0, "a refused call changed the residual");
    ds_sparsifier_destroy(&s);
    free(g);
    free(res);
    free(old);
    free(val);
    free(sent);
    free(idx);
}

Test(sparsify, ef_zero_checks_its_indices)
{
    float r[8] = {1, 2, 3, 4, 5, 6, 7, 8};
    const uint32_t ok[] = {1, 3, 7}, unsorted[] = {3, 1}, dup[] = {2, 2}, out[] = {1, 8};
    cr_expect_eq(ds_ef_zero(r, 8, unsorted, 2), -EINVAL);
    cr_expect_eq(ds_ef_zero(r, 8, dup, 2), -EINVAL);
    cr_expect_eq(ds_ef_zero(r, 8, out, 2), -ERANGE);
    for (int i = 0; i < 8; i++)
        cr_expect_eq(r[i], (float)(i + 1), "refused calls write nothing");
    cr_expect_eq(ds_ef_zero(r, 8, ok, 3), 0);
    cr_expect(r[1] == 0 && r[3] == 0 && r[7] == 0 && r[0] == 1 && r[6] == 7);
    cr_expect_eq(ds_ef_zero(NULL, 8, ok, 0), 0);
}

/* ---- bad input --------------------------------------------------------------- */

Test(sparsify, bad_input_is_refused_counted_and_harmless)
{
    const size_t n = 1000;
    float v[1000], val[1000];
    uint32_t idx[1000];
    fill_grad(v, n, 1, 0);
    for (int m = 0; m < NM; m++) {
        ds_sparsifier *s = make(m, n, NULL);
        ds_sparsify_result r;
        cr_assert_eq(ds_sparsify_select(s, v, n, 0.05, idx, val, n, &r), 0);
        const float thr = ds_sparsifier_threshold(s);
        for (size_t i = 0; i < n; i++) {
            idx[i] = 0xabcdef01u;
            val[i] = -1234.0f;
        }
        const double bad_d[] = {0.0, -0.5, 1.0000001, NAN, INFINITY, -INFINITY};
        for (int i = 0; i < 6; i++)
            cr_expect_eq(ds_sparsify_select(s, v, n, bad_d[i], idx, val, n, &r), -EINVAL, "%s d=%g",
                         ds_sparsify_method_name(m), bad_d[i]);
        cr_expect_eq(ds_sparsify_select(s, NULL, n, 0.1, idx, val, n, &r), -EINVAL);
        cr_expect_eq(ds_sparsify_select(s, v, n, 0.1, NULL, val, n, &r), -EINVAL);
        cr_expect_eq(ds_sparsify_select(s, v, n + 1, 0.1, idx, val, n + 1, &r), -EINVAL);
        /* Sizes beyond uint32 indices: refused before anything is read. */
        cr_expect_eq(ds_sparsify_select(s, v, (size_t)UINT32_MAX + 1, 0.1, idx, val, SIZE_MAX, &r), -EOVERFLOW);
        const size_t cap = ds_sparsify_capacity(s, n, 0.1);
        cr_expect_eq(ds_sparsify_select(s, v, n, 0.1, idx, val, cap - 1, &r), -ENOBUFS);
        for (size_t i = 0; i < n; i++)
            if (idx[i] != 0xabcdef01u || val[i] != -1234.0f) {
                cr_expect_fail("%s: a refused call wrote entry %zu", ds_sparsify_method_name(m), i);
                break;
            }
        cr_expect_eq(ds_sparsifier_threshold(s), thr, "%s: state changed", ds_sparsify_method_name(m));
        ds_sparsify_totals t;
        ds_sparsifier_totals(s, &t);
        cr_expect_eq(t.rejected, 11u, "%s rejected %llu", ds_sparsify_method_name(m), (unsigned long long)t.rejected);
        cr_expect_eq(t.calls, 1u);
        /* n = 0 is a call that selects nothing (deft's units cover n). */
        if (m != DS_SPARSIFY_DEFT) {
            cr_expect_eq(ds_sparsify_select(s, NULL, 0, 0.1, NULL, NULL, 0, &r), 0);
            cr_expect(r.count == 0 && r.n == 0 && r.density == 0.0);
            cr_expect_eq(ds_sparsifier_threshold(s), thr);
        }
        /* The error-feedback step refuses the same and leaves the residual. */
        float resid[1000];
        memcpy(resid, v, sizeof(resid));
        cr_expect_eq(ds_ef_step(s, resid, v, n, 2.0, idx, val, n, &r), -EINVAL);
        cr_expect_eq(ds_ef_step(s, resid, v, n, 0.1, idx, val, cap - 1, &r), -ENOBUFS);
        cr_expect_eq(memcmp(resid, v, sizeof(resid)), 0);
        ds_sparsifier_destroy(&s);
    }
    /* NaN and Inf: never selected, counted per call and in the totals. */
    for (size_t i = 0; i < n; i += 10)
        v[i] = (i / 10) % 2 ? NAN : -INFINITY;
    for (int m = 0; m < NM; m++) {
        ds_sparsifier *s = make(m, n, NULL);
        ds_sparsify_result r;
        for (int call = 0; call < 3; call++) {
            cr_assert_eq(ds_sparsify_select(s, v, n, m == DS_SPARSIFY_RANDOM ? 1.0 : 0.05, idx, val, n, &r), 0);
            cr_expect(valid_selection(ds_sparsify_method_name(m), v, n, idx, val, r.count));
            cr_expect_eq(r.nonfinite, 100u, "%s nonfinite %zu", ds_sparsify_method_name(m), r.nonfinite);
        }
        ds_sparsify_totals t;
        ds_sparsifier_totals(s, &t);
        cr_expect_eq(t.nonfinite, 300u);
        cr_expect_eq(t.calls_with_nonfinite, 3u);
        ds_sparsifier_destroy(&s);
    }
    /* Create refuses what it cannot serve. */
    ds_sparsifier *s = NULL;
    ds_sparsify_cfg c;
    ds_sparsify_cfg_defaults(&c, DS_SPARSIFY_SAGE);
    cr_expect_eq(ds_sparsifier_create(&s, &c, (size_t)UINT32_MAX + 1, NULL), -EOVERFLOW);
    c.method = (enum ds_sparsify_method)NM;
    cr_expect_eq(ds_sparsifier_create(&s, &c, 10, NULL), -EINVAL);
    ds_sparsify_cfg_defaults(&c, DS_SPARSIFY_THRESHOLD);
    c.threshold = NAN;
    cr_expect_eq(ds_sparsifier_create(&s, &c, 10, NULL), -EINVAL);
    c.threshold = -1.0f;
    cr_expect_eq(ds_sparsifier_create(&s, &c, 10, NULL), -EINVAL);
    ds_select_ops cuda_like;
    ds_select_ops_init(&cuda_like, 0);
    cuda_like.kind = DS_BACKEND_CUDA;
    ds_sparsify_cfg_defaults(&c, DS_SPARSIFY_TOPK);
    cr_expect_eq(ds_sparsifier_create(&s, &c, 10, &cuda_like), -EINVAL);
    const uint32_t bad_units[] = {0, 5, 3, 10};
    ds_sparsify_cfg_defaults(&c, DS_SPARSIFY_DEFT);
    c.unit_off = bad_units;
    c.n_units = 3;
    cr_expect_eq(ds_sparsifier_create(&s, &c, 10, NULL), -EINVAL);
    cr_expect_null(s);
    ds_sparsifier_destroy(&s);
    ds_sparsifier_destroy(NULL);
}

Test(sparsify, threshold_recovers_from_an_all_zero_stretch)
{
    /* A vector of zeros drives SAGE's sampled mean to 0 and MiCRO's count
     * to 0; neither may get stuck at a threshold of 0 or +Inf. */
    const size_t n = 5003;
    float *v = malloc(n * sizeof(float)), *val = malloc(n * sizeof(float));
    uint32_t *idx = malloc(n * sizeof(uint32_t));
    const int ms[] = {DS_SPARSIFY_SAGE, DS_SPARSIFY_MICRO, DS_SPARSIFY_THRESHOLD};
    for (int i = 0; i < 3; i++) {
        ds_sparsifier *s = make(ms[i], n, NULL);
        ds_sparsify_result r;
        fill_grad(v, n, 2, 0);
        cr_assert_eq(ds_sparsify_select(s, v, n, 0.01, idx, val, n, &r), 0);
        memset(v, 0, n * sizeof(float));
        for (int c = 0; c < 30; c++) {
            cr_assert_eq(ds_sparsify_select(s, v, n, 0.01, idx, val, n, &r), 0);
            cr_expect_eq(r.count, 0u, "zeros are never selected by a threshold");
            cr_expect(isfinite(ds_sparsifier_threshold(s)) && ds_sparsifier_threshold(s) > 0);
        }
        fill_grad(v, n, 3, 0);
        size_t got = 0;
        for (int c = 0; c < 10; c++) {
            cr_assert_eq(ds_sparsify_select(s, v, n, 0.01, idx, val, n, &r), 0);
            got += r.count;
        }
        cr_expect_gt(got, 0u, "%s selects again after the zeros", ds_sparsify_method_name(ms[i]));
        ds_sparsifier_destroy(&s);
    }
    free(v);
    free(val);
    free(idx);
}

/* MiCRO's runaway guard: after the vector's scale jumps 100x (a first call
 * on one step's drift, then accumulated drift), the next call must not
 * keep more than DS_SPARSIFY_RUNAWAY x k -- the published 0.5% steering
 * alone would keep nearly everything for hundreds of calls. */
Test(sparsify, micro_restarts_when_the_scale_jumps)
{
    const size_t n = 100000;
    const double d = 0.01;
    const size_t k = ds_sparsify_k(n, d);
    float *v = malloc(n * sizeof(float)), *val = malloc(n * sizeof(float));
    uint32_t *idx = malloc(n * sizeof(uint32_t));
    ds_sparsify_cfg cfg;
    ds_sparsify_cfg_defaults(&cfg, DS_SPARSIFY_MICRO);
    ds_sparsifier *s;
    cr_assert_eq(ds_sparsifier_create(&s, &cfg, n, NULL), 0);
    ds_sparsify_result r;
    ds_t_fill(v, n, 1, -1e-3f, 1e-3f);
    cr_assert_eq(ds_sparsify_select(s, v, n, d, idx, val, n, &r), 0);
    cr_expect_eq(r.count, k, "first call: exact k-th threshold");
    for (size_t i = 0; i < n; i++)
        v[i] *= 100.0f;
    cr_assert_eq(ds_sparsify_select(s, v, n, d, idx, val, n, &r), 0);
    cr_expect_leq(r.count, DS_SPARSIFY_RUNAWAY * k, "kept %zu of k=%zu after a 100x jump", r.count, k);
    cr_expect_geq(r.count, k / DS_SPARSIFY_RUNAWAY);
    ds_sparsify_totals tt;
    ds_sparsifier_totals(s, &tt);
    cr_expect_eq(tt.starts, 2, "the first call and one restart");
    /* Back down 1000x: too few kept, restart again. */
    for (size_t i = 0; i < n; i++)
        v[i] *= 1e-3f;
    cr_assert_eq(ds_sparsify_select(s, v, n, d, idx, val, n, &r), 0);
    cr_expect_geq(r.count, k / DS_SPARSIFY_RUNAWAY);
    ds_sparsifier_destroy(&s);
    free(v);
    free(val);
    free(idx);
}

/* Checkpoints (node/runtime/checkpoint.c): a sparsifier whose state was
 * taken after some calls and put into a fresh one goes on exactly as the
 * original: the same selections and thresholds, call after call, for
 * every method with state (random's generator, sage's and micro's
 * thresholds and what steers them, threshold's start). */
Test(sparsify, state_taken_and_put_back_continues_identically)
{
    const size_t n = 4096;
    const enum ds_sparsify_method ms[] = {DS_SPARSIFY_RANDOM, DS_SPARSIFY_THRESHOLD,
                                          DS_SPARSIFY_SAGE, DS_SPARSIFY_MICRO};
    float *v = malloc(n * sizeof(float)), *va = malloc(n * sizeof(float)),
          *vb = malloc(n * sizeof(float));
    uint32_t *ia = malloc(n * sizeof(uint32_t)), *ib = malloc(n * sizeof(uint32_t));
    cr_assert(v && va && vb && ia && ib);
    for (size_t m = 0; m < sizeof(ms) / sizeof(ms[0]); m++) {
        ds_sparsifier *a = make(ms[m], n, NULL), *b = make(ms[m], n, NULL);
        ds_sparsify_result ra, rb;
        for (int c = 0; c < 7; c++) {
            fill_grad(v, n, 100 + (uint64_t)c, 0);
            cr_assert_eq(ds_sparsify_select(a, v, n, 0.02, ia, va, n, &ra), 0);
        }
        ds_sparsify_state st;
        ds_sparsifier_state_get(a, &st);
        ds_sparsifier_state_set(b, &st);
        cr_expect_eq(ds_sparsifier_threshold(a), ds_sparsifier_threshold(b), "%s",
                     ds_sparsify_method_name(ms[m]));
        for (int c = 7; c < 15; c++) {
            fill_grad(v, n, 100 + (uint64_t)c, 0);
            cr_assert_eq(ds_sparsify_select(a, v, n, 0.02, ia, va, n, &ra), 0);
            cr_assert_eq(ds_sparsify_select(b, v, n, 0.02, ib, vb, n, &rb), 0);
            cr_assert_eq(ra.count, rb.count, "%s call %d", ds_sparsify_method_name(ms[m]), c);
            cr_expect_eq(ra.threshold, rb.threshold, "%s call %d", ds_sparsify_method_name(ms[m]),
                         c);
            cr_expect(!memcmp(ia, ib, ra.count * sizeof(uint32_t)), "%s call %d",
                      ds_sparsify_method_name(ms[m]), c);
        }
        ds_sparsifier_destroy(&a);
        ds_sparsifier_destroy(&b);
    }
    free(v);
    free(va);
    free(vb);
    free(ia);
    free(ib);
}

/* DEFT's group step (ds_deft_ef_step): what it sends plus what it keeps
 * is the gradient plus the old residual, bit for bit; a refused call
 * changes nothing; the squared unit norms are the residual's. */
Test(sparsify, deft_ef_step_conserves_and_refuses_cleanly)
{
    enum { N = 3000 };
    const uint32_t layers[4] = {0, 2000, 2100, N};
    ds_sparsify_cfg sc;
    ds_sparsify_cfg_defaults(&sc, DS_SPARSIFY_DEFT);
    sc.unit_off = layers;
    sc.n_units = 3;
    ds_sparsifier *s = NULL;
    cr_assert_eq(ds_sparsifier_create(&s, &sc, N, NULL), 0);
    static float res[N], g[N], before[N], val[N];
    static uint32_t idx[N];
    float sq[16];
    ds_t_fill(res, N, 11, -1.0f, 1.0f);
    ds_t_fill(g, N, 12, -1.0f, 1.0f);
    memcpy(before, res, sizeof(res));
    const size_t nu = ds_deft_group_units(s, 4);
    cr_assert_eq(nu, 9, "the layers of 2000 and 900 (over N/4) in 4 parts, 100 whole: %zu", nu);
    /* Refused: r >= G, a wrong length, no room; nothing changes. */
    ds_sparsify_result r;
    cr_expect_eq(ds_deft_ef_step(s, res, g, N, 4, 4, 0, 0.01, idx, val, N, sq, &r), -EINVAL);
    cr_expect_eq(ds_deft_ef_step(s, res, g, N - 1, 4, 0, 0, 0.01, idx, val, N, sq, &r), -EINVAL);
    cr_expect_eq(ds_deft_ef_step(s, res, g, N, 4, 0, 0, 0.01, idx, val, 1, sq, &r), -ENOBUFS);
    cr_expect_eq(memcmp(res, before, sizeof(res)), 0, "a refused call changed the residual");
    ds_sparsifier *micro = NULL;
    ds_sparsify_cfg mc;
    ds_sparsify_cfg_defaults(&mc, DS_SPARSIFY_MICRO);
    cr_assert_eq(ds_sparsifier_create(&micro, &mc, N, NULL), 0);
    cr_expect_eq(ds_deft_ef_step(micro, res, g, N, 4, 0, 0, 0.01, idx, val, N, sq, &r), -EINVAL,
                 "not a deft sparsifier");
    cr_expect_eq(ds_deft_group_units(micro, 4), 0);
    ds_sparsifier_destroy(&micro);
    /* Accepted: sent + kept == g + old residual, bit for bit. */
    cr_assert_eq(ds_deft_ef_step(s, res, g, N, 4, 1, 0, 0.01, idx, val, N, sq, &r), 0);
    cr_expect_gt(r.count, 0);
    static float want[N];
    for (size_t i = 0; i < N; i++)
        want[i] = before[i] + g[i];
    size_t j = 0;
    for (size_t i = 0; i < N; i++) {
        float got = res[i];
        if (j < r.count && idx[j] == i) {
            cr_expect_eq(res[i], 0.0f, "a sent entry left the residual");
            got = val[j++];
        }
        cr_expect_eq(memcmp(&got, &want[i], sizeof(float)), 0, "entry %zu", i);
    }
    /* The norms it reported are of g + old residual, unit by unit. */
    double first = 0;
    for (size_t i = 0; i < 500; i++)
        first += (double)want[i] * want[i];
    cr_expect(fabs(sq[0] - first) <= 1e-4 * first, "unit 0: %g, want %g", (double)sq[0], first);
    ds_sparsifier_destroy(&s);
}

/* ---- the device path: on a fake device here, on CUDA when one answers ----
 *
 * A sparsifier made with a device table must touch its vectors only
 * through the table. The fake device is the C reference behind pointers
 * the host cannot dereference: its "device memory" is malloc'd memory
 * handed out tagged into the non-canonical address range and untagged by
 * each fake kernel, so a host read or write that bypasses the table
 * crashes the test instead of passing. Both runs are compared with the CPU
 * path (the reference table) on the same input and state, call by call. */

#define FAKE_TAG ((uintptr_t)1 << 62)

static void *untag(const void *p)
{
    return p ? (void *)((uintptr_t)p - FAKE_TAG) : NULL;
}

static void fake_count(const float *v, size_t n, uint32_t t, ds_sel_tally *out)
{
    ds_sel_count_c(untag(v), n, t, out);
}

static void fake_compact(const float *v, size_t n, uint32_t t_keep, uint32_t t_count, uint32_t base,
                         uint32_t *idx, float *val, size_t cap, ds_sel_tally *out)
{
    ds_sel_compact_c(untag(v), n, t_keep, t_count, base, untag(idx), untag(val), cap, out);
}

static size_t fake_filter(uint32_t *idx, float *val, size_t count, uint32_t t)
{
    return ds_sel_filter_c(untag(idx), untag(val), count, t);
}

static size_t fake_filter_ties(uint32_t *oidx, float *oval, const uint32_t *idx, const float *val,
                               size_t count, uint32_t t, size_t ties)
{
    return ds_sel_filter_ties_c(untag(oidx), untag(oval), untag(idx), untag(val), count, t, ties);
}

static void fake_hist(const float *v, size_t n, uint32_t *hist)
{
    ds_sel_hist_c(untag(v), n, hist); /* hist: host */
}

static void fake_hist_sub(const float *v, size_t n, uint32_t prefix, unsigned shift, uint32_t *hist)
{
    ds_sel_hist_sub_c(untag(v), n, prefix, shift, hist);
}

static void fake_norms(const float *v, const uint32_t *unit_off, size_t n_units, double *norms)
{
    ds_sel_norms_c(untag(v), untag(unit_off), n_units, norms); /* norms: host */
}

static double fake_absmean_at(const float *v, const uint32_t *pos, size_t count, size_t *used)
{
    return ds_sel_absmean_at_c(untag(v), pos, count, used); /* pos: host */
}

static void fake_gather(float *out, const float *v, const uint32_t *idx, size_t count)
{
    ds_sel_gather_c(untag(out), untag(v), untag(idx), count);
}

static void fake_scatter_add(float *y, const uint32_t *idx, const float *val, size_t count, float w)
{
    ds_sel_scatter_add_c(untag(y), untag(idx), untag(val), count, w);
}

static void fake_zero_at(float *y, const uint32_t *idx, size_t count)
{
    ds_sel_zero_at_c(untag(y), untag(idx), count);
}

static void fake_accumulate(float *y, const float *x, size_t n)
{
    ds_sel_accumulate_c(untag(y), untag(x), n);
}

static void *fake_alloc(size_t bytes)
{
    void *p = malloc(bytes ? bytes : 1);
    return p ? (void *)((uintptr_t)p + FAKE_TAG) : NULL;
}

static void fake_free(void *p)
{
    free(untag(p));
}

static int fake_upload(void *dst, const void *src, size_t bytes)
{
    if (bytes)
        memcpy(untag(dst), src, bytes);
    return 0;
}

static int fake_download(void *dst, const void *src, size_t bytes)
{
    if (bytes)
        memcpy(dst, untag(src), bytes);
    return 0;
}

static int fake_sync(void)
{
    return 0;
}

static void fake_device(ds_select_ops *o)
{
    memset(o, 0, sizeof(*o));
    o->kind = DS_BACKEND_CUDA; /* all the sparsifier asks: not host memory */
    o->device = 0;
    snprintf(o->name, sizeof(o->name), "select-fake-device");
    o->count = fake_count;
    o->compact = fake_compact;
    o->filter = fake_filter;
    o->filter_ties = fake_filter_ties;
    o->hist = fake_hist;
    o->hist_sub = fake_hist_sub;
    o->norms = fake_norms;
    o->absmean_at = fake_absmean_at;
    o->gather = fake_gather;
    o->scatter_add = fake_scatter_add;
    o->zero_at = fake_zero_at;
    o->accumulate = fake_accumulate;
    o->alloc = fake_alloc;
    o->free = fake_free;
    o->upload = fake_upload;
    o->download = fake_download;
    o->sync = fake_sync;
}

/* Device buffers of the comparison, through the table under test. */
static void *dev_buf(const ds_select_ops *o, size_t bytes)
{
    void *p = o->alloc(bytes);
    cr_assert_not_null(p, "%s: alloc of %zu bytes", o->name, bytes);
    return p;
}

#define CMP_N 100003
#define CMP_ROUNDS 6

/* Round r's vector: gradient-like with NaN / Inf, its scale moving so that
 * the threshold rules steer, band, restart (x30, x0.05) and start over
 * (a round of zeros). */
static void cmp_fill(float *v, size_t n, int r)
{
    static const float scale[CMP_ROUNDS] = {1.0f, 1.02f, 1.5f, 0.05f, 0.0f, 30.0f};
    fill_grad(v, n, 1000 + (uint64_t)r, 1);
    for (size_t i = 0; i < n; i++)
        v[i] = scale[r] == 0.0f ? 0.0f : v[i] * scale[r];
}

static int same_state(const ds_sparsifier *a, const ds_sparsifier *b)
{
    ds_sparsify_state x, y;
    ds_sparsifier_state_get(a, &x);
    ds_sparsifier_state_get(b, &y);
    ds_sparsify_totals tx, ty;
    ds_sparsifier_totals(a, &tx);
    ds_sparsifier_totals(b, &ty);
    return x.rng == y.rng && x.started == y.started && !memcmp(&x.delta, &y.delta, sizeof(float)) &&
           !memcmp(&x.mean_prev, &y.mean_prev, sizeof(double)) &&
           !memcmp(&x.micro_ratio, &y.micro_ratio, sizeof(double)) && x.micro_fed == y.micro_fed &&
           x.micro_group_count == y.micro_group_count && x.micro_k_group == y.micro_k_group &&
           !memcmp(&tx, &ty, sizeof(tx));
}

/* Residuals: the same bits, except that any NaN matches any NaN (x86
 * keeps a NaN operand's payload in a sum, CUDA answers its canonical NaN;
 * NaN entries are never selected, so only the residuals can show it). */
static int same_residual(const float *a, const float *b, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (memcmp(&a[i], &b[i], sizeof(float)) && !(isnan(a[i]) && isnan(b[i]))) {
            cr_log_error("residual[%zu]: %.9g on the CPU, %.9g on the device", i, a[i], b[i]);
            return 0;
        }
    return 1;
}

/* The same call's outputs: return code, result, and the lists (the
 * device's downloaded). */
static int same_call(const char *what, int rh, int rd, const ds_sparsify_result *a,
                     const ds_sparsify_result *b, const uint32_t *ih, const float *vh, const uint32_t *id,
                     const float *vd)
{
    if (rh != rd || rh != 0) {
        cr_log_error("%s: returned %d on the CPU, %d on the device", what, rh, rd);
        return 0;
    }
    if (a->n != b->n || a->k != b->k || a->count != b->count || a->nonfinite != b->nonfinite ||
        memcmp(&a->threshold, &b->threshold, sizeof(float))) {
        cr_log_error("%s: count %zu/%zu nonfinite %zu/%zu threshold %.9g/%.9g k %zu/%zu", what, a->count,
                     b->count, a->nonfinite, b->nonfinite, a->threshold, b->threshold, a->k, b->k);
        return 0;
    }
    for (size_t j = 0; j < a->count; j++)
        if (ih[j] != id[j] || memcmp(&vh[j], &vd[j], sizeof(float))) {
            cr_log_error("%s: entry %zu of %zu: (%u, %.9g) on the CPU, (%u, %.9g) on the device", what, j,
                         a->count, ih[j], vh[j], id[j], vd[j]);
            return 0;
        }
    return 1;
}

/* Every method, and every step with error feedback, with the table `dops`
 * and with the CPU reference, from the same input and state, over
 * CMP_ROUNDS rounds: the selections must be the same, index and value,
 * and so must the states, the totals and the residuals. */
static void compare_with_cpu(const ds_select_ops *dops)
{
    const size_t n = CMP_N;
    ds_select_ops ref;
    ds_select_ops_init(&ref, 0);
    /* DEFT's layers: a long one, a one-entry one, an empty one, the rest. */
    const uint32_t layers[] = {0, 30000, 30001, 30001, 70000, (uint32_t)n};
    const size_t n_layers = sizeof(layers) / sizeof(layers[0]) - 1;
    float *v = malloc(n * sizeof(float)), *vh = malloc(n * sizeof(float)), *vd = malloc(n * sizeof(float));
    float *rh = malloc(n * sizeof(float)), *rdh = malloc(n * sizeof(float));
    uint32_t *ih = malloc(n * sizeof(uint32_t)), *id = malloc(n * sizeof(uint32_t));
    cr_assert(v && vh && vd && rh && rdh && ih && id);
    float *dv = dev_buf(dops, n * sizeof(float)), *dval = dev_buf(dops, n * sizeof(float)),
          *dres = dev_buf(dops, n * sizeof(float));
    uint32_t *didx = dev_buf(dops, n * sizeof(uint32_t));
    static const double dens[] = {0.01, 0.3};
    int bad = 0;
    for (int m = 0; m < NM && bad < 5; m++)
        for (size_t di = 0; di < 2 && bad < 5; di++) {
            const double d = dens[di];
            ds_sparsify_cfg c;
            ds_sparsify_cfg_defaults(&c, (enum ds_sparsify_method)m);
            c.seed = 777;
            if (m == DS_SPARSIFY_DEFT) {
                c.unit_off = layers;
                c.n_units = n_layers;
            }
            /* sel: plain selection; ef: ds_ef_step; grp: the group steps
             * (MiCRO's owned chunk, DEFT's bins), on every method that has
             * one. Each pair starts from the same state. */
            ds_sparsifier *sh = NULL, *sd = NULL, *eh = NULL, *ed = NULL, *gh = NULL, *gd = NULL;
            cr_assert_eq(ds_sparsifier_create(&sh, &c, n, &ref), 0);
            cr_assert_eq(ds_sparsifier_create(&sd, &c, n, dops), 0, "%s refused", dops->name);
            cr_assert_eq(ds_sparsifier_create(&eh, &c, n, &ref), 0);
            cr_assert_eq(ds_sparsifier_create(&ed, &c, n, dops), 0);
            cr_assert_eq(ds_sparsifier_create(&gh, &c, n, &ref), 0);
            cr_assert_eq(ds_sparsifier_create(&gd, &c, n, dops), 0);
            memset(rh, 0, n * sizeof(float));
            cr_assert_eq(dops->upload(dres, rh, n * sizeof(float)), 0);
            float *grh = malloc(n * sizeof(float)), *grd = dev_buf(dops, n * sizeof(float));
            memset(grh, 0, n * sizeof(float));
            cr_assert_eq(dops->upload(grd, grh, n * sizeof(float)), 0);
            const unsigned G = 3;
            for (int r = 0; r < CMP_ROUNDS && bad < 5; r++) {
                char what[96];
                ds_sparsify_result a, b;
                int x, y;
                cmp_fill(v, n, r);
                cr_assert_eq(dops->upload(dv, v, n * sizeof(float)), 0);

                snprintf(what, sizeof(what), "%s d=%g round %d: select", ds_sparsify_method_name(m), d, r);
                x = ds_sparsify_select(sh, v, n, d, ih, vh, n, &a);
                y = ds_sparsify_select(sd, dv, n, d, didx, dval, n, &b);
                cr_assert_eq(dops->download(id, didx, b.count * sizeof(uint32_t)), 0);
                cr_assert_eq(dops->download(vd, dval, b.count * sizeof(float)), 0);
                if (!same_call(what, x, y, &a, &b, ih, vh, id, vd) || !same_state(sh, sd)) {
                    cr_log_error("%s: differs (state or call)", what);
                    bad++;
                }

                /* Error feedback: residual += v, select, zero what was sent. */
                snprintf(what, sizeof(what), "%s d=%g round %d: ef_step", ds_sparsify_method_name(m), d, r);
                x = ds_ef_step(eh, rh, v, n, d, ih, vh, n, &a);
                y = ds_ef_step(ed, dres, dv, n, d, didx, dval, n, &b);
                cr_assert_eq(dops->download(id, didx, b.count * sizeof(uint32_t)), 0);
                cr_assert_eq(dops->download(vd, dval, b.count * sizeof(float)), 0);
                cr_assert_eq(dops->sync(), 0);
                cr_assert_eq(dops->download(rdh, dres, n * sizeof(float)), 0);
                if (!same_call(what, x, y, &a, &b, ih, vh, id, vd) || !same_state(eh, ed) ||
                    !same_residual(rh, rdh, n)) {
                    cr_log_error("%s: differs (state, call or residual)", what);
                    bad++;
                }

                /* The group steps, member r % G at step r. */
                snprintf(what, sizeof(what), "%s d=%g round %d: group step", ds_sparsify_method_name(m), d, r);
                if (m == DS_SPARSIFY_DEFT) {
                    float sqh[64], sqd[64];
                    cr_assert_leq(ds_deft_group_units(gh, G), 64u);
                    const size_t nu = ds_deft_group_units(gh, G);
                    cr_assert_eq(ds_deft_group_units(gd, G), nu);
                    x = ds_deft_ef_step(gh, grh, v, n, G, (unsigned)r % G, (uint64_t)r, d, ih, vh, n, sqh, &a);
                    y = ds_deft_ef_step(gd, grd, dv, n, G, (unsigned)r % G, (uint64_t)r, d, didx, dval, n, sqd,
                                        &b);
                    /* The squared norms: the same up to the norms kernel's
                     * order of summation (bitwise on the fake device). */
                    for (size_t u = 0; u < nu; u++)
                        if (!ds_t_close_d(sqd[u], sqh[u], 0, 1e-6)) {
                            cr_log_error("%s: sq_norms[%zu] %.9g on the device, %.9g on the CPU", what, u,
                                         (double)sqd[u], (double)sqh[u]);
                            bad++;
                        }
                    /* Both take the CPU's as the group's mean: the same k next step. */
                    ds_deft_feedback(gh, G, sqh, nu);
                    ds_deft_feedback(gd, G, sqh, nu);
                } else {
                    x = ds_micro_ef_step(gh, grh, v, n, G, (unsigned)r % G, (uint64_t)r, d, ih, vh, n, &a);
                    y = ds_micro_ef_step(gd, grd, dv, n, G, (unsigned)r % G, (uint64_t)r, d, didx, dval, n, &b);
                    if (x == 0 && y == 0 && m == DS_SPARSIFY_MICRO) {
                        ds_micro_feedback(gh, a.count * G);
                        ds_micro_feedback(gd, b.count * G);
                    }
                }
                cr_assert_eq(dops->download(id, didx, b.count * sizeof(uint32_t)), 0);
                cr_assert_eq(dops->download(vd, dval, b.count * sizeof(float)), 0);
                cr_assert_eq(dops->sync(), 0);
                cr_assert_eq(dops->download(rdh, grd, n * sizeof(float)), 0);
                if (!same_call(what, x, y, &a, &b, ih, vh, id, vd) || !same_state(gh, gd) ||
                    !same_residual(grh, rdh, n)) {
                    cr_log_error("%s: differs (state, call or residual)", what);
                    bad++;
                }
            }
            ds_sparsifier_destroy(&sh);
            ds_sparsifier_destroy(&sd);
            ds_sparsifier_destroy(&eh);
            ds_sparsifier_destroy(&ed);
            ds_sparsifier_destroy(&gh);
            ds_sparsifier_destroy(&gd);
            free(grh);
            dops->free(grd);
        }
    cr_expect_eq(bad, 0, "%s: %d calls differ from the CPU's (first five logged)", dops->name, bad);
    /* topk at density 1: every finite entry, the device's general path. */
    {
        ds_sparsifier *th = make(DS_SPARSIFY_TOPK, n, &ref), *td = make(DS_SPARSIFY_TOPK, n, dops);
        ds_sparsify_result a, b;
        cmp_fill(v, n, 0);
        cr_assert_eq(dops->upload(dv, v, n * sizeof(float)), 0);
        const int x = ds_sparsify_select(th, v, n, 1.0, ih, vh, n, &a);
        const int y = ds_sparsify_select(td, dv, n, 1.0, didx, dval, n, &b);
        cr_assert_eq(dops->download(id, didx, b.count * sizeof(uint32_t)), 0);
        cr_assert_eq(dops->download(vd, dval, b.count * sizeof(float)), 0);
        cr_expect(same_call("topk d=1", x, y, &a, &b, ih, vh, id, vd));
        cr_expect_eq(a.count, n - count_nonfinite(v, n));
        ds_sparsifier_destroy(&th);
        ds_sparsifier_destroy(&td);
    }
    dops->free(dv);
    dops->free(dval);
    dops->free(dres);
    dops->free(didx);
    free(v);
    free(vh);
    free(vd);
    free(rh);
    free(rdh);
    free(ih);
    free(id);
}

Test(sparsify, device_path_selects_as_the_cpu_on_a_fake_device, .timeout = 300)
{
    ds_select_ops fake;
    fake_device(&fake);
    compare_with_cpu(&fake);
    /* A device table missing a kernel is refused, as is one naming no
     * device (the CPU table relabelled). */
    ds_sparsify_cfg c;
    ds_sparsify_cfg_defaults(&c, DS_SPARSIFY_SAGE);
    ds_sparsifier *s = NULL;
    fake.hist_sub = NULL;
    cr_expect_eq(ds_sparsifier_create(&s, &c, 10, &fake), -EINVAL);
    fake_device(&fake);
    fake.device = -1;
    cr_expect_eq(ds_sparsifier_create(&s, &c, 10, &fake), -EINVAL);
    cr_expect_null(s);
}

Test(sparsify, cuda_table_selects_as_the_cpu, .timeout = 300)
{
    char why[256];
    ds_select_ops cuda;
    const int r = ds_select_ops_init_cuda(&cuda, 0, why, sizeof(why));
    if (r == -ENODEV)
        cr_skip_test("no CUDA device: %s", why);
    cr_assert_eq(r, 0, "%s", why);
    compare_with_cpu(&cuda);
    ds_select_cuda_fini(&cuda);
}
