/*
 * kernels/cpu/blas.c: GEMM through CBLAS (OpenBLAS), row-major, and the
 * choice of OpenBLAS's kernels.
 *
 * OpenBLAS (Debian builds it with DYNAMIC_ARCH) picks its kernels once, when
 * the library is loaded, from CPUID. On virtual CPUs that report a generic
 * model ("Intel Xeon Processor") it does not recognise the core and falls
 * back to its oldest x86-64 kernels (Prescott, SSE3): measured here, the
 * MLP step is 4x slower than with its AVX-512 (SkylakeX) kernels. The only
 * supported override is OPENBLAS_CORETYPE in the environment at load time,
 * so programs call ds_blas_reexec_if_needed() first thing in main(): when
 * the loaded kernels are weaker than what ds_cpu_detect() finds and the user
 * has not set OPENBLAS_CORETYPE, the program runs itself again, once, with
 * it set. DS_BLAS_KEEP=1 disables this.
 */
#include "config.h"

#include <cblas.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/prctl.h>
#include <unistd.h>

#include "kernels/cpu.h"
#include "kernels/cpu/cpu_kernels.h"

DS_DECL_GEMM(ds_gemm_blas)
{
    cblas_sgemm(CblasRowMajor, trans_a ? CblasTrans : CblasNoTrans,
                trans_b ? CblasTrans : CblasNoTrans, m, n, k, alpha, a, lda, b, ldb,
                beta, c, ldc);
}

/* One image's im2col: col[(ci*k + ky)*k + kx][oy*w + ox] = x[ci][oy+ky-p][ox+kx-p],
 * 0 outside the image (p = k/2). */
static void im2col(float *col, const float *x, int c_in, int h, int w, int k)
{
    const int p = k / 2;
    for (int ci = 0; ci < c_in; ci++)
        for (int ky = 0; ky < k; ky++)
            for (int kx = 0; kx < k; kx++) {
                float *row = col + ((size_t)(ci * k + ky) * k + kx) * h * w;
                const float *xp = x + (size_t)ci * h * w;
                const int lo = p - kx > 0 ? p - kx : 0;             /* first ox inside */
                const int hi = w + p - kx < w ? w + p - kx : w;     /* past the last */
                for (int oy = 0; oy < h; oy++) {
                    float *r = row + (size_t)oy * w;
                    const int iy = oy + ky - p;
                    if (iy < 0 || iy >= h || lo >= hi) {
                        memset(r, 0, (size_t)w * sizeof(float));
                        continue;
                    }
                    /* An inline copy: the rows are short (14 floats for
                     * the CNN's conv2), and a memcpy call per row cost more
                     * than the copy. */
                    const float *src = xp + (size_t)iy * w + kx - p;
                    for (int ox = 0; ox < lo; ox++)
                        r[ox] = 0.0f;
                    for (int ox = lo; ox < hi; ox++)
                        r[ox] = src[ox];
                    for (int ox = hi; ox < w; ox++)
                        r[ox] = 0.0f;
                }
            }
}

/* The adjoint of im2col: dx (one image, overwritten) = sum of col's entries
 * over every place they were copied from. */
static void col2im(float *dx, const float *col, int c_in, int h, int w, int k)
{
    const int p = k / 2;
    memset(dx, 0, (size_t)c_in * h * w * sizeof(float));
    for (int ci = 0; ci < c_in; ci++)
        for (int ky = 0; ky < k; ky++)
            for (int kx = 0; kx < k; kx++) {
                const float *row = col + ((size_t)(ci * k + ky) * k + kx) * h * w;
                float *xp = dx + (size_t)ci * h * w;
                const int lo = p - kx > 0 ? p - kx : 0;
                const int hi = w + p - kx < w ? w + p - kx : w;
                for (int oy = 0; oy < h; oy++) {
                    const int iy = oy + ky - p;
                    if (iy < 0 || iy >= h)
                        continue;
                    const float *r = row + (size_t)oy * w;
                    float *xr = xp + (size_t)iy * w + kx - p;
                    for (int ox = lo; ox < hi; ox++)
                        xr[ox] += r[ox];
                }
            }
}

/* Per image: y_n (c_out x hw) = W (c_out x ckk) . col_n (ckk x hw), + bias. */
DS_DECL_CONV2D_FWD(ds_conv2d_fwd_blas)
{
    const int hw = s->h * s->w, ckk = s->c_in * s->k * s->k;
    for (int n = 0; n < s->batch; n++) {
        float *yn = y + (size_t)n * s->c_out * hw;
        im2col(col, x + (size_t)n * s->c_in * hw, s->c_in, s->h, s->w, s->k);
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, s->c_out, hw, ckk, 1.0f, w, ckk,
                    col, hw, 0.0f, yn, hw);
        for (int co = 0; co < s->c_out; co++) {
            float *r = yn + (size_t)co * hw;
            for (int i = 0; i < hw; i++)
                r[i] += bias[co];
        }
    }
}

/* Per image: dW += dy_n . col_n^T; db += row sums of dy_n;
 * dx_n = col2im(W^T . dy_n). */
DS_DECL_CONV2D_BWD(ds_conv2d_bwd_blas)
{
    const int hw = s->h * s->w, ckk = s->c_in * s->k * s->k;
    /* Bias sums: eight float partial sums per plane (the compiler keeps
     * them in vector registers; one serial double sum was a chain of
     * dependent adds), each plane's total added in double. */
    for (int co = 0; co < s->c_out; co++) {
        double sb = 0;
        for (int n = 0; n < s->batch; n++) {
            const float *r = dy + ((size_t)n * s->c_out + co) * hw;
            float part[8] = {0};
            int i = 0;
            for (; i + 8 <= hw; i += 8)
                for (int j = 0; j < 8; j++)
                    part[j] += r[i + j];
            double t = 0;
            for (int j = 0; j < 8; j++)
                t += part[j];
            for (; i < hw; i++)
                t += r[i];
            sb += t;
        }
        db[co] = (float)sb;
    }
    for (int n = 0; n < s->batch; n++) {
        const float *dyn = dy + (size_t)n * s->c_out * hw;
        im2col(col, x + (size_t)n * s->c_in * hw, s->c_in, s->h, s->w, s->k);
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, s->c_out, ckk, hw, 1.0f, dyn, hw,
                    col, hw, n ? 1.0f : 0.0f, dw, ckk);
        if (!dx)
            continue;
        cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, ckk, hw, s->c_out, 1.0f, w, ckk,
                    dyn, hw, 0.0f, col, hw);
        col2im(dx + (size_t)n * s->c_in * hw, col, s->c_in, s->h, s->w, s->k);
    }
}

void ds_blas_set_threads(int n)
{
    openblas_set_num_threads(n > 0 ? n : 1);
}

const char *ds_blas_corename(void)
{
    const char *c = openblas_get_corename();
    return c ? c : "unknown";
}

/* OpenBLAS core names whose SGEMM uses AVX-512, and AVX2 (or better). */
static int name_in(const char *name, const char *const *list)
{
    for (; *list; list++)
        if (!strcasecmp(name, *list))
            return 1;
    return 0;
}

const char *ds_blas_wanted_coretype(void)
{
    static const char *const avx512[] = {"SkylakeX", "Cooperlake", "SapphireRapids", NULL};
    static const char *const avx2[] = {"Haswell", "Zen", "SkylakeX", "Cooperlake",
                                       "SapphireRapids", NULL};
    const unsigned have = ds_cpu_detect();
    const char *core = ds_blas_corename();
    if ((have & DS_CPU_AVX512) && !name_in(core, avx512))
        return "SkylakeX";
    if ((have & DS_CPU_AVX2) && !name_in(core, avx2))
        return "Haswell";
    return NULL;
}

/* A program started through /proc/self/exe is named "exe" by the kernel
 * (ps, top, /proc/PID/comm, and every thread it creates): give it back the
 * name it was started under. */
static void restore_comm(char **argv)
{
    if (!argv || !argv[0] || !*argv[0])
        return;
    const char *base = strrchr(argv[0], '/');
    base = base ? base + 1 : argv[0];
    if (*base)
        prctl(PR_SET_NAME, base, 0, 0, 0);
}

void ds_blas_reexec_if_needed(char **argv)
{
    const char *keep = getenv("DS_BLAS_KEEP");
    if (getenv("OPENBLAS_CORETYPE") || (keep && *keep && strcmp(keep, "0"))) {
        restore_comm(argv);
        return;
    }
    const char *want = ds_blas_wanted_coretype();
    if (!want)
        return;
    /* Set both so a second pass can never loop, whatever OpenBLAS does. */
    setenv("OPENBLAS_CORETYPE", want, 1);
    setenv("DS_BLAS_KEEP", "1", 1);
    execv("/proc/self/exe", argv);
    /* exec failed: carry on with the kernels we have (slower, still right). */
    fprintf(stderr, "dsnode: note: could not re-exec with OPENBLAS_CORETYPE=%s; "
                    "OpenBLAS runs its %s kernels\n", want, ds_blas_corename());
}
