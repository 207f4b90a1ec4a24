/* kernels/cpu.c: CPU feature detection and the dispatch mask (see cpu.h). */
#include "config.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/cpu.h"

/* DS_KERNELS is read once, whichever thread asks first: libdsnode may
 * register two engines from two threads at once. */
static pthread_once_t mask_once = PTHREAD_ONCE_INIT;
static _Atomic unsigned mask_value = DS_CPU_ALL;
static const char *_Atomic mask_err;

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
    pthread_once(&mask_once, load_env_mask);
    return ds_cpu_detect() & mask_value;
}

void ds_cpu_set_mask(unsigned mask)
{
    pthread_once(&mask_once, load_env_mask);
    mask_value = mask;
    mask_err = NULL;
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
    pthread_once(&mask_once, load_env_mask);
    return mask_err;
}
