/*
 * tests/test_select.c: every CPU variant of every selection kernel
 * (kernels/select.h) against the C reference, on seeded inputs of odd sizes
 * salted with the awkward values (NaN, +-Inf, -0, zeros, denormals, ties),
 * checkasm style: outputs canary-filled, compared bit for bit (norms to a
 * relative 1e-12), buffers checked for writes past their end; and the
 * reference-only families (filter with a tie quota, the refining
 * sub-histogram, accumulate) and the CPU table's memory functions.
 * Run: meson test -C build select --verbose
 */
#include <criterion/criterion.h>
#include <errno.h>
#include <float.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/cpu.h"
#include "kernels/select.h"
#include "testutil.h"

static const size_t sizes[] = {0, 1, 3, 7, 8, 15, 16, 17, 31, 33, 63, 100, 257, 1000, 4099, 65537};
#define NSIZES (sizeof(sizes) / sizeof(sizes[0]))
#define CANARY_IDX 0xdeadbeefu
#define CANARY_VAL -7777.0f

static int variants(ds_select_ops *out, const char **names)
{
    static const unsigned masks[] = {0, DS_CPU_AVX2, DS_CPU_ALL};
    static const char *mnames[] = {"ref", "avx2", "avx512"};
    const unsigned have = ds_cpu_detect();
    int n = 0;
    for (int i = 0; i < 3; i++) {
        if (i == 1 && !(have & DS_CPU_AVX2))
            continue;
        if (i == 2 && !(have & DS_CPU_AVX512))
            continue;
        ds_select_ops_init(&out[n], masks[i] & have);
        names[n++] = mnames[i];
    }
    return n;
}

/* Gradient-like values with the awkward ones mixed in. */
static void fill_awkward(float *v, size_t n, uint64_t seed)
{
    uint64_t s = seed;
    for (size_t i = 0; i < n; i++) {
        const uint64_t r = ds_t_next(&s);
        const double u = ((r >> 11) + 0.5) * (1.0 / 9007199254740992.0);
        /* Laplace-ish magnitudes over several octaves, random sign. */
        float x = (float)(-log(u) * 0.01);
        if (r & 1)
            x = -x;
        switch (r % 97) {
        case 0: x = NAN; break;
        case 1: x = INFINITY; break;
        case 2: x = -INFINITY; break;
        case 3: x = -0.0f; break;
        case 4: x = 0.0f; break;
        case 5: x = FLT_TRUE_MIN * 3; break;
        case 6: x = 0.01f; break; /* ties */
        case 7: x = -0.01f; break;
        default: break;
        }
        v[i] = x;
    }
}

static float *falloc(size_t n)
{
    float *p = malloc((n + 1) * sizeof(float));
    cr_assert_not_null(p);
    return p;
}

static uint32_t *ualloc(size_t n)
{
    uint32_t *p = malloc((n + 1) * sizeof(uint32_t));
    cr_assert_not_null(p);
    return p;
}

static void canary(uint32_t *idx, float *val, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        idx[i] = CANARY_IDX;
        val[i] = CANARY_VAL;
    }
}

/* Thresholds worth trying on v: 0, every-finite, a few quantiles, Inf. */
static void thresholds(const float *v, size_t n, uint32_t *t, int *nt)
{
    int m = 0;
    t[m++] = 0;
    t[m++] = 1;
    t[m++] = ds_sel_key(0.01f);
    t[m++] = ds_sel_key(0.03f);
    if (n)
        t[m++] = ds_sel_key(v[n / 2]) < DS_SEL_KEY_INF ? ds_sel_key(v[n / 2]) : 5;
    t[m++] = DS_SEL_KEY_INF;
    *nt = m;
}

Test(select, names_follow_mask)
{
    ds_select_ops o;
    ds_select_ops_init(&o, 0);
    cr_expect_str_eq(o.name, "select-ref");
    cr_expect_eq((void *)o.compact, (void *)ds_sel_compact_c);
    cr_expect_eq(o.kind, DS_BACKEND_CPU);
    cr_expect_eq(o.sync(), 0);
    if (ds_cpu_detect() & DS_CPU_AVX2) {
        ds_select_ops_init(&o, DS_CPU_AVX2);
        cr_expect_str_eq(o.name, "select-avx2");
        cr_expect_eq((void *)o.compact, (void *)ds_sel_compact_avx2);
        cr_expect_eq((void *)o.zero_at, (void *)ds_sel_zero_at_c);
    }
    if (ds_cpu_detect() & DS_CPU_AVX512) {
        ds_select_ops_init(&o, DS_CPU_ALL);
        cr_expect_str_eq(o.name, "select-avx512");
        cr_expect_eq((void *)o.hist, (void *)ds_sel_hist_avx512);
    }
}

/* Criterion runs each test in its own process: the mask comes from
 * DS_KERNELS on first use. */
Test(select, env_mask_forces_reference)
{
    setenv("DS_KERNELS", "ref", 1);
    ds_select_ops o;
    ds_select_ops_init(&o, ds_cpu_flags());
    cr_expect_str_eq(o.name, "select-ref");
}

Test(select, keys_order_like_magnitudes)
{
    const float xs[] = {0.0f, FLT_TRUE_MIN, 1e-30f, 0.5f, 1.0f, 1.0000001f, 3e38f, FLT_MAX};
    for (size_t i = 0; i + 1 < sizeof(xs) / sizeof(xs[0]); i++) {
        cr_expect_lt(ds_sel_key(xs[i]), ds_sel_key(xs[i + 1]));
        cr_expect_eq(ds_sel_key(xs[i]), ds_sel_key(-xs[i]));
    }
    cr_expect_eq(ds_sel_key(-0.0f), 0u);
    cr_expect_eq(ds_sel_key(INFINITY), DS_SEL_KEY_INF);
    cr_expect_gt(ds_sel_key(NAN), DS_SEL_KEY_INF);
    cr_expect_eq(ds_sel_key_value(ds_sel_key(-2.5f)), 2.5f);
}

Test(select, count_and_compact_match_reference)
{
    ds_select_ops v[3];
    const char *names[3];
    const int nv = variants(v, names);
    for (size_t si = 0; si < NSIZES; si++) {
        const size_t n = sizes[si];
        const uint64_t seed = 100 + si;
        float *x = falloc(n), *v0 = falloc(n), *v1 = falloc(n);
        uint32_t *i0 = ualloc(n), *i1 = ualloc(n);
        fill_awkward(x, n, seed);
        uint32_t ts[8];
        int nt;
        thresholds(x, n, ts, &nt);
        for (int ti = 0; ti < nt; ti++) {
            for (int ci = 0; ci < nt; ci++) {
                const uint32_t base = (uint32_t)(seed * 1000);
                ds_sel_tally r, o;
                canary(i0, v0, n + 1);
                ds_sel_compact_c(x, n, ts[ti], ts[ci], base, i0, v0, n, &r);
                ds_sel_tally rc;
                ds_sel_count_c(x, n, ts[ci], &rc);
                cr_expect_eq(rc.counted, r.counted, "count vs compact n=%zu", n);
                cr_expect_eq(rc.nonfinite, r.nonfinite);
                /* The kept set in the reference is what the definition says. */
                size_t want = 0;
                for (size_t i = 0; i < n; i++)
                    want += ds_sel_key(x[i]) < DS_SEL_KEY_INF && ds_sel_key(x[i]) >= ts[ti];
                cr_expect_eq(r.kept, want);
                /* Full, short and empty output buffers. */
                const size_t caps[] = {n, r.kept, r.kept / 2, r.kept ? r.kept - 1 : 0, 0};
                for (int vi = 0; vi < nv; vi++) {
                    ds_sel_tally tc;
                    v[vi].count(x, n, ts[ci], &tc);
                    cr_expect(tc.counted == rc.counted && tc.nonfinite == rc.nonfinite && tc.kept == 0,
                              "%s count n=%zu t=%u: %zu/%zu vs %zu/%zu", names[vi], n, ts[ci],
                              tc.counted, tc.nonfinite, rc.counted, rc.nonfinite);
                    for (int k = 0; k < 5; k++) {
                        const size_t cap = caps[k];
                        canary(i1, v1, n + 1);
                        v[vi].compact(x, n, ts[ti], ts[ci], base, i1, v1, cap, &o);
                        cr_expect(o.kept == r.kept && o.counted == r.counted && o.nonfinite == r.nonfinite,
                                  "%s compact n=%zu cap=%zu tally %zu/%zu/%zu vs %zu/%zu/%zu", names[vi],
                                  n, cap, o.kept, o.counted, o.nonfinite, r.kept, r.counted, r.nonfinite);
                        const size_t w = r.kept < cap ? r.kept : cap;
                        cr_expect(memcmp(i1, i0, w * sizeof(uint32_t)) == 0 &&
                                      memcmp(v1, v0, w * sizeof(float)) == 0,
                                  "%s compact n=%zu cap=%zu: kept lists differ", names[vi], n, cap);
                        /* Nothing at or past cap (full-vector stores are
                         * only allowed while they end below cap). */
                        for (size_t j = cap; j <= n; j++)
                            if (i1[j] != CANARY_IDX || v1[j] != CANARY_VAL) {
                                cr_expect_fail("%s compact n=%zu cap=%zu wrote at %zu", names[vi], n, cap, j);
                                break;
                            }
                    }
                }
            }
        }
        free(x);
        free(v0);
        free(v1);
        free(i0);
        free(i1);
    }
}

Test(select, filter_matches_reference)
{
    ds_select_ops v[3];
    const char *names[3];
    const int nv = variants(v, names);
    for (size_t si = 0; si < NSIZES; si++) {
        const size_t n = sizes[si];
        float *x = falloc(n), *v0 = falloc(n), *v1 = falloc(n), *vs = falloc(n);
        uint32_t *i0 = ualloc(n), *i1 = ualloc(n), *is = ualloc(n);
        fill_awkward(x, n, 300 + si);
        ds_sel_tally r;
        ds_sel_compact_c(x, n, 0, 0, 7, is, vs, n, &r);
        uint32_t ts[8];
        int nt;
        thresholds(x, n, ts, &nt);
        for (int ti = 0; ti < nt; ti++) {
            memcpy(i0, is, r.kept * sizeof(uint32_t));
            memcpy(v0, vs, r.kept * sizeof(float));
            const size_t c0 = ds_sel_filter_c(i0, v0, r.kept, ts[ti]);
            for (int vi = 0; vi < nv; vi++) {
                memcpy(i1, is, r.kept * sizeof(uint32_t));
                memcpy(v1, vs, r.kept * sizeof(float));
                i1[r.kept] = CANARY_IDX;
                const size_t c1 = v[vi].filter(i1, v1, r.kept, ts[ti]);
                cr_expect_eq(c1, c0, "%s filter n=%zu", names[vi], n);
                cr_expect(memcmp(i1, i0, c0 * sizeof(uint32_t)) == 0 && memcmp(v1, v0, c0 * sizeof(float)) == 0,
                          "%s filter n=%zu lists differ", names[vi], n);
                cr_expect_eq(i1[r.kept], CANARY_IDX);
            }
        }
        free(x);
        free(v0);
        free(v1);
        free(vs);
        free(i0);
        free(i1);
        free(is);
    }
}

Test(select, hist_matches_reference)
{
    ds_select_ops v[3];
    const char *names[3];
    const int nv = variants(v, names);
    static uint32_t h0[DS_SEL_HIST_BUCKETS], h1[DS_SEL_HIST_BUCKETS];
    for (size_t si = 0; si < NSIZES; si++) {
        const size_t n = sizes[si];
        float *x = falloc(n);
        fill_awkward(x, n, 500 + si);
        /* hist adds into its table: start both from the same non-zero one. */
        for (int b = 0; b < DS_SEL_HIST_BUCKETS; b++)
            h0[b] = (uint32_t)b;
        ds_sel_hist_c(x, n, h0);
        size_t total = 0;
        for (int b = 0; b < DS_SEL_HIST_BUCKETS; b++)
            total += h0[b] - (uint32_t)b;
        cr_expect_eq(total, n);
        for (int vi = 0; vi < nv; vi++) {
            for (int b = 0; b < DS_SEL_HIST_BUCKETS; b++)
                h1[b] = (uint32_t)b;
            v[vi].hist(x, n, h1);
            cr_expect(memcmp(h0, h1, sizeof(h0)) == 0, "%s hist n=%zu", names[vi], n);
        }
        free(x);
    }
}

Test(select, norms_match_reference)
{
    ds_select_ops v[3];
    const char *names[3];
    const int nv = variants(v, names);
    const size_t n = 70001;
    float *x = falloc(n);
    fill_awkward(x, n, 77);
    /* Units of odd lengths, one empty, one all NaN. */
    uint32_t off[] = {0, 1, 18, 18, 1041, 5000, 5003, 40000, 70001};
    const size_t nu = sizeof(off) / sizeof(off[0]) - 1;
    for (uint32_t i = 5000; i < 5003; i++)
        x[i] = NAN;
    double n0[16], n1[16];
    ds_sel_norms_c(x, off, nu, n0);
    cr_expect_eq(n0[2], 0.0);
    cr_expect_eq(n0[5], 0.0);
    for (int vi = 0; vi < nv; vi++) {
        v[vi].norms(x, off, nu, n1);
        for (size_t u = 0; u < nu; u++)
            cr_expect(ds_t_close_d(n1[u], n0[u], 1e-300, 1e-12), "%s norm[%zu] %.17g vs %.17g",
                      names[vi], u, n1[u], n0[u]);
    }
    free(x);
}

Test(select, gather_scatter_zero_match_reference)
{
    ds_select_ops v[3];
    const char *names[3];
    const int nv = variants(v, names);
    for (size_t si = 0; si < NSIZES; si++) {
        const size_t n = sizes[si];
        float *x = falloc(n), *y0 = falloc(n), *y1 = falloc(n), *g0 = falloc(n), *g1 = falloc(n);
        uint32_t *idx = ualloc(n);
        fill_awkward(x, n, 900 + si);
        /* A sorted, unique index set of about a third of [0, n). */
        uint64_t s = 31 + si;
        size_t c = 0;
        for (size_t i = 0; i < n; i++)
            if (ds_t_next(&s) % 3 == 0)
                idx[c++] = (uint32_t)i;
        float *vals = falloc(c);
        ds_t_fill(vals, c, 5 + si, -2, 2);
        ds_sel_gather_c(g0, x, idx, c);
        ds_t_fill(y0, n, 41 + si, -1, 1);
        ds_sel_scatter_add_c(y0, idx, vals, c, 0.333f);
        for (int vi = 0; vi < nv; vi++) {
            g1[c] = CANARY_VAL;
            v[vi].gather(g1, x, idx, c);
            cr_expect(memcmp(g1, g0, c * sizeof(float)) == 0, "%s gather n=%zu", names[vi], n);
            cr_expect_eq(g1[c], CANARY_VAL);
            ds_t_fill(y1, n, 41 + si, -1, 1);
            v[vi].scatter_add(y1, idx, vals, c, 0.333f);
            cr_expect(memcmp(y1, y0, n * sizeof(float)) == 0, "%s scatter_add n=%zu", names[vi], n);
            v[vi].zero_at(y1, idx, c);
            for (size_t j = 0; j < c; j++)
                cr_expect(y1[idx[j]] == 0.0f && !signbit(y1[idx[j]]));
        }
        free(x);
        free(y0);
        free(y1);
        free(g0);
        free(g1);
        free(idx);
        free(vals);
    }
}

Test(select, absmean_skips_nonfinite)
{
    const float x[] = {1.0f, -3.0f, NAN, INFINITY, -INFINITY, 2.0f};
    const uint32_t pos[] = {0, 1, 2, 3, 4, 5, 1};
    size_t used = 99;
    const double m = ds_sel_absmean_at_c(x, pos, 7, &used);
    cr_expect_eq(used, 4u);
    cr_expect(ds_t_close_d(m, (1.0 + 3.0 + 2.0 + 3.0) / 4.0, 0, 1e-15), "mean %g", m);
    const uint32_t bad[] = {2, 3};
    cr_expect_eq(ds_sel_absmean_at_c(x, bad, 2, &used), 0.0);
    cr_expect_eq(used, 0u);
}

Test(select, cuda_probe_answers_cleanly)
{
    /* With or without a GPU and a CUDA build, the probe returns 0 or 1 and
     * says why; without a device, init is -ENODEV, never a crash. */
    char why[200] = "";
    const int have = ds_select_cuda_available(0, why, sizeof(why));
    cr_expect(have == 0 || have == 1);
    cr_expect_gt(strlen(why), 0u);
    ds_select_ops o;
    char why2[200] = "";
    const int ret = ds_select_ops_init_cuda(&o, 0, why2, sizeof(why2));
    cr_expect(have ? ret == 0 : ret == -ENODEV, "available=%d init=%d (%s)", have, ret, why2);
    cr_expect_eq(ds_select_cuda_available(-1, why, sizeof(why)), 0);
    if (ret == 0)
        ds_select_cuda_fini(&o);
}

Test(select, filter_ties_keeps_the_first_ties_in_order)
{
    /* Keys 3 > t = 2: keep every 3, the first `ties` 2s, never a 1; NaN and
     * Inf have keys above any finite t and are kept like the 3s. */
    const float v[] = {2, 1, 3, 2, -2, NAN, 3, 2, 1, -3, INFINITY, 2};
    const size_t n = sizeof(v) / sizeof(v[0]);
    uint32_t idx[12];
    for (size_t i = 0; i < n; i++)
        idx[i] = (uint32_t)(10 + i);
    const uint32_t t = ds_sel_key(2.0f);
    for (size_t ties = 0; ties <= 7; ties++) {
        uint32_t oi[12], ii[12];
        float ov[12], iv[12];
        const size_t got = ds_sel_filter_ties_c(oi, ov, idx, v, n, t, ties);
        size_t want = 0, eq = 0;
        for (size_t i = 0; i < n; i++) {
            const uint32_t k = ds_sel_key(v[i]);
            if (k > t || (k == t && eq++ < ties)) {
                cr_expect(want < got && oi[want] == idx[i] && !memcmp(&ov[want], &v[i], 4),
                          "ties=%zu: entry %zu should be index %u", ties, want, idx[i]);
                want++;
            }
        }
        cr_expect_eq(got, want, "ties=%zu", ties);
        /* In place gives the same. */
        memcpy(ii, idx, sizeof(ii));
        memcpy(iv, v, sizeof(iv));
        cr_expect_eq(ds_sel_filter_ties_c(ii, iv, ii, iv, n, t, ties), got);
        cr_expect(!memcmp(ii, oi, got * 4) && !memcmp(iv, ov, got * 4), "ties=%zu in place", ties);
    }
    /* With no quota it is filter. */
    for (size_t si = 0; si < NSIZES; si++) {
        const size_t m = sizes[si];
        float *x = falloc(m), *x2 = falloc(m);
        uint32_t *i1 = ualloc(m), *i2 = ualloc(m);
        fill_awkward(x, m, 300 + si);
        for (size_t i = 0; i < m; i++)
            i1[i] = i2[i] = (uint32_t)i;
        memcpy(x2, x, m * sizeof(float));
        const uint32_t tk = ds_sel_key(0.01f);
        const size_t a = ds_sel_filter_c(i1, x, m, tk);
        const size_t b = ds_sel_filter_ties_c(i2, x2, i2, x2, m, tk, SIZE_MAX);
        cr_expect(a == b && !memcmp(i1, i2, a * 4) && !memcmp(x, x2, a * 4), "n=%zu: %zu vs %zu", m, a, b);
        free(x);
        free(x2);
        free(i1);
        free(i2);
    }
}

Test(select, hist_sub_refines_one_bucket)
{
    const size_t n = 65537;
    float *x = falloc(n);
    fill_awkward(x, n, 400);
    uint32_t top[DS_SEL_HIST_BUCKETS] = {0};
    ds_sel_hist_c(x, n, top);
    /* The fullest finite bucket, then the fullest of its sub-buckets: the
     * two levels must split it exactly. */
    uint32_t b1 = 0;
    for (uint32_t b = 0; b < (DS_SEL_KEY_INF >> DS_SEL_HIST_SHIFT); b++)
        if (top[b] > top[b1])
            b1 = b;
    uint32_t h2[DS_SEL_SUB_BUCKETS], h3[DS_SEL_SUB_BUCKETS];
    for (int b = 0; b < DS_SEL_SUB_BUCKETS; b++)
        h2[b] = 5; /* added to, not cleared */
    ds_sel_hist_sub_c(x, n, b1, 10, h2);
    uint64_t sum = 0;
    uint32_t b2 = 0;
    for (int b = 0; b < DS_SEL_SUB_BUCKETS; b++) {
        sum += h2[b] - 5;
        if (h2[b] > h2[b2])
            b2 = (uint32_t)b;
    }
    cr_expect_eq(sum, top[b1], "level 2 holds %llu of bucket %u's %u", (unsigned long long)sum, b1, top[b1]);
    memset(h3, 0, sizeof(h3));
    ds_sel_hist_sub_c(x, n, (b1 << 10) | b2, 0, h3);
    sum = 0;
    for (int b = 0; b < DS_SEL_SUB_BUCKETS; b++)
        sum += h3[b];
    cr_expect_eq(sum, h2[b2] - 5u);
    for (int b = 0; b < DS_SEL_SUB_BUCKETS; b++) {
        uint32_t want = 0;
        for (size_t i = 0; i < n; i++)
            want += ds_sel_key(x[i]) == (((b1 << 10 | b2) << 10) | (uint32_t)b);
        cr_expect_eq(h3[b], want, "level 3 bucket %d", b);
    }
    free(x);
}

Test(select, accumulate_and_memory_of_the_cpu_table)
{
    ds_select_ops o;
    ds_select_ops_init(&o, ds_cpu_flags());
    cr_expect_eq(o.device, -1);
    const float y0[] = {1.0f, -2.5f, 1e30f, NAN, 0.1f};
    const float g[] = {0.5f, 2.5f, 1e30f, 1.0f, 0.2f};
    float y[5];
    memcpy(y, y0, sizeof(y));
    o.accumulate(y, g, 5);
    for (int i = 0; i < 5; i++) {
        const float want = y0[i] + g[i];
        cr_expect(!memcmp(&y[i], &want, 4) || (isnan(y[i]) && isnan(want)), "[%d] %g", i, y[i]);
    }
    float *p = o.alloc(0);
    cr_expect_not_null(p, "alloc(0) is memory, not a failure");
    o.free(p);
    p = o.alloc(sizeof(y));
    cr_assert_not_null(p);
    float back[5];
    cr_expect_eq(o.upload(p, y0, sizeof(y0)), 0);
    cr_expect_eq(o.download(back, p, sizeof(back)), 0);
    cr_expect(!memcmp(back, y0, sizeof(back)));
    o.free(p);
    o.free(NULL);
    ds_select_cuda_fini(&o); /* a CPU table: nothing to give back */
    cr_expect_not_null(o.count);
}
