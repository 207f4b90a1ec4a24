/*
 * kernels/cuda/cuda_ops.cu: the CUDA backend's op table.
 *
 * One process owns one device (design §1), so the stream and cuBLAS handle
 * are per process. Every compute op is queued on that stream; reductions and
 * softmax cross-entropy copy their scalar results back, which synchronizes.
 * "No driver" and "no device" are normal answers: ds_ops_init_cuda returns
 * -ENODEV with the reason and the caller uses the CPU.
 *
 * Each kernel mirrors a C reference in kernels/cpu/ref.c; tests/test_cuda.c
 * compares them on seeded random inputs and skips when no device answers.
 * Run it with: meson test -C build cuda --verbose
 */
#include <dlfcn.h>
#include <errno.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include <cublas_v2.h>
#include <cuda_runtime.h>

extern "C" {
#include "kernels/kernels.h"
}

#define THREADS 256

static cudaStream_t g_stream;
static cublasHandle_t g_blas;

/* cuBLAS is opened at run time, once a device has answered, not linked:
 * libcublasLt's static constructors cost every process 0.5-0.9 s of CPU
 * at start-up (perf: 70% of `dsnode --version` in call_init, most of it
 * libcublasLt), CPU-only machines and nodes included. The header gives the
 * types; these four are all the backend calls. */
static struct {
    void *lib;
    decltype(&cublasCreate_v2) create;
    decltype(&cublasDestroy_v2) destroy;
    decltype(&cublasSetStream_v2) set_stream;
    decltype(&cublasSgemm_v2) sgemm;
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
    if (!g_cublas.create || !g_cublas.destroy || !g_cublas.set_stream || !g_cublas.sgemm) {
        snprintf(why, why_len, "%s lacks cublasCreate_v2, cublasDestroy_v2, cublasSetStream_v2 "
                 "or cublasSgemm_v2", name);
        dlclose(lib);
        memset(&g_cublas, 0, sizeof(g_cublas));
        return -ENODEV;
    }
    g_cublas.lib = lib; /* kept open: the handle's code lives there */
    return 0;
}

static double *g_scratch;      /* device: reduction results */
static int g_ready;

/* The first failure since the backend started (a launch, a cuBLAS
 * status, an asynchronous copy or memset): ops->sync returns -EIO from
 * then on, and ops->error says what it was. Ops that return nothing record here;
 * a step that syncs (node/train/train.c) fails on it, so nothing goes on
 * computing from a fault's leftovers. */
static int g_failed;
static char g_error[160];

static void fail(const char *what, const char *why)
{
    if (g_failed)
        return;
    g_failed = 1;
    snprintf(g_error, sizeof(g_error), "%s: %s", what, why);
}

static void note(cudaError_t e, const char *what)
{
    if (e != cudaSuccess)
        fail(what, cudaGetErrorString(e));
}

/* After a kernel launch: a bad configuration or a fault already known. */
#define LAUNCHED(name) note(cudaGetLastError(), name)

static unsigned grid_for(size_t n)
{
    size_t g = (n + THREADS - 1) / THREADS;
    if (g > 65535 * 8)
        g = 65535 * 8;
    return g ? (unsigned)g : 1;
}

/* ---- memory ---------------------------------------------------------------- */

static void *cu_alloc(size_t bytes)
{
    void *p = NULL;
    size_t rounded = (bytes + 63) & ~(size_t)63;
    if (!rounded)
        rounded = 64;
    if (cudaMalloc(&p, rounded) != cudaSuccess)
        return NULL;
    /* On the ops' stream, not the legacy one, and finished before use. */
    if (cudaMemsetAsync(p, 0, rounded, g_stream) != cudaSuccess ||
        cudaStreamSynchronize(g_stream) != cudaSuccess) {
        cudaFree(p);
        return NULL;
    }
    return p;
}

static void cu_free(void *p)
{
    if (p)
        cudaFree(p);
}

/* 0, or -EIO with the failure kept for sync and error. */
static int cu_check(cudaError_t e, const char *what)
{
    note(e, what);
    return e == cudaSuccess ? 0 : -EIO;
}

static int cu_upload(void *dst, const void *src, size_t bytes)
{
    int ret = cu_check(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, g_stream),
                       "upload");
    return ret ? ret : cu_check(cudaStreamSynchronize(g_stream), "upload");
}

static int cu_download(void *dst, const void *src, size_t bytes)
{
    int ret = cu_check(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, g_stream),
                       "download");
    return ret ? ret : cu_check(cudaStreamSynchronize(g_stream), "download");
}

static int cu_copy(void *dst, const void *src, size_t bytes)
{
    return cu_check(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, g_stream), "copy");
}

static int cu_memzero(void *dst, size_t bytes)
{
    return cu_check(cudaMemsetAsync(dst, 0, bytes, g_stream), "memzero");
}

/* Waits for the stream; -EIO when it or anything since the last sync
 * failed (the failure stays: a device fault is not cleared by a sync). */
static int cu_sync(void)
{
    note(cudaStreamSynchronize(g_stream), "sync");
    return g_failed ? -EIO : 0;
}

static const char *cu_error(void) { return g_failed ? g_error : NULL; }

/* ---- GEMM: row-major on top of column-major cuBLAS ------------------------- */

/* A row-major matrix seen column-major is its transpose, so C = op(A) op(B)
 * (row-major) is C^T = op(B)^T op(A)^T (column-major): swap the operands. */
static void cu_gemm(int trans_a, int trans_b, int m, int n, int k, float alpha,
                    const float *a, int lda, const float *b, int ldb, float beta,
                    float *c, int ldc)
{
    const cublasStatus_t st =
        g_cublas.sgemm(g_blas, trans_b ? CUBLAS_OP_T : CUBLAS_OP_N,
                       trans_a ? CUBLAS_OP_T : CUBLAS_OP_N, n, m, k, &alpha, b, ldb, a, lda,
                       &beta, c, ldc);
    if (st != CUBLAS_STATUS_SUCCESS) {
        char why[32];
        snprintf(why, sizeof(why), "cuBLAS status %d", (int)st);
        fail("cublasSgemm", why);
    }
}

/* ---- elementwise ------------------------------------------------------------ */

__global__ void k_bias_add(float *y, const float *bias, int rows, int cols)
{
    size_t total = (size_t)rows * cols;
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < total;
         i += (size_t)gridDim.x * blockDim.x)
        y[i] += bias[i % cols];
}

static void cu_bias_add(float *y, const float *bias, int rows, int cols)
{
    k_bias_add<<<grid_for((size_t)rows * cols), THREADS, 0, g_stream>>>(y, bias, rows, cols);
    LAUNCHED("k_bias_add");
}

__global__ void k_bias_grad(float *db, const float *dy, int rows, int cols)
{
    for (int c = blockIdx.x * blockDim.x + threadIdx.x; c < cols; c += gridDim.x * blockDim.x) {
        double s = 0;
        for (int r = 0; r < rows; r++)
            s += dy[(size_t)r * cols + c];
        db[c] = (float)s;
    }
}

static void cu_bias_grad(float *db, const float *dy, int rows, int cols)
{
    k_bias_grad<<<grid_for((size_t)cols), THREADS, 0, g_stream>>>(db, dy, rows, cols);
    LAUNCHED("k_bias_grad");
}

__global__ void k_relu_fwd(float *y, const float *x, size_t n)
{
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x)
        y[i] = x[i] > 0.0f ? x[i] : 0.0f;
}

static void cu_relu_fwd(float *y, const float *x, size_t n)
{
    k_relu_fwd<<<grid_for(n), THREADS, 0, g_stream>>>(y, x, n);
    LAUNCHED("k_relu_fwd");
}

__global__ void k_relu_bwd(float *dx, const float *dy, const float *y, size_t n)
{
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x)
        dx[i] = y[i] > 0.0f ? dy[i] : 0.0f;
}

static void cu_relu_bwd(float *dx, const float *dy, const float *y, size_t n)
{
    k_relu_bwd<<<grid_for(n), THREADS, 0, g_stream>>>(dx, dy, y, n);
    LAUNCHED("k_relu_bwd");
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

static void cu_sgd(float *theta, float *mom, const float *grad, size_t n, const ds_sgd_params *p)
{
    k_sgd<<<grid_for(n), THREADS, 0, g_stream>>>(theta, mom, grad, n, p->lr, p->momentum,
                                                 p->weight_decay, p->nesterov);
    LAUNCHED("k_sgd");
}

__global__ void k_axpy(size_t n, float a, const float *x, float *y)
{
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x)
        y[i] += a * x[i];
}

static void cu_axpy(size_t n, float a, const float *x, float *y)
{
    k_axpy<<<grid_for(n), THREADS, 0, g_stream>>>(n, a, x, y);
    LAUNCHED("k_axpy");
}

__global__ void k_scale(size_t n, float a, float *x)
{
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x)
        x[i] *= a;
}

static void cu_scale(size_t n, float a, float *x)
{
    k_scale<<<grid_for(n), THREADS, 0, g_stream>>>(n, a, x);
    LAUNCHED("k_scale");
}

/* ---- reductions: grid-stride partial sums in double, block tree, one
 * atomicAdd per block into g_scratch[slot] ---------------------------------- */

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
    part[threadIdx.x] = s;
    __syncthreads();
    for (int w = THREADS / 2; w > 0; w >>= 1) {
        if ((int)threadIdx.x < w)
            part[threadIdx.x] += part[threadIdx.x + w];
        __syncthreads();
    }
    if (threadIdx.x == 0)
        atomicAdd(out, part[0]);
}

static double cu_reduce(int kind, size_t n, const float *x, const float *y)
{
    double h = 0;
    unsigned g = grid_for(n);
    if (g > 1024)
        g = 1024;
    note(cudaMemsetAsync(g_scratch, 0, sizeof(double), g_stream), "reduce");
    k_reduce<<<g, THREADS, 0, g_stream>>>(kind, n, x, y, g_scratch);
    LAUNCHED("k_reduce");
    /* A failed reduction is NaN, never a zero that looks valid. */
    if (cu_download(&h, g_scratch, sizeof(h)) < 0 || g_failed)
        return NAN;
    return h;
}

static double cu_dot(size_t n, const float *x, const float *y) { return cu_reduce(RED_DOT, n, x, y); }
static double cu_nrm2(size_t n, const float *x) { return sqrt(cu_reduce(RED_SQ, n, x, x)); }
static double cu_sum(size_t n, const float *x) { return cu_reduce(RED_SUM, n, x, x); }

/* ---- softmax cross-entropy: one thread per row ------------------------------ */

__global__ void k_softmax_xent(float *dlogits, const float *logits, const int32_t *labels,
                               int rows, int cols, double *out)
{
    __shared__ double part_loss[THREADS];
    __shared__ double part_good[THREADS];
    double loss = 0, good = 0;
    const float inv_rows = 1.0f / (float)rows;
    for (int r = blockIdx.x * blockDim.x + threadIdx.x; r < rows; r += gridDim.x * blockDim.x) {
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
    part_loss[threadIdx.x] = loss;
    part_good[threadIdx.x] = good;
    __syncthreads();
    for (int w = THREADS / 2; w > 0; w >>= 1) {
        if ((int)threadIdx.x < w) {
            part_loss[threadIdx.x] += part_loss[threadIdx.x + w];
            part_good[threadIdx.x] += part_good[threadIdx.x + w];
        }
        __syncthreads();
    }
    if (threadIdx.x == 0) {
        atomicAdd(&out[0], part_loss[0]);
        atomicAdd(&out[1], part_good[0]);
    }
}

static void cu_softmax_xent(float *dlogits, const float *logits, const int32_t *labels,
                            int rows, int cols, double *loss_sum, int64_t *correct)
{
    double h[2] = {0, 0};
    unsigned g = grid_for((size_t)rows);
    if (g > 256)
        g = 256;
    note(cudaMemsetAsync(g_scratch, 0, 2 * sizeof(double), g_stream), "softmax_xent");
    k_softmax_xent<<<g, THREADS, 0, g_stream>>>(dlogits, logits, labels, rows, cols, g_scratch);
    LAUNCHED("k_softmax_xent");
    if (cu_download(h, g_scratch, sizeof(h)) < 0 || g_failed)
        h[0] = h[1] = NAN; /* never a loss of 0 that looks valid */
    *loss_sum = h[0];
    *correct = isnan(h[1]) ? -1 : (int64_t)(h[1] + 0.5);
}

/* ---- init -------------------------------------------------------------------- */

extern "C" int ds_ops_init_cuda(ds_ops *ops, int device, char *why, size_t why_len)
{
    int count = 0;
    cudaError_t e = cudaGetDeviceCount(&count);
    if (e != cudaSuccess) {
        snprintf(why, why_len, "no CUDA driver or device (%s)", cudaGetErrorString(e));
        return -ENODEV;
    }
    if (device >= count) {
        snprintf(why, why_len, "CUDA device %d asked for, %d present", device, count);
        return -ENODEV;
    }
    struct cudaDeviceProp prop;
    if ((e = cudaSetDevice(device)) != cudaSuccess ||
        (e = cudaGetDeviceProperties(&prop, device)) != cudaSuccess) {
        snprintf(why, why_len, "CUDA device %d unusable (%s)", device, cudaGetErrorString(e));
        return -ENODEV;
    }
    if (!g_ready) {
        if (cudaStreamCreateWithFlags(&g_stream, cudaStreamNonBlocking) != cudaSuccess) {
            snprintf(why, why_len, "cudaStreamCreate failed");
            return -ENODEV;
        }
        if (cublas_open(why, why_len) < 0)
            goto fail_stream;
        if (g_cublas.create(&g_blas) != CUBLAS_STATUS_SUCCESS) {
            snprintf(why, why_len, "cublasCreate failed");
            goto fail_stream;
        }
        g_cublas.set_stream(g_blas, g_stream);
        if (cudaMalloc(&g_scratch, 4 * sizeof(double)) != cudaSuccess) {
            snprintf(why, why_len, "cudaMalloc of scratch failed");
            goto fail_blas;
        }
        g_ready = 1;
    }

    memset(ops, 0, sizeof(*ops));
    ops->kind = DS_BACKEND_CUDA;
    snprintf(ops->name, sizeof(ops->name), "cuda:%d %.60s", device, prop.name);
    ops->alloc = cu_alloc;
    ops->free = cu_free;
    ops->upload = cu_upload;
    ops->download = cu_download;
    ops->copy = cu_copy;
    ops->memzero = cu_memzero;
    ops->sync = cu_sync;
    ops->error = cu_error;
    ops->gemm = cu_gemm;
    ops->bias_add = cu_bias_add;
    ops->bias_grad = cu_bias_grad;
    ops->relu_fwd = cu_relu_fwd;
    ops->relu_bwd = cu_relu_bwd;
    ops->softmax_xent = cu_softmax_xent;
    ops->sgd = cu_sgd;
    ops->axpy = cu_axpy;
    ops->scale = cu_scale;
    ops->dot = cu_dot;
    ops->nrm2 = cu_nrm2;
    ops->sum = cu_sum;
    snprintf(why, why_len, "CUDA device %d: %s, %d SMs, %.1f GiB", device, prop.name,
             prop.multiProcessorCount, prop.totalGlobalMem / 1073741824.0);
    return 0;

fail_blas:
    g_cublas.destroy(g_blas);
fail_stream:
    cudaStreamDestroy(g_stream);
    return -ENODEV;
}

extern "C" void ds_ops_fini(ds_ops *ops)
{
    if (ops && ops->kind == DS_BACKEND_CUDA && g_ready) {
        cudaStreamSynchronize(g_stream);
        cudaFree(g_scratch);
        g_cublas.destroy(g_blas);
        cudaStreamDestroy(g_stream);
        g_scratch = NULL;
        g_ready = 0;
    }
}
