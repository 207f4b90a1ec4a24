/*
 * tests/test_cuda.c: the CUDA op table against the C reference on seeded
 * random inputs of odd sizes, and a short training run on the device.
 * Every test skips (never fails) when no CUDA device answers: this build
 * machine has nvcc but no GPU. Criterion forks per test, so CUDA is
 * initialised inside each test, never in a constructor.
 * Run: meson test -C build cuda --verbose
 */
#include <criterion/criterion.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/cpu/cpu_kernels.h"
#include "kernels/kernels.h"
#include "node/train/train.h"
#include "testutil.h"

static ds_ops dev;

static void need_device(void)
{
    char why[256];
    int r = ds_ops_init_cuda(&dev, 0, why, sizeof(why));
    if (r == -ENODEV)
        cr_skip_test("no CUDA device: %s", why);
    cr_assert_eq(r, 0, "%s", why);
}

static float *up(const float *h, size_t n)
{
    float *d = dev.alloc(n * sizeof(float));
    cr_assert_not_null(d);
    cr_assert_eq(dev.upload(d, h, n * sizeof(float)), 0);
    return d;
}

static void down(float *h, const float *d, size_t n)
{
    cr_assert_eq(dev.download(h, d, n * sizeof(float)), 0);
}

/* For GEMM-based ops: |got - want| <= rtol * mag + 1e-6 everywhere, where
 * mag is the reference run on the absolute values of the inputs (the sum
 * of the magnitudes of the terms of each output), so the tolerance follows
 * what float accumulation can lose, not the size of the result. Prints the
 * seed and the first ten mismatches. */
static int close_mag(const char *what, uint64_t seed, const float *got, const float *want,
                     const float *mag, size_t n, double rtol)
{
    int bad = 0;
    for (size_t i = 0; i < n; i++) {
        const double d = fabs((double)got[i] - (double)want[i]);
        if (!(d <= rtol * mag[i] + 1e-6)) {
            if (bad < 10)
                cr_log_error("%s seed=%llu n=%zu: [%zu] got %.9g want %.9g (diff %.3g, "
                             "magnitude %.3g)",
                             what, (unsigned long long)seed, n, i, got[i], want[i], d, mag[i]);
            bad++;
        }
    }
    if (bad)
        cr_log_error("%s: %d of %zu values differ", what, bad, n);
    return bad == 0;
}

static float *abs_copy(const float *x, size_t n)
{
    float *a = malloc(n * sizeof(float));
    cr_assert_not_null(a);
    for (size_t i = 0; i < n; i++)
        a[i] = fabsf(x[i]);
    return a;
}

static const size_t sizes[] = {1, 7, 255, 256, 257, 1000, 65537};

Test(cuda, elementwise_and_reductions_match_reference)
{
    need_device();
    for (size_t si = 0; si < sizeof(sizes) / sizeof(sizes[0]); si++) {
        const size_t n = sizes[si];
        const uint64_t seed = 40 + si;
        float *x = malloc(n * 4), *y = malloc(n * 4), *r0 = malloc(n * 4), *r1 = malloc(n * 4);
        ds_t_fill(x, n, seed, -1, 1);
        ds_t_fill(y, n, seed + 1, -1, 1);
        float *dx = up(x, n), *dy = up(y, n);

        ds_relu_fwd_c(r0, x, n);
        dev.relu_fwd(dy, dx, n);
        down(r1, dy, n);
        cr_expect(ds_t_close("relu_fwd", seed, r1, r0, n, 0, 0));

        ds_relu_bwd_c(r0, y, x, n);
        cr_assert_eq(dev.upload(dy, y, n * 4), 0);
        dev.relu_bwd(dy, dy, dx, n);
        down(r1, dy, n);
        cr_expect(ds_t_close("relu_bwd", seed, r1, r0, n, 0, 0));

        memcpy(r0, y, n * 4);
        ds_axpy_c(n, 0.3f, x, r0);
        cr_assert_eq(dev.upload(dy, y, n * 4), 0);
        dev.axpy(n, 0.3f, dx, dy);
        down(r1, dy, n);
        cr_expect(ds_t_close("axpy", seed, r1, r0, n, 1e-6, 1e-6));

        ds_scale_c(n, -2.5f, r0);
        dev.scale(n, -2.5f, dy);
        down(r1, dy, n);
        cr_expect(ds_t_close("scale", seed, r1, r0, n, 1e-6, 1e-6));

        cr_expect(ds_t_close_d(dev.dot(n, dx, dx), ds_dot_c(n, x, x), 1e-9 * n, 1e-9));
        cr_expect(ds_t_close_d(dev.sum(n, dx), ds_sum_c(n, x), 1e-9 * n, 1e-9));
        cr_expect(ds_t_close_d(dev.nrm2(n, dx), ds_nrm2_c(n, x), 1e-9 * n, 1e-9));
        dev.free(dx);
        dev.free(dy);
        free(x);
        free(y);
        free(r0);
        free(r1);
    }
    ds_ops_fini(&dev);
}

Test(cuda, sgd_matches_reference)
{
    need_device();
    const ds_sgd_params ps[] = {{0.1f, 0, 0, 0}, {0.05f, 0.9f, 1e-4f, 0}, {0.01f, 0.9f, 5e-4f, 1}};
    for (size_t pi = 0; pi < 3; pi++) {
        const size_t n = 70001;
        float *t = malloc(n * 4), *m = malloc(n * 4), *g = malloc(n * 4), *r = malloc(n * 4);
        ds_t_fill(t, n, pi, -1, 1);
        ds_t_fill(m, n, pi + 10, -0.1f, 0.1f);
        ds_t_fill(g, n, pi + 20, -1, 1);
        float *dt = up(t, n), *dm = up(m, n), *dg = up(g, n);
        for (int rep = 0; rep < 3; rep++) {
            ds_sgd_c(t, m, g, n, &ps[pi]);
            dev.sgd(dt, dm, dg, n, &ps[pi]);
        }
        down(r, dt, n);
        cr_expect(ds_t_close("sgd theta", pi, r, t, n, 1e-6, 1e-5));
        down(r, dm, n);
        cr_expect(ds_t_close("sgd momentum", pi, r, m, n, 1e-6, 1e-5));
        dev.free(dt);
        dev.free(dm);
        dev.free(dg);
        free(t);
        free(m);
        free(g);
        free(r);
    }
    ds_ops_fini(&dev);
}

Test(cuda, gemm_bias_softmax_match_reference)
{
    need_device();
    const int shapes[][3] = {{64, 256, 784}, {17, 10, 33}, {3, 5, 7}};
    for (int s = 0; s < 3; s++)
        for (int ta = 0; ta < 2; ta++)
            for (int tb = 0; tb < 2; tb++) {
                const int m = shapes[s][0], n = shapes[s][1], k = shapes[s][2];
                float *a = malloc((size_t)m * k * 4), *b = malloc((size_t)k * n * 4);
                float *c0 = malloc((size_t)m * n * 4), *c1 = malloc((size_t)m * n * 4);
                ds_t_fill(a, (size_t)m * k, s, -1, 1);
                ds_t_fill(b, (size_t)k * n, s + 5, -1, 1);
                ds_t_fill(c0, (size_t)m * n, s + 9, -1, 1);
                float *da = up(a, (size_t)m * k), *db = up(b, (size_t)k * n), *dc = up(c0, (size_t)m * n);
                const int lda = ta ? m : k, ldb = tb ? k : n;
                ds_gemm_c(ta, tb, m, n, k, 0.5f, a, lda, b, ldb, 0.25f, c0, n);
                dev.gemm(ta, tb, m, n, k, 0.5f, da, lda, db, ldb, 0.25f, dc, n);
                down(c1, dc, (size_t)m * n);
                cr_expect(ds_t_close("gemm", s, c1, c0, (size_t)m * n, 1e-3, 1e-3), "%dx%dx%d ta=%d tb=%d", m, n, k, ta, tb);
                dev.free(da);
                dev.free(db);
                dev.free(dc);
                free(a);
                free(b);
                free(c0);
                free(c1);
            }

    const int rows = 37, cols = 10;
    float lg[370], d0[370], d1[370], bias[10], bg0[10], bg1[10];
    int32_t lab[37];
    ds_t_fill(lg, 370, 3, -4, 4);
    ds_t_fill(bias, 10, 4, -1, 1);
    for (int r = 0; r < rows; r++)
        lab[r] = (r * 7) % cols;
    float *dl = up(lg, 370), *dd = dev.alloc(370 * 4), *dbias = up(bias, 10), *dbg = dev.alloc(40);
    int32_t *dlab = dev.alloc(sizeof(lab));
    cr_assert_eq(dev.upload(dlab, lab, sizeof(lab)), 0);
    double l0, l1;
    int64_t g0, g1;
    ds_softmax_xent_c(d0, lg, lab, rows, cols, &l0, &g0);
    dev.softmax_xent(dd, dl, dlab, rows, cols, &l1, &g1);
    down(d1, dd, 370);
    cr_expect(ds_t_close("softmax_xent grad", 3, d1, d0, 370, 1e-6, 1e-4));
    cr_expect(ds_t_close_d(l1, l0, 1e-4, 1e-5), "loss %g vs %g", l1, l0);
    cr_expect_eq(g1, g0);
    ds_bias_add_c(lg, bias, rows, cols);
    dev.bias_add(dl, dbias, rows, cols);
    down(d1, dl, 370);
    cr_expect(ds_t_close("bias_add", 4, d1, lg, 370, 1e-6, 1e-6));
    ds_bias_grad_c(bg0, lg, rows, cols);
    dev.bias_grad(dbg, dl, rows, cols);
    down(bg1, dbg, 10);
    cr_expect(ds_t_close("bias_grad", 4, bg1, bg0, 10, 1e-5, 1e-5));
    dev.free(dl);
    dev.free(dd);
    dev.free(dbias);
    dev.free(dbg);
    dev.free(dlab);
    ds_ops_fini(&dev);
}

/* bias_grad reduces rows in parallel (16 row lanes per column): rows that
 * are not a multiple of the lanes, columns not a multiple of the block's
 * 32, and one row. Sums of at most 1025 values of [-1, 1] in double, so
 * the device and the reference round the same sum to float, up to an ulp. */
Test(cuda, bias_grad_matches_reference)
{
    need_device();
    const int shapes[][2] = {{1, 10}, {37, 10}, {37, 33}, {1000, 100}, {1025, 1}, {17, 129}};
    for (size_t si = 0; si < sizeof(shapes) / sizeof(shapes[0]); si++) {
        const int rows = shapes[si][0], cols = shapes[si][1];
        const size_t n = (size_t)rows * cols;
        const uint64_t seed = 80 + si;
        float *dy = malloc(n * 4), *want = malloc((size_t)cols * 4), *got = malloc((size_t)cols * 4);
        cr_assert(dy && want && got);
        ds_t_fill(dy, n, seed, -1, 1);
        float *ddy = up(dy, n), *ddb = dev.alloc((size_t)cols * 4);
        cr_assert_not_null(ddb);
        ds_bias_grad_c(want, dy, rows, cols);
        dev.bias_grad(ddb, ddy, rows, cols);
        down(got, ddb, (size_t)cols);
        cr_expect_eq(dev.sync(), 0, "%s", dev.error() ? dev.error() : "");
        cr_expect(ds_t_close("bias_grad", seed, got, want, (size_t)cols, 1e-6, 1e-6),
                  "rows %d cols %d", rows, cols);
        dev.free(ddy);
        dev.free(ddb);
        free(dy);
        free(want);
        free(got);
    }
    ds_ops_fini(&dev);
}

/* Softmax cross-entropy, one warp per row: 10 and 37 columns (37 spans two
 * strides of a warp), rows not a multiple of the 8 rows of a block, and
 * logits drawn from {-1, 0, 1, 2} so that most rows have tied maxima, in
 * one lane and across lanes. Labels hit the first and the later maxima, so
 * the count of correct rows checks the reference's tie rule (the first
 * maximum wins) exactly. Also without dlogits (evaluation). */
Test(cuda, softmax_xent_matches_reference_with_ties)
{
    need_device();
    const int shapes[][2] = {{37, 10}, {37, 37}, {1, 37}, {1001, 10}};
    for (size_t si = 0; si < sizeof(shapes) / sizeof(shapes[0]); si++) {
        const int rows = shapes[si][0], cols = shapes[si][1];
        const size_t n = (size_t)rows * cols;
        const uint64_t seed = 90 + si;
        float *lg = malloc(n * 4), *d0 = malloc(n * 4), *d1 = malloc(n * 4);
        int32_t *lab = malloc((size_t)rows * 4);
        cr_assert(lg && d0 && d1 && lab);
        ds_t_fill(lg, n, seed, -1, 3);
        for (size_t i = 0; i < n; i++)
            lg[i] = floorf(lg[i]);
        for (int r = 0; r < rows; r++) {
            /* Every third row: the label is the LAST maximum (a hit only if
             * it is also the first); otherwise a seeded column. */
            const float *x = lg + (size_t)r * cols;
            int last = 0;
            for (int c = 1; c < cols; c++)
                if (x[c] >= x[last])
                    last = c;
            lab[r] = r % 3 == 0 ? last : (r * 7 + (int)si) % cols;
        }
        float *dl = up(lg, n), *dd = dev.alloc(n * 4);
        int32_t *dlab = dev.alloc((size_t)rows * 4);
        cr_assert(dd && dlab);
        cr_assert_eq(dev.upload(dlab, lab, (size_t)rows * 4), 0);
        double l0, l1, l2;
        int64_t g0, g1, g2;
        ds_softmax_xent_c(d0, lg, lab, rows, cols, &l0, &g0);
        dev.softmax_xent(dd, dl, dlab, rows, cols, &l1, &g1);
        down(d1, dd, n);
        cr_expect(ds_t_close("softmax_xent grad", seed, d1, d0, n, 1e-7, 1e-5),
                  "rows %d cols %d", rows, cols);
        cr_expect(ds_t_close_d(l1, l0, 1e-9 * rows, 1e-9), "rows %d cols %d: loss %.12g vs %.12g",
                  rows, cols, l1, l0);
        cr_expect_eq(g1, g0, "rows %d cols %d: correct %lld vs %lld", rows, cols, (long long)g1,
                     (long long)g0);
        dev.softmax_xent(NULL, dl, dlab, rows, cols, &l2, &g2);
        cr_expect(ds_t_close_d(l2, l0, 1e-9 * rows, 1e-9), "loss without dlogits %.12g", l2);
        cr_expect_eq(g2, g0);
        cr_expect_eq(dev.sync(), 0, "%s", dev.error() ? dev.error() : "");
        dev.free(dl);
        dev.free(dd);
        dev.free(dlab);
        free(lg);
        free(d0);
        free(d1);
        free(lab);
    }
    ds_ops_fini(&dev);
}

/* Convolution forward and backward (im2col + cuBLAS) against the direct
 * reference: odd sizes with k 3 and 5, k 1, one image (the caller's col),
 * and a shape whose batch does not fit one chunk of the device's scratch
 * (two chunks, the last of one image). Outputs start as NaN so every
 * element must be written; the backward also runs with dx NULL. */
Test(cuda, conv2d_matches_reference, .timeout = 120)
{
    need_device();
    const ds_conv_shape shapes[] = {
        {.batch = 3, .c_in = 5, .h = 7, .w = 9, .c_out = 6, .k = 3},
        {.batch = 3, .c_in = 5, .h = 7, .w = 9, .c_out = 6, .k = 5},
        {.batch = 2, .c_in = 3, .h = 5, .w = 4, .c_out = 7, .k = 1},
        {.batch = 1, .c_in = 4, .h = 6, .w = 11, .c_out = 3, .k = 3},
        {.batch = 11, .c_in = 64, .h = 32, .w = 32, .c_out = 4, .k = 5},
    };
    for (size_t si = 0; si < sizeof(shapes) / sizeof(shapes[0]); si++) {
        const ds_conv_shape *sh = &shapes[si];
        const uint64_t seed = 120 + si;
        const size_t P = (size_t)sh->h * sh->w, kk = (size_t)sh->k * sh->k;
        const size_t nx = (size_t)sh->batch * sh->c_in * P, ny = (size_t)sh->batch * sh->c_out * P;
        const size_t nw = (size_t)sh->c_out * sh->c_in * kk, nb = (size_t)sh->c_out;
        float *x = malloc(nx * 4), *w = malloc(nw * 4), *b = malloc(nb * 4), *dy = malloc(ny * 4);
        float *y0 = malloc(ny * 4), *y1 = malloc(ny * 4), *ym = malloc(ny * 4);
        float *dx0 = malloc(nx * 4), *dx1 = malloc(nx * 4), *dxm = malloc(nx * 4);
        float *dw0 = malloc(nw * 4), *dw1 = malloc(nw * 4), *dwm = malloc(nw * 4);
        float *db0 = malloc(nb * 4), *db1 = malloc(nb * 4), *dbm = malloc(nb * 4);
        const size_t nmax = nx > ny ? (nx > nw ? nx : nw) : (ny > nw ? ny : nw);
        float *nan = malloc(nmax * 4);
        cr_assert(x && w && b && dy && y0 && y1 && ym && dx0 && dx1 && dxm && dw0 && dw1 && dwm &&
                  db0 && db1 && dbm && nan);
        ds_t_fill(x, nx, seed, -1, 1);
        ds_t_fill(w, nw, seed + 1, -0.5f, 0.5f);
        ds_t_fill(b, nb, seed + 2, -1, 1);
        ds_t_fill(dy, ny, seed + 3, -1, 1);
        for (size_t i = 0; i < nmax; i++)
            nan[i] = NAN;

        float *ax = abs_copy(x, nx), *aw = abs_copy(w, nw), *ab = abs_copy(b, nb);
        float *ady = abs_copy(dy, ny);
        ds_conv2d_fwd_c(y0, x, w, b, sh, NULL);
        ds_conv2d_fwd_c(ym, ax, aw, ab, sh, NULL);
        ds_conv2d_bwd_c(dx0, dw0, db0, dy, x, w, sh, NULL);
        ds_conv2d_bwd_c(dxm, dwm, dbm, ady, ax, aw, sh, NULL);

        float *dx_ = up(x, nx), *dw_ = up(w, nw), *db_ = up(b, nb), *ddy = up(dy, ny);
        float *dyo = up(nan, ny), *ddx = up(nan, nx), *ddw = up(nan, nw), *ddb = up(nan, nb);
        float *col = dev.alloc(ds_conv_col_floats(sh) * 4);
        cr_assert_not_null(col);
        char what[64];
        snprintf(what, sizeof(what), "conv2d b%d c%d %dx%d o%d k%d", sh->batch, sh->c_in, sh->h,
                 sh->w, sh->c_out, sh->k);

        dev.conv2d_fwd(dyo, dx_, dw_, db_, sh, col);
        down(y1, dyo, ny);
        cr_expect(close_mag(what, seed, y1, y0, ym, ny, 1e-5), "%s: y", what);

        dev.conv2d_bwd(ddx, ddw, ddb, ddy, dx_, dw_, sh, col);
        down(dx1, ddx, nx);
        down(dw1, ddw, nw);
        down(db1, ddb, nb);
        cr_expect(close_mag(what, seed, dx1, dx0, dxm, nx, 1e-5), "%s: dx", what);
        cr_expect(close_mag(what, seed, dw1, dw0, dwm, nw, 1e-5), "%s: dw", what);
        cr_expect(close_mag(what, seed, db1, db0, dbm, nb, 1e-5), "%s: db", what);

        cr_assert_eq(dev.upload(ddw, nan, nw * 4), 0);
        cr_assert_eq(dev.upload(ddb, nan, nb * 4), 0);
        dev.conv2d_bwd(NULL, ddw, ddb, ddy, dx_, dw_, sh, col);
        down(dw1, ddw, nw);
        down(db1, ddb, nb);
        cr_expect(close_mag(what, seed, dw1, dw0, dwm, nw, 1e-5), "%s: dw, dx NULL", what);
        cr_expect(close_mag(what, seed, db1, db0, dbm, nb, 1e-5), "%s: db, dx NULL", what);
        cr_expect_eq(dev.sync(), 0, "%s", dev.error() ? dev.error() : "");

        float *dev_bufs[] = {dx_, dw_, db_, ddy, dyo, ddx, ddw, ddb, col};
        for (size_t i = 0; i < sizeof(dev_bufs) / sizeof(dev_bufs[0]); i++)
            dev.free(dev_bufs[i]);
        float *host_bufs[] = {x, w, b, dy, y0, y1, ym, dx0, dx1, dxm, dw0, dw1, dwm,
                              db0, db1, dbm, nan, ax, aw, ab, ady};
        for (size_t i = 0; i < sizeof(host_bufs) / sizeof(host_bufs[0]); i++)
            free(host_bufs[i]);
    }
    ds_ops_fini(&dev);
}

/* Max-pool forward and backward bit for bit against the reference: odd h
 * and w (the last row and column dropped, their gradient 0), even ones,
 * planes too narrow for any window; values from {-1, 0, 1}, with -0.0 and
 * NaN sprinkled in, so most windows have ties, which the first maximum in
 * row-major order must win. Outputs start as a canary, so every element
 * must be written. */
Test(cuda, maxpool_matches_reference_bit_for_bit)
{
    need_device();
    const int shapes[][3] = {{15, 7, 9}, {15, 8, 6}, {2, 1, 5}, {3, 5, 1}, {64, 28, 28}};
    for (size_t si = 0; si < sizeof(shapes) / sizeof(shapes[0]); si++) {
        const int planes = shapes[si][0], h = shapes[si][1], w = shapes[si][2];
        const size_t nx = (size_t)planes * h * w, ny = (size_t)planes * (h / 2) * (w / 2);
        const uint64_t seed = 100 + si;
        float *x = malloc(nx * 4), *dx0 = malloc(nx * 4), *dx1 = malloc(nx * 4);
        /* At least one element: a plane too narrow for a window has none. */
        float *dy = calloc(ny + 1, 4), *y0 = calloc(ny + 1, 4), *y1 = calloc(ny + 1, 4);
        cr_assert(x && dx0 && dx1 && dy && y0 && y1);
        ds_t_fill(x, nx, seed, -1, 2);
        for (size_t i = 0; i < nx; i++) {
            x[i] = floorf(x[i]);
            if (i % 23 == 5)
                x[i] = -0.0f;
            if (i % 97 == 11)
                x[i] = NAN;
        }
        ds_t_fill(dy, ny, seed + 1, -1, 1);
        for (size_t i = 0; i < nx; i++)
            dx1[i] = 7.0f;
        for (size_t i = 0; i < ny; i++)
            y1[i] = 7.0f;
        float *dxd = up(x, nx), *ddx = up(dx1, nx), *ddy = up(dy, ny + 1);
        float *dyo = up(y1, ny + 1);

        ds_maxpool_fwd_c(y0, x, planes, h, w);
        dev.maxpool_fwd(dyo, dxd, planes, h, w);
        down(y1, dyo, ny);
        cr_expect(!memcmp(y0, y1, ny * 4), "maxpool_fwd differs: planes %d h %d w %d", planes, h,
                  w);
        ds_maxpool_bwd_c(dx0, dy, x, planes, h, w);
        dev.maxpool_bwd(ddx, ddy, dxd, planes, h, w);
        down(dx1, ddx, nx);
        cr_expect(!memcmp(dx0, dx1, nx * 4), "maxpool_bwd differs: planes %d h %d w %d", planes,
                  h, w);
        for (size_t i = 0, bad = 0; i < nx && bad < 10; i++)
            if (memcmp(&dx0[i], &dx1[i], 4) && ++bad)
                cr_log_error("maxpool_bwd seed=%llu [%zu] got %.9g want %.9g",
                             (unsigned long long)seed, i, dx1[i], dx0[i]);
        cr_expect_eq(dev.sync(), 0, "%s", dev.error() ? dev.error() : "");
        dev.free(dxd);
        dev.free(ddx);
        dev.free(ddy);
        dev.free(dyo);
        free(x);
        free(dx0);
        free(dx1);
        free(dy);
        free(y0);
        free(y1);
    }
    ds_ops_fini(&dev);
}

/* A batch gathered on the device from images uploaded once equals the
 * reference gather bit for bit (no fused multiply-add), by indices and by
 * position, with every byte value among the pixels. */
Test(cuda, gather_images_matches_reference_bit_for_bit)
{
    need_device();
    enum { N = 301, DIM = 785, B = 67 };
    uint8_t *img = malloc((size_t)N * DIM), *lab = malloc(N);
    uint32_t idx[B];
    cr_assert(img && lab);
    uint64_t r = 7;
    for (size_t i = 0; i < (size_t)N * DIM; i++) {
        r = r * 6364136223846793005ull + 1442695040888963407ull;
        img[i] = i < 256 ? (uint8_t)i : (uint8_t)(r >> 56);
    }
    for (int i = 0; i < N; i++)
        lab[i] = (uint8_t)(i * 7 % 10);
    for (int b = 0; b < B; b++)
        idx[b] = (uint32_t)((b * 113 + 5) % N);
    const float scale = 1.0f / (255.0f * 0.3530f), shift = -0.2860f / 0.3530f;
    uint8_t *dimg = dev.alloc((size_t)N * DIM), *dlab = dev.alloc(N);
    uint32_t *didx = dev.alloc(sizeof(idx));
    float *dx = dev.alloc((size_t)B * DIM * 4);
    int32_t *dy = dev.alloc(B * 4);
    cr_assert(dimg && dlab && didx && dx && dy);
    cr_assert_eq(dev.upload(dimg, img, (size_t)N * DIM), 0);
    cr_assert_eq(dev.upload(dlab, lab, N), 0);
    cr_assert_eq(dev.upload(didx, idx, sizeof(idx)), 0);
    float *x0 = malloc((size_t)B * DIM * 4), *x1 = malloc((size_t)B * DIM * 4);
    int32_t y0[B], y1[B];
    cr_assert(x0 && x1);
    for (int by_idx = 0; by_idx < 2; by_idx++) {
        const size_t first = by_idx ? 0 : N - B;
        ds_gather_images_c(x0, y0, img, lab, by_idx ? idx : NULL, first, B, DIM, scale, shift);
        dev.gather_images(dx, dy, dimg, dlab, by_idx ? didx : NULL, first, B, DIM, scale, shift);
        cr_assert_eq(dev.download(x1, dx, (size_t)B * DIM * 4), 0);
        cr_assert_eq(dev.download(y1, dy, sizeof(y1)), 0);
        cr_expect(!memcmp(x0, x1, (size_t)B * DIM * 4), "pixels differ (by_idx %d)", by_idx);
        cr_expect(!memcmp(y0, y1, sizeof(y0)), "labels differ (by_idx %d)", by_idx);
    }
    cr_expect_eq(dev.sync(), 0, "%s", dev.error() ? dev.error() : "");
    dev.free(dimg);
    dev.free(dlab);
    dev.free(didx);
    dev.free(dx);
    dev.free(dy);
    free(img);
    free(lab);
    free(x0);
    free(x1);
    ds_ops_fini(&dev);
}

/* A device index past the count (or negative) is -ENODEV with a reason,
 * device or not; cuda asked for it is refused, auto falls back to the CPU. */
Test(cuda, device_past_the_count_is_enodev)
{
    ds_ops o;
    char why[256] = "";
    cr_expect_eq(ds_ops_init_cuda(&o, 1024, why, sizeof(why)), -ENODEV);
    cr_expect(why[0] != '\0', "no reason given");
    why[0] = '\0';
    cr_expect_eq(ds_ops_init_cuda(&o, -1, why, sizeof(why)), -ENODEV);
    cr_expect(why[0] != '\0', "no reason given");
    cr_expect_eq(ds_ops_init_backend(&o, DS_OPS_CUDA, 1024, why, sizeof(why)), -ENODEV);
    cr_expect(strstr(why, "cuda asked for but not available") != NULL, "%s", why);
    cr_expect_eq(ds_ops_init_backend(&o, DS_OPS_AUTO, 1024, why, sizeof(why)), 0, "%s", why);
    cr_expect_eq(o.kind, DS_BACKEND_CPU, "%s", why);
    if (ds_ops_init_cuda(&o, 0, why, sizeof(why)) == 0) {
        /* With a device the reason names the count. */
        ds_ops_fini(&o);
        cr_expect_eq(ds_ops_init_cuda(&o, 1024, why, sizeof(why)), -ENODEV);
        cr_expect(strstr(why, "1024 asked for") != NULL, "%s", why);
    }
}

/* Two tables of device 0 share its stream, handle and scratch by reference:
 * closing the first (twice: the second close must do nothing) leaves the
 * second working, memory allocated through the first included; the last
 * close frees the state, and a table opened afterwards builds it afresh. */
Test(cuda, two_tables_of_one_device_open_and_close_in_turn)
{
    need_device();
    ds_ops b;
    char why[256];
    cr_assert_eq(ds_ops_init_cuda(&b, 0, why, sizeof(why)), 0, "%s", why);
    cr_expect_eq(b.device, 0);
    /* The table is complete: the CNN's image ops included. */
    cr_expect(b.alloc && b.free && b.host_alloc && b.host_free && b.upload && b.download && b.copy && b.memzero && b.sync &&
              b.error && b.gemm && b.bias_add && b.bias_grad && b.relu_fwd && b.relu_bwd &&
              b.softmax_xent && b.sgd && b.axpy && b.scale && b.dot && b.nrm2 && b.sum &&
              b.conv2d_fwd && b.conv2d_bwd && b.maxpool_fwd && b.maxpool_bwd &&
              b.gather_images);
    enum { N = 257 };
    float h[N], r[N];
    ds_t_fill(h, N, 70, -1, 1);
    float *pa = up(h, N);
    ds_ops_fini(&dev);
    cr_expect_null(dev.alloc, "fini empties the table");
    ds_ops_fini(&dev);

    float *pb = b.alloc(N * sizeof(float));
    cr_assert_not_null(pb);
    cr_expect_eq(b.copy(pb, pa, N * sizeof(float)), 0);
    b.scale(N, 2.0f, pb);
    cr_assert_eq(b.download(r, pb, sizeof(r)), 0);
    cr_expect_eq(b.sync(), 0, "%s", b.error() ? b.error() : "");
    for (int i = 0; i < N; i++)
        h[i] *= 2.0f;
    cr_expect(ds_t_close("scale after the other table closed", 70, r, h, N, 0, 0));
    b.free(pa);
    b.free(pb);
    ds_ops_fini(&b);

    cr_assert_eq(ds_ops_init_cuda(&b, 0, why, sizeof(why)), 0, "%s", why);
    float a[6] = {1, 2, 3, 4, 5, 6}, c[4];
    float *da = b.alloc(sizeof(a)), *dc = b.alloc(sizeof(c));
    cr_assert(da && dc);
    cr_assert_eq(b.upload(da, a, sizeof(a)), 0);
    /* C (2x2) = A (2x3) A^T */
    b.gemm(0, 1, 2, 2, 3, 1.0f, da, 3, da, 3, 0.0f, dc, 2);
    cr_assert_eq(b.download(c, dc, sizeof(c)), 0);
    cr_expect_eq(b.sync(), 0, "%s", b.error() ? b.error() : "");
    const float want[4] = {14, 32, 32, 77};
    cr_expect(ds_t_close("gemm on a reopened device", 0, c, want, 4, 0, 0));
    b.free(da);
    b.free(dc);
    ds_ops_fini(&b);
}

/* The CNN on the device: its first gradient (batch 64, the chunked conv
 * path) against the CPU trainer's with the same seeds, then 60 steps must
 * learn as on the CPU (tests/test_train.c: 0.7290 there, 0.6 required);
 * the evaluation's batches of 500 run the forward in two chunks. */
Test(cuda, cnn_matches_cpu_and_learns_on_device, .timeout = 300)
{
    need_device();
    ds_ops_fini(&dev);
    ds_train_cfg c;
    ds_trainer tc, tg;
    char err[512];
    ds_train_cfg_defaults(&c);
    c.model = DS_TRAIN_CNN;
    c.init_seed = 7;
    c.data_seed = 8;
    c.backend = DS_OPS_CPU;
    cr_assert_eq(ds_trainer_init(&tc, &c, err, sizeof(err)), 0, "%s", err);
    c.backend = DS_OPS_CUDA;
    cr_assert_eq(ds_trainer_init(&tg, &c, err, sizeof(err)), 0, "%s", err);
    cr_expect_eq(tg.ops.kind, DS_BACKEND_CUDA);
    cr_assert_eq(tg.n_params, tc.n_params);
    double lc, lg;
    cr_assert_eq(ds_trainer_compute_grad(&tc, &lc, NULL), 0);
    cr_assert_eq(ds_trainer_compute_grad(&tg, &lg, NULL), 0, "%s",
                 tg.ops.error() ? tg.ops.error() : "");
    cr_expect(ds_t_close_d(lg, lc, 1e-5, 1e-4), "first loss %.9g on the device, %.9g on the CPU",
              lg, lc);
    float *g = malloc(tg.n_params * sizeof(float));
    cr_assert_not_null(g);
    cr_assert_eq(tg.ops.download(g, tg.grad, tg.n_params * sizeof(float)), 0);
    /* Per layer, the norm of the difference against the norm of the CPU's
     * gradient: float rounding is about 1e-6 of it, and a ReLU that flips
     * on a pre-activation near 0 moves a few elements without moving the
     * norm; an indexing error moves it by its own size. */
    for (int l = 0; l < tg.model.n_layers; l++) {
        const ds_layer *ly = &tg.model.layer[l];
        double dd = 0, nn = 0;
        for (size_t i = ly->off; i < ly->off + ly->len; i++) {
            const double d = (double)g[i] - (double)tc.grad[i];
            dd += d * d;
            nn += (double)tc.grad[i] * tc.grad[i];
        }
        cr_expect(sqrt(dd) <= 1e-4 * sqrt(nn) + 1e-9, "%s: |grad diff| %.3g, |grad| %.3g",
                  ly->name, sqrt(dd), sqrt(nn));
    }
    free(g);
    ds_trainer_fini(&tc);

    ds_trainer_apply_grad(&tg);
    for (int s = 1; s < 60; s++) {
        double loss;
        cr_assert_eq(ds_trainer_compute_grad(&tg, &loss, NULL), 0);
        cr_assert(isfinite(loss), "step %d loss %g", s, loss);
        ds_trainer_apply_grad(&tg);
    }
    double loss, acc;
    cr_assert_eq(ds_trainer_evaluate(&tg, &loss, &acc), 0);
    cr_log_info("cuda cnn: 60 steps, test accuracy %.4f", acc);
    cr_expect_gt(acc, 0.6, "test accuracy %.4f after 60 steps", acc);
    ds_trainer_fini(&tg);
}

Test(cuda, short_training_run_on_device, .timeout = 300)
{
    need_device();
    ds_ops_fini(&dev);
    ds_train_cfg c;
    ds_trainer t;
    char err[512];
    ds_train_cfg_defaults(&c);
    c.backend = DS_OPS_CUDA;
    cr_assert_eq(ds_trainer_init(&t, &c, err, sizeof(err)), 0, "%s", err);
    cr_expect_eq(t.ops.kind, DS_BACKEND_CUDA);
    for (int s = 0; s < 300; s++) {
        cr_assert_eq(ds_trainer_compute_grad(&t, NULL, NULL), 0);
        ds_trainer_apply_grad(&t);
    }
    double loss, acc;
    cr_assert_eq(ds_trainer_evaluate(&t, &loss, &acc), 0);
    cr_log_info("cuda: 300 steps, test accuracy %.4f", acc);
    cr_expect_gt(acc, 0.75);
    ds_trainer_fini(&t);
}
