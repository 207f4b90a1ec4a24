/*
 * kernels/cuda/select.cu: the CUDA selection table, every kernel family of
 * kernels/select.h on device memory: threshold count and compaction, list
 * filtering (with a quota on ties, for top-k), the magnitude histogram and
 * the sub-histograms that refine it, per-unit L2 norms, the sampled mean
 * |v|, gather, scatter-add, zeroing at an index set and residual += g, and
 * the table's memory functions (kernels/cpu/select_ref.c is the reference
 * each kernel is tested against).
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
 * Filtering a list is the same three steps over the list's values
 * (k_list_tally, k_sel_scan, k_list_compact), into scratch and copied back,
 * because blocks run in any order and an in-place write could land on a
 * tile another block has not read yet.
 *
 * Exactness. Counts, lists and the histograms are integers and come out
 * equal to the reference. A histogram adds per-block shared-memory
 * counts into the global one with integer atomics, whose order does not
 * matter. The norms are sums of doubles, whose order does: each unit is
 * cut into SEL_NORM_PARTS interleaved parts by a fixed rule, each part
 * summed by one block (per-thread sums, then a fixed tree), and the parts
 * added in order by one thread, so a unit's norm depends on its entries
 * only, never on scheduling, and is the same bits on every run and device
 * of one architecture; it differs from the sequential C sum in the last
 * bits only (every square is exact in double; only the additions round, in
 * a different order), the same latitude the AVX variants have. The mean
 * |v| at a few hundred positions gathers them in parallel and adds them on
 * one thread in the reference's order: the same bits as the reference.
 *
 * Streams and state. Every kernel is queued on the device's one stream
 * (kernels/cuda/device.h), shared by every CUDA table of the process, so
 * selection is ordered with whatever else is queued on the device (the
 * training table's ops, once cuda_ops.cu is on that stream too) with no
 * host synchronisation between them. The kernels that return a result on
 * the host (count, compact, filter, filter_ties, hist, hist_sub, norms,
 * absmean_at) copy it back and so return synchronized, as do upload and
 * download; gather, scatter_add, zero_at and accumulate are queued, and
 * ops->sync() waits for them and reports the first error since the last
 * sync. A kernel whose launch or scratch allocation failed returns zeros
 * and leaves the error for ops->sync().
 *
 * The scratch (tally, per-tile offsets, histogram, list and norm buffers)
 * and the sticky error are per device, in g_sel[device]. The table's
 * function pointers carry no context, so each table is filled with
 * functions bound to its device at compile time (the template on<D> below,
 * one instantiation per device index): a table for device 1 always works
 * on device 1's stream and scratch, whichever device the calling thread
 * has current. One device's kernels share its scratch, so they are called
 * from one thread at a time.
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
#define SEL_NORM_PARTS 64        /* blocks per unit for the norms */

/* What the selection kernels keep per device. */
typedef struct sel_dev {
    int refs;                       /* tables handed out, not yet given to fini */
    cudaStream_t stream;            /* the device's shared stream (device.h) */
    int sms;                        /* multiprocessors: sizes the histogram grid */
    unsigned long long *tally;      /* device: kept, counted, nonfinite */
    unsigned long long *tile_off;   /* device: per-tile counts, then offsets */
    unsigned long long *tile_eq;    /* device: filter's per-tile ties, then offsets */
    size_t tile_cap, tile_eq_cap;
    unsigned *hist;                 /* device: DS_SEL_HIST_BUCKETS counts */
    uint32_t *lst_idx;              /* device: filter's output before the copy back */
    float *lst_val;
    size_t lst_idx_cap, lst_val_cap;
    double *norm;                   /* device: per-unit parts, then the norms */
    size_t norm_cap;
    uint32_t *pos;                  /* device: absmean_at's positions */
    size_t pos_cap;
    double *mean;                   /* device: absmean_at's sum and count */
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

/* Rank of this thread's flag among the block's set flags (threads in
 * order), and their number in *total. Every thread of the block calls it;
 * warp_cnt is SEL_WARPS shared words, free again on return. */
__device__ unsigned block_rank(bool flag, unsigned *warp_cnt, unsigned *total)
{
    const unsigned lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const unsigned ballot = __ballot_sync(0xffffffffu, flag);
    if (lane == 0)
        warp_cnt[warp] = __popc(ballot);
    __syncthreads();
    unsigned before = 0, tot = 0;
    for (int w = 0; w < SEL_WARPS; w++) {
        before += w < (int)warp ? warp_cnt[w] : 0;
        tot += warp_cnt[w];
    }
    __syncthreads(); /* warp_cnt is rewritten by the next call */
    *total = tot;
    return before + __popc(ballot & ((1u << lane) - 1u));
}

__global__ void k_sel_compact(const float *v, size_t n, uint32_t t_keep, uint32_t base,
                              const unsigned long long *tile_off, uint32_t *idx, float *val,
                              size_t cap)
{
    __shared__ unsigned warp_cnt[SEL_WARPS];
    const size_t tiles = (n + SEL_TILE - 1) / SEL_TILE;
    for (size_t tile = blockIdx.x; tile < tiles; tile += gridDim.x) {
        const size_t start = tile * SEL_TILE;
        unsigned long long out = tile_off[tile];
        for (int j = 0; j < SEL_ITEMS; j++) {
            const size_t i = start + (size_t)j * SEL_THREADS + threadIdx.x;
            const float x = i < n ? v[i] : 0.0f;
            const uint32_t k = dkey(x);
            const bool keep = i < n && k < DS_SEL_KEY_INF && k >= t_keep;
            unsigned total;
            const unsigned rank = block_rank(keep, warp_cnt, &total);
            if (keep) {
                const unsigned long long pos = out + rank;
                if (pos < cap) {
                    idx[pos] = base + (uint32_t)i;
                    val[pos] = x;
                }
            }
            out += total;
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


/* Filtering a list at key t, the first `ties` entries equal to t kept:
 * per tile, the entries with key > t (tile_gt) and key == t (tile_eq); the
 * totals into tally[0], tally[1]. */
__global__ void k_list_tally(const float *val, size_t n, uint32_t t, unsigned long long *tile_gt,
                             unsigned long long *tile_eq, unsigned long long *tally)
{
    __shared__ unsigned part[SEL_WARPS];
    unsigned long long tot_gt = 0, tot_eq = 0;
    const size_t tiles = (n + SEL_TILE - 1) / SEL_TILE;
    for (size_t tile = blockIdx.x; tile < tiles; tile += gridDim.x) {
        const size_t start = tile * SEL_TILE;
        unsigned gt = 0, eq = 0;
        for (int j = 0; j < SEL_ITEMS; j++) {
            const size_t i = start + (size_t)j * SEL_THREADS + threadIdx.x;
            if (i < n) {
                const uint32_t k = dkey(val[i]);
                gt += k > t;
                eq += k == t;
            }
        }
        const unsigned bgt = block_sum(gt, part);
        const unsigned beq = block_sum(eq, part);
        if (threadIdx.x == 0) {
            tile_gt[tile] = bgt;
            tile_eq[tile] = beq;
        }
        tot_gt += gt;
        tot_eq += eq;
    }
    for (int o = 16; o > 0; o >>= 1) {
        tot_gt += __shfl_down_sync(0xffffffffu, tot_gt, o);
        tot_eq += __shfl_down_sync(0xffffffffu, tot_eq, o);
    }
    if ((threadIdx.x & 31) == 0) {
        atomicAdd(&tally[0], tot_gt);
        atomicAdd(&tally[1], tot_eq);
    }
}

/* Keep key > t, and key == t while fewer than `ties` such were met before
 * (in list order); gt_off / eq_off are the exclusive per-tile offsets of
 * k_list_tally's counts. A tile's output starts after the entries kept
 * before it: gt_off + min(ties, eq_off). */
__global__ void k_list_compact(const uint32_t *idx, const float *val, size_t n, uint32_t t,
                               unsigned long long ties, const unsigned long long *gt_off,
                               const unsigned long long *eq_off, uint32_t *oidx, float *oval)
{
    __shared__ unsigned warp_cnt[SEL_WARPS];
    const size_t tiles = (n + SEL_TILE - 1) / SEL_TILE;
    for (size_t tile = blockIdx.x; tile < tiles; tile += gridDim.x) {
        const size_t start = tile * SEL_TILE;
        unsigned long long eq_run = eq_off[tile];
        unsigned long long out = gt_off[tile] + (eq_run < ties ? eq_run : ties);
        for (int j = 0; j < SEL_ITEMS; j++) {
            const size_t i = start + (size_t)j * SEL_THREADS + threadIdx.x;
            const bool in = i < n;
            const float x = in ? val[i] : 0.0f;
            const uint32_t k = dkey(x);
            const bool gt = in && k > t, eq = in && k == t;
            unsigned eq_tot, keep_tot;
            const unsigned er = block_rank(eq, warp_cnt, &eq_tot);
            const bool keep = gt || (eq && eq_run + er < ties);
            const unsigned kr = block_rank(keep, warp_cnt, &keep_tot);
            if (keep) {
                oidx[out + kr] = idx[i];
                oval[out + kr] = x;
            }
            out += keep_tot;
            eq_run += eq_tot;
        }
    }
}

/* hist[key >> DS_SEL_HIST_SHIFT] += 1 for every entry: counts per block in
 * shared memory, then one integer atomicAdd per non-empty bucket. */
__global__ void k_sel_hist(const float *v, size_t n, unsigned *hist)
{
    __shared__ unsigned h[DS_SEL_HIST_BUCKETS];
    for (int b = threadIdx.x; b < DS_SEL_HIST_BUCKETS; b += blockDim.x)
        h[b] = 0;
    __syncthreads();
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x)
        atomicAdd(&h[dkey(v[i]) >> DS_SEL_HIST_SHIFT], 1u);
    __syncthreads();
    for (int b = threadIdx.x; b < DS_SEL_HIST_BUCKETS; b += blockDim.x)
        if (h[b])
            atomicAdd(&hist[b], h[b]);
}

/* hist[(key >> shift) & 1023] += 1 for the entries whose key >> (shift +
 * 10) is prefix; as k_sel_hist. */
__global__ void k_sel_hist_sub(const float *v, size_t n, uint32_t prefix, unsigned shift,
                               unsigned *hist)
{
    __shared__ unsigned h[DS_SEL_SUB_BUCKETS];
    for (int b = threadIdx.x; b < DS_SEL_SUB_BUCKETS; b += blockDim.x)
        h[b] = 0;
    __syncthreads();
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x) {
        const uint32_t k = dkey(v[i]);
        if ((k >> (shift + 10)) == prefix)
            atomicAdd(&h[(k >> shift) & (DS_SEL_SUB_BUCKETS - 1)], 1u);
    }
    __syncthreads();
    for (int b = threadIdx.x; b < DS_SEL_SUB_BUCKETS; b += blockDim.x)
        if (h[b])
            atomicAdd(&hist[b], h[b]);
}

__global__ void k_sel_accumulate(float *y, const float *x, size_t n)
{
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x)
        y[i] = __fadd_rn(y[i], x[i]);
}

/* Block (u, p) of the norms: the squares of unit u's finite entries at
 * offsets p * SEL_THREADS + tid + j * SEL_NORM_PARTS * SEL_THREADS, summed
 * by each thread in increasing j, then over the block in a fixed tree, into
 * part[u * SEL_NORM_PARTS + p]. The assignment depends on the offset only,
 * so the sum's order is fixed. Each square is exact in double. */
__global__ void k_sel_norm_parts(const float *v, const uint32_t *unit_off, size_t u0, double *part)
{
    __shared__ double sh[SEL_THREADS];
    const size_t u = u0 + blockIdx.x;
    const uint32_t lo = unit_off[u], hi = unit_off[u + 1];
    const size_t len = hi > lo ? hi - lo : 0;
    double s = 0;
    for (size_t i = (size_t)blockIdx.y * SEL_THREADS + threadIdx.x; i < len;
         i += (size_t)SEL_NORM_PARTS * SEL_THREADS) {
        const float x = v[lo + i];
        if (dkey(x) < DS_SEL_KEY_INF)
            s += (double)x * (double)x;
    }
    s = ds_block_tree_sum<SEL_THREADS>(s, sh);
    if (threadIdx.x == 0)
        part[u * SEL_NORM_PARTS + blockIdx.y] = s;
}

/* norms[u] = sqrt of unit u's parts added in order. */
__global__ void k_sel_norm_sum(const double *part, size_t n_units, double *norms)
{
    for (size_t u = blockIdx.x * (size_t)blockDim.x + threadIdx.x; u < n_units;
         u += (size_t)gridDim.x * blockDim.x) {
        double s = 0;
        for (int p = 0; p < SEL_NORM_PARTS; p++)
            s += part[u * SEL_NORM_PARTS + p];
        norms[u] = sqrt(s);
    }
}

/* One block: the values at pos[0..count) are loaded SEL_THREADS at a time
 * in parallel, then thread 0 adds the finite |x| in the order of pos, as
 * the reference does. out[0] = the sum, out[1] = how many were finite. */
__global__ void k_sel_absmean(const float *v, const uint32_t *pos, size_t count, double *out)
{
    __shared__ float x[SEL_THREADS];
    double s = 0, good = 0;
    for (size_t j0 = 0; j0 < count; j0 += SEL_THREADS) {
        const size_t j = j0 + threadIdx.x;
        if (j < count)
            x[threadIdx.x] = v[pos[j]];
        __syncthreads();
        if (threadIdx.x == 0) {
            const size_t m = count - j0 < SEL_THREADS ? count - j0 : SEL_THREADS;
            for (size_t i = 0; i < m; i++)
                if (dkey(x[i]) < DS_SEL_KEY_INF) {
                    s += fabs((double)x[i]);
                    good += 1.0;
                }
        }
        __syncthreads(); /* x is reloaded by the next round */
    }
    if (threadIdx.x == 0) {
        out[0] = s;
        out[1] = good;
    }
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

/* bytes of device memory src into host h, after everything queued before
 * it: 0, or -1 with the error (the copy's, the stream's or a launch's)
 * kept for the next sync. */
static int fetch(sel_dev *d, void *h, const void *src, size_t bytes)
{
    cudaError_t e = cudaMemcpyAsync(h, src, bytes, cudaMemcpyDeviceToHost, d->stream);
    if (e == cudaSuccess)
        e = cudaStreamSynchronize(d->stream);
    if (e == cudaSuccess)
        e = cudaGetLastError();
    note(d, e);
    return e == cudaSuccess ? 0 : -1;
}

/* Copy the device tally to *out; on any error *out is zero and the error is
 * kept for the next sync. */
static void fetch_tally(sel_dev *d, ds_sel_tally *out)
{
    unsigned long long h[3] = {0, 0, 0};
    if (fetch(d, h, d->tally, sizeof(h)) < 0)
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

/* Filter (idx, val)[0..count) into (oidx, oval): keep key > t, and the
 * first `ties` entries with key == t. In place when oidx == idx (through
 * scratch, then copied back). Returns how many were kept; 0 on error
 * (noted). */
static size_t sel_filter_ties(sel_dev *d, uint32_t *oidx, float *oval, const uint32_t *idx,
                              const float *val, size_t count, uint32_t t, size_t ties)
{
    if (count == 0)
        return 0;
    const size_t tiles = (count + SEL_TILE - 1) / SEL_TILE;
    const bool in_place = oidx == idx;
    if (grow(d, (void **)&d->tile_off, &d->tile_cap, tiles, sizeof(*d->tile_off)) < 0 ||
        grow(d, (void **)&d->tile_eq, &d->tile_eq_cap, tiles, sizeof(*d->tile_eq)) < 0)
        return 0;
    uint32_t *wi = oidx;
    float *wv = oval;
    if (in_place) {
        if (grow(d, (void **)&d->lst_idx, &d->lst_idx_cap, count, sizeof(*d->lst_idx)) < 0 ||
            grow(d, (void **)&d->lst_val, &d->lst_val_cap, count, sizeof(*d->lst_val)) < 0)
            return 0;
        wi = d->lst_idx;
        wv = d->lst_val;
    }
    note(d, cudaMemsetAsync(d->tally, 0, 2 * sizeof(unsigned long long), d->stream));
    k_list_tally<<<grid_tiles(count), SEL_THREADS, 0, d->stream>>>(val, count, t, d->tile_off,
                                                                   d->tile_eq, d->tally);
    k_sel_scan<<<1, SEL_SCAN_THREADS, 0, d->stream>>>(d->tile_off, tiles);
    k_sel_scan<<<1, SEL_SCAN_THREADS, 0, d->stream>>>(d->tile_eq, tiles);
    k_list_compact<<<grid_tiles(count), SEL_THREADS, 0, d->stream>>>(
        idx, val, count, t, (unsigned long long)ties, d->tile_off, d->tile_eq, wi, wv);
    unsigned long long h[2] = {0, 0};
    if (fetch(d, h, d->tally, sizeof(h)) < 0)
        return 0;
    const size_t kept = (size_t)h[0] + (h[1] < ties ? (size_t)h[1] : ties);
    if (in_place && kept) {
        note(d, cudaMemcpyAsync(oidx, wi, kept * sizeof(*oidx), cudaMemcpyDeviceToDevice,
                                d->stream));
        note(d, cudaMemcpyAsync(oval, wv, kept * sizeof(*oval), cudaMemcpyDeviceToDevice,
                                d->stream));
    }
    return kept;
}

static size_t sel_filter(sel_dev *d, uint32_t *idx, float *val, size_t count, uint32_t t)
{
    /* key >= t is key > t or key == t, with no limit on the ties. */
    return sel_filter_ties(d, idx, val, idx, val, count, t, SIZE_MAX);
}

/* Blocks for a shared-memory histogram of n entries: a few per
 * multiprocessor, as each block adds its whole histogram to the global one
 * and more blocks cost more atomics. */
static unsigned grid_hist(const sel_dev *d, size_t n)
{
    const size_t want = (n + SEL_TILE - 1) / SEL_TILE, most = 4 * (size_t)d->sms;
    return (unsigned)(want == 0 ? 1 : want < most ? want : most);
}

/* Add the first `buckets` counts of d->hist to the host's hist; nothing on
 * error (noted). */
static void hist_fetch(sel_dev *d, size_t buckets, uint32_t *hist)
{
    unsigned h[DS_SEL_HIST_BUCKETS];
    if (fetch(d, h, d->hist, buckets * sizeof(*h)) < 0)
        return;
    for (size_t b = 0; b < buckets; b++)
        hist[b] += h[b];
}

static void sel_hist(sel_dev *d, const float *v, size_t n, uint32_t *hist)
{
    if (n == 0)
        return;
    note(d, cudaMemsetAsync(d->hist, 0, DS_SEL_HIST_BUCKETS * sizeof(*d->hist), d->stream));
    k_sel_hist<<<grid_hist(d, n), SEL_THREADS, 0, d->stream>>>(v, n, d->hist);
    hist_fetch(d, DS_SEL_HIST_BUCKETS, hist);
}

static void sel_hist_sub(sel_dev *d, const float *v, size_t n, uint32_t prefix, unsigned shift,
                         uint32_t *hist)
{
    if (n == 0 || shift > 21)
        return;
    note(d, cudaMemsetAsync(d->hist, 0, DS_SEL_SUB_BUCKETS * sizeof(*d->hist), d->stream));
    k_sel_hist_sub<<<grid_hist(d, n), SEL_THREADS, 0, d->stream>>>(v, n, prefix, shift, d->hist);
    hist_fetch(d, DS_SEL_SUB_BUCKETS, hist);
}

static void sel_norms(sel_dev *d, const float *v, const uint32_t *unit_off, size_t n_units,
                      double *norms)
{
    if (n_units == 0)
        return;
    memset(norms, 0, n_units * sizeof(*norms));
    /* The parts, then the norms behind them. */
    if (grow(d, (void **)&d->norm, &d->norm_cap, n_units * (SEL_NORM_PARTS + 1),
             sizeof(*d->norm)) < 0)
        return;
    double *dn = d->norm + n_units * SEL_NORM_PARTS;
    const size_t batch = 1u << 20; /* well inside gridDim.x */
    for (size_t u0 = 0; u0 < n_units; u0 += batch) {
        const size_t nu = n_units - u0 < batch ? n_units - u0 : batch;
        k_sel_norm_parts<<<dim3((unsigned)nu, SEL_NORM_PARTS), SEL_THREADS, 0, d->stream>>>(
            v, unit_off, u0, d->norm);
    }
    k_sel_norm_sum<<<grid_elems(n_units), SEL_THREADS, 0, d->stream>>>(d->norm, n_units, dn);
    if (fetch(d, norms, dn, n_units * sizeof(*norms)) < 0)
        memset(norms, 0, n_units * sizeof(*norms));
}

static double sel_absmean_at(sel_dev *d, const float *v, const uint32_t *pos, size_t count,
                             size_t *used)
{
    *used = 0;
    if (count == 0)
        return 0.0;
    if (grow(d, (void **)&d->pos, &d->pos_cap, count, sizeof(*d->pos)) < 0)
        return 0.0;
    /* From pageable memory the copy has read pos when the call returns. */
    note(d, cudaMemcpyAsync(d->pos, pos, count * sizeof(*pos), cudaMemcpyHostToDevice,
                            d->stream));
    k_sel_absmean<<<1, SEL_THREADS, 0, d->stream>>>(v, d->pos, count, d->mean);
    double h[2] = {0, 0};
    if (fetch(d, h, d->mean, sizeof(h)) < 0 || !(h[1] > 0))
        return 0.0;
    *used = (size_t)h[1];
    return h[0] / h[1];
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

static void sel_accumulate(sel_dev *d, float *y, const float *x, size_t n)
{
    if (n)
        k_sel_accumulate<<<grid_elems(n), SEL_THREADS, 0, d->stream>>>(y, x, n);
    note(d, cudaGetLastError());
}

static void *sel_alloc(sel_dev *d, size_t bytes)
{
    (void)d;
    void *p = NULL;
    if (cudaMalloc(&p, bytes ? bytes : 4) != cudaSuccess) {
        /* NULL says it; keep the error from the next fetch's
         * cudaGetLastError(), which would take it for a kernel's. */
        cudaGetLastError();
        return NULL;
    }
    return p;
}

static void sel_free(sel_dev *d, void *p)
{
    (void)d;
    cudaFree(p); /* waits for the kernels that may still use it */
}

/* A copy on the stream, finished on return; 0 or -EIO (noted). */
static int sel_copy(sel_dev *d, void *dst, const void *src, size_t bytes, cudaMemcpyKind kind)
{
    if (bytes == 0)
        return 0;
    cudaError_t e = cudaMemcpyAsync(dst, src, bytes, kind, d->stream);
    if (e == cudaSuccess)
        e = cudaStreamSynchronize(d->stream);
    note(d, e);
    return e == cudaSuccess ? 0 : -EIO;
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
    static DS_DECL_SEL_FILTER(filter)
    {
        return sel_filter(enter(D), idx, val, count, t);
    }
    static DS_DECL_SEL_FILTER_TIES(filter_ties)
    {
        return sel_filter_ties(enter(D), oidx, oval, idx, val, count, t, ties);
    }
    static DS_DECL_SEL_HIST(hist)
    {
        sel_hist(enter(D), v, n, hist);
    }
    static DS_DECL_SEL_HIST_SUB(hist_sub)
    {
        sel_hist_sub(enter(D), v, n, prefix, shift, hist);
    }
    static DS_DECL_SEL_NORMS(norms)
    {
        sel_norms(enter(D), v, unit_off, n_units, norms);
    }
    static DS_DECL_SEL_ABSMEAN_AT(absmean_at)
    {
        return sel_absmean_at(enter(D), v, pos, count, used);
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
    static DS_DECL_SEL_ACCUMULATE(accumulate)
    {
        sel_accumulate(enter(D), y, x, n);
    }
    static int sync(void)
    {
        return sel_sync(enter(D));
    }
    static void *alloc(size_t bytes)
    {
        return sel_alloc(enter(D), bytes);
    }
    static void free(void *p)
    {
        sel_free(enter(D), p);
    }
    static int upload(void *dst, const void *src_host, size_t bytes)
    {
        return sel_copy(enter(D), dst, src_host, bytes, cudaMemcpyHostToDevice);
    }
    static int download(void *dst_host, const void *src, size_t bytes)
    {
        return sel_copy(enter(D), dst_host, src, bytes, cudaMemcpyDeviceToHost);
    }
    static void bind(ds_select_ops *ops)
    {
        ops->count = count;
        ops->compact = compact;
        ops->filter = filter;
        ops->filter_ties = filter_ties;
        ops->hist = hist;
        ops->hist_sub = hist_sub;
        ops->norms = norms;
        ops->absmean_at = absmean_at;
        ops->gather = gather;
        ops->scatter_add = scatter_add;
        ops->zero_at = zero_at;
        ops->accumulate = accumulate;
        ops->sync = sync;
        ops->alloc = alloc;
        ops->free = free;
        ops->upload = upload;
        ops->download = download;
    }
};

static_assert(DS_CUDA_MAX_DEVICES == 16, "g_bind lists one binder per device index");
static void (*const g_bind[DS_CUDA_MAX_DEVICES])(ds_select_ops *) = {
    on<0>::bind,  on<1>::bind,  on<2>::bind,  on<3>::bind,  on<4>::bind,  on<5>::bind,
    on<6>::bind,  on<7>::bind,  on<8>::bind,  on<9>::bind,  on<10>::bind, on<11>::bind,
    on<12>::bind, on<13>::bind, on<14>::bind, on<15>::bind,
};

/* First reference to `device`: its fixed scratch (what grows with the
 * input is allocated on first use). The device is current and its stream
 * acquired. 0 or -ENODEV with the reason. */
static int dev_open(sel_dev *d, int device, char *why, size_t why_len)
{
    cudaError_t e = cudaDeviceGetAttribute(&d->sms, cudaDevAttrMultiProcessorCount, device);
    const char *what = "the multiprocessor count";
    if (e == cudaSuccess) {
        what = "cudaMalloc of the tally";
        e = cudaMalloc(&d->tally, 3 * sizeof(unsigned long long));
    }
    if (e == cudaSuccess) {
        what = "cudaMalloc of the histogram";
        e = cudaMalloc(&d->hist, DS_SEL_HIST_BUCKETS * sizeof(unsigned));
    }
    if (e == cudaSuccess) {
        what = "cudaMalloc of the mean";
        e = cudaMalloc(&d->mean, 2 * sizeof(double));
    }
    if (e != cudaSuccess) {
        snprintf(why, why_len, "CUDA device %d: %s failed (%s)", device, what,
                 cudaGetErrorString(e));
        cudaFree(d->mean);
        cudaFree(d->hist);
        cudaFree(d->tally);
        memset(d, 0, sizeof(*d));
        return -ENODEV;
    }
    if (d->sms < 1)
        d->sms = 1;
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
        cudaFree(d->tile_eq);
        cudaFree(d->hist);
        cudaFree(d->lst_idx);
        cudaFree(d->lst_val);
        cudaFree(d->norm);
        cudaFree(d->pos);
        cudaFree(d->mean);
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
