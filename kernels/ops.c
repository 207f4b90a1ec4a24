/* kernels/ops.c: choosing a backend (see kernels.h). */
#include "config.h"

#include <errno.h>
#include <stdio.h>
#include <string.h>

#include "kernels/cpu.h"
#include "kernels/cpu/cpu_kernels.h"
#include "kernels/kernels.h"

void ds_ops_init_cpu(ds_ops *ops)
{
    ds_ops_fill_cpu(ops, ds_cpu_flags());
}

#if !HAVE_CUDA
int ds_ops_init_cuda(ds_ops *ops, int device, char *why, size_t why_len)
{
    (void)ops;
    (void)device;
    snprintf(why, why_len, "this build has no CUDA backend (configured with -Dcuda=disabled or no nvcc)");
    return -ENODEV;
}

void ds_ops_fini(ds_ops *ops)
{
    (void)ops;
}
#endif

int ds_ops_init(ds_ops *ops, const char *backend, char *why, size_t why_len)
{
    char cuda_why[160] = "";
    if (!strcmp(backend, "cpu")) {
        ds_ops_init_cpu(ops);
        snprintf(why, why_len, "backend=%s (asked for cpu)", ops->name);
        return 0;
    }
    if (!strcmp(backend, "cuda")) {
        int ret = ds_ops_init_cuda(ops, 0, cuda_why, sizeof(cuda_why));
        if (ret < 0)
            snprintf(why, why_len, "cuda asked for but not available: %s", cuda_why);
        else
            snprintf(why, why_len, "backend=%s", ops->name);
        return ret;
    }
    if (!strcmp(backend, "auto")) {
        if (ds_ops_init_cuda(ops, 0, cuda_why, sizeof(cuda_why)) == 0) {
            snprintf(why, why_len, "backend=%s (auto: a CUDA device answered)", ops->name);
            return 0;
        }
        ds_ops_init_cpu(ops);
        snprintf(why, why_len, "backend=%s (auto: no CUDA: %s)", ops->name, cuda_why);
        return 0;
    }
    snprintf(why, why_len, "unknown backend '%s' (expected auto, cpu or cuda)", backend);
    return -EINVAL;
}
