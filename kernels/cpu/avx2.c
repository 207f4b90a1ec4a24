/* kernels/cpu/avx2.c: AVX2 + FMA variants (8 lanes); see simd_tmpl.c.
 * Built with -mavx2 -mfma; only called when ds_cpu_flags() has DS_CPU_AVX2. */
#include "config.h"

#include <immintrin.h>
#include <math.h>
#include <string.h>

#include "kernels/cpu/cpu_kernels.h"

#define SFX avx2
#define W 8
typedef __m256 vf;
typedef __m256d vd;
#define vload _mm256_loadu_ps
#define vstore _mm256_storeu_ps
#define vset1 _mm256_set1_ps
#define vzero _mm256_setzero_ps
#define vadd _mm256_add_ps
#define vmul _mm256_mul_ps
#define vmax _mm256_max_ps
#define vfma(a, b, c) _mm256_fmadd_ps(a, b, c)    /* a*b + c */
#define vfnma(a, b, c) _mm256_fnmadd_ps(a, b, c)  /* c - a*b */
#define vsel_gt0(y, v) _mm256_and_ps(_mm256_cmp_ps(y, _mm256_setzero_ps(), _CMP_GT_OQ), v)
#define vd_zero _mm256_setzero_pd
#define vd_add _mm256_add_pd
#define vd_fma(a, b, c) _mm256_fmadd_pd(a, b, c)
#define vd_store _mm256_storeu_pd
#define vd_lo(v) _mm256_cvtps_pd(_mm256_castps256_ps128(v))
#define vd_hi(v) _mm256_cvtps_pd(_mm256_extractf128_ps(v, 1))

/* Masked loads and stores of the first n lanes (0 < n <= W); the other
 * lanes read as 0 and are not written, and are never touched in memory. */
typedef __m256i vmask;
#define vmask_n(n) _mm256_cmpgt_epi32(_mm256_set1_epi32(n), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7))
#define vload_m(p, m) _mm256_maskload_ps(p, m)
#define vstore_m(p, m, v) _mm256_maskstore_ps(p, m, v)

/* For the max-pool backward on interleaved pairs (simd_tmpl.c). */
typedef __m256 vcm; /* a compare mask */
#define vcmpgt(a, b) _mm256_cmp_ps(a, b, _CMP_GT_OQ)
#define vblendm(m, x, y) _mm256_blendv_ps(x, y, m)      /* m ? y : x */
#define vand_m(m, v) _mm256_and_ps(m, v)                /* m ? v : 0 */
#define vandn_m(m, v) _mm256_andnot_ps(m, v)            /* m ? 0 : v */
#define vswap_pairs(v) _mm256_permute_ps(v, 0xB1)       /* [1 0 3 2 ...] */
#define vblend_odd(e, o) _mm256_blend_ps(e, o, 0xAA)    /* even lanes of e, odd of o */
/* n <= 4 floats from p, each twice: [p0 p0 p1 p1 ...], 0 past n. */
static inline __m256 vload_dup_n(const float *p, int n)
{
    const __m128 h = n == 4 ? _mm_loadu_ps(p)
                            : _mm_maskload_ps(p, _mm_cmpgt_epi32(_mm_set1_epi32(n),
                                                                 _mm_setr_epi32(0, 1, 2, 3)));
    return _mm256_permutevar8x32_ps(_mm256_castps128_ps256(h),
                                    _mm256_setr_epi32(0, 0, 1, 1, 2, 2, 3, 3));
}

static inline double vd_hsum(__m256d v)
{
    __m128d s = _mm_add_pd(_mm256_castpd256_pd128(v), _mm256_extractf128_pd(v, 1));
    return _mm_cvtsd_f64(_mm_add_sd(s, _mm_unpackhi_pd(s, s)));
}

#include "kernels/cpu/simd_tmpl.c"
