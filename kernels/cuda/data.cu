/*
 * kernels/cuda/data.cu: a training batch gathered on the device from the
 * data set uploaded once (kernels.h, gather_images; node/train/train.c).
 *
 * One thread per pixel of the batch: blockIdx.y is the row of the batch,
 * x the pixels. The affine map is rounded twice (__fmul_rn, __fadd_rn):
 * nvcc would otherwise fuse it into one FMA and the inputs would differ
 * from the CPU's in the last bit (kernels/cpu/ref.c, ds_gather_images_c,
 * is the reference; tests/test_cuda.c compares them).
 */
#include <stdint.h>

#include "kernels/cuda/device.h"

#define GATHER_THREADS 256

__global__ void k_gather_images(float *x, int32_t *y, const uint8_t *images,
                                const uint8_t *labels, const uint32_t *idx, size_t first,
                                size_t dim, float scale, float shift)
{
    const size_t b = blockIdx.y;
    const size_t i = idx ? (size_t)idx[b] : first + b;
    const uint8_t *p = images + i * dim;
    float *o = x + b * dim;
    for (size_t j = (size_t)blockIdx.x * blockDim.x + threadIdx.x; j < dim;
         j += (size_t)gridDim.x * blockDim.x)
        o[j] = __fadd_rn(__fmul_rn((float)p[j], scale), shift);
    if (blockIdx.x == 0 && threadIdx.x == 0)
        y[b] = labels[i];
}

cudaError_t ds_cuda_gather_images(cudaStream_t stream, float *x, int32_t *y,
                                  const uint8_t *images, const uint8_t *labels,
                                  const uint32_t *idx, size_t first, int batch, size_t dim,
                                  float scale, float shift)
{
    if (batch <= 0 || !dim)
        return cudaSuccess;
    if (batch > 65535)
        return cudaErrorInvalidConfiguration; /* grid.y; batches are far smaller */
    size_t gx = (dim + GATHER_THREADS - 1) / GATHER_THREADS;
    if (gx > 1024)
        gx = 1024;
    const dim3 grid((unsigned)gx, (unsigned)batch);
    k_gather_images<<<grid, GATHER_THREADS, 0, stream>>>(x, y, images, labels, idx, first, dim,
                                                         scale, shift);
    return cudaGetLastError();
}
