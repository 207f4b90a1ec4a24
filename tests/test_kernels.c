/*
 * tests/test_kernels.c: every CPU kernel variant against the C reference on
 * seeded random inputs of odd sizes, and the backend chooser.
 * Run: meson test -C build kernels --verbose
 */
#include "config.h"

#include <criterion/criterion.h>
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/cpu.h"
#include "kernels/cpu/cpu_kernels.h"
#include "kernels/kernels.h"
#include "testutil.h"

static const size_t sizes[] = {0, 1, 3, 7, 8, 15, 16, 17, 31, 33, 63, 100, 257, 1000, 4099};
#define NSIZES (sizeof(sizes) / sizeof(sizes[0]))

/* The variants this CPU can run, each as a full op table. */
static int variants(ds_ops *out, const char **names)
{
    static const unsigned masks[] = {0, DS_CPU_AVX2, DS_CPU_ALL};
    static const char *mnames[] = {"ref", "avx2", "avx512"};
    unsigned have = ds_cpu_detect();
    int n = 0;
    for (int i = 0; i < 3; i++) {
        if (i == 1 && !(have & DS_CPU_AVX2))
            continue;
        if (i == 2 && !(have & DS_CPU_AVX512))
            continue;
        ds_ops_fill_cpu(&out[n], masks[i] & have);
        names[n++] = mnames[i];
    }
    return n;
}

static float *fbuf(size_t n)
{
    /* One canary float past the end catches writes beyond n. */
    float *p = malloc((n + 1) * sizeof(float));
    cr_assert_not_null(p);
    p[n] = 12345.0f;
    return p;
}

Test(kernels, variant_names_follow_mask)
{
    ds_ops o;
    ds_ops_fill_cpu(&o, 0);
    cr_expect_str_eq(o.name, "cpu-ref");
    cr_expect_eq((void *)o.relu_fwd, (void *)ds_relu_fwd_c);
    cr_expect_eq((void *)o.gemm, (void *)ds_gemm_c);
    if (ds_cpu_detect() & DS_CPU_AVX2) {
        ds_ops_fill_cpu(&o, DS_CPU_AVX2);
        cr_expect_str_eq(o.name, "cpu-avx2");
        cr_expect_eq((void *)o.relu_fwd, (void *)ds_relu_fwd_avx2);
        cr_expect_eq((void *)o.gemm, (void *)ds_gemm_blas);
    }
}

/* Criterion runs each test in a fresh process, so the mask is read from
 * DS_KERNELS on first use here. */
Test(kernels, env_mask_forces_reference)
{
    setenv("DS_KERNELS", "ref", 1);
    ds_ops o;
    ds_ops_init_cpu(&o);
    cr_expect_str_eq(o.name, "cpu-ref");
    cr_expect_null(ds_cpu_mask_error());
}

Test(kernels, env_mask_unknown_is_reference_and_reported)
{
    setenv("DS_KERNELS", "sse9", 1);
    ds_ops o;
    ds_ops_init_cpu(&o);
    cr_expect_str_eq(o.name, "cpu-ref");
    cr_expect(ds_cpu_mask_error() && strstr(ds_cpu_mask_error(), "expected one of"));
}

Test(kernels, env_mask_avx2_caps_variant)
{
    setenv("DS_KERNELS", "avx2", 1);
    ds_ops o;
    ds_ops_init_cpu(&o);
    cr_expect_str_eq(o.name, (ds_cpu_detect() & DS_CPU_AVX2) ? "cpu-avx2" : "cpu-ref");
}

Test(kernels, elementwise_match_reference)
{
    ds_ops v[3];
    const char *names[3];
    int nv = variants(v, names);
    for (int vi = 0; vi < nv; vi++) {
        for (size_t si = 0; si < NSIZES; si++) {
            size_t n = sizes[si];
            uint64_t seed = 1000 + si;
            float *x = fbuf(n), *y0 = fbuf(n), *y1 = fbuf(n), *dy = fbuf(n);
            ds_t_fill(x, n, seed, -1, 1);
            ds_t_fill(dy, n, seed + 1, -1, 1);
            if (n > 2)
                x[n / 2] = 0.0f; /* the boundary of relu */

            ds_relu_fwd_c(y0, x, n);
            v[vi].relu_fwd(y1, x, n);
            cr_expect(ds_t_close(names[vi], seed, y1, y0, n + 1, 0, 0), "relu_fwd %s n=%zu", names[vi], n);

            ds_relu_bwd_c(y0, dy, x, n);
            v[vi].relu_bwd(y1, dy, x, n);
            cr_expect(ds_t_close(names[vi], seed, y1, y0, n + 1, 0, 0), "relu_bwd %s n=%zu", names[vi], n);

            memcpy(y0, dy, n * sizeof(float));
            memcpy(y1, dy, n * sizeof(float));
            ds_axpy_c(n, 0.37f, x, y0);
            v[vi].axpy(n, 0.37f, x, y1);
            cr_expect(ds_t_close(names[vi], seed, y1, y0, n + 1, 1e-7, 1e-6), "axpy %s n=%zu", names[vi], n);

            ds_scale_c(n, -1.5f, y0);
            v[vi].scale(n, -1.5f, y1);
            cr_expect(ds_t_close(names[vi], seed, y1, y0, n + 1, 1e-7, 1e-6), "scale %s n=%zu", names[vi], n);

            double tol = 1e-9 * (double)(n + 1);
            cr_expect(ds_t_close_d(v[vi].dot(n, x, dy), ds_dot_c(n, x, dy), tol, 1e-12), "dot %s n=%zu", names[vi], n);
            cr_expect(ds_t_close_d(v[vi].sum(n, x), ds_sum_c(n, x), tol, 1e-12), "sum %s n=%zu", names[vi], n);
            cr_expect(ds_t_close_d(v[vi].nrm2(n, x), ds_nrm2_c(n, x), tol, 1e-12), "nrm2 %s n=%zu", names[vi], n);
            free(x);
            free(y0);
            free(y1);
            free(dy);
        }
    }
}

Test(kernels, relu_nan_and_negative_zero)
{
    ds_ops v[3];
    const char *names[3];
    int nv = variants(v, names);
    float x[17], y0[17], y1[17];
    for (int i = 0; i < 17; i++)
        x[i] = (i % 3 == 0) ? NAN : (i % 3 == 1 ? -0.0f : 2.0f);
    ds_relu_fwd_c(y0, x, 17);
    for (int vi = 0; vi < nv; vi++) {
        v[vi].relu_fwd(y1, x, 17);
        for (int i = 0; i < 17; i++)
            cr_expect(y1[i] == y0[i] && !isnan(y1[i]), "%s [%d] got %g want %g", names[vi], i, y1[i], y0[i]);
    }
}

Test(kernels, sgd_matches_reference)
{
    ds_ops v[3];
    const char *names[3];
    int nv = variants(v, names);
    const ds_sgd_params ps[] = {
        {0.1f, 0.0f, 0.0f, 0},
        {0.05f, 0.9f, 1e-4f, 0},
        {0.01f, 0.9f, 5e-4f, 1},
    };
    for (int vi = 0; vi < nv; vi++)
        for (size_t pi = 0; pi < 3; pi++)
            for (size_t si = 0; si < NSIZES; si++) {
                size_t n = sizes[si];
                uint64_t seed = 77 + si * 3 + pi;
                float *t0 = fbuf(n), *t1 = fbuf(n), *m0 = fbuf(n), *m1 = fbuf(n), *g = fbuf(n);
                ds_t_fill(t0, n, seed, -1, 1);
                ds_t_fill(m0, n, seed + 1, -0.1f, 0.1f);
                ds_t_fill(g, n, seed + 2, -1, 1);
                memcpy(t1, t0, n * sizeof(float));
                memcpy(m1, m0, n * sizeof(float));
                for (int rep = 0; rep < 3; rep++) {
                    ds_sgd_c(t0, m0, g, n, &ps[pi]);
                    v[vi].sgd(t1, m1, g, n, &ps[pi]);
                }
                cr_expect(ds_t_close("sgd theta", seed, t1, t0, n + 1, 1e-6, 1e-5), "%s n=%zu p=%zu", names[vi], n, pi);
                cr_expect(ds_t_close("sgd mom", seed, m1, m0, n + 1, 1e-6, 1e-5), "%s n=%zu p=%zu", names[vi], n, pi);
                free(t0);
                free(t1);
                free(m0);
                free(m1);
                free(g);
            }
}

Test(kernels, bias_ops_match_reference)
{
    ds_ops v[3];
    const char *names[3];
    int nv = variants(v, names);
    const int shapes[][2] = {{1, 1}, {3, 7}, {64, 10}, {5, 17}, {64, 256}, {9, 33}};
    for (int vi = 0; vi < nv; vi++)
        for (int s = 0; s < 6; s++) {
            int rows = shapes[s][0], cols = shapes[s][1];
            size_t n = (size_t)rows * cols;
            float *y0 = fbuf(n), *y1 = fbuf(n), *b = fbuf(cols), *d0 = fbuf(cols), *d1 = fbuf(cols);
            ds_t_fill(y0, n, s, -1, 1);
            ds_t_fill(b, cols, s + 50, -1, 1);
            memcpy(y1, y0, n * sizeof(float));
            ds_bias_add_c(y0, b, rows, cols);
            v[vi].bias_add(y1, b, rows, cols);
            cr_expect(ds_t_close("bias_add", s, y1, y0, n + 1, 0, 0), "%s %dx%d", names[vi], rows, cols);
            ds_bias_grad_c(d0, y0, rows, cols);
            v[vi].bias_grad(d1, y0, rows, cols);
            cr_expect(ds_t_close("bias_grad", s, d1, d0, cols + 1, 1e-6, 1e-6), "%s %dx%d", names[vi], rows, cols);
            free(y0);
            free(y1);
            free(b);
            free(d0);
            free(d1);
        }
}

Test(kernels, gemm_blas_matches_reference)
{
    const int shapes[][3] = {{1, 1, 1}, {3, 5, 7}, {64, 256, 784}, {17, 10, 33}, {64, 10, 256}, {2, 129, 65}};
    for (int s = 0; s < 6; s++)
        for (int ta = 0; ta < 2; ta++)
            for (int tb = 0; tb < 2; tb++) {
                int m = shapes[s][0], n = shapes[s][1], k = shapes[s][2];
                float *a = fbuf((size_t)m * k), *b = fbuf((size_t)k * n);
                float *c0 = fbuf((size_t)m * n), *c1 = fbuf((size_t)m * n);
                uint64_t seed = 500 + s * 4 + ta * 2 + tb;
                ds_t_fill(a, (size_t)m * k, seed, -1, 1);
                ds_t_fill(b, (size_t)k * n, seed + 9, -1, 1);
                ds_t_fill(c0, (size_t)m * n, seed + 7, -1, 1);
                memcpy(c1, c0, (size_t)m * n * sizeof(float));
                int lda = ta ? m : k, ldb = tb ? k : n;
                ds_gemm_c(ta, tb, m, n, k, 0.75f, a, lda, b, ldb, 0.5f, c0, n);
                ds_gemm_blas(ta, tb, m, n, k, 0.75f, a, lda, b, ldb, 0.5f, c1, n);
                cr_expect(ds_t_close("gemm", seed, c1, c0, (size_t)m * n + 1, 1e-4, 1e-4),
                          "m=%d n=%d k=%d ta=%d tb=%d", m, n, k, ta, tb);
                free(a);
                free(b);
                free(c0);
                free(c1);
            }
}

/* conv2d: im2col + OpenBLAS against the direct loops, odd shapes, every
 * odd kernel size up to 5, with and without the input gradient. The canary
 * past each output catches a write beyond it. */
Test(kernels, conv2d_blas_matches_reference)
{
    const ds_conv_shape shapes[] = {
        {.batch = 1, .c_in = 1, .h = 1, .w = 1, .c_out = 1, .k = 1},
        {.batch = 3, .c_in = 2, .h = 5, .w = 7, .c_out = 3, .k = 3},
        {.batch = 2, .c_in = 3, .h = 9, .w = 4, .c_out = 5, .k = 5},
        {.batch = 5, .c_in = 1, .h = 7, .w = 7, .c_out = 7, .k = 3},
        {.batch = 2, .c_in = 4, .h = 3, .w = 11, .c_out = 1, .k = 1},
        {.batch = 1, .c_in = 3, .h = 2, .w = 2, .c_out = 2, .k = 5}, /* kernel > image */
        {.batch = 3, .c_in = 32, .h = 13, .w = 13, .c_out = 17, .k = 3},
    };
    for (size_t t = 0; t < sizeof(shapes) / sizeof(shapes[0]); t++) {
        const ds_conv_shape *s = &shapes[t];
        const size_t nx = (size_t)s->batch * s->c_in * s->h * s->w;
        const size_t ny = (size_t)s->batch * s->c_out * s->h * s->w;
        const size_t nw = (size_t)s->c_out * s->c_in * s->k * s->k;
        const uint64_t seed = 700 + t;
        float *x = fbuf(nx), *w = fbuf(nw), *b = fbuf((size_t)s->c_out), *dy = fbuf(ny);
        float *col = fbuf(ds_conv_col_floats(s));
        float *y0 = fbuf(ny), *y1 = fbuf(ny), *dx0 = fbuf(nx), *dx1 = fbuf(nx);
        float *dw0 = fbuf(nw), *dw1 = fbuf(nw), *db0 = fbuf((size_t)s->c_out),
              *db1 = fbuf((size_t)s->c_out);
        ds_t_fill(x, nx, seed, -1, 1);
        ds_t_fill(w, nw, seed + 1, -1, 1);
        ds_t_fill(b, (size_t)s->c_out, seed + 2, -1, 1);
        ds_t_fill(dy, ny, seed + 3, -1, 1);
        /* Garbage in the outputs: every op must overwrite, not accumulate. */
        ds_t_fill(y1, ny, seed + 4, -9, 9);
        ds_t_fill(dx1, nx, seed + 5, -9, 9);
        ds_t_fill(dw1, nw, seed + 6, -9, 9);
        ds_t_fill(db1, (size_t)s->c_out, seed + 7, -9, 9);
        ds_conv2d_fwd_c(y0, x, w, b, s, NULL);
        ds_conv2d_fwd_blas(y1, x, w, b, s, col);
        ds_conv2d_bwd_c(dx0, dw0, db0, dy, x, w, s, NULL);
        ds_conv2d_bwd_blas(dx1, dw1, db1, dy, x, w, s, col);
        cr_expect(ds_t_close("conv2d y", seed, y1, y0, ny + 1, 1e-4, 1e-4), "shape %zu", t);
        cr_expect(ds_t_close("conv2d dx", seed, dx1, dx0, nx + 1, 1e-4, 1e-4), "shape %zu", t);
        cr_expect(ds_t_close("conv2d dw", seed, dw1, dw0, nw + 1, 1e-4, 1e-4), "shape %zu", t);
        cr_expect(ds_t_close("conv2d db", seed, db1, db0, (size_t)s->c_out + 1, 1e-4, 1e-4),
                  "shape %zu", t);
        /* dx == NULL: the weight gradients are the same, nothing else written. */
        ds_t_fill(dw1, nw, seed + 8, -9, 9);
        ds_conv2d_bwd_blas(NULL, dw1, db1, dy, x, w, s, col);
        cr_expect(ds_t_close("conv2d dw (no dx)", seed, dw1, dw0, nw + 1, 1e-4, 1e-4));
        ds_conv2d_bwd_c(NULL, dw0, db0, dy, x, w, s, NULL);
        cr_expect(ds_t_close("conv2d dw ref (no dx)", seed, dw0, dw1, nw + 1, 1e-4, 1e-4));
        float *bufs[] = {x, w, b, dy, col, y0, y1, dx0, dx1, dw0, dw1, db0, db1};
        for (size_t i = 0; i < sizeof(bufs) / sizeof(bufs[0]); i++)
            free(bufs[i]);
    }
}

/* Each ISA's conv ops (direct loops for few input channels, and the
 * direct loops themselves on every shape) against the direct C reference:
 * odd sizes, rows narrower and wider than a vector (masked tails), k 1, 3
 * and 5, c_in 1 (the direct path) and more, garbage in the outputs and a
 * canary past each. Sums are float in another order than the reference's
 * double sums, hence the tolerance. */
Test(kernels, conv2d_variants_match_reference)
{
    ds_ops ops[3];
    const char *names[3];
    const int nv = variants(ops, names);
    const ds_conv_shape shapes[] = {
        {.batch = 1, .c_in = 1, .h = 1, .w = 1, .c_out = 1, .k = 1},
        {.batch = 3, .c_in = 1, .h = 28, .w = 28, .c_out = 32, .k = 3}, /* conv1 */
        {.batch = 2, .c_in = 1, .h = 5, .w = 7, .c_out = 3, .k = 3},
        {.batch = 2, .c_in = 1, .h = 9, .w = 17, .c_out = 5, .k = 5},
        {.batch = 3, .c_in = 1, .h = 13, .w = 33, .c_out = 7, .k = 3},
        {.batch = 1, .c_in = 1, .h = 2, .w = 2, .c_out = 2, .k = 5}, /* kernel > image */
        {.batch = 2, .c_in = 3, .h = 9, .w = 4, .c_out = 5, .k = 5},
        {.batch = 2, .c_in = 2, .h = 11, .w = 19, .c_out = 3, .k = 3},
        {.batch = 3, .c_in = 32, .h = 13, .w = 13, .c_out = 17, .k = 3},
    };
    for (size_t t = 0; t < sizeof(shapes) / sizeof(shapes[0]); t++) {
        const ds_conv_shape *s = &shapes[t];
        const size_t nx = (size_t)s->batch * s->c_in * s->h * s->w;
        const size_t ny = (size_t)s->batch * s->c_out * s->h * s->w;
        const size_t nw = (size_t)s->c_out * s->c_in * s->k * s->k;
        const size_t nb = (size_t)s->c_out;
        const uint64_t seed = 1700 + t;
        float *x = fbuf(nx), *w = fbuf(nw), *b = fbuf(nb), *dy = fbuf(ny);
        float *y0 = fbuf(ny), *dx0 = fbuf(nx), *dw0 = fbuf(nw), *db0 = fbuf(nb);
        ds_t_fill(x, nx, seed, -1, 1);
        ds_t_fill(w, nw, seed + 1, -1, 1);
        ds_t_fill(b, nb, seed + 2, -1, 1);
        ds_t_fill(dy, ny, seed + 3, -1, 1);
        ds_conv2d_fwd_c(y0, x, w, b, s, NULL);
        ds_conv2d_bwd_c(dx0, dw0, db0, dy, x, w, s, NULL);
        for (int v = 0; v < 2 * nv; v++) {
            ds_conv2d_fwd_fn fwd = ops[v % nv].conv2d_fwd;
            ds_conv2d_bwd_fn bwd = ops[v % nv].conv2d_bwd;
            const char *how = "op";
#if ARCH_X86_64
            if (v >= nv) { /* the direct loops on every shape */
                how = "direct";
                if (!strcmp(names[v % nv], "avx2")) {
                    fwd = ds_conv2d_fwd_direct_avx2;
                    bwd = ds_conv2d_bwd_direct_avx2;
                } else if (!strcmp(names[v % nv], "avx512")) {
                    fwd = ds_conv2d_fwd_direct_avx512;
                    bwd = ds_conv2d_bwd_direct_avx512;
                } else {
                    continue;
                }
            }
#else
            if (v >= nv)
                continue;
#endif
            float *col = fbuf(ds_conv_col_floats(s));
            float *y1 = fbuf(ny), *dx1 = fbuf(nx), *dw1 = fbuf(nw), *db1 = fbuf(nb);
            ds_t_fill(y1, ny, seed + 4, -9, 9);
            ds_t_fill(dx1, nx, seed + 5, -9, 9);
            ds_t_fill(dw1, nw, seed + 6, -9, 9);
            ds_t_fill(db1, nb, seed + 7, -9, 9);
            fwd(y1, x, w, b, s, col);
            cr_expect(ds_t_close("conv2d y", seed, y1, y0, ny + 1, 1e-4, 1e-4),
                      "%s %s shape %zu", names[v % nv], how, t);
            /* Without dx first (the first layer's case), then with it. */
            bwd(NULL, dw1, db1, dy, x, w, s, col);
            cr_expect(ds_t_close("conv2d dw", seed, dw1, dw0, nw + 1, 1e-4, 1e-4),
                      "%s %s shape %zu", names[v % nv], how, t);
            cr_expect(ds_t_close("conv2d db", seed, db1, db0, nb + 1, 1e-4, 1e-4),
                      "%s %s shape %zu", names[v % nv], how, t);
            ds_t_fill(dw1, nw, seed + 8, -9, 9);
            ds_t_fill(db1, nb, seed + 9, -9, 9);
            bwd(dx1, dw1, db1, dy, x, w, s, col);
            cr_expect(ds_t_close("conv2d dx", seed, dx1, dx0, nx + 1, 1e-4, 1e-4),
                      "%s %s shape %zu", names[v % nv], how, t);
            cr_expect(ds_t_close("conv2d dw (dx)", seed, dw1, dw0, nw + 1, 1e-4, 1e-4),
                      "%s %s shape %zu", names[v % nv], how, t);
            cr_expect(ds_t_close("conv2d db (dx)", seed, db1, db0, nb + 1, 1e-4, 1e-4),
                      "%s %s shape %zu", names[v % nv], how, t);
            float *bufs[] = {col, y1, dx1, dw1, db1};
            for (size_t i = 0; i < sizeof(bufs) / sizeof(bufs[0]); i++)
                free(bufs[i]);
        }
        float *bufs[] = {x, w, b, dy, y0, dx0, dw0, db0};
        for (size_t i = 0; i < sizeof(bufs) / sizeof(bufs[0]); i++)
            free(bufs[i]);
    }
}

Test(kernels, conv2d_known_values)
{
    /* A 3x3 box filter over a 3x3 image of ones with zero padding counts
     * each pixel's in-image neighbours: 4 at corners, 6 on edges, 9 in the
     * middle; plus the bias. */
    const ds_conv_shape s = {.batch = 1, .c_in = 1, .h = 3, .w = 3, .c_out = 1, .k = 3};
    float x[9], w[9], b[1] = {0.5f}, y[9], col[81];
    for (int i = 0; i < 9; i++)
        x[i] = w[i] = 1.0f;
    const float want[9] = {4.5f, 6.5f, 4.5f, 6.5f, 9.5f, 6.5f, 4.5f, 6.5f, 4.5f};
    ds_conv2d_fwd_c(y, x, w, b, &s, NULL);
    cr_expect(ds_t_close("conv2d ref box", 0, y, want, 9, 0, 0));
    ds_conv2d_fwd_blas(y, x, w, b, &s, col);
    cr_expect(ds_t_close("conv2d blas box", 0, y, want, 9, 1e-6, 0));
}

Test(kernels, maxpool_values_and_gradient_routing)
{
    /* Two planes of 3x5: the odd last row and column are dropped (output
     * 1x2); a tie goes to the first maximum in row-major window order. */
    const float x[30] = {1, 5, 2, 2, 9,
                         3, 4, 2, 0, 9,
                         9, 9, 9, 9, 9,
                         -1, -2, 7, 7, 0,
                         -3, -4, 7, 8, 0,
                         0, 0, 0, 0, 0};
    float y[4], dx[31];
    const float dy[4] = {10, 20, 30, 40};
    dx[30] = 12345.0f;
    ds_maxpool_fwd_c(y, x, 2, 3, 5);
    const float want_y[4] = {5, 2, -1, 8};
    cr_expect(ds_t_close("maxpool y", 0, y, want_y, 4, 0, 0));
    ds_maxpool_bwd_c(dx, dy, x, 2, 3, 5);
    float want_dx[31] = {0};
    want_dx[1] = 10;      /* the 5 */
    want_dx[2] = 20;      /* first of the tied 2s */
    want_dx[15] = 30;     /* -1 */
    want_dx[15 + 8] = 40; /* the 8 */
    want_dx[30] = 12345.0f;
    cr_expect(ds_t_close("maxpool dx", 0, dx, want_dx, 31, 0, 0));
}

/* Each variant's max-pool against the reference, bit for bit, on seeded
 * random planes of odd and even sizes: values drawn from 7 levels so that
 * windows tie often (the first maximum must win), a NaN in some windows,
 * and a canary past each output. dx is prefilled with garbage: every
 * element must be written. */
Test(kernels, maxpool_variants_match_reference)
{
    ds_ops ops[3];
    const char *names[3];
    const int nv = variants(ops, names);
    const int shapes[][3] = {{1, 1, 1}, {1, 2, 2}, {3, 3, 5}, {2, 28, 28}, {5, 14, 14},
                             {4, 7, 33}, {2, 35, 9}, {64, 6, 6}};
    for (size_t t = 0; t < sizeof(shapes) / sizeof(shapes[0]); t++) {
        const int planes = shapes[t][0], h = shapes[t][1], w = shapes[t][2];
        const size_t nx = (size_t)planes * h * w, ny = (size_t)planes * (h / 2) * (w / 2);
        const uint64_t seed = 900 + t;
        float *x = fbuf(nx), *dy = fbuf(ny), *y0 = fbuf(ny), *dx0 = fbuf(nx);
        ds_t_fill(x, nx, seed, -3.5, 3.5);
        for (size_t i = 0; i < nx; i++)
            x[i] = (float)(int)x[i]; /* 7 levels: many ties */
        for (size_t i = 0; i < nx; i += 37)
            x[i] = NAN;
        ds_t_fill(dy, ny, seed + 1, -1, 1);
        ds_maxpool_fwd_c(y0, x, planes, h, w);
        ds_maxpool_bwd_c(dx0, dy, x, planes, h, w);
        for (int v = 0; v < nv; v++) {
            float *y1 = fbuf(ny), *dx1 = fbuf(nx);
            for (size_t i = 0; i < nx; i++)
                dx1[i] = 777.0f;
            ops[v].maxpool_fwd(y1, x, planes, h, w);
            ops[v].maxpool_bwd(dx1, dy, x, planes, h, w);
            cr_expect_eq(memcmp(y1, y0, (ny + 1) * sizeof(float)), 0,
                         "%s maxpool y differs, shape %zu", names[v], t);
            cr_expect_eq(memcmp(dx1, dx0, (nx + 1) * sizeof(float)), 0,
                         "%s maxpool dx differs, shape %zu", names[v], t);
            free(y1);
            free(dx1);
        }
        free(x);
        free(dy);
        free(y0);
        free(dx0);
    }
}

Test(kernels, image_ops_in_tables)
{
    ds_ops o;
    ds_ops_fill_cpu(&o, 0);
    cr_expect_eq(o.conv2d_fwd, ds_conv2d_fwd_c);
    cr_expect_eq(o.conv2d_bwd, ds_conv2d_bwd_c);
    cr_expect_eq(o.maxpool_fwd, ds_maxpool_fwd_c);
    cr_expect_eq(o.maxpool_bwd, ds_maxpool_bwd_c);
    if (ds_cpu_detect()) {
        ds_ops_fill_cpu(&o, ds_cpu_detect());
        cr_expect_neq(o.conv2d_fwd, ds_conv2d_fwd_c);
        cr_expect_neq(o.conv2d_bwd, ds_conv2d_bwd_c);
#if ARCH_X86_64
        const int a512 = !!(ds_cpu_detect() & DS_CPU_AVX512);
        cr_expect_eq(o.conv2d_fwd, a512 ? ds_conv2d_fwd_avx512 : ds_conv2d_fwd_avx2);
        cr_expect_eq(o.conv2d_bwd, a512 ? ds_conv2d_bwd_avx512 : ds_conv2d_bwd_avx2);
#endif
        cr_expect_neq(o.maxpool_fwd, ds_maxpool_fwd_c);
        cr_expect_neq(o.maxpool_bwd, ds_maxpool_bwd_c);
    }
}

Test(kernels, softmax_xent_values)
{
    /* Two rows with known answers: uniform logits give log(cols), and a
     * dominant correct logit gives loss near 0 and a correct arg-max. */
    float logits[2 * 4] = {0, 0, 0, 0, 0, 0, 50, 0};
    int32_t labels[2] = {1, 2};
    float d[8];
    double loss;
    int64_t good;
    ds_softmax_xent_c(d, logits, labels, 2, 4, &loss, &good);
    cr_expect(ds_t_close_d(loss, log(4.0), 1e-6, 0), "loss %f", loss);
    cr_expect_eq(good, 1);
    cr_expect(ds_t_close_d(d[1], (0.25 - 1) / 2, 1e-7, 0));
    cr_expect(ds_t_close_d(d[0], 0.25 / 2, 1e-7, 0));
    double s = 0;
    for (int i = 0; i < 8; i++)
        s += d[i];
    cr_expect(ds_t_close_d(s, 0, 1e-6, 0), "gradient rows sum to zero, got %g", s);
}

Test(kernels, backend_chooser)
{
    ds_ops o;
    char why[256];
    cr_expect_eq(ds_ops_init(&o, "cpu", 0, why, sizeof(why)), 0);
    cr_expect_eq(o.kind, DS_BACKEND_CPU);
    cr_expect_eq(ds_ops_init(&o, "auto", 0, why, sizeof(why)), 0, "%s", why);
    ds_ops_fini(&o);
    cr_expect_eq(ds_ops_init(&o, "tpu", 0, why, sizeof(why)), -EINVAL);
    cr_expect(strstr(why, "unknown backend 'tpu'") != NULL, "%s", why);
    int r = ds_ops_init(&o, "cuda", 0, why, sizeof(why));
    cr_expect(r == 0 || r == -ENODEV, "%d %s", r, why);
    if (r == 0)
        ds_ops_fini(&o);
}
