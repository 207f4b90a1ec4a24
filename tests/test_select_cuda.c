/*
 * tests/test_select_cuda.c: the CUDA selection kernels (kernels/cuda/
 * select.cu: threshold count, block-scan compaction, gather, scatter-add,
 * zeroing) against the C reference, bit for bit, on seeded inputs of odd
 * sizes salted with NaN, +-Inf, -0 and ties, with short output buffers and
 * sizes that span many tiles. Every test skips (never fails) when no CUDA
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

static void *up(const void *h, size_t bytes)
{
    void *d = dev.alloc(bytes ? bytes : 4);
    cr_assert_not_null(d);
    if (bytes)
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
