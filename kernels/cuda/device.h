/*
 * kernels/cuda/device.h: what the CUDA op table (cuda_ops.cu) and the CUDA
 * selection kernels (select.cu) share for one device: its stream, and the
 * block reduction both use.
 *
 * Everything dsnode queues on a device goes on that device's one stream, so
 * training ops, selection, packing and copies are ordered with each other
 * without a host synchronisation between them (issue 11: select.cu used to
 * run on a stream of its own). Streams are per device, created on first
 * use, never on the legacy default stream, and live until
 * ds_cuda_device_release() drops the last reference.
 *
 * C++ (nvcc) only: the header names cudaStream_t.
 */
#ifndef DS_KERNELS_CUDA_DEVICE_H
#define DS_KERNELS_CUDA_DEVICE_H

#include <stddef.h>
#include <stdint.h>

#include <cuda_runtime.h>

#define DS_CUDA_MAX_DEVICES 16

/* Take a reference on device `device`: make it current for the calling
 * thread and create its stream (non-blocking) on the first reference.
 * Returns 0, or -ENODEV with the reason in why (no driver, no such device,
 * index over DS_CUDA_MAX_DEVICES, a stream that cannot be created). */
int ds_cuda_device_acquire(int device, char *why, size_t why_len);

/* Drop a reference; the last one synchronises and destroys the stream. */
void ds_cuda_device_release(int device);

/* The stream of an acquired device (0, the legacy stream, is never
 * returned for an acquired device; an unacquired one gives 0). */
cudaStream_t ds_cuda_device_stream(int device);

/* kernels.h's gather_images on `stream` (kernels/cuda/data.cu): the
 * launch's status (a kernel's own faults surface at the next sync). */
cudaError_t ds_cuda_gather_images(cudaStream_t stream, float *x, int32_t *y,
                                  const uint8_t *images, const uint8_t *labels,
                                  const uint32_t *idx, size_t first, int batch, size_t dim,
                                  float scale, float shift);

/* Each thread's s summed over the block (T threads, all calling) in a
 * fixed tree order, with part as T doubles of shared scratch; thread 0
 * gets the sum. */
template <int T> __device__ inline double ds_block_tree_sum(double s, double *part)
{
    part[threadIdx.x] = s;
    __syncthreads();
    for (int w = T / 2; w > 0; w >>= 1) {
        if ((int)threadIdx.x < w)
            part[threadIdx.x] += part[threadIdx.x + w];
        __syncthreads();
    }
    return part[0];
}

#endif
