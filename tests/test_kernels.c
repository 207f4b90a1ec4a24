/*
 * tests/test_kernels.c: every CPU kernel variant against the C reference on
 * seeded random inputs of odd sizes, and the backend chooser.
 * Run: meson test -C build kernels --verbose
 */
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
    cr_expect_eq(ds_ops_init(&o, "cpu", why, sizeof(why)), 0);
    cr_expect_eq(o.kind, DS_BACKEND_CPU);
    cr_expect_eq(ds_ops_init(&o, "auto", why, sizeof(why)), 0, "%s", why);
    ds_ops_fini(&o);
    cr_expect_eq(ds_ops_init(&o, "tpu", why, sizeof(why)), -EINVAL);
    cr_expect(strstr(why, "unknown backend 'tpu'") != NULL, "%s", why);
    int r = ds_ops_init(&o, "cuda", why, sizeof(why));
    cr_expect(r == 0 || r == -ENODEV, "%d %s", r, why);
    if (r == 0)
        ds_ops_fini(&o);
}
