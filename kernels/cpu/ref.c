/*
 * kernels/cpu/ref.c: the plain C reference of every kernel, and the CPU op
 * table (reference first, then what the SIMD mask allows).
 *
 * Compiled without SIMD flags on purpose: these are the definitions the
 * vectorized variants and the CUDA kernels are checked against. Reductions
 * accumulate in double so the reference is the accurate side of a compare.
 */
#include "config.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/cpu.h"
#include "kernels/cpu/cpu_kernels.h"

DS_DECL_GEMM(ds_gemm_c)
{
    /* C = beta*C first, then accumulate alpha*op(A)*op(B) row by row in an
     * i-p-j order that walks C and B contiguously when B is not transposed. */
    for (int i = 0; i < m; i++)
        for (int j = 0; j < n; j++)
            c[(size_t)i * ldc + j] = beta == 0.0f ? 0.0f : beta * c[(size_t)i * ldc + j];
    for (int i = 0; i < m; i++) {
        float *ci = c + (size_t)i * ldc;
        for (int p = 0; p < k; p++) {
            const float aip = alpha * (trans_a ? a[(size_t)p * lda + i] : a[(size_t)i * lda + p]);
            if (trans_b) {
                for (int j = 0; j < n; j++)
                    ci[j] += aip * b[(size_t)j * ldb + p];
            } else {
                const float *bp = b + (size_t)p * ldb;
                for (int j = 0; j < n; j++)
                    ci[j] += aip * bp[j];
            }
        }
    }
}

DS_DECL_BIAS_ADD(ds_bias_add_c)
{
    for (int r = 0; r < rows; r++)
        for (int c = 0; c < cols; c++)
            y[(size_t)r * cols + c] += bias[c];
}

DS_DECL_BIAS_GRAD(ds_bias_grad_c)
{
    for (int c = 0; c < cols; c++) {
        double s = 0;
        for (int r = 0; r < rows; r++)
            s += dy[(size_t)r * cols + c];
        db[c] = (float)s;
    }
}

DS_DECL_RELU_FWD(ds_relu_fwd_c)
{
    for (size_t i = 0; i < n; i++)
        y[i] = x[i] > 0.0f ? x[i] : 0.0f;
}

DS_DECL_RELU_BWD(ds_relu_bwd_c)
{
    for (size_t i = 0; i < n; i++)
        dx[i] = y[i] > 0.0f ? dy[i] : 0.0f;
}

DS_DECL_SOFTMAX_XENT(ds_softmax_xent_c)
{
    double loss = 0;
    int64_t good = 0;
    const float inv_rows = 1.0f / (float)rows;
    for (int r = 0; r < rows; r++) {
        const float *x = logits + (size_t)r * cols;
        int best = 0;
        for (int c = 1; c < cols; c++)
            if (x[c] > x[best])
                best = c;
        const float mx = x[best];
        double se = 0;
        for (int c = 0; c < cols; c++)
            se += exp((double)(x[c] - mx));
        const int y = labels[r];
        loss += log(se) - (double)(x[y] - mx);
        good += best == y;
        if (dlogits) {
            float *d = dlogits + (size_t)r * cols;
            for (int c = 0; c < cols; c++) {
                const float p = (float)(exp((double)(x[c] - mx)) / se);
                d[c] = (p - (c == y ? 1.0f : 0.0f)) * inv_rows;
            }
        }
    }
    *loss_sum = loss;
    *correct = good;
}

DS_DECL_SGD(ds_sgd_c)
{
    const float lr = p->lr, mu = p->momentum, wd = p->weight_decay;
    for (size_t i = 0; i < n; i++) {
        float g = grad[i] + wd * theta[i];
        if (mu != 0.0f) {
            const float m = mu * mom[i] + g;
            mom[i] = m;
            g = p->nesterov ? g + mu * m : m;
        }
        theta[i] -= lr * g;
    }
}

DS_DECL_AXPY(ds_axpy_c)
{
    for (size_t i = 0; i < n; i++)
        y[i] += a * x[i];
}

DS_DECL_SCALE(ds_scale_c)
{
    for (size_t i = 0; i < n; i++)
        x[i] *= a;
}

DS_DECL_DOT(ds_dot_c)
{
    double s = 0;
    for (size_t i = 0; i < n; i++)
        s += (double)x[i] * (double)y[i];
    return s;
}

DS_DECL_NRM2(ds_nrm2_c)
{
    double s = 0;
    for (size_t i = 0; i < n; i++)
        s += (double)x[i] * (double)x[i];
    return sqrt(s);
}

DS_DECL_SUM(ds_sum_c)
{
    double s = 0;
    for (size_t i = 0; i < n; i++)
        s += x[i];
    return s;
}

/* ---- image ops ----------------------------------------------------------- */

DS_DECL_CONV2D_FWD(ds_conv2d_fwd_c)
{
    (void)col;
    const int ci_n = s->c_in, co_n = s->c_out, h = s->h, wd = s->w, k = s->k, p = k / 2;
    const size_t plane = (size_t)h * wd;
    for (int n = 0; n < s->batch; n++)
        for (int co = 0; co < co_n; co++)
            for (int oy = 0; oy < h; oy++)
                for (int ox = 0; ox < wd; ox++) {
                    double acc = bias[co];
                    for (int ci = 0; ci < ci_n; ci++) {
                        const float *xp = x + ((size_t)n * ci_n + ci) * plane;
                        const float *wp = w + ((size_t)co * ci_n + ci) * k * k;
                        for (int ky = 0; ky < k; ky++) {
                            const int iy = oy + ky - p;
                            if (iy < 0 || iy >= h)
                                continue;
                            for (int kx = 0; kx < k; kx++) {
                                const int ix = ox + kx - p;
                                if (ix >= 0 && ix < wd)
                                    acc += (double)wp[ky * k + kx] * xp[(size_t)iy * wd + ix];
                            }
                        }
                    }
                    y[((size_t)n * co_n + co) * plane + (size_t)oy * wd + ox] = (float)acc;
                }
}

DS_DECL_CONV2D_BWD(ds_conv2d_bwd_c)
{
    (void)col;
    const int ci_n = s->c_in, co_n = s->c_out, h = s->h, wd = s->w, k = s->k, p = k / 2;
    const size_t plane = (size_t)h * wd;
    for (int co = 0; co < co_n; co++) {
        double sb = 0;
        for (int n = 0; n < s->batch; n++)
            for (size_t i = 0; i < plane; i++)
                sb += dy[((size_t)n * co_n + co) * plane + i];
        db[co] = (float)sb;
        for (int ci = 0; ci < ci_n; ci++)
            for (int ky = 0; ky < k; ky++)
                for (int kx = 0; kx < k; kx++) {
                    double acc = 0;
                    for (int n = 0; n < s->batch; n++) {
                        const float *dyp = dy + ((size_t)n * co_n + co) * plane;
                        const float *xp = x + ((size_t)n * ci_n + ci) * plane;
                        for (int oy = 0; oy < h; oy++) {
                            const int iy = oy + ky - p;
                            if (iy < 0 || iy >= h)
                                continue;
                            for (int ox = 0; ox < wd; ox++) {
                                const int ix = ox + kx - p;
                                if (ix >= 0 && ix < wd)
                                    acc += (double)dyp[(size_t)oy * wd + ox] *
                                           xp[(size_t)iy * wd + ix];
                            }
                        }
                    }
                    dw[(((size_t)co * ci_n + ci) * k + ky) * k + kx] = (float)acc;
                }
    }
    if (!dx)
        return;
    for (int n = 0; n < s->batch; n++)
        for (int ci = 0; ci < ci_n; ci++)
            for (int iy = 0; iy < h; iy++)
                for (int ix = 0; ix < wd; ix++) {
                    double acc = 0;
                    for (int co = 0; co < co_n; co++) {
                        const float *dyp = dy + ((size_t)n * co_n + co) * plane;
                        const float *wp = w + ((size_t)co * ci_n + ci) * k * k;
                        for (int ky = 0; ky < k; ky++) {
                            const int oy = iy - ky + p;
                            if (oy < 0 || oy >= h)
                                continue;
                            for (int kx = 0; kx < k; kx++) {
                                const int ox = ix - kx + p;
                                if (ox >= 0 && ox < wd)
                                    acc += (double)wp[ky * k + kx] * dyp[(size_t)oy * wd + ox];
                            }
                        }
                    }
                    dx[((size_t)n * ci_n + ci) * plane + (size_t)iy * wd + ix] = (float)acc;
                }
}

/* Index (within x's plane) of the first maximum of the window at (oy, ox). */
static size_t pool_arg(const float *xp, int w, int oy, int ox)
{
    size_t best = (size_t)(2 * oy) * w + 2 * ox;
    const size_t cand[3] = {best + 1, best + w, best + w + 1};
    for (int i = 0; i < 3; i++)
        if (xp[cand[i]] > xp[best])
            best = cand[i];
    return best;
}

DS_DECL_MAXPOOL_FWD(ds_maxpool_fwd_c)
{
    const int oh = h / 2, ow = w / 2;
    for (int p = 0; p < planes; p++) {
        const float *xp = x + (size_t)p * h * w;
        float *yp = y + (size_t)p * oh * ow;
        for (int oy = 0; oy < oh; oy++)
            for (int ox = 0; ox < ow; ox++)
                yp[oy * ow + ox] = xp[pool_arg(xp, w, oy, ox)];
    }
}

DS_DECL_MAXPOOL_BWD(ds_maxpool_bwd_c)
{
    const int oh = h / 2, ow = w / 2;
    memset(dx, 0, (size_t)planes * h * w * sizeof(float));
    for (int p = 0; p < planes; p++) {
        const float *xp = x + (size_t)p * h * w;
        const float *dyp = dy + (size_t)p * oh * ow;
        float *dxp = dx + (size_t)p * h * w;
        for (int oy = 0; oy < oh; oy++)
            for (int ox = 0; ox < ow; ox++)
                dxp[pool_arg(xp, w, oy, ox)] = dyp[oy * ow + ox];
    }
}

/* ---- host memory ops ----------------------------------------------------- */

DS_DECL_GATHER_IMAGES(ds_gather_images_c)
{
    for (int b = 0; b < batch; b++) {
        const size_t i = idx ? idx[b] : first + (size_t)b;
        const uint8_t *p = images + i * dim;
        float *o = x + (size_t)b * dim;
        for (size_t j = 0; j < dim; j++) {
            const float v = (float)p[j] * scale; /* two roundings, as on every backend */
            o[j] = v + shift;
        }
        y[b] = labels[i];
    }
}

static void *host_alloc(size_t bytes)
{
    size_t rounded = (bytes + 63) & ~(size_t)63;
    void *p = aligned_alloc(64, rounded ? rounded : 64);
    if (p)
        memset(p, 0, rounded ? rounded : 64);
    return p;
}

static void host_free(void *p) { free(p); }

static int host_copy(void *dst, const void *src, size_t bytes)
{
    if (bytes)
        memmove(dst, src, bytes);
    return 0;
}

static int host_memzero(void *dst, size_t bytes)
{
    if (bytes)
        memset(dst, 0, bytes);
    return 0;
}

static int host_sync(void) { return 0; }
static const char *host_error(void) { return NULL; }

void ds_ops_fill_cpu(ds_ops *ops, unsigned flags)
{
    memset(ops, 0, sizeof(*ops));
    ops->kind = DS_BACKEND_CPU;
    ops->alloc = host_alloc;
    ops->free = host_free;
    ops->host_alloc = host_alloc;
    ops->host_free = host_free;
    ops->upload = host_copy;
    ops->download = host_copy;
    ops->copy = host_copy;
    ops->memzero = host_memzero;
    ops->sync = host_sync;
    ops->error = host_error;

    ops->gemm = ds_gemm_c;
    ops->bias_add = ds_bias_add_c;
    ops->bias_grad = ds_bias_grad_c;
    ops->relu_fwd = ds_relu_fwd_c;
    ops->relu_bwd = ds_relu_bwd_c;
    ops->softmax_xent = ds_softmax_xent_c;
    ops->sgd = ds_sgd_c;
    ops->axpy = ds_axpy_c;
    ops->scale = ds_scale_c;
    ops->dot = ds_dot_c;
    ops->nrm2 = ds_nrm2_c;
    ops->sum = ds_sum_c;
    ops->conv2d_fwd = ds_conv2d_fwd_c;
    ops->conv2d_bwd = ds_conv2d_bwd_c;
    ops->maxpool_fwd = ds_maxpool_fwd_c;
    ops->maxpool_bwd = ds_maxpool_bwd_c;
    ops->gather_images = ds_gather_images_c;

#define SET_SIMD(sfx) \
    do { \
        ops->bias_add = ds_bias_add_##sfx; \
        ops->bias_grad = ds_bias_grad_##sfx; \
        ops->relu_fwd = ds_relu_fwd_##sfx; \
        ops->relu_bwd = ds_relu_bwd_##sfx; \
        ops->sgd = ds_sgd_##sfx; \
        ops->axpy = ds_axpy_##sfx; \
        ops->scale = ds_scale_##sfx; \
        ops->dot = ds_dot_##sfx; \
        ops->nrm2 = ds_nrm2_##sfx; \
        ops->sum = ds_sum_##sfx; \
        ops->maxpool_fwd = ds_maxpool_fwd_##sfx; \
        ops->maxpool_bwd = ds_maxpool_bwd_##sfx; \
        ops->conv2d_fwd = ds_conv2d_fwd_##sfx; \
        ops->conv2d_bwd = ds_conv2d_bwd_##sfx; \
    } while (0)

    /* OpenBLAS is the production GEMM whenever SIMD is allowed at all; the
     * "ref" mask keeps the plain loops (GEMM, direct convolution) so every
     * result can be reproduced without any optimized code. The ISA's conv
     * ops below then take the direct loops for few input channels. */
    if (flags) {
        ops->gemm = ds_gemm_blas;
        ops->conv2d_fwd = ds_conv2d_fwd_blas;
        ops->conv2d_bwd = ds_conv2d_bwd_blas;
    }
#if ARCH_X86_64
    if (flags & DS_CPU_AVX2)
        SET_SIMD(avx2);
    if (flags & DS_CPU_AVX512)
        SET_SIMD(avx512);
#endif
#undef SET_SIMD
    snprintf(ops->name, sizeof(ops->name), "cpu-%s", ds_cpu_flags_name(flags));
}
