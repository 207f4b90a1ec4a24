/*
 * tools/dsbench/bench_gpu.h: the device-side baselines of `dsbench sparsify
 * --gpu` (bench_sparsify_gpu.cu, built only with CUDA): a plain read of the
 * array and CUB's radix-sort top-k, queued on the stream the selection
 * table of the same device uses (kernels/cuda/device.h), so they and the
 * sparsifiers run under the same conditions.
 */
#ifndef DS_TOOLS_BENCH_GPU_H
#define DS_TOOLS_BENCH_GPU_H

#include <stddef.h>
#include <stdint.h>

typedef struct ds_gpu_bench ds_gpu_bench;

/* Buffers for arrays of up to n_max floats on `device`, which must have a
 * selection table initialised (ds_select_ops_init_cuda: the stream).
 * The caller owns *out and closes it with ds_gpu_bench_close. 0, -EINVAL,
 * -ENOMEM (device memory, with the reason in why) or -EIO. */
int ds_gpu_bench_open(ds_gpu_bench **out, int device, size_t n_max, char *why, size_t why_len);

/* NULL-safe; clears the caller's pointer. */
void ds_gpu_bench_close(ds_gpu_bench **b);

/* `iters` reads of dv[0..n) (device memory) back to back, each a kernel
 * summing every float, then one wait. *sum: the last sum (kept so that the
 * read cannot be left out). 0 or -EIO. */
int ds_gpu_bench_read(ds_gpu_bench *b, const float *dv, size_t n, int iters, double *sum);

/* `iters` top-k by CUB, back to back, then one wait: magnitude keys (NaN
 * and Inf as 0) and indices, cub::DeviceRadixSort::SortPairsDescending,
 * the first k indices copied out. *kth_key: the k-th largest key. 1 <= k
 * <= n <= n_max. 0, -EINVAL or -EIO. */
int ds_gpu_bench_cub_topk(ds_gpu_bench *b, const float *dv, size_t n, size_t k, int iters,
                          uint32_t *kth_key);

#endif
