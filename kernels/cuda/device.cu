/*
 * kernels/cuda/device.cu: one stream per device, shared by every CUDA
 * table of the process (see device.h).
 */
#include <errno.h>
#include <pthread.h>
#include <stdio.h>

#include "kernels/cuda/device.h"

extern "C" int ds_ops_cuda_devices(void)
{
    int count = 0;
    return cudaGetDeviceCount(&count) == cudaSuccess && count > 0 ? count : 0;
}

static pthread_mutex_t g_lock = PTHREAD_MUTEX_INITIALIZER;
static struct {
    cudaStream_t stream;
    int refs;
} g_dev[DS_CUDA_MAX_DEVICES];

int ds_cuda_device_acquire(int device, char *why, size_t why_len)
{
    int count = 0;
    cudaError_t e = cudaGetDeviceCount(&count);
    if (e != cudaSuccess) {
        snprintf(why, why_len, "no CUDA driver or device (%s)", cudaGetErrorString(e));
        return -ENODEV;
    }
    if (device < 0 || device >= count) {
        snprintf(why, why_len, "CUDA device %d asked for, %d present", device, count);
        return -ENODEV;
    }
    if (device >= DS_CUDA_MAX_DEVICES) {
        snprintf(why, why_len, "CUDA device %d: dsnode handles devices 0 to %d", device,
                 DS_CUDA_MAX_DEVICES - 1);
        return -ENODEV;
    }
    if ((e = cudaSetDevice(device)) != cudaSuccess) {
        snprintf(why, why_len, "CUDA device %d unusable (%s)", device, cudaGetErrorString(e));
        return -ENODEV;
    }
    pthread_mutex_lock(&g_lock);
    if (g_dev[device].refs == 0 &&
        (e = cudaStreamCreateWithFlags(&g_dev[device].stream, cudaStreamNonBlocking)) !=
            cudaSuccess) {
        pthread_mutex_unlock(&g_lock);
        snprintf(why, why_len, "CUDA device %d: cudaStreamCreate failed (%s)", device,
                 cudaGetErrorString(e));
        return -ENODEV;
    }
    g_dev[device].refs++;
    pthread_mutex_unlock(&g_lock);
    return 0;
}

void ds_cuda_device_release(int device)
{
    if (device < 0 || device >= DS_CUDA_MAX_DEVICES)
        return;
    pthread_mutex_lock(&g_lock);
    if (g_dev[device].refs > 0 && --g_dev[device].refs == 0) {
        int cur = -1;
        cudaGetDevice(&cur);
        cudaSetDevice(device);
        cudaStreamSynchronize(g_dev[device].stream);
        cudaStreamDestroy(g_dev[device].stream);
        g_dev[device].stream = 0;
        if (cur >= 0)
            cudaSetDevice(cur);
    }
    pthread_mutex_unlock(&g_lock);
}

cudaStream_t ds_cuda_device_stream(int device)
{
    if (device < 0 || device >= DS_CUDA_MAX_DEVICES)
        return 0;
    pthread_mutex_lock(&g_lock);
    cudaStream_t s = g_dev[device].refs ? g_dev[device].stream : 0;
    pthread_mutex_unlock(&g_lock);
    return s;
}
