/*
 * tests/test_select_cuda.c: the CUDA selection kernels (kernels/cuda/
 * select.cu) against the C reference on seeded inputs of odd sizes salted
 * with NaN, +-Inf, -0 and ties, with short output buffers, empty inputs and
 * sizes that span many tiles: count, compaction, filter (whole lists, NaN
 * entries included), the histogram (added to), absmean_at, gather,
 * scatter-add and zeroing bit for bit; the norms within 1e-9 relative (the
 * sum's order differs from the C loop's) and bit for bit from one call to
 * the next. Every test skips (never fails) when no CUDA
 * device answers; Criterion forks per test, so CUDA is initialised inside
 * each test. Run: meson test -C build select_cuda --verbose
 */
#include <criterion/criterion.h>
#include <errno.h>
#include <float.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/kernels.h"
#include "kernels/select.h"
#include "testutil.h"

static ds_ops dev;
static ds_select_ops sel;

static void need_device(void)
{
    char why[256];
    int r = ds_ops_init_cuda(&dev, 0, why, sizeof(why));
    if (r == -ENODEV)
        cr_skip_test("no CUDA device: %s", why);
    cr_assert_eq(r, 0, "%s", why);
    r = ds_select_ops_init_cuda(&sel, 0, why, sizeof(why));
    cr_assert_eq(r, 0, "%s", why);
    cr_assert_eq(sel.kind, DS_BACKEND_CUDA);
}

/* Device memory holding a copy of h, or zeros when h is NULL (dev.alloc
 * zeroes; a copy from NULL would be an error). */
static void *up(const void *h, size_t bytes)
{
    void *d = dev.alloc(bytes ? bytes : 4);
    cr_assert_not_null(d);
    if (h && bytes)
        cr_assert_eq(dev.upload(d, h, bytes), 0);
    return d;
}

static void down(void *h, const void *d, size_t bytes)
{
    if (bytes)
        cr_assert_eq(dev.download(h, d, bytes), 0);
}

static void fill_awkward(float *v, size_t n, uint64_t seed)
{
    uint64_t s = seed;
    for (size_t i = 0; i < n; i++) {
        const uint64_t r = ds_t_next(&s);
        float x = (float)(((r >> 11) * (1.0 / 9007199254740992.0)) * 0.05);
        if (r & 1)
            x = -x;
        switch (r % 89) {
        case 0: x = NAN; break;
        case 1: x = INFINITY; break;
        case 2: x = -INFINITY; break;
        case 3: x = -0.0f; break;
        case 4: x = 0.02f; break;
        default: break;
        }
        v[i] = x;
    }
}

/* Tiles are 4096 entries: these cross 0, 1 and many tile boundaries, and
 * the largest needs more than one pass of the offset scan (1024 tiles). */
static const size_t sizes[] = {1, 31, 32, 33, 255, 257, 4095, 4096, 4097, 100003, 5000011};

Test(select_cuda, probe_without_device_says_why)
{
    char why[256] = "";
    const int have = ds_select_cuda_available(0, why, sizeof(why));
    cr_expect(have == 0 || have == 1);
    cr_expect_gt(strlen(why), 0u);
    if (!have) {
        ds_select_ops o;
        cr_expect_eq(ds_select_ops_init_cuda(&o, 0, why, sizeof(why)), -ENODEV);
        cr_skip_test("no CUDA device: %s", why);
    }
}

Test(select_cuda, count_and_compact_match_reference, .timeout = 120)
{
    need_device();
    for (size_t si = 0; si < sizeof(sizes) / sizeof(sizes[0]); si++) {
        const size_t n = sizes[si];
        float *x = malloc(n * sizeof(float)), *v0 = malloc(n * sizeof(float)), *v1 = malloc(n * sizeof(float));
        uint32_t *i0 = malloc(n * sizeof(uint32_t)), *i1 = malloc(n * sizeof(uint32_t));
        fill_awkward(x, n, 10 + si);
        float *dx = up(x, n * sizeof(float));
        uint32_t *di = up(NULL, (n + 1) * sizeof(uint32_t));
        float *dv = up(NULL, (n + 1) * sizeof(float));
        const uint32_t ts[] = {0, ds_sel_key(0.01f), ds_sel_key(0.02f), ds_sel_key(0.049f), DS_SEL_KEY_INF};
        for (int ti = 0; ti < 5; ti++) {
            ds_sel_tally r, o;
            ds_sel_count_c(x, n, ts[ti], &r);
            sel.count(dx, n, ts[ti], &o);
            cr_expect(o.counted == r.counted && o.nonfinite == r.nonfinite && o.kept == 0,
                      "count n=%zu t=%u: %zu/%zu vs %zu/%zu", n, ts[ti], o.counted, o.nonfinite, r.counted, r.nonfinite);
            ds_sel_compact_c(x, n, ts[ti], ts[(ti + 2) % 5], 17, i0, v0, n, &r);
            const size_t caps[] = {n, r.kept / 2};
            for (int ci = 0; ci < 2; ci++) {
                const size_t cap = caps[ci];
                /* A canary past cap on the device. */
                const uint32_t canary = 0xfeedfaceu;
                cr_assert_eq(dev.upload(di + cap, &canary, sizeof(canary)), 0);
                sel.compact(dx, n, ts[ti], ts[(ti + 2) % 5], 17, di, dv, cap, &o);
                cr_assert_eq(sel.sync(), 0);
                cr_expect(o.kept == r.kept && o.counted == r.counted && o.nonfinite == r.nonfinite,
                          "compact n=%zu cap=%zu tally %zu/%zu/%zu vs %zu/%zu/%zu", n, cap, o.kept, o.counted,
                          o.nonfinite, r.kept, r.counted, r.nonfinite);
                const size_t w = r.kept < cap ? r.kept : cap;
                down(i1, di, w * sizeof(uint32_t));
                down(v1, dv, w * sizeof(float));
                cr_expect(memcmp(i1, i0, w * sizeof(uint32_t)) == 0 && memcmp(v1, v0, w * sizeof(float)) == 0,
                          "compact n=%zu cap=%zu t=%u: lists differ", n, cap, ts[ti]);
                uint32_t after;
                down(&after, di + cap, sizeof(after));
                cr_expect_eq(after, canary, "compact n=%zu wrote at cap %zu", n, cap);
            }
        }
        dev.free(dx);
        dev.free(di);
        dev.free(dv);
        free(x);
        free(v0);
        free(v1);
        free(i0);
        free(i1);
    }
    ds_select_cuda_fini(&sel);
}

Test(select_cuda, gather_scatter_zero_match_reference, .timeout = 120)
{
    need_device();
    for (size_t si = 0; si < sizeof(sizes) / sizeof(sizes[0]); si++) {
        const size_t n = sizes[si];
        float *x = malloc(n * sizeof(float)), *y0 = malloc(n * sizeof(float)), *y1 = malloc(n * sizeof(float));
        uint32_t *idx = malloc(n * sizeof(uint32_t));
        ds_t_fill(x, n, 3 + si, -1, 1);
        uint64_t s = 77 + si;
        size_t c = 0;
        for (size_t i = 0; i < n; i++)
            if (ds_t_next(&s) % 5 == 0)
                idx[c++] = (uint32_t)i;
        float *vals = malloc((c + 1) * sizeof(float)), *g0 = malloc((c + 1) * sizeof(float)),
              *g1 = malloc((c + 1) * sizeof(float));
        ds_t_fill(vals, c, 9 + si, -2, 2);
        float *dx = up(x, n * sizeof(float)), *dvals = up(vals, c * sizeof(float)), *dg = up(NULL, (c + 1) * sizeof(float));
        uint32_t *didx = up(idx, c * sizeof(uint32_t));

        ds_sel_gather_c(g0, x, idx, c);
        sel.gather(dg, dx, didx, c);
        cr_assert_eq(sel.sync(), 0);
        down(g1, dg, c * sizeof(float));
        cr_expect(memcmp(g0, g1, c * sizeof(float)) == 0, "gather n=%zu", n);

        memcpy(y0, x, n * sizeof(float));
        ds_sel_scatter_add_c(y0, idx, vals, c, 0.333f);
        sel.scatter_add(dx, didx, dvals, c, 0.333f);
        cr_assert_eq(sel.sync(), 0);
        down(y1, dx, n * sizeof(float));
        cr_expect(memcmp(y0, y1, n * sizeof(float)) == 0, "scatter_add n=%zu (bit for bit)", n);

        ds_sel_zero_at_c(y0, idx, c);
        sel.zero_at(dx, didx, c);
        cr_assert_eq(sel.sync(), 0);
        down(y1, dx, n * sizeof(float));
        cr_expect(memcmp(y0, y1, n * sizeof(float)) == 0, "zero_at n=%zu", n);

        dev.free(dx);
        dev.free(dvals);
        dev.free(dg);
        dev.free(didx);
        free(x);
        free(y0);
        free(y1);
        free(idx);
        free(vals);
        free(g0);
        free(g1);
    }
    ds_select_cuda_fini(&sel);
}

/* Thresholds for the list and vector tests: every entry, a few inside the
 * data's range (0.02 is a salted tie), +Inf (NaN and Inf only) and past it. */
static const uint32_t list_ts[] = {0, 0x00800000u, 0x3c23d70au /* 0.01 */, 0x3ca3d70au /* 0.02 */,
                                   0x3d48b439u /* 0.049 */, DS_SEL_KEY_INF, DS_SEL_KEY_INF + 1};

Test(select_cuda, filter_matches_reference, .timeout = 120)
{
    need_device();
    /* A list straight from the vector, NaN and Inf included: filter keeps
     * key >= t whatever the entry, and must agree on them too. */
    for (size_t si = 0; si < sizeof(sizes) / sizeof(sizes[0]); si++) {
        const size_t n = sizes[si];
        float *x = malloc(n * sizeof(float)), *v0 = malloc(n * sizeof(float)), *v1 = malloc(n * sizeof(float));
        uint32_t *i0 = malloc(n * sizeof(uint32_t)), *i1 = malloc(n * sizeof(uint32_t)),
                 *in = malloc(n * sizeof(uint32_t));
        fill_awkward(x, n, 40 + si);
        for (size_t i = 0; i < n; i++)
            in[i] = (uint32_t)(3 * i + 1);
        float *dv = up(x, n * sizeof(float));
        uint32_t *di = up(in, n * sizeof(uint32_t));
        for (size_t ti = 0; ti < sizeof(list_ts) / sizeof(list_ts[0]); ti++) {
            memcpy(i0, in, n * sizeof(uint32_t));
            memcpy(v0, x, n * sizeof(float));
            const size_t want = ds_sel_filter_c(i0, v0, n, list_ts[ti]);
            cr_assert_eq(dev.upload(dv, x, n * sizeof(float)), 0);
            cr_assert_eq(dev.upload(di, in, n * sizeof(uint32_t)), 0);
            const size_t got = sel.filter(di, dv, n, list_ts[ti]);
            cr_assert_eq(sel.sync(), 0);
            cr_expect_eq(got, want, "filter n=%zu t=%#x: kept %zu, reference %zu", n, list_ts[ti], got, want);
            /* The whole arrays: the kept prefix, and what lies past it untouched. */
            down(i1, di, n * sizeof(uint32_t));
            down(v1, dv, n * sizeof(float));
            cr_expect(memcmp(i1, i0, n * sizeof(uint32_t)) == 0 && memcmp(v1, v0, n * sizeof(float)) == 0,
                      "filter n=%zu t=%#x: lists differ", n, list_ts[ti]);
        }
        cr_expect_eq(sel.filter(di, dv, 0, 0), 0u, "an empty list keeps nothing");
        dev.free(dv);
        dev.free(di);
        free(x);
        free(v0);
        free(v1);
        free(i0);
        free(i1);
        free(in);
    }
    ds_select_cuda_fini(&sel);
}

Test(select_cuda, hist_matches_reference, .timeout = 120)
{
    need_device();
    uint32_t h0[DS_SEL_HIST_BUCKETS], h1[DS_SEL_HIST_BUCKETS];
    for (size_t si = 0; si <= sizeof(sizes) / sizeof(sizes[0]); si++) {
        const size_t n = si ? sizes[si - 1] : 0; /* 0 first: adds nothing */
        float *x = malloc((n + 1) * sizeof(float));
        fill_awkward(x, n, 60 + si);
        float *dx = up(x, n * sizeof(float));
        /* Added to, not cleared: start from something other than zeros. */
        for (uint32_t b = 0; b < DS_SEL_HIST_BUCKETS; b++)
            h0[b] = h1[b] = b * 7u;
        ds_sel_hist_c(x, n, h0);
        sel.hist(dx, n, h1);
        cr_assert_eq(sel.sync(), 0);
        size_t first = DS_SEL_HIST_BUCKETS;
        for (uint32_t b = 0; b < DS_SEL_HIST_BUCKETS && first == DS_SEL_HIST_BUCKETS; b++)
            if (h0[b] != h1[b])
                first = b;
        cr_expect_eq(first, (size_t)DS_SEL_HIST_BUCKETS, "hist n=%zu: bucket %zu is %u, reference %u", n,
                     first, first < DS_SEL_HIST_BUCKETS ? h1[first] : 0, first < DS_SEL_HIST_BUCKETS ? h0[first] : 0);
        dev.free(dx);
        free(x);
    }
    ds_select_cuda_fini(&sel);
}

Test(select_cuda, norms_match_reference_and_repeat_exactly, .timeout = 120)
{
    need_device();
    /* Units of every shape: empty, one entry, one all NaN / Inf, short,
     * a warp's, across tiles and parts, and one of most of the vector. */
    const size_t n = 5000011;
    float *x = malloc(n * sizeof(float));
    fill_awkward(x, n, 80);
    x[40] = NAN;
    x[41] = INFINITY;
    const uint32_t off[] = {0, 0, 1, 40, 42, 42, 74, 331, 4096, 4097, 70000, 70001, 1048576, (uint32_t)n - 1,
                            (uint32_t)n};
    const size_t nu = sizeof(off) / sizeof(off[0]) - 1;
    double r[16], g[16], g2[16];
    float *dx = up(x, n * sizeof(float));
    uint32_t *doff = up(off, sizeof(off));
    ds_sel_norms_c(x, off, nu, r);
    sel.norms(dx, doff, nu, g);
    sel.norms(dx, doff, nu, g2);
    cr_assert_eq(sel.sync(), 0);
    for (size_t u = 0; u < nu; u++) {
        /* Every square is exact in double; the sums round in another order
         * than the C loop: at most (len - 1) ulps of relative error, under
         * 1e-9 for these lengths, halved by the square root. */
        cr_expect(ds_t_close_d(g[u], r[u], 0, 1e-9), "unit %zu [%u, %u): %.17g, reference %.17g", u, off[u],
                  off[u + 1], g[u], r[u]);
        cr_expect(memcmp(&g[u], &g2[u], sizeof(double)) == 0, "unit %zu: %.17g then %.17g", u, g[u], g2[u]);
    }
    cr_expect(g[0] == 0.0 && g[4] == 0.0, "empty units: %g %g", g[0], g[4]);
    cr_expect(g[3] == 0.0, "a unit of NaN / Inf only: %g", g[3]);
    sel.norms(dx, doff, 0, g); /* no units: nothing to do, nothing written */
    cr_assert_eq(sel.sync(), 0);
    dev.free(dx);
    dev.free(doff);
    free(x);
    ds_select_cuda_fini(&sel);
}

Test(select_cuda, absmean_at_matches_reference_bit_for_bit, .timeout = 60)
{
    need_device();
    const size_t n = 100003;
    float *x = malloc(n * sizeof(float));
    fill_awkward(x, n, 90);
    float *dx = up(x, n * sizeof(float));
    static const size_t counts[] = {0, 1, 255, 256, 257, 400, 1000};
    uint32_t pos[1000];
    uint64_t s = 91;
    for (size_t ci = 0; ci < sizeof(counts) / sizeof(counts[0]); ci++) {
        const size_t c = counts[ci];
        for (size_t j = 0; j < c; j++)
            pos[j] = (uint32_t)(ds_t_next(&s) % n);
        size_t u0 = 7, u1 = 9;
        const double m0 = ds_sel_absmean_at_c(x, pos, c, &u0);
        /* pos is host memory, per the contract. */
        const double m1 = sel.absmean_at(dx, pos, c, &u1);
        cr_assert_eq(sel.sync(), 0);
        cr_expect_eq(u1, u0, "absmean count=%zu: used %zu, reference %zu", c, u1, u0);
        cr_expect(memcmp(&m0, &m1, sizeof(double)) == 0, "absmean count=%zu: %.17g, reference %.17g", c, m1, m0);
    }
    dev.free(dx);
    free(x);
    ds_select_cuda_fini(&sel);
}

Test(select_cuda, table_is_complete)
{
    need_device();
    /* The sparsifier takes a device table only when every slot is there. */
    cr_expect(sel.count && sel.compact && sel.filter && sel.filter_ties && sel.hist && sel.hist_sub &&
              sel.norms && sel.absmean_at && sel.gather && sel.scatter_add && sel.zero_at && sel.accumulate &&
              sel.alloc && sel.free && sel.upload && sel.download && sel.sync);
    cr_expect_eq(sel.device, 0);
    /* Memory round trip through the table's own functions. */
    float h[33], back[33];
    ds_t_fill(h, 33, 5, -1, 1);
    float *d = sel.alloc(sizeof(h));
    cr_assert_not_null(d);
    cr_expect_eq(sel.upload(d, h, sizeof(h)), 0);
    cr_expect_eq(sel.download(back, d, sizeof(back)), 0);
    cr_expect(memcmp(h, back, sizeof(h)) == 0);
    sel.free(d);
    void *z = sel.alloc(0);
    cr_expect_not_null(z, "alloc(0) is memory, not a failure");
    sel.free(z);
    cr_expect_eq(sel.sync(), 0);
    ds_select_cuda_fini(&sel);
    cr_expect(sel.count == NULL && sel.device == -1, "fini clears the table");
    ds_select_cuda_fini(&sel); /* a cleared table: nothing to give back */
}

Test(select_cuda, filter_ties_matches_reference, .timeout = 120)
{
    need_device();
    for (size_t si = 0; si < sizeof(sizes) / sizeof(sizes[0]); si++) {
        const size_t n = sizes[si];
        float *x = malloc(n * sizeof(float)), *v0 = malloc(n * sizeof(float)), *v1 = malloc(n * sizeof(float));
        uint32_t *i0 = malloc(n * sizeof(uint32_t)), *i1 = malloc(n * sizeof(uint32_t)),
                 *in = malloc(n * sizeof(uint32_t));
        fill_awkward(x, n, 140 + si);
        for (size_t i = 0; i < n; i++)
            in[i] = (uint32_t)(5 * i);
        /* t = 0.02, the salted tie: about n / 89 entries equal it. */
        const uint32_t t = 0x3ca3d70au;
        size_t eq = 0;
        for (size_t i = 0; i < n; i++)
            eq += ds_sel_key(x[i]) == t;
        const size_t quotas[] = {0, 1, eq / 2, eq ? eq - 1 : 0, eq, SIZE_MAX};
        float *dx = up(x, n * sizeof(float)), *dov = up(NULL, n * sizeof(float));
        uint32_t *din = up(in, n * sizeof(uint32_t)), *doi = up(NULL, n * sizeof(uint32_t));
        for (size_t qi = 0; qi < sizeof(quotas) / sizeof(quotas[0]); qi++) {
            const size_t want = ds_sel_filter_ties_c(i0, v0, in, x, n, t, quotas[qi]);
            /* Out of place into fresh buffers... */
            size_t got = sel.filter_ties(doi, dov, din, dx, n, t, quotas[qi]);
            cr_assert_eq(sel.sync(), 0);
            cr_expect_eq(got, want, "filter_ties n=%zu ties=%zu: kept %zu, reference %zu", n, quotas[qi], got, want);
            const size_t w = got < want ? got : want;
            down(i1, doi, w * sizeof(uint32_t));
            down(v1, dov, w * sizeof(float));
            cr_expect(memcmp(i1, i0, w * sizeof(uint32_t)) == 0 && memcmp(v1, v0, w * sizeof(float)) == 0,
                      "filter_ties n=%zu ties=%zu: out-of-place lists differ", n, quotas[qi]);
            /* ...and in place, on a copy of the input. */
            cr_assert_eq(sel.upload(doi, in, n * sizeof(uint32_t)), 0);
            cr_assert_eq(sel.upload(dov, x, n * sizeof(float)), 0);
            got = sel.filter_ties(doi, dov, doi, dov, n, t, quotas[qi]);
            cr_assert_eq(sel.sync(), 0);
            cr_expect_eq(got, want, "filter_ties in place n=%zu ties=%zu", n, quotas[qi]);
            down(i1, doi, w * sizeof(uint32_t));
            down(v1, dov, w * sizeof(float));
            cr_expect(memcmp(i1, i0, w * sizeof(uint32_t)) == 0 && memcmp(v1, v0, w * sizeof(float)) == 0,
                      "filter_ties n=%zu ties=%zu: in-place lists differ", n, quotas[qi]);
        }
        dev.free(dx);
        dev.free(dov);
        dev.free(din);
        dev.free(doi);
        free(x);
        free(v0);
        free(v1);
        free(i0);
        free(i1);
        free(in);
    }
    ds_select_cuda_fini(&sel);
}

Test(select_cuda, hist_sub_and_accumulate_match_reference, .timeout = 120)
{
    need_device();
    for (size_t si = 0; si <= sizeof(sizes) / sizeof(sizes[0]); si++) {
        const size_t n = si ? sizes[si - 1] : 0;
        float *x = malloc((n + 1) * sizeof(float)), *y0 = malloc((n + 1) * sizeof(float)),
              *y1 = malloc((n + 1) * sizeof(float));
        fill_awkward(x, n, 160 + si);
        float *dx = up(x, n * sizeof(float));
        /* The prefixes a radix select would take: the bucket of 0.02 (the
         * tie) and of the first finite entry, at both levels. */
        uint32_t k1 = 0x3ca3d70au;
        for (size_t i = 0; i < n; i++)
            if (ds_sel_key(x[i]) < DS_SEL_KEY_INF) {
                k1 = ds_sel_key(x[i]);
                break;
            }
        const uint32_t keys[] = {0x3ca3d70au, k1};
        for (int ki = 0; ki < 2; ki++)
            for (unsigned shift = 0; shift <= 10; shift += 10) {
                uint32_t h0[DS_SEL_SUB_BUCKETS], h1[DS_SEL_SUB_BUCKETS];
                for (int b = 0; b < DS_SEL_SUB_BUCKETS; b++)
                    h0[b] = h1[b] = (uint32_t)b;
                const uint32_t prefix = keys[ki] >> (shift + 10);
                ds_sel_hist_sub_c(x, n, prefix, shift, h0);
                sel.hist_sub(dx, n, prefix, shift, h1);
                cr_assert_eq(sel.sync(), 0);
                cr_expect(memcmp(h0, h1, sizeof(h0)) == 0, "hist_sub n=%zu prefix=%#x shift=%u", n, prefix, shift);
            }
        /* accumulate: every sum rounded to float once, NaN and Inf as IEEE says. */
        ds_t_fill(y0, n, 170 + si, -1, 1);
        float *dy = up(y0, n * sizeof(float));
        ds_sel_accumulate_c(y0, x, n);
        sel.accumulate(dy, dx, n);
        cr_assert_eq(sel.sync(), 0);
        down(y1, dy, n * sizeof(float));
        size_t bad = 0;
        for (size_t i = 0; i < n; i++)
            bad += memcmp(&y0[i], &y1[i], 4) != 0 && !(isnan(y0[i]) && isnan(y1[i]));
        cr_expect_eq(bad, 0u, "accumulate n=%zu: %zu entries differ", n, bad);
        dev.free(dx);
        dev.free(dy);
        free(x);
        free(y0);
        free(y1);
    }
    ds_select_cuda_fini(&sel);
}
