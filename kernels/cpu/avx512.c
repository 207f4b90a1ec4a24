/* kernels/cpu/avx512.c: AVX-512 variants (16 lanes); see simd_tmpl.c.
 * Built with -mavx512f -mavx512bw -mavx512vl -mavx512dq -mfma; only called
 * when ds_cpu_flags() has DS_CPU_AVX512. */
#include "config.h"

#include <immintrin.h>
#include <math.h>
#include <string.h>

#include "kernels/cpu/cpu_kernels.h"

#define SFX avx512
#define W 16
typedef __m512 vf;
typedef __m512d vd;
#define vload _mm512_loadu_ps
#define vstore _mm512_storeu_ps
#define vset1 _mm512_set1_ps
#define vzero _mm512_setzero_ps
#define vadd _mm512_add_ps
#define vmul _mm512_mul_ps
#define vmax _mm512_max_ps
#define vfma(a, b, c) _mm512_fmadd_ps(a, b, c)
#define vfnma(a, b, c) _mm512_fnmadd_ps(a, b, c)
#define vsel_gt0(y, v) _mm512_maskz_mov_ps(_mm512_cmp_ps_mask(y, _mm512_setzero_ps(), _CMP_GT_OQ), v)
#define vd_zero _mm512_setzero_pd
#define vd_add _mm512_add_pd
#define vd_fma(a, b, c) _mm512_fmadd_pd(a, b, c)
#define vd_store _mm512_storeu_pd
#define vd_lo(v) _mm512_cvtps_pd(_mm512_castps512_ps256(v))
#define vd_hi(v) _mm512_cvtps_pd(_mm512_extractf32x8_ps(v, 1))
#define vd_hsum(v) _mm512_reduce_add_pd(v)
/* Masked loads and stores of the first n lanes (0 < n <= W); the other
 * lanes read as 0 and are not written, and are never touched in memory. */
typedef __mmask16 vmask;
#define vmask_n(n) ((__mmask16)((1u << (n)) - 1u))
#define vload_m(p, m) _mm512_maskz_loadu_ps(m, p)
#define vstore_m(p, m, v) _mm512_mask_storeu_ps(p, m, v)
/* For the max-pool backward on interleaved pairs (simd_tmpl.c). */
typedef __mmask16 vcm; /* a compare mask */
#define vcmpgt(a, b) _mm512_cmp_ps_mask(a, b, _CMP_GT_OQ)
#define vblendm(m, x, y) _mm512_mask_blend_ps(m, x, y)           /* m ? y : x */
#define vand_m(m, v) _mm512_maskz_mov_ps(m, v)                   /* m ? v : 0 */
#define vandn_m(m, v) _mm512_maskz_mov_ps((__mmask16)~(m), v)     /* m ? 0 : v */
#define vswap_pairs(v) _mm512_permute_ps(v, 0xB1)                /* [1 0 3 2 ...] */
#define vblend_odd(e, o) _mm512_mask_blend_ps(0xAAAA, e, o)      /* even lanes of e, odd of o */
/* n <= 8 floats from p, each twice: [p0 p0 p1 p1 ...], 0 past n. */
static inline __m512 vload_dup_n(const float *p, int n)
{
    const __m256 h = _mm256_maskz_loadu_ps((__mmask8)((1u << n) - 1u), p);
    return _mm512_permutexvar_ps(_mm512_setr_epi32(0, 0, 1, 1, 2, 2, 3, 3, 4, 4, 5, 5, 6, 6, 7, 7),
                                 _mm512_castps256_ps512(h));
}

#include "kernels/cpu/simd_tmpl.c"
