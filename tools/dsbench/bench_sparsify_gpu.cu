/*
 * tools/dsbench/bench_sparsify_gpu.cu: the baselines `dsbench sparsify
 * --gpu` measures the device sparsifiers against (bench_gpu.h):
 *   read      a kernel that reads every float of the array once (float4
 *             loads, a block sum per block): the best any one-pass
 *             selection can do, as memory bandwidth;
 *   cub_topk  the top-k a CUDA user reaches for: magnitude keys and
 *             indices built from the array, CUB's radix sort of the pairs
 *             (descending), the first k indices copied out.
 * Both run on the device's shared stream (kernels/cuda/device.h), the one
 * the selection table queues on, and every CUDA status is checked.
 */
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cub/device/device_radix_sort.cuh>
#include <cuda_runtime.h>

#include "kernels/cuda/device.h"
extern "C" {
#include "kernels/select.h"
#include "tools/dsbench/bench_gpu.h"
}

#define READ_THREADS 256

struct ds_gpu_bench {
    int device;
    cudaStream_t stream;
    int blocks;              /* of the read kernel: 8 per multiprocessor */
    size_t n_max;
    float *part;             /* the read's block sums */
    uint32_t *keys_in, *keys_out, *vals_in, *vals_out, *topk_idx;
    void *temp;
    size_t temp_bytes;
};

__global__ void k_read(const float *v, size_t n, float *part)
{
    __shared__ float warp_sum[READ_THREADS / 32];
    float s = 0.0f;
    const size_t stride = (size_t)gridDim.x * blockDim.x;
    const size_t first = blockIdx.x * (size_t)blockDim.x + threadIdx.x;
    /* cudaMalloc'd arrays are 256-byte aligned: float4 loads, then the tail. */
    const size_t n4 = ((uintptr_t)v % 16 == 0) ? n / 4 : 0;
    const float4 *v4 = (const float4 *)v;
    for (size_t i = first; i < n4; i += stride) {
        const float4 x = v4[i];
        s += (x.x + x.y) + (x.z + x.w);
    }
    for (size_t i = n4 * 4 + first; i < n; i += stride)
        s += v[i];
    for (int o = 16; o > 0; o >>= 1)
        s += __shfl_down_sync(0xffffffffu, s, o);
    if ((threadIdx.x & 31) == 0)
        warp_sum[threadIdx.x >> 5] = s;
    __syncthreads();
    if (threadIdx.x == 0) {
        float t = 0.0f;
        for (int w = 0; w < READ_THREADS / 32; w++)
            t += warp_sum[w];
        part[blockIdx.x] = t;
    }
}

/* Magnitude keys (kernels/select.h), NaN and Inf as 0 so that they sort
 * last, and the indices they come with. */
__global__ void k_keys(const float *v, size_t n, uint32_t *keys, uint32_t *vals)
{
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x) {
        const uint32_t k = __float_as_uint(v[i]) & 0x7fffffffu;
        keys[i] = k < DS_SEL_KEY_INF ? k : 0;
        vals[i] = (uint32_t)i;
    }
}

static int check(cudaError_t e, const char *what)
{
    if (e == cudaSuccess)
        return 0;
    fprintf(stderr, "dsbench sparsify --gpu: %s: %s\n", what, cudaGetErrorString(e));
    return -EIO;
}

extern "C" int ds_gpu_bench_open(ds_gpu_bench **out, int device, size_t n_max, char *why,
                                 size_t why_len)
{
    *out = NULL;
    /* CUB's item count is an int here; the selection's indices are uint32. */
    if (n_max == 0 || n_max > (size_t)INT32_MAX) {
        snprintf(why, why_len, "array of %zu floats: 1 to %d", n_max, INT32_MAX);
        return -EINVAL;
    }
    cudaStream_t stream = ds_cuda_device_stream(device);
    if (!stream) {
        snprintf(why, why_len, "CUDA device %d has no selection table (no stream)", device);
        return -EINVAL;
    }
    ds_gpu_bench *b = (ds_gpu_bench *)calloc(1, sizeof(*b));
    if (!b) {
        snprintf(why, why_len, "out of host memory");
        return -ENOMEM;
    }
    b->device = device;
    b->stream = stream;
    b->n_max = n_max;
    int sms = 0;
    cudaError_t e = cudaSetDevice(device);
    if (e == cudaSuccess)
        e = cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device);
    b->blocks = 8 * (sms > 0 ? sms : 1);
    const size_t bytes = n_max * sizeof(uint32_t);
    if (e == cudaSuccess)
        e = cudaMalloc(&b->part, (size_t)b->blocks * sizeof(float));
    if (e == cudaSuccess)
        e = cudaMalloc(&b->keys_in, bytes);
    if (e == cudaSuccess)
        e = cudaMalloc(&b->keys_out, bytes);
    if (e == cudaSuccess)
        e = cudaMalloc(&b->vals_in, bytes);
    if (e == cudaSuccess)
        e = cudaMalloc(&b->vals_out, bytes);
    if (e == cudaSuccess)
        e = cudaMalloc(&b->topk_idx, bytes);
    /* The sort's scratch for the largest array serves every smaller one. */
    if (e == cudaSuccess)
        e = cub::DeviceRadixSort::SortPairsDescending(NULL, b->temp_bytes, b->keys_in,
                                                      b->keys_out, b->vals_in, b->vals_out,
                                                      (int)n_max, 0, 31, stream);
    if (e == cudaSuccess)
        e = cudaMalloc(&b->temp, b->temp_bytes ? b->temp_bytes : 1);
    if (e != cudaSuccess) {
        snprintf(why, why_len, "CUDA device %d: buffers for %zu floats: %s", device, n_max,
                 cudaGetErrorString(e));
        ds_gpu_bench_close(&b);
        return e == cudaErrorMemoryAllocation ? -ENOMEM : -EIO;
    }
    *out = b;
    return 0;
}

extern "C" void ds_gpu_bench_close(ds_gpu_bench **bp)
{
    if (!bp || !*bp)
        return;
    ds_gpu_bench *b = *bp;
    cudaStreamSynchronize(b->stream);
    cudaFree(b->part);
    cudaFree(b->keys_in);
    cudaFree(b->keys_out);
    cudaFree(b->vals_in);
    cudaFree(b->vals_out);
    cudaFree(b->topk_idx);
    cudaFree(b->temp);
    free(b);
    *bp = NULL;
}

extern "C" int ds_gpu_bench_read(ds_gpu_bench *b, const float *dv, size_t n, int iters,
                                 double *sum)
{
    for (int it = 0; it < iters; it++)
        k_read<<<b->blocks, READ_THREADS, 0, b->stream>>>(dv, n, b->part);
    int ret = check(cudaGetLastError(), "read kernel");
    float first = 0.0f;
    if (!ret)
        ret = check(cudaMemcpyAsync(&first, b->part, sizeof(first), cudaMemcpyDeviceToHost,
                                    b->stream), "read result");
    if (!ret)
        ret = check(cudaStreamSynchronize(b->stream), "read");
    *sum = first;
    return ret;
}

extern "C" int ds_gpu_bench_cub_topk(ds_gpu_bench *b, const float *dv, size_t n, size_t k,
                                     int iters, uint32_t *kth_key)
{
    if (k == 0 || k > n || n > b->n_max)
        return -EINVAL;
    const unsigned grid = (unsigned)((n + READ_THREADS - 1) / READ_THREADS < 65535u * 8
                                         ? (n + READ_THREADS - 1) / READ_THREADS
                                         : 65535u * 8);
    int ret = 0;
    for (int it = 0; it < iters && !ret; it++) {
        k_keys<<<grid, READ_THREADS, 0, b->stream>>>(dv, n, b->keys_in, b->vals_in);
        ret = check(cudaGetLastError(), "key kernel");
        size_t temp_bytes = b->temp_bytes;
        if (!ret)
            ret = check(cub::DeviceRadixSort::SortPairsDescending(
                            b->temp, temp_bytes, b->keys_in, b->keys_out, b->vals_in,
                            b->vals_out, (int)n, 0, 31, b->stream),
                        "cub::DeviceRadixSort::SortPairsDescending");
        if (!ret)
            ret = check(cudaMemcpyAsync(b->topk_idx, b->vals_out, k * sizeof(uint32_t),
                                        cudaMemcpyDeviceToDevice, b->stream),
                        "top-k copy");
    }
    uint32_t kth = 0;
    if (!ret)
        ret = check(cudaMemcpyAsync(&kth, b->keys_out + (k - 1), sizeof(kth),
                                    cudaMemcpyDeviceToHost, b->stream), "k-th key");
    if (!ret)
        ret = check(cudaStreamSynchronize(b->stream), "cub top-k");
    *kth_key = kth;
    return ret;
}
