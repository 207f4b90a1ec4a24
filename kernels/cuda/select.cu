/*
 * kernels/cuda/select.cu: CUDA versions of the selection kernels that a
 * sparsifier runs on device memory: threshold count, threshold compaction,
 * gather, scatter-add and zeroing at an index set (see kernels/select.h for
 * what each computes; kernels/cpu/select_ref.c is the reference).
 *
 * Compaction keeps the indices sorted, so it is a stable stream compaction
 * in three launches over tiles of SEL_TILE elements:
 *   1. k_sel_tally: each block counts, per tile, the entries it keeps (and,
 *      for the whole vector, the entries over the count threshold and the
 *      non-finite ones, one atomicAdd per block);
 *   2. k_sel_scan: one block turns the per-tile counts into exclusive
 *      offsets (a block scan over chunks of 1024 tiles with a carry);
 *   3. k_sel_compact: each block walks its tile in slices of SEL_THREADS
 *      consecutive elements; a warp ballot gives each kept lane its rank in
 *      its warp, the warps' counts in shared memory give the warp's offset,
 *      and the lane writes at tile offset + slice offset + rank. Loads and
 *      stores of one slice are coalesced.
 * The vector is read twice (tally, compact); the kept count is known only
 * after the first pass, which is what makes the output order exact.
 *
 * Streams and state. Every kernel is queued on the device's one stream
 * (kernels/cuda/device.h), the stream the training op table uses too, so
 * selection is ordered after the training ops that produced its input and
 * before whatever reads its output, with no host synchronisation between
 * them. Count and compact copy their tally to the host and so return
 * synchronized; gather, scatter_add and zero_at are queued, and ops->sync()
 * waits for them and reports the first error since the last sync.
 *
 * The scratch (the tally, the per-tile offsets) and the sticky error are
 * per device, in g_sel[device]. The table's function pointers carry no
 * context, so each table is filled with functions bound to its device at
 * compile time (the template on<D> below, one instantiation per device
 * index): a table for device 1 always works on device 1's stream and
 * scratch, whichever device the calling thread has current. One device's
 * kernels share its scratch, so they are called from one thread at a time.
 * No driver and no device are normal answers: ds_select_ops_init_cuda
 * returns -ENODEV with the reason.
 *
 * Test: meson test -C build select_cuda --verbose (skips without a device).
 */
#include <errno.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include <cuda_runtime.h>

#include "kernels/cuda/device.h"
extern "C" {
#include "kernels/select.h"
}

#define SEL_THREADS 256
#define SEL_WARPS (SEL_THREADS / 32)
#define SEL_ITEMS 16
#define SEL_TILE (SEL_THREADS * SEL_ITEMS)
#define SEL_SCAN_THREADS 1024
#define SEL_MAX_GRID 65535u

/* What the selection kernels keep per device. */
typedef struct sel_dev {
    int refs;                       /* tables handed out, not yet given to fini */
    cudaStream_t stream;            /* the device's shared stream (device.h) */
    unsigned long long *tally;      /* device: kept, counted, nonfinite */
    unsigned long long *tile_off;   /* device: per-tile counts, then offsets */
    size_t tile_cap;
    cudaError_t err;                /* first error since the last sync */
} sel_dev;

/* g_lock guards refs (init and fini may come from any thread); the rest of
 * an entry belongs to the thread calling that device's kernels. */
static pthread_mutex_t g_lock = PTHREAD_MUTEX_INITIALIZER;
static sel_dev g_sel[DS_CUDA_MAX_DEVICES];

static void note(sel_dev *d, cudaError_t e)
{
    if (e != cudaSuccess && d->err == cudaSuccess)
        d->err = e;
}

__device__ __forceinline__ uint32_t dkey(float x)
{
    return __float_as_uint(x) & 0x7fffffffu;
}

__device__ __forceinline__ unsigned warp_sum(unsigned x)
{
    for (int o = 16; o > 0; o >>= 1)
        x += __shfl_down_sync(0xffffffffu, x, o);
    return x;
}

/* Sum over the block; every thread must call it; thread 0 gets the sum. */
__device__ unsigned block_sum(unsigned x, unsigned *shared)
{
    const unsigned lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    x = warp_sum(x);
    if (lane == 0)
        shared[warp] = x;
    __syncthreads();
    unsigned s = 0;
    if (threadIdx.x == 0)
        for (int w = 0; w < SEL_WARPS; w++)
            s += shared[w];
    __syncthreads();
    return s;
}

__global__ void k_sel_tally(const float *v, size_t n, uint32_t t_keep, uint32_t t_count,
                            unsigned long long *tile_kept, unsigned long long *tally)
{
    __shared__ unsigned part[SEL_WARPS];
    unsigned long long tot_counted = 0, tot_nonfinite = 0, tot_kept = 0;
    const size_t tiles = (n + SEL_TILE - 1) / SEL_TILE;
    /* The tile loop's bounds depend on blockIdx only, so every thread of
     * the block takes part in each block_sum. */
    for (size_t tile = blockIdx.x; tile < tiles; tile += gridDim.x) {
        const size_t start = tile * SEL_TILE;
        unsigned kept = 0, counted = 0, nonfinite = 0;
        for (int j = 0; j < SEL_ITEMS; j++) {
            const size_t i = start + (size_t)j * SEL_THREADS + threadIdx.x;
            if (i < n) {
                const uint32_t k = dkey(v[i]);
                const bool fin = k < DS_SEL_KEY_INF;
                kept += fin && k >= t_keep;
                counted += fin && k >= t_count;
                nonfinite += !fin;
            }
        }
        const unsigned bk = block_sum(kept, part);
        if (threadIdx.x == 0 && tile_kept)
            tile_kept[tile] = bk;
        tot_kept += kept;
        tot_counted += counted;
        tot_nonfinite += nonfinite;
    }
    /* Per-thread totals fit in 32 bits only per tile; reduce in 64 bits. */
    for (int o = 16; o > 0; o >>= 1) {
        tot_kept += __shfl_down_sync(0xffffffffu, tot_kept, o);
        tot_counted += __shfl_down_sync(0xffffffffu, tot_counted, o);
        tot_nonfinite += __shfl_down_sync(0xffffffffu, tot_nonfinite, o);
    }
    if ((threadIdx.x & 31) == 0) {
        atomicAdd(&tally[0], tot_kept);
        atomicAdd(&tally[1], tot_counted);
        atomicAdd(&tally[2], tot_nonfinite);
    }
}

/* Exclusive prefix sum of a[0..m) in place, one block of SEL_SCAN_THREADS. */
__global__ void k_sel_scan(unsigned long long *a, size_t m)
{
    __shared__ unsigned long long warp_tot[SEL_SCAN_THREADS / 32];
    __shared__ unsigned long long carry;
    const unsigned lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    if (threadIdx.x == 0)
        carry = 0;
    __syncthreads();
    for (size_t base = 0; base < m; base += SEL_SCAN_THREADS) {
        const size_t i = base + threadIdx.x;
        const unsigned long long x = i < m ? a[i] : 0;
        /* Inclusive scan inside the warp. */
        unsigned long long s = x;
        for (int o = 1; o < 32; o <<= 1) {
            const unsigned long long y = __shfl_up_sync(0xffffffffu, s, o);
            if ((int)lane >= o)
                s += y;
        }
        if (lane == 31)
            warp_tot[warp] = s;
        __syncthreads();
        if (warp == 0) {
            const unsigned long long w = lane < SEL_SCAN_THREADS / 32 ? warp_tot[lane] : 0;
            unsigned long long ws = w;
            for (int o = 1; o < 32; o <<= 1) {
                const unsigned long long y = __shfl_up_sync(0xffffffffu, ws, o);
                if ((int)lane >= o)
                    ws += y;
            }
            if (lane < SEL_SCAN_THREADS / 32)
                warp_tot[lane] = ws - w; /* exclusive offset of each warp */
        }
        __syncthreads();
        const unsigned long long c = carry;
        if (i < m)
            a[i] = c + warp_tot[warp] + s - x;
        __syncthreads();
        if (threadIdx.x == SEL_SCAN_THREADS - 1)
            carry = c + warp_tot[warp] + s;
        __syncthreads();
    }
}

__global__ void k_sel_compact(const float *v, size_t n, uint32_t t_keep, uint32_t base,
                              const unsigned long long *tile_off, uint32_t *idx, float *val,
                              size_t cap)
{
    __shared__ unsigned warp_cnt[SEL_WARPS];
    const unsigned lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const size_t tiles = (n + SEL_TILE - 1) / SEL_TILE;
    for (size_t tile = blockIdx.x; tile < tiles; tile += gridDim.x) {
        const size_t start = tile * SEL_TILE;
        unsigned long long out = tile_off[tile];
        for (int j = 0; j < SEL_ITEMS; j++) {
            const size_t i = start + (size_t)j * SEL_THREADS + threadIdx.x;
            const float x = i < n ? v[i] : 0.0f;
            const uint32_t k = dkey(x);
            const bool keep = i < n && k < DS_SEL_KEY_INF && k >= t_keep;
            const unsigned ballot = __ballot_sync(0xffffffffu, keep);
            if (lane == 0)
                warp_cnt[warp] = __popc(ballot);
            __syncthreads();
            unsigned before = 0, total = 0;
            for (int w = 0; w < SEL_WARPS; w++) {
                before += w < (int)warp ? warp_cnt[w] : 0;
                total += warp_cnt[w];
            }
            if (keep) {
                const unsigned long long pos = out + before + __popc(ballot & ((1u << lane) - 1u));
                if (pos < cap) {
                    idx[pos] = base + (uint32_t)i;
                    val[pos] = x;
                }
            }
            out += total;
            __syncthreads(); /* warp_cnt is rewritten by the next slice */
        }
    }
}

__global__ void k_sel_gather(float *out, const float *v, const uint32_t *idx, size_t count)
{
    for (size_t j = blockIdx.x * (size_t)blockDim.x + threadIdx.x; j < count;
         j += (size_t)gridDim.x * blockDim.x)
        out[j] = v[idx[j]];
}

__global__ void k_sel_scatter_add(float *y, const uint32_t *idx, const float *val, size_t count,
                                  float w)
{
    /* Indices are unique: no two threads touch one element. The explicit
     * round-to-nearest intrinsics keep nvcc from fusing a multiply-add, so
     * the result has the same bits as the C reference. */
    for (size_t j = blockIdx.x * (size_t)blockDim.x + threadIdx.x; j < count;
         j += (size_t)gridDim.x * blockDim.x) {
        const uint32_t i = idx[j];
        y[i] = __fadd_rn(y[i], __fmul_rn(w, val[j]));
    }
}

__global__ void k_sel_zero_at(float *y, const uint32_t *idx, size_t count)
{
    for (size_t j = blockIdx.x * (size_t)blockDim.x + threadIdx.x; j < count;
         j += (size_t)gridDim.x * blockDim.x)
        y[idx[j]] = 0.0f;
}

static unsigned grid_tiles(size_t n)
{
    const size_t tiles = (n + SEL_TILE - 1) / SEL_TILE;
    return tiles == 0 ? 1u : tiles > SEL_MAX_GRID ? SEL_MAX_GRID : (unsigned)tiles;
}

static unsigned grid_elems(size_t n)
{
    const size_t g = (n + SEL_THREADS - 1) / SEL_THREADS;
    return g == 0 ? 1u : g > SEL_MAX_GRID ? SEL_MAX_GRID : (unsigned)g;
}

/* Copy the device tally to *out; on any error *out is zero and the error is
 * kept for the next sync. */
static void fetch_tally(sel_dev *d, ds_sel_tally *out)
{
    unsigned long long h[3] = {0, 0, 0};
    cudaError_t e = cudaMemcpyAsync(h, d->tally, sizeof(h), cudaMemcpyDeviceToHost, d->stream);
    if (e == cudaSuccess)
        e = cudaStreamSynchronize(d->stream);
    if (e == cudaSuccess)
        e = cudaGetLastError();
    note(d, e);
    if (e != cudaSuccess)
        h[0] = h[1] = h[2] = 0;
    out->kept = (size_t)h[0];
    out->counted = (size_t)h[1];
    out->nonfinite = (size_t)h[2];
}

/* Grow a device buffer of `elem`-byte entries to hold `need`; what it held
 * is not kept. 0, or -1 with the error noted. */
static int grow(sel_dev *d, void **p, size_t *cap, size_t need, size_t elem)
{
    if (need <= *cap)
        return 0;
    void *q = NULL;
    const cudaError_t e = cudaMalloc(&q, need * elem);
    if (e != cudaSuccess) {
        note(d, e);
        return -1;
    }
    /* cudaFree waits for the kernels still reading the old buffer. */
    cudaFree(*p);
    *p = q;
    *cap = need;
    return 0;
}

static void sel_count(sel_dev *d, const float *v, size_t n, uint32_t t, ds_sel_tally *out)
{
    memset(out, 0, sizeof(*out));
    if (n == 0)
        return;
    note(d, cudaMemsetAsync(d->tally, 0, 3 * sizeof(unsigned long long), d->stream));
    k_sel_tally<<<grid_tiles(n), SEL_THREADS, 0, d->stream>>>(v, n, t, t, NULL, d->tally);
    fetch_tally(d, out);
    out->kept = 0;
}

static void sel_compact(sel_dev *d, const float *v, size_t n, uint32_t t_keep, uint32_t t_count,
                        uint32_t base, uint32_t *idx, float *val, size_t cap, ds_sel_tally *out)
{
    memset(out, 0, sizeof(*out));
    if (n == 0)
        return;
    const size_t tiles = (n + SEL_TILE - 1) / SEL_TILE;
    if (grow(d, (void **)&d->tile_off, &d->tile_cap, tiles, sizeof(*d->tile_off)) < 0)
        return;
    note(d, cudaMemsetAsync(d->tally, 0, 3 * sizeof(unsigned long long), d->stream));
    k_sel_tally<<<grid_tiles(n), SEL_THREADS, 0, d->stream>>>(v, n, t_keep, t_count, d->tile_off,
                                                              d->tally);
    k_sel_scan<<<1, SEL_SCAN_THREADS, 0, d->stream>>>(d->tile_off, tiles);
    k_sel_compact<<<grid_tiles(n), SEL_THREADS, 0, d->stream>>>(v, n, t_keep, base, d->tile_off,
                                                                idx, val, cap);
    fetch_tally(d, out);
}

static void sel_gather(sel_dev *d, float *out, const float *v, const uint32_t *idx, size_t count)
{
    if (count)
        k_sel_gather<<<grid_elems(count), SEL_THREADS, 0, d->stream>>>(out, v, idx, count);
    note(d, cudaGetLastError());
}

static void sel_scatter_add(sel_dev *d, float *y, const uint32_t *idx, const float *val,
                            size_t count, float w)
{
    if (count)
        k_sel_scatter_add<<<grid_elems(count), SEL_THREADS, 0, d->stream>>>(y, idx, val, count, w);
    note(d, cudaGetLastError());
}

static void sel_zero_at(sel_dev *d, float *y, const uint32_t *idx, size_t count)
{
    if (count)
        k_sel_zero_at<<<grid_elems(count), SEL_THREADS, 0, d->stream>>>(y, idx, count);
    note(d, cudaGetLastError());
}

static int sel_sync(sel_dev *d)
{
    note(d, cudaStreamSynchronize(d->stream));
    note(d, cudaGetLastError());
    const cudaError_t e = d->err;
    d->err = cudaSuccess;
    return e == cudaSuccess ? 0 : -EIO;
}

/* The state of `device`, made current for the calling thread first: a
 * launch goes to the current device, and the stream belongs to this one. */
static sel_dev *enter(int device)
{
    sel_dev *d = &g_sel[device];
    int cur = -1;
    if (cudaGetDevice(&cur) != cudaSuccess || cur != device)
        note(d, cudaSetDevice(device));
    return d;
}

/* The table's entries for device D. */
template <int D> struct on {
    static DS_DECL_SEL_COUNT(count)
    {
        sel_count(enter(D), v, n, t, out);
    }
    static DS_DECL_SEL_COMPACT(compact)
    {
        sel_compact(enter(D), v, n, t_keep, t_count, base, idx, val, cap, out);
    }
    static DS_DECL_SEL_GATHER(gather)
    {
        sel_gather(enter(D), out, v, idx, count);
    }
    static DS_DECL_SEL_SCATTER_ADD(scatter_add)
    {
        sel_scatter_add(enter(D), y, idx, val, count, w);
    }
    static DS_DECL_SEL_ZERO_AT(zero_at)
    {
        sel_zero_at(enter(D), y, idx, count);
    }
    static int sync(void)
    {
        return sel_sync(enter(D));
    }
    static void bind(ds_select_ops *ops)
    {
        ops->count = count;
        ops->compact = compact;
        ops->gather = gather;
        ops->scatter_add = scatter_add;
        ops->zero_at = zero_at;
        ops->sync = sync;
    }
};

static_assert(DS_CUDA_MAX_DEVICES == 16, "g_bind lists one binder per device index");
static void (*const g_bind[DS_CUDA_MAX_DEVICES])(ds_select_ops *) = {
    on<0>::bind,  on<1>::bind,  on<2>::bind,  on<3>::bind,  on<4>::bind,  on<5>::bind,
    on<6>::bind,  on<7>::bind,  on<8>::bind,  on<9>::bind,  on<10>::bind, on<11>::bind,
    on<12>::bind, on<13>::bind, on<14>::bind, on<15>::bind,
};

/* First reference to `device`: its scratch. The device is current and its
 * stream acquired. 0 or -ENODEV with the reason. */
static int dev_open(sel_dev *d, int device, char *why, size_t why_len)
{
    const cudaError_t e = cudaMalloc(&d->tally, 3 * sizeof(unsigned long long));
    if (e != cudaSuccess) {
        snprintf(why, why_len, "CUDA device %d: cudaMalloc of the tally failed (%s)", device,
                 cudaGetErrorString(e));
        d->tally = NULL;
        return -ENODEV;
    }
    d->stream = ds_cuda_device_stream(device);
    d->err = cudaSuccess;
    return 0;
}

/* Last reference gone: wait for what is queued, free the scratch. */
static void dev_close(sel_dev *d, int device)
{
    int cur = -1;
    const int have_cur = cudaGetDevice(&cur) == cudaSuccess;
    if (cudaSetDevice(device) == cudaSuccess) {
        cudaStreamSynchronize(d->stream);
        cudaFree(d->tile_off);
        cudaFree(d->tally);
    }
    memset(d, 0, sizeof(*d));
    if (have_cur && cur != device)
        cudaSetDevice(cur);
}

extern "C" int ds_select_cuda_available(int device, char *why, size_t why_len)
{
    int count = 0;
    cudaError_t e = cudaGetDeviceCount(&count);
    if (e != cudaSuccess) {
        snprintf(why, why_len, "no CUDA driver or device (%s)", cudaGetErrorString(e));
        return 0;
    }
    if (device < 0 || device >= count) {
        snprintf(why, why_len, "CUDA device %d asked for, %d present", device, count);
        return 0;
    }
    snprintf(why, why_len, "CUDA device %d of %d answers", device, count);
    return 1;
}

extern "C" int ds_select_ops_init_cuda(ds_select_ops *ops, int device, char *why, size_t why_len)
{
    if (!ds_select_cuda_available(device, why, why_len))
        return -ENODEV;
    /* The device's shared stream; this also checks the index against
     * DS_CUDA_MAX_DEVICES and makes the device current. */
    int ret = ds_cuda_device_acquire(device, why, why_len);
    if (ret < 0)
        return ret;
    struct cudaDeviceProp prop;
    const cudaError_t e = cudaGetDeviceProperties(&prop, device);
    if (e != cudaSuccess) {
        snprintf(why, why_len, "CUDA device %d unusable (%s)", device, cudaGetErrorString(e));
        ds_cuda_device_release(device);
        return -ENODEV;
    }
    pthread_mutex_lock(&g_lock);
    sel_dev *d = &g_sel[device];
    ret = d->refs ? 0 : dev_open(d, device, why, why_len);
    if (ret == 0)
        d->refs++;
    pthread_mutex_unlock(&g_lock);
    if (ret < 0) {
        ds_cuda_device_release(device);
        return ret;
    }
    memset(ops, 0, sizeof(*ops));
    ops->kind = DS_BACKEND_CUDA;
    ops->device = device;
    snprintf(ops->name, sizeof(ops->name), "select-cuda:%d %.70s", device, prop.name);
    g_bind[device](ops);
    snprintf(why, why_len, "CUDA device %d: %s", device, prop.name);
    return 0;
}

extern "C" void ds_select_cuda_fini(ds_select_ops *ops)
{
    if (!ops || ops->kind != DS_BACKEND_CUDA || ops->device < 0 ||
        ops->device >= DS_CUDA_MAX_DEVICES)
        return;
    const int device = ops->device;
    int had = 0;
    pthread_mutex_lock(&g_lock);
    sel_dev *d = &g_sel[device];
    if (d->refs > 0) {
        had = 1;
        if (--d->refs == 0)
            dev_close(d, device);
    }
    pthread_mutex_unlock(&g_lock);
    if (had)
        ds_cuda_device_release(device);
    memset(ops, 0, sizeof(*ops));
    ops->device = -1;
}
