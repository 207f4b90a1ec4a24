/*
 * kernels/ops.c: choosing a backend (see kernels.h). The choices and their
 * names come from DS_OPS_BACKENDS alone, so the config (conf/keys.h), the
 * lookup by name and the "expected ..." text cannot list different ones.
 */
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

int ds_ops_device_auto(int rank)
{
    const int n = ds_ops_cuda_devices();
    return n > 0 && rank >= 0 ? rank % n : 0;
}

#if !HAVE_CUDA
int ds_ops_cuda_devices(void)
{
    return 0;
}

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

#define BACKEND_ROW_(e, v, name) {e, name},
static const struct {
    enum ds_ops_backend b;
    const char *name;
} backends[] = {DS_OPS_BACKENDS(BACKEND_ROW_)};
#undef BACKEND_ROW_
#define NBACKENDS (sizeof(backends) / sizeof(backends[0]))

const char *ds_ops_backend_name(enum ds_ops_backend b)
{
    for (size_t i = 0; i < NBACKENDS; i++)
        if (backends[i].b == b)
            return backends[i].name;
    return "?";
}

int ds_ops_backend_parse(const char *s)
{
    for (size_t i = 0; s && i < NBACKENDS; i++)
        if (!strcmp(s, backends[i].name))
            return (int)backends[i].b;
    return -EINVAL;
}

int ds_ops_init_backend(ds_ops *ops, enum ds_ops_backend b, int device, char *why,
                        size_t why_len)
{
    char cuda_why[160] = "";
    switch (b) {
    case DS_OPS_CPU:
        ds_ops_init_cpu(ops);
        snprintf(why, why_len, "backend=%s (asked for cpu)", ops->name);
        return 0;
    case DS_OPS_CUDA: {
        int ret = ds_ops_init_cuda(ops, device, cuda_why, sizeof(cuda_why));
        if (ret < 0)
            snprintf(why, why_len, "cuda asked for but not available: %s", cuda_why);
        else
            snprintf(why, why_len, "backend=%s", ops->name);
        return ret;
    }
    case DS_OPS_AUTO:
        if (ds_ops_init_cuda(ops, device, cuda_why, sizeof(cuda_why)) == 0) {
            snprintf(why, why_len, "backend=%s (auto: a CUDA device answered)", ops->name);
            return 0;
        }
        ds_ops_init_cpu(ops);
        snprintf(why, why_len, "backend=%s (auto: no CUDA: %s)", ops->name, cuda_why);
        return 0;
    }
    snprintf(why, why_len, "unknown backend %d", (int)b);
    return -EINVAL;
}

int ds_ops_init(ds_ops *ops, const char *backend, int device, char *why, size_t why_len)
{
    const int b = ds_ops_backend_parse(backend);
    if (b >= 0)
        return ds_ops_init_backend(ops, (enum ds_ops_backend)b, device, why, why_len);
    /* "unknown backend 'x' (expected auto, cpu or cuda)", from the list. */
    size_t o = (size_t)snprintf(why, why_len, "unknown backend '%s' (expected",
                                backend ? backend : "(null)");
    for (size_t i = 0; i < NBACKENDS && o < why_len; i++) {
        const char *sep = i == 0 ? " " : i + 1 < NBACKENDS ? ", " : " or ";
        o += (size_t)snprintf(why + o, why_len - o, "%s%s", sep, backends[i].name);
    }
    if (o < why_len)
        snprintf(why + o, why_len - o, ")");
    return -EINVAL;
}
