/*
 * kernels/cuda/cuda_ops.cu: the CUDA backend's op table.
 *
 * State is per device. Device d has one record in g_dev[d]: the stream of
 * kernels/cuda/device.h (shared with every other CUDA user of the process,
 * so training ops and selection are ordered without host syncs), a cuBLAS
 * handle bound to that stream, device scratch, and the sticky first error.
 * The record is created by the first table opened on d and destroyed by the
 * last one closed (refs, under g_lock); two tables of one device share it,
 * as they share the stream, and tables of two devices share nothing.
 *
 * The ds_ops signatures carry no context pointer (many callers, and the CPU
 * table has nothing to point at), so the device index is bound at compile
 * time instead: every op is written once as a static function whose first
 * argument is its device's record, and on_device<D, F>::call is the
 * argument-less-context entry point that looks up g_dev[D], makes D the
 * calling thread's current device when it is not already, and calls F.
 * fill<D> fills a table with the D instantiations; g_fill[d] picks the one
 * for the device asked for, for d in 0..DS_CUDA_MAX_DEVICES-1. Kernels are
 * not templated: only these host wrappers (a few hundred bytes each) are.
 * Ops leave D current for the calling thread: every CUDA entry point of
 * dsnode selects its own device, so none relies on what it was before.
 * The ops of one device share its scratch, so they are called from one
 * thread at a time (the trainer's); opening and closing tables may happen
 * on any thread.
 *
 * Every compute op is queued on the device's stream; reductions and
 * softmax cross-entropy copy their scalar results back, which synchronizes.
 * "No driver" and "no device" are normal answers: ds_ops_init_cuda returns
 * -ENODEV with the reason and the caller uses the CPU.
 *
 * Each kernel mirrors a C reference in kernels/cpu/ref.c; tests/test_cuda.c
 * compares them on seeded random inputs and skips when no device answers.
 * Run it with: meson test -C build cuda --verbose
 */
#include <array>
#include <dlfcn.h>
#include <errno.h>
#include <math.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <utility>

#include <cublas_v2.h>
#include <cuda_runtime.h>

extern "C" {
#include "kernels/kernels.h"
}
#include "kernels/cuda/device.h"

#define THREADS 256

/* cuBLAS is opened at run time, once a device has answered, not linked:
 * libcublasLt's static constructors cost every process 0.5-0.9 s of CPU
 * at start-up (perf: 70% of `dsnode --version` in call_init, most of it
 * libcublasLt), CPU-only machines and nodes included. The header gives the
 * types; these are all the backend calls. The library is one per process,
 * opened under g_lock by the first table and never closed. */
static struct {
    void *lib;
    decltype(&cublasCreate_v2) create;
    decltype(&cublasDestroy_v2) destroy;
    decltype(&cublasSetStream_v2) set_stream;
    decltype(&cublasSgemm_v2) sgemm;
    decltype(&cublasSgemmStridedBatched) sgemm_strided;
} g_cublas;

static int cublas_open(char *why, size_t why_len)
{
    if (g_cublas.lib)
        return 0;
    char name[32];
    snprintf(name, sizeof(name), "libcublas.so.%d", CUBLAS_VER_MAJOR);
    void *lib = dlopen(name, RTLD_NOW | RTLD_LOCAL);
    if (!lib) {
        const char *e = dlerror();
        snprintf(why, why_len, "cannot load %s: %s", name, e ? e : "dlopen failed");
        return -ENODEV;
    }
    g_cublas.create = (decltype(g_cublas.create))dlsym(lib, "cublasCreate_v2");
    g_cublas.destroy = (decltype(g_cublas.destroy))dlsym(lib, "cublasDestroy_v2");
    g_cublas.set_stream = (decltype(g_cublas.set_stream))dlsym(lib, "cublasSetStream_v2");
    g_cublas.sgemm = (decltype(g_cublas.sgemm))dlsym(lib, "cublasSgemm_v2");
    g_cublas.sgemm_strided =
        (decltype(g_cublas.sgemm_strided))dlsym(lib, "cublasSgemmStridedBatched");
    if (!g_cublas.create || !g_cublas.destroy || !g_cublas.set_stream || !g_cublas.sgemm ||
        !g_cublas.sgemm_strided) {
        snprintf(why, why_len, "%s lacks cublasCreate_v2, cublasDestroy_v2, cublasSetStream_v2, "
                 "cublasSgemm_v2 or cublasSgemmStridedBatched", name);
        dlclose(lib);
        memset(&g_cublas, 0, sizeof(g_cublas));
        return -ENODEV;
    }
    g_cublas.lib = lib; /* kept open: the handles' code lives there */
    return 0;
}

/* softmax_xent: rows per block (one warp each) and the most blocks, whose
 * partial sums wait in dev_state.red for the final pass. */
#define SX_WARPS 8
#define SX_BLOCKS_MAX 1024

/* Doubles of dev_state.red: the results of a reduction or of softmax_xent
 * (red[0..4)), then softmax_xent's per-block partials (2 per block). */
#define RED_DOUBLES (4 + 2 * SX_BLOCKS_MAX)

/* What one device's tables share. Written under g_lock by open and close;
 * the ops read it without the lock, which is safe because a table exists
 * only between its open and its close. */
struct dev_state {
    int refs;              /* tables open on this device */
    cudaStream_t stream;   /* device.h's, borrowed while refs > 0 */
    cublasHandle_t blas;   /* bound to stream */
    double *red;           /* device: RED_DOUBLES reduction results */
    float *conv;           /* device: im2col of a chunk of images, grown on demand */
    size_t conv_floats;    /* its size */

    /* The first failure since the record was created (a launch, a cuBLAS
     * status, an asynchronous copy or memset): ops->sync returns -EIO from
     * then on, and ops->error says what it was. Ops that return nothing
     * record here; a step that syncs (node/train/train.c) fails on it, so
     * nothing goes on computing from a fault's leftovers. */
    int failed;
    char error[160];
};

static pthread_mutex_t g_lock = PTHREAD_MUTEX_INITIALIZER;
static dev_state g_dev[DS_CUDA_MAX_DEVICES];

static void fail(dev_state *st, const char *what, const char *why)
{
    if (st->failed)
        return;
    st->failed = 1;
    snprintf(st->error, sizeof(st->error), "%s: %s", what, why);
}

static void note(dev_state *st, cudaError_t e, const char *what)
{
    if (e != cudaSuccess)
        fail(st, what, cudaGetErrorString(e));
}

static void note_blas(dev_state *st, cublasStatus_t s, const char *what)
{
    if (s != CUBLAS_STATUS_SUCCESS) {
        char why[32];
        snprintf(why, sizeof(why), "cuBLAS status %d", (int)s);
        fail(st, what, why);
    }
}

/* After a kernel launch: a bad configuration or a fault already known. */
#define LAUNCHED(st, name) note(st, cudaGetLastError(), name)

static unsigned grid_for(size_t n)
{
    size_t g = (n + THREADS - 1) / THREADS;
    if (g > 65535 * 8)
        g = 65535 * 8;
    return g ? (unsigned)g : 1;
}

/* ---- memory ---------------------------------------------------------------- */

static void *cu_alloc(dev_state *st, size_t bytes)
{
    void *p = NULL;
    size_t rounded = (bytes + 63) & ~(size_t)63;
    if (!rounded)
        rounded = 64;
    if (cudaMalloc(&p, rounded) != cudaSuccess) {
        /* Out of memory is the caller's to handle (NULL), not a device
         * fault: clear it so the next launch check does not record it. */
        (void)cudaGetLastError();
        return NULL;
    }
    /* On the ops' stream, not the legacy one, and finished before use. */
    if (cudaMemsetAsync(p, 0, rounded, st->stream) != cudaSuccess ||
        cudaStreamSynchronize(st->stream) != cudaSuccess) {
        (void)cudaGetLastError();
        cudaFree(p);
        return NULL;
    }
    return p;
}

static void cu_free(dev_state *st, void *p)
{
    if (p)
        note(st, cudaFree(p), "free");
}

/* 0, or -EIO with the failure kept for sync and error. */
static int cu_check(dev_state *st, cudaError_t e, const char *what)
{
    note(st, e, what);
    return e == cudaSuccess ? 0 : -EIO;
}

/* Pinned host memory: copies to and from it are DMA, with no staging
 * through a driver buffer (the engine's host mirrors, run.c). */
static void *cu_host_alloc(dev_state *st, size_t bytes)
{
    (void)st;
    void *p = NULL;
    size_t rounded = (bytes + 63) & ~(size_t)63;
    if (!rounded)
        rounded = 64;
    if (cudaHostAlloc(&p, rounded, cudaHostAllocDefault) != cudaSuccess) {
        (void)cudaGetLastError(); /* the caller's to handle, not a fault */
        return NULL;
    }
    memset(p, 0, rounded);
    return p;
}

static void cu_host_free(dev_state *st, void *p)
{
    if (p)
        note(st, cudaFreeHost(p), "cudaFreeHost");
}

static int cu_upload(dev_state *st, void *dst, const void *src, size_t bytes)
{
    int ret = cu_check(st, cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, st->stream),
                       "upload");
    return ret ? ret : cu_check(st, cudaStreamSynchronize(st->stream), "upload");
}

static int cu_download(dev_state *st, void *dst, const void *src, size_t bytes)
{
    int ret = cu_check(st, cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, st->stream),
                       "download");
    return ret ? ret : cu_check(st, cudaStreamSynchronize(st->stream), "download");
}

static int cu_copy(dev_state *st, void *dst, const void *src, size_t bytes)
{
    return cu_check(st, cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, st->stream),
                    "copy");
}

static int cu_memzero(dev_state *st, void *dst, size_t bytes)
{
    return cu_check(st, cudaMemsetAsync(dst, 0, bytes, st->stream), "memzero");
}

/* Waits for the stream; -EIO when it or anything since the record was
 * created failed (the failure stays: a device fault is not cleared by a
 * sync). */
static int cu_sync(dev_state *st)
{
    note(st, cudaStreamSynchronize(st->stream), "sync");
    return st->failed ? -EIO : 0;
}

static const char *cu_error(dev_state *st) { return st->failed ? st->error : NULL; }

/* ---- GEMM: row-major on top of column-major cuBLAS ------------------------- */

/* A row-major matrix seen column-major is its transpose, so C = op(A) op(B)
 * (row-major) is C^T = op(B)^T op(A)^T (column-major): swap the operands. */
static void cu_gemm(dev_state *st, int trans_a, int trans_b, int m, int n, int k, float alpha,
                    const float *a, int lda, const float *b, int ldb, float beta, float *c,
                    int ldc)
{
    note_blas(st,
              g_cublas.sgemm(st->blas, trans_b ? CUBLAS_OP_T : CUBLAS_OP_N,
                             trans_a ? CUBLAS_OP_T : CUBLAS_OP_N, n, m, k, &alpha, b, ldb, a, lda,
                             &beta, c, ldc),
              "cublasSgemm");
}

/* The same for `count` products at once: A_i = a + i*sa, B_i = b + i*sb,
 * C_i = c + i*sc (a stride of 0 shares one matrix among all). */
static void cu_gemm_strided(dev_state *st, int trans_a, int trans_b, int m, int n, int k,
                            float alpha, const float *a, int lda, long long sa, const float *b,
                            int ldb, long long sb, float beta, float *c, int ldc, long long sc,
                            int count)
{
    note_blas(st,
              g_cublas.sgemm_strided(st->blas, trans_b ? CUBLAS_OP_T : CUBLAS_OP_N,
                                     trans_a ? CUBLAS_OP_T : CUBLAS_OP_N, n, m, k, &alpha, b, ldb,
                                     sb, a, lda, sa, &beta, c, ldc, sc, count),
              "cublasSgemmStridedBatched");
}

/* ---- elementwise ------------------------------------------------------------ */

__global__ void k_bias_add(float *y, const float *bias, int rows, int cols)
{
    size_t total = (size_t)rows * cols;
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < total;
         i += (size_t)gridDim.x * blockDim.x)
        y[i] += bias[i % cols];
}

static void cu_bias_add(dev_state *st, float *y, const float *bias, int rows, int cols)
{
    k_bias_add<<<grid_for((size_t)rows * cols), THREADS, 0, st->stream>>>(y, bias, rows, cols);
    LAUNCHED(st, "k_bias_add");
}

/* bias_grad: a block is BG_COLS columns by BG_ROWS row lanes. Lane ty of
 * column c sums rows ty, ty + BG_ROWS, ... in double (reads of a row are
 * coalesced across the columns), then the lanes are added in a fixed tree:
 * the same order every run, no atomics. Rows are a batch (hundreds), so one
 * block per 32 columns has work enough. */
#define BG_COLS 32
#define BG_ROWS 16

__global__ void k_bias_grad(float *db, const float *dy, int rows, int cols)
{
    __shared__ double part[BG_ROWS][BG_COLS];
    const int c = blockIdx.x * BG_COLS + threadIdx.x;
    double s = 0;
    if (c < cols)
        for (int r = threadIdx.y; r < rows; r += BG_ROWS)
            s += dy[(size_t)r * cols + c];
    part[threadIdx.y][threadIdx.x] = s;
    __syncthreads();
    for (int h = BG_ROWS / 2; h > 0; h >>= 1) {
        if ((int)threadIdx.y < h)
            part[threadIdx.y][threadIdx.x] += part[threadIdx.y + h][threadIdx.x];
        __syncthreads();
    }
    if (threadIdx.y == 0 && c < cols)
        db[c] = (float)part[0][threadIdx.x];
}

static void cu_bias_grad(dev_state *st, float *db, const float *dy, int rows, int cols)
{
    if (cols <= 0)
        return;
    const dim3 block(BG_COLS, BG_ROWS);
    k_bias_grad<<<(unsigned)((cols + BG_COLS - 1) / BG_COLS), block, 0, st->stream>>>(db, dy,
                                                                                      rows, cols);
    LAUNCHED(st, "k_bias_grad");
}

__global__ void k_relu_fwd(float *y, const float *x, size_t n)
{
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x)
        y[i] = x[i] > 0.0f ? x[i] : 0.0f;
}

static void cu_relu_fwd(dev_state *st, float *y, const float *x, size_t n)
{
    k_relu_fwd<<<grid_for(n), THREADS, 0, st->stream>>>(y, x, n);
    LAUNCHED(st, "k_relu_fwd");
}

__global__ void k_relu_bwd(float *dx, const float *dy, const float *y, size_t n)
{
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x)
        dx[i] = y[i] > 0.0f ? dy[i] : 0.0f;
}

static void cu_relu_bwd(dev_state *st, float *dx, const float *dy, const float *y, size_t n)
{
    k_relu_bwd<<<grid_for(n), THREADS, 0, st->stream>>>(dx, dy, y, n);
    LAUNCHED(st, "k_relu_bwd");
}

__global__ void k_sgd(float *theta, float *mom, const float *grad, size_t n, float lr,
                      float mu, float wd, int nesterov)
{
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x) {
        float g = grad[i] + wd * theta[i];
        if (mu != 0.0f) {
            const float m = mu * mom[i] + g;
            mom[i] = m;
            g = nesterov ? g + mu * m : m;
        }
        theta[i] -= lr * g;
    }
}

static void cu_sgd(dev_state *st, float *theta, float *mom, const float *grad, size_t n,
                   const ds_sgd_params *p)
{
    k_sgd<<<grid_for(n), THREADS, 0, st->stream>>>(theta, mom, grad, n, p->lr, p->momentum,
                                                   p->weight_decay, p->nesterov);
    LAUNCHED(st, "k_sgd");
}

__global__ void k_axpy(size_t n, float a, const float *x, float *y)
{
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x)
        y[i] += a * x[i];
}

static void cu_axpy(dev_state *st, size_t n, float a, const float *x, float *y)
{
    k_axpy<<<grid_for(n), THREADS, 0, st->stream>>>(n, a, x, y);
    LAUNCHED(st, "k_axpy");
}

__global__ void k_scale(size_t n, float a, float *x)
{
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x)
        x[i] *= a;
}

static void cu_scale(dev_state *st, size_t n, float a, float *x)
{
    k_scale<<<grid_for(n), THREADS, 0, st->stream>>>(n, a, x);
    LAUNCHED(st, "k_scale");
}

/* ---- reductions: grid-stride partial sums in double, block tree, one
 * atomicAdd per block into red[0] --------------------------------------------- */

enum { RED_SUM, RED_DOT, RED_SQ };

__global__ void k_reduce(int kind, size_t n, const float *x, const float *y, double *out)
{
    __shared__ double part[THREADS];
    double s = 0;
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x) {
        const double v = x[i];
        s += kind == RED_SUM ? v : kind == RED_DOT ? v * (double)y[i] : v * v;
    }
    s = ds_block_tree_sum<THREADS>(s, part);
    if (threadIdx.x == 0)
        atomicAdd(out, s);
}

static double cu_reduce(dev_state *st, int kind, size_t n, const float *x, const float *y)
{
    double h = 0;
    unsigned g = grid_for(n);
    if (g > 1024)
        g = 1024;
    note(st, cudaMemsetAsync(st->red, 0, sizeof(double), st->stream), "reduce");
    k_reduce<<<g, THREADS, 0, st->stream>>>(kind, n, x, y, st->red);
    LAUNCHED(st, "k_reduce");
    /* A failed reduction is NaN, never a zero that looks valid. */
    if (cu_download(st, &h, st->red, sizeof(h)) < 0 || st->failed)
        return NAN;
    return h;
}

static double cu_dot(dev_state *st, size_t n, const float *x, const float *y)
{
    return cu_reduce(st, RED_DOT, n, x, y);
}

static double cu_nrm2(dev_state *st, size_t n, const float *x)
{
    return sqrt(cu_reduce(st, RED_SQ, n, x, x));
}

static double cu_sum(dev_state *st, size_t n, const float *x)
{
    return cu_reduce(st, RED_SUM, n, x, x);
}

/* ---- softmax cross-entropy: one warp per row -------------------------------- */

/* The first maximum of a row, as the reference's scan finds it: the larger
 * value, or the lower index of two equal ones (idx < 0: nothing yet). */
__device__ __forceinline__ void argmax_merge(float *v, int *idx, float ov, int oi)
{
    if (oi >= 0 && (*idx < 0 || ov > *v || (ov == *v && oi < *idx))) {
        *v = ov;
        *idx = oi;
    }
}

/* Each warp takes rows warp, warp + SX_WARPS*gridDim.x, ...: its lanes
 * stride the columns, shuffles combine them (arg-max, sum of exp in double)
 * and lane 0 broadcasts, so every lane of a row works from the same max and
 * sum. The row's loss and hit go to lane 0; the block adds its warps in
 * order and writes part[block] (loss) and part[gridDim.x + block] (hits),
 * which k_softmax_total adds in order: the totals are the same every run.
 * For finite logits the arg-max is the reference's (first maximum); the
 * loss differs from it only by the order of the sum of exp. A label outside
 * 0..cols-1 makes the row's loss and gradient NaN rather than reading past
 * the row (the C reference does not check). */
__global__ void k_softmax_xent(float *dlogits, const float *logits, const int32_t *labels,
                               int rows, int cols, double *part)
{
    __shared__ double w_loss[SX_WARPS], w_good[SX_WARPS];
    const unsigned all = 0xffffffffu;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const float inv_rows = 1.0f / (float)rows;
    double loss = 0, good = 0;
    /* r is the same for the 32 lanes of a warp: the shuffles see them all. */
    for (int r = blockIdx.x * SX_WARPS + warp; r < rows; r += gridDim.x * SX_WARPS) {
        const float *x = logits + (size_t)r * cols;
        float bv = 0.0f;
        int bi = -1;
        for (int c = lane; c < cols; c += 32)
            argmax_merge(&bv, &bi, x[c], c);
        for (int o = 16; o > 0; o >>= 1) {
            const float ov = __shfl_down_sync(all, bv, o);
            const int oi = __shfl_down_sync(all, bi, o);
            argmax_merge(&bv, &bi, ov, oi);
        }
        const int best = __shfl_sync(all, bi, 0);
        const float mx = x[best];
        double se = 0;
        for (int c = lane; c < cols; c += 32)
            se += exp((double)(x[c] - mx));
        for (int o = 16; o > 0; o >>= 1)
            se += __shfl_down_sync(all, se, o);
        se = __shfl_sync(all, se, 0);
        const int y = labels[r];
        const bool bad = y < 0 || y >= cols;
        if (lane == 0) {
            loss += bad ? (double)NAN : log(se) - (double)(x[y] - mx);
            good += best == y;
        }
        if (dlogits) {
            float *d = dlogits + (size_t)r * cols;
            for (int c = lane; c < cols; c += 32) {
                const float p = (float)(exp((double)(x[c] - mx)) / se);
                d[c] = bad ? NAN : (p - (c == y ? 1.0f : 0.0f)) * inv_rows;
            }
        }
    }
    if (lane == 0) {
        w_loss[warp] = loss;
        w_good[warp] = good;
    }
    __syncthreads();
    if (threadIdx.x == 0) {
        double l = 0, g = 0;
        for (int i = 0; i < SX_WARPS; i++) {
            l += w_loss[i];
            g += w_good[i];
        }
        part[blockIdx.x] = l;
        part[gridDim.x + blockIdx.x] = g;
    }
}

/* out[0] = sum of part[0..n), out[1] = sum of part[n..2n), in a fixed order;
 * one block of THREADS threads. */
__global__ void k_softmax_total(const double *part, int n, double *out)
{
    __shared__ double sl[THREADS], sg[THREADS];
    double l = 0, g = 0;
    for (int i = threadIdx.x; i < n; i += THREADS) {
        l += part[i];
        g += part[n + i];
    }
    l = ds_block_tree_sum<THREADS>(l, sl);
    g = ds_block_tree_sum<THREADS>(g, sg);
    if (threadIdx.x == 0) {
        out[0] = l;
        out[1] = g;
    }
}

static void cu_softmax_xent(dev_state *st, float *dlogits, const float *logits,
                            const int32_t *labels, int rows, int cols, double *loss_sum,
                            int64_t *correct)
{
    double h[2] = {NAN, NAN};
    if (rows <= 0 || cols <= 0) {
        /* No row: the reference's sums (0, 0); no column: nothing to
         * classify, which is no valid loss. */
        *loss_sum = rows <= 0 && cols > 0 ? 0.0 : NAN;
        *correct = rows <= 0 && cols > 0 ? 0 : -1;
        return;
    }
    int g = (rows + SX_WARPS - 1) / SX_WARPS;
    if (g > SX_BLOCKS_MAX)
        g = SX_BLOCKS_MAX;
    double *part = st->red + 4;
    k_softmax_xent<<<g, SX_WARPS * 32, 0, st->stream>>>(dlogits, logits, labels, rows, cols,
                                                        part);
    LAUNCHED(st, "k_softmax_xent");
    k_softmax_total<<<1, THREADS, 0, st->stream>>>(part, g, st->red);
    LAUNCHED(st, "k_softmax_total");
    if (cu_download(st, h, st->red, sizeof(h)) < 0 || st->failed)
        h[0] = h[1] = NAN; /* never a loss of 0 that looks valid */
    *loss_sum = h[0];
    *correct = isnan(h[1]) ? -1 : (int64_t)(h[1] + 0.5);
}

/* ---- 2-D convolution: im2col + cuBLAS ---------------------------------------- */

/* A chunk of cnt images is unrolled into one matrix, col, (c_in*k*k) x
 * (cnt*h*w) row-major: row (ci, ky, kx), column (image j, pixel oy, ox)
 * holds x[j][ci][oy + ky - k/2][ox + kx - k/2], 0 in the padding. Image j's
 * K x P block (K = c_in*k*k, P = h*w) is then columns j*P.. of col, which a
 * strided batched GEMM addresses with ld cnt*P and stride P:
 *   forward   y_j = W col_j                  (one batched GEMM, W shared)
 *   weights   dW  = sum_j dy_j col_j^T       (one GEMM over cnt*P columns,
 *                                             dy moved to c_out x (cnt*P))
 *   input     dcol_j = W^T dy_j, then col2im (one thread per dx element
 *                                             gathers its k*k terms: no race)
 * Chunks use the device's own scratch (dev_state.conv, up to
 * CONV_SCRATCH_MAX floats); with one image, an image over that cap, or a
 * scratch that cannot grow, they are one image in the caller's col, where
 * dy_j is already c_out x P. Results then differ from the chunked ones by
 * float rounding only. */
#define CONV_SCRATCH_MAX ((size_t)1 << 24) /* 64 MiB; conv2 of the CNN: ~240 images */

__global__ void k_im2col(float *col, const float *x, int c_in, int h, int w, int k, int cnt)
{
    const size_t P = (size_t)h * w, cols = (size_t)cnt * P;
    const size_t total = (size_t)c_in * k * k * cols;
    const int pad = k / 2;
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < total;
         i += (size_t)gridDim.x * blockDim.x) {
        const size_t q = i / cols, r = i % cols, j = r / P;
        const int kx = (int)(q % k), ky = (int)(q / k % k), ci = (int)(q / ((size_t)k * k));
        const int at = (int)(r % P), iy = at / w + ky - pad, ix = at % w + kx - pad;
        col[i] = iy >= 0 && iy < h && ix >= 0 && ix < w
                     ? x[(j * c_in + ci) * P + (size_t)iy * w + ix]
                     : 0.0f;
    }
}

/* dx[j][ci][iy][ix] = sum over (ky, kx) of dcol[(ci, ky, kx)][j, oy, ox]
 * with oy = iy - ky + k/2, ox = ix - kx + k/2 inside the image: the terms
 * im2col copied this input element to. Overwrites dx. */
__global__ void k_col2im(float *dx, const float *dcol, int c_in, int h, int w, int k, int cnt)
{
    const size_t P = (size_t)h * w, cols = (size_t)cnt * P, total = (size_t)cnt * c_in * P;
    const int pad = k / 2;
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < total;
         i += (size_t)gridDim.x * blockDim.x) {
        const int ix = (int)(i % w), iy = (int)(i / w % h), ci = (int)(i / P % c_in);
        const size_t j = i / (P * c_in);
        float acc = 0.0f;
        for (int ky = 0; ky < k; ky++) {
            const int oy = iy - ky + pad;
            if (oy < 0 || oy >= h)
                continue;
            for (int kx = 0; kx < k; kx++) {
                const int ox = ix - kx + pad;
                if (ox >= 0 && ox < w)
                    acc += dcol[((size_t)(ci * k + ky) * k + kx) * cols + j * P +
                                (size_t)oy * w + ox];
            }
        }
        dx[i] = acc;
    }
}

/* y[plane][.] += bias[plane % c_out] over `planes` planes of P. */
__global__ void k_bias_planes(float *y, const float *bias, size_t planes, int c_out, size_t P)
{
    const size_t total = planes * P;
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < total;
         i += (size_t)gridDim.x * blockDim.x)
        y[i] += bias[i / P % c_out];
}

/* out (c_out x cnt x P) = in (cnt x c_out x P): dy of a chunk with the
 * images of one channel side by side, as the weight GEMM reads it. */
__global__ void k_nchw_to_cnhw(float *out, const float *in, int cnt, int c_out, size_t P)
{
    const size_t total = (size_t)cnt * c_out * P;
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < total;
         i += (size_t)gridDim.x * blockDim.x) {
        const size_t p = i % P, j = i / P % cnt, co = i / (P * cnt);
        out[i] = in[(j * c_out + co) * P + p];
    }
}

/* db[co] = sum over the batch and the plane of dy[n][co]: one block per
 * channel, a fixed order (strided partials in double, then a tree). */
__global__ void k_conv_bias_grad(float *db, const float *dy, int batch, int c_out, size_t P)
{
    __shared__ double part[THREADS];
    const int co = blockIdx.x;
    const size_t total = (size_t)batch * P;
    double s = 0;
    for (size_t i = threadIdx.x; i < total; i += THREADS)
        s += dy[(i / P * c_out + co) * P + i % P];
    s = ds_block_tree_sum<THREADS>(s, part);
    if (threadIdx.x == 0)
        db[co] = (float)s;
}

static bool conv_shape_ok(const ds_conv_shape *s)
{
    return s->batch >= 0 && s->c_in > 0 && s->h > 0 && s->w > 0 && s->c_out > 0 && s->k > 0 &&
           (s->k & 1);
}

/* Where a conv op unrolls its images, per_image floats each, and how many
 * at a time (*cnt): see the section comment. NULL when there is no room
 * at all (col NULL and no own scratch). */
static float *conv_scratch(dev_state *st, int batch, size_t per_image, float *col, int *cnt)
{
    size_t want = CONV_SCRATCH_MAX / per_image;
    if (want > (size_t)batch)
        want = (size_t)batch;
    *cnt = 1;
    if (want < 2)
        return col;
    if (st->conv_floats >= want * per_image) {
        *cnt = (int)want;
        return st->conv;
    }
    /* Growing: queued ops may still read the old buffer. */
    cudaError_t e = cudaStreamSynchronize(st->stream);
    if (e != cudaSuccess) {
        note(st, e, "conv scratch");
        return col;
    }
    if (st->conv)
        note(st, cudaFree(st->conv), "conv scratch");
    st->conv = NULL;
    st->conv_floats = 0;
    if (cudaMalloc(&st->conv, want * per_image * sizeof(float)) != cudaSuccess) {
        /* Not a fault: the caller's col still does, one image at a time. */
        (void)cudaGetLastError();
        st->conv = NULL;
        return col;
    }
    st->conv_floats = want * per_image;
    *cnt = (int)want;
    return st->conv;
}

static void cu_conv2d_fwd(dev_state *st, float *y, const float *x, const float *w,
                          const float *bias, const ds_conv_shape *s, float *col)
{
    if (!conv_shape_ok(s)) {
        fail(st, "conv2d_fwd", "bad shape (sizes must be positive, k odd)");
        return;
    }
    if (s->batch == 0)
        return;
    const int P = s->h * s->w, K = s->c_in * s->k * s->k;
    int nb;
    float *buf = conv_scratch(st, s->batch, (size_t)K * P, col, &nb);
    if (!buf) {
        fail(st, "conv2d_fwd", "no im2col scratch (col is NULL)");
        return;
    }
    for (int n0 = 0; n0 < s->batch; n0 += nb) {
        const int cnt = s->batch - n0 < nb ? s->batch - n0 : nb;
        k_im2col<<<grid_for((size_t)K * cnt * P), THREADS, 0, st->stream>>>(
            buf, x + (size_t)n0 * s->c_in * P, s->c_in, s->h, s->w, s->k, cnt);
        LAUNCHED(st, "k_im2col");
        /* y_j (c_out x P) = W (c_out x K) col_j (K x P) */
        cu_gemm_strided(st, 0, 0, s->c_out, P, K, 1.0f, w, K, 0, buf, cnt * P, P, 0.0f,
                        y + (size_t)n0 * s->c_out * P, P, (long long)s->c_out * P, cnt);
    }
    const size_t planes = (size_t)s->batch * s->c_out;
    k_bias_planes<<<grid_for(planes * P), THREADS, 0, st->stream>>>(y, bias, planes, s->c_out,
                                                                    (size_t)P);
    LAUNCHED(st, "k_bias_planes");
}

static void cu_conv2d_bwd(dev_state *st, float *dx, float *dw, float *db, const float *dy,
                          const float *x, const float *w, const ds_conv_shape *s, float *col)
{
    if (!conv_shape_ok(s)) {
        fail(st, "conv2d_bwd", "bad shape (sizes must be positive, k odd)");
        return;
    }
    const int P = s->h * s->w, K = s->c_in * s->k * s->k, co_n = s->c_out;
    if (s->batch == 0) {
        /* The sum over no image. */
        note(st, cudaMemsetAsync(dw, 0, (size_t)co_n * K * sizeof(float), st->stream),
             "conv2d_bwd");
        note(st, cudaMemsetAsync(db, 0, (size_t)co_n * sizeof(float), st->stream), "conv2d_bwd");
        return;
    }
    k_conv_bias_grad<<<co_n, THREADS, 0, st->stream>>>(db, dy, s->batch, co_n, (size_t)P);
    LAUNCHED(st, "k_conv_bias_grad");
    int nb;
    float *buf = conv_scratch(st, s->batch, (size_t)(K + co_n) * P, col, &nb);
    if (!buf) {
        fail(st, "conv2d_bwd", "no im2col scratch (col is NULL)");
        return;
    }
    for (int n0 = 0; n0 < s->batch; n0 += nb) {
        const int cnt = s->batch - n0 < nb ? s->batch - n0 : nb;
        const float *dyc = dy + (size_t)n0 * co_n * P;
        k_im2col<<<grid_for((size_t)K * cnt * P), THREADS, 0, st->stream>>>(
            buf, x + (size_t)n0 * s->c_in * P, s->c_in, s->h, s->w, s->k, cnt);
        LAUNCHED(st, "k_im2col");
        /* dW (c_out x K) = dy (c_out x cnt*P) col^T, added up over chunks. */
        const float *dyt = dyc;
        if (cnt > 1) {
            float *t = buf + (size_t)K * cnt * P;
            k_nchw_to_cnhw<<<grid_for((size_t)cnt * co_n * P), THREADS, 0, st->stream>>>(
                t, dyc, cnt, co_n, (size_t)P);
            LAUNCHED(st, "k_nchw_to_cnhw");
            dyt = t;
        }
        cu_gemm(st, 0, 1, co_n, K, cnt * P, 1.0f, dyt, cnt * P, buf, cnt * P, n0 ? 1.0f : 0.0f,
                dw, K);
        if (!dx)
            continue;
        /* dcol_j (K x P, over col_j: the weight GEMM before it on the
         * stream has read it) = W^T (K x c_out) dy_j (c_out x P). */
        cu_gemm_strided(st, 1, 0, K, P, co_n, 1.0f, w, K, 0, dyc, P, (long long)co_n * P, 0.0f,
                        buf, cnt * P, P, cnt);
        k_col2im<<<grid_for((size_t)cnt * s->c_in * P), THREADS, 0, st->stream>>>(
            dx + (size_t)n0 * s->c_in * P, buf, s->c_in, s->h, s->w, s->k, cnt);
        LAUNCHED(st, "k_col2im");
    }
}

/* ---- 2x2 max-pool ------------------------------------------------------------ */

/* Index (within the plane xp, w wide) of the first maximum of the window at
 * (oy, ox): the reference's pool_arg, comparison for comparison, so both
 * pick the same element (NaN and signed zeros included). */
__device__ __forceinline__ size_t pool_arg(const float *xp, int w, int oy, int ox)
{
    size_t best = (size_t)(2 * oy) * w + 2 * ox;
    const size_t cand[3] = {best + 1, best + w, best + w + 1};
    for (int i = 0; i < 3; i++)
        if (xp[cand[i]] > xp[best])
            best = cand[i];
    return best;
}

/* One thread per output element. */
__global__ void k_maxpool_fwd(float *y, const float *x, int planes, int h, int w)
{
    const int oh = h / 2, ow = w / 2;
    const size_t total = (size_t)planes * oh * ow;
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < total;
         i += (size_t)gridDim.x * blockDim.x) {
        const int ox = (int)(i % ow), oy = (int)(i / ow % oh);
        const float *xp = x + i / ((size_t)oh * ow) * ((size_t)h * w);
        y[i] = xp[pool_arg(xp, w, oy, ox)];
    }
}

/* One thread per input element: it takes dy when it is its window's first
 * maximum, else 0 (dropped last row or column included). Every element of
 * dx is written by exactly one thread, so there is no race and no memset. */
__global__ void k_maxpool_bwd(float *dx, const float *dy, const float *x, int planes, int h,
                              int w)
{
    const int oh = h / 2, ow = w / 2;
    const size_t plane = (size_t)h * w, total = (size_t)planes * plane;
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < total;
         i += (size_t)gridDim.x * blockDim.x) {
        const size_t p = i / plane, at = i % plane;
        const int iy = (int)(at / w), ix = (int)(at % w), oy = iy / 2, ox = ix / 2;
        float v = 0.0f;
        if (oy < oh && ox < ow && pool_arg(x + p * plane, w, oy, ox) == at)
            v = dy[(p * oh + oy) * ow + ox];
        dx[i] = v;
    }
}

static void cu_maxpool_fwd(dev_state *st, float *y, const float *x, int planes, int h, int w)
{
    const size_t total = planes > 0 && h > 1 && w > 1 ? (size_t)planes * (h / 2) * (w / 2) : 0;
    if (!total)
        return;
    k_maxpool_fwd<<<grid_for(total), THREADS, 0, st->stream>>>(y, x, planes, h, w);
    LAUNCHED(st, "k_maxpool_fwd");
}

static void cu_maxpool_bwd(dev_state *st, float *dx, const float *dy, const float *x, int planes,
                           int h, int w)
{
    const size_t total = planes > 0 && h > 0 && w > 0 ? (size_t)planes * h * w : 0;
    if (!total)
        return;
    k_maxpool_bwd<<<grid_for(total), THREADS, 0, st->stream>>>(dx, dy, x, planes, h, w);
    LAUNCHED(st, "k_maxpool_bwd");
}

/* A training batch from the data set uploaded once (kernels/cuda/data.cu). */
static void cu_gather_images(dev_state *st, float *x, int32_t *y, const uint8_t *images,
                             const uint8_t *labels, const uint32_t *idx, size_t first, int batch,
                             size_t dim, float scale, float shift)
{
    note(st, ds_cuda_gather_images(st->stream, x, y, images, labels, idx, first, batch, dim,
                                   scale, shift),
         "k_gather_images");
}

/* ---- one table per device ---------------------------------------------------- */

/* The entry point of op F on device D (see the header comment). */
template <int D, auto F> struct on_device;
template <int D, typename R, typename... A, R (*F)(dev_state *, A...)>
struct on_device<D, F> {
    static R call(A... a)
    {
        dev_state *st = &g_dev[D];
        int cur = -1;
        if (cudaGetDevice(&cur) != cudaSuccess || cur != D)
            note(st, cudaSetDevice(D), "cudaSetDevice");
        return F(st, a...);
    }
};

template <int D> static void fill(ds_ops *ops)
{
    ops->alloc = on_device<D, cu_alloc>::call;
    ops->free = on_device<D, cu_free>::call;
    ops->host_alloc = on_device<D, cu_host_alloc>::call;
    ops->host_free = on_device<D, cu_host_free>::call;
    ops->upload = on_device<D, cu_upload>::call;
    ops->download = on_device<D, cu_download>::call;
    ops->copy = on_device<D, cu_copy>::call;
    ops->memzero = on_device<D, cu_memzero>::call;
    ops->sync = on_device<D, cu_sync>::call;
    ops->error = on_device<D, cu_error>::call;
    ops->gemm = on_device<D, cu_gemm>::call;
    ops->bias_add = on_device<D, cu_bias_add>::call;
    ops->bias_grad = on_device<D, cu_bias_grad>::call;
    ops->relu_fwd = on_device<D, cu_relu_fwd>::call;
    ops->relu_bwd = on_device<D, cu_relu_bwd>::call;
    ops->softmax_xent = on_device<D, cu_softmax_xent>::call;
    ops->sgd = on_device<D, cu_sgd>::call;
    ops->axpy = on_device<D, cu_axpy>::call;
    ops->scale = on_device<D, cu_scale>::call;
    ops->dot = on_device<D, cu_dot>::call;
    ops->nrm2 = on_device<D, cu_nrm2>::call;
    ops->sum = on_device<D, cu_sum>::call;
    ops->conv2d_fwd = on_device<D, cu_conv2d_fwd>::call;
    ops->conv2d_bwd = on_device<D, cu_conv2d_bwd>::call;
    ops->maxpool_fwd = on_device<D, cu_maxpool_fwd>::call;
    ops->maxpool_bwd = on_device<D, cu_maxpool_bwd>::call;
    ops->gather_images = on_device<D, cu_gather_images>::call;
}

template <size_t... I>
static constexpr std::array<void (*)(ds_ops *), sizeof...(I)> fillers(std::index_sequence<I...>)
{
    return {{fill<(int)I>...}};
}

/* g_fill[d] fills a table with device d's entry points. */
static constexpr auto g_fill = fillers(std::make_index_sequence<DS_CUDA_MAX_DEVICES>());

/* Create device d's record (d current, its stream acquired); g_lock held. */
static int state_open(dev_state *st, int d, char *why, size_t why_len)
{
    cublasStatus_t bs;
    memset(st, 0, sizeof(*st));
    st->stream = ds_cuda_device_stream(d);
    if (cublas_open(why, why_len) < 0)
        return -ENODEV;
    if ((bs = g_cublas.create(&st->blas)) != CUBLAS_STATUS_SUCCESS) {
        snprintf(why, why_len, "CUDA device %d: cublasCreate failed (status %d)", d, (int)bs);
        return -ENODEV;
    }
    if ((bs = g_cublas.set_stream(st->blas, st->stream)) != CUBLAS_STATUS_SUCCESS) {
        snprintf(why, why_len, "CUDA device %d: cublasSetStream failed (status %d)", d, (int)bs);
        goto fail_blas;
    }
    cudaError_t e;
    if ((e = cudaMalloc(&st->red, RED_DOUBLES * sizeof(double))) != cudaSuccess) {
        (void)cudaGetLastError();
        snprintf(why, why_len, "CUDA device %d: cudaMalloc of scratch failed (%s)", d,
                 cudaGetErrorString(e));
        goto fail_blas;
    }
    return 0;

fail_blas:
    g_cublas.destroy(st->blas);
    memset(st, 0, sizeof(*st));
    return -ENODEV;
}

/* Destroy device d's record after its work finished; g_lock held. Errors
 * are past caring about here: the record goes either way. */
static void state_close(dev_state *st, int d)
{
    cudaSetDevice(d);
    cudaStreamSynchronize(st->stream);
    cudaFree(st->red);
    cudaFree(st->conv);
    g_cublas.destroy(st->blas);
    memset(st, 0, sizeof(*st));
}

extern "C" int ds_ops_init_cuda(ds_ops *ops, int device, char *why, size_t why_len)
{
    /* Checks the driver, the index against the count and the limit, makes
     * the device current and gives it its stream. */
    int ret = ds_cuda_device_acquire(device, why, why_len);
    if (ret < 0)
        return ret;
    struct cudaDeviceProp prop;
    cudaError_t e = cudaGetDeviceProperties(&prop, device);
    if (e != cudaSuccess) {
        snprintf(why, why_len, "CUDA device %d unusable (%s)", device, cudaGetErrorString(e));
        ds_cuda_device_release(device);
        return -ENODEV;
    }
    pthread_mutex_lock(&g_lock);
    dev_state *st = &g_dev[device];
    if (st->refs == 0 && (ret = state_open(st, device, why, why_len)) < 0) {
        pthread_mutex_unlock(&g_lock);
        ds_cuda_device_release(device);
        return ret;
    }
    st->refs++;
    pthread_mutex_unlock(&g_lock);

    memset(ops, 0, sizeof(*ops));
    ops->kind = DS_BACKEND_CUDA;
    ops->device = device;
    snprintf(ops->name, sizeof(ops->name), "cuda:%d %.60s", device, prop.name);
    g_fill[device](ops);
    snprintf(why, why_len, "CUDA device %d: %s, %d SMs, %.1f GiB", device, prop.name,
             prop.multiProcessorCount, prop.totalGlobalMem / 1073741824.0);
    return 0;
}

extern "C" void ds_ops_fini(ds_ops *ops)
{
    if (!ops || ops->kind != DS_BACKEND_CUDA)
        return;
    const int d = ops->device;
    if (d >= 0 && d < DS_CUDA_MAX_DEVICES) {
        pthread_mutex_lock(&g_lock);
        if (g_dev[d].refs > 0 && --g_dev[d].refs == 0)
            state_close(&g_dev[d], d);
        pthread_mutex_unlock(&g_lock);
        ds_cuda_device_release(d);
    }
    /* A second fini of this table, or a late op through it, must not drop
     * another table's reference: the table is emptied. */
    memset(ops, 0, sizeof(*ops));
}
