/*
 * kernels/cpu.h: which SIMD variants this CPU may use.
 *
 * Every dispatch decision goes through ds_cpu_flags(): the features the CPU
 * reports, intersected with a mask that users and tests can force.
 *   DS_KERNELS=ref     plain C reference only
 *   DS_KERNELS=avx2    up to AVX2 + FMA
 *   DS_KERNELS=avx512  up to AVX-512 (F, BW, VL, DQ)
 *   unset / "all"      everything the CPU has
 * Tests call ds_cpu_set_mask() to run each variant in turn.
 */
#ifndef DS_KERNELS_CPU_H
#define DS_KERNELS_CPU_H

enum {
    DS_CPU_AVX2 = 1u << 0,   /* AVX2 and FMA3 */
    DS_CPU_AVX512 = 1u << 1, /* AVX-512 F + BW + VL + DQ */
    DS_CPU_ALL = DS_CPU_AVX2 | DS_CPU_AVX512,
};

/* Features the CPU and OS support, ignoring any mask. */
unsigned ds_cpu_detect(void);

/* ds_cpu_detect() & mask, where the mask comes from ds_cpu_set_mask() or,
 * on first use, from DS_KERNELS. An unknown DS_KERNELS value is treated as
 * "ref" (the safe choice) and reported by ds_cpu_mask_error(). */
unsigned ds_cpu_flags(void);

/* Force the mask (tests, --cpumask style); DS_CPU_ALL restores the default. */
void ds_cpu_set_mask(unsigned mask);

/* Name of the best variant allowed by flags: "avx512", "avx2" or "ref". */
const char *ds_cpu_flags_name(unsigned flags);

/* Non-NULL when DS_KERNELS held a value we do not know (a message). */
const char *ds_cpu_mask_error(void);

#endif
