/* kernels/cpu.c: CPU feature detection and the dispatch mask (see cpu.h). */
#include "config.h"

#include <stdlib.h>
#include <string.h>

#include "kernels/cpu.h"

static unsigned mask_value = DS_CPU_ALL;
static int mask_loaded;
static const char *mask_err;

unsigned ds_cpu_detect(void)
{
    unsigned f = 0;
#if ARCH_X86_64
    /* libgcc checks OSXSAVE/XCR0 as well, so these mean "usable here". */
    __builtin_cpu_init();
    if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma"))
        f |= DS_CPU_AVX2;
    if ((f & DS_CPU_AVX2) && __builtin_cpu_supports("avx512f") &&
        __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512vl") &&
        __builtin_cpu_supports("avx512dq"))
        f |= DS_CPU_AVX512;
#endif
    return f;
}

static void load_env_mask(void)
{
    const char *s = getenv("DS_KERNELS");
    mask_loaded = 1;
    if (!s || !*s || !strcmp(s, "all"))
        mask_value = DS_CPU_ALL;
    else if (!strcmp(s, "ref"))
        mask_value = 0;
    else if (!strcmp(s, "avx2"))
        mask_value = DS_CPU_AVX2;
    else if (!strcmp(s, "avx512"))
        mask_value = DS_CPU_ALL;
    else {
        mask_value = 0;
        mask_err = "DS_KERNELS: expected one of ref, avx2, avx512, all; using ref";
    }
}

unsigned ds_cpu_flags(void)
{
    if (!mask_loaded)
        load_env_mask();
    return ds_cpu_detect() & mask_value;
}

void ds_cpu_set_mask(unsigned mask)
{
    mask_loaded = 1;
    mask_value = mask;
}

const char *ds_cpu_flags_name(unsigned flags)
{
    if (flags & DS_CPU_AVX512)
        return "avx512";
    if (flags & DS_CPU_AVX2)
        return "avx2";
    return "ref";
}

const char *ds_cpu_mask_error(void)
{
    if (!mask_loaded)
        load_env_mask();
    return mask_err;
}
