/*
 * kernels/cpu/select_avx512.c: AVX-512 selection kernels (16 lanes); the
 * streaming ones come from select_tmpl.c. Compaction packs the kept lanes
 * with vcompress into a register and stores all 16 (the compress-to-memory
 * form is slow on several cores), gather and scatter-add use the 64-bit
 * index forms so that indices of 2^31 and above stay correct.
 * Built with -mavx512f -mavx512bw -mavx512vl -mavx512dq -mfma; only called
 * when ds_cpu_flags() has DS_CPU_AVX512. Test: meson test -C build select.
 */
#include "config.h"

#include <immintrin.h>
#include <math.h>
#include <string.h>

#include "kernels/select.h"

#define SFX avx512
#define W 16
typedef __m512 vf;
typedef __m512i vi;
typedef unsigned msk;
#define vload _mm512_loadu_ps
#define vloadi(p) _mm512_loadu_si512((const void *)(p))
#define vstorei(p, a) _mm512_storeu_si512((void *)(p), a)
#define vset1i _mm512_set1_epi32
#define vaddi _mm512_add_epi32
#define viota() _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15)
#define vsrli20(k) _mm512_srli_epi32(k, 20)
#define vkey(x) _mm512_and_si512(_mm512_castps_si512(x), _mm512_set1_epi32(0x7fffffff))
#define vge(a, b) ((msk)_mm512_cmpge_epi32_mask(a, b))
typedef __mmask16 vm;
#define vm_inrange(k, lo, span) _mm512_cmplt_epu32_mask(_mm512_sub_epi32(k, lo), span)
#define vm_nonfinite(k) _mm512_cmpge_epu32_mask(k, _mm512_set1_epi32((int32_t)DS_SEL_KEY_INF))
#define vm_bits(m) ((msk)(m))
#define vcount(c, m) _mm512_mask_sub_epi32(c, m, c, _mm512_set1_epi32(-1))
#define mpop(m) ((size_t)__builtin_popcount(m))
#define vfinite(x) \
    _mm512_maskz_mov_ps(_mm512_cmplt_epi32_mask(vkey(x), _mm512_set1_epi32((int32_t)DS_SEL_KEY_INF)), x)
typedef __m512d vd;
#define vd_zero _mm512_setzero_pd
#define vd_fma(a, b, c) _mm512_fmadd_pd(a, b, c)
#define vd_hsum(v) _mm512_reduce_add_pd(v)
#define vd_lo(v) _mm512_cvtps_pd(_mm512_castps512_ps256(v))
#define vd_hi(v) _mm512_cvtps_pd(_mm512_extractf32x8_ps(v, 1))

/* Lane counts are at most n / 16 < 2^28; their sum can pass 2^31. */
static inline size_t vi_hsum(__m512i c)
{
    return (size_t)_mm512_reduce_add_epi64(_mm512_cvtepu32_epi64(_mm512_castsi512_si256(c))) +
           (size_t)_mm512_reduce_add_epi64(_mm512_cvtepu32_epi64(_mm512_extracti64x4_epi64(c, 1)));
}

static inline void compress_store(uint32_t *pidx, float *pval, msk m, vi ix, vf x)
{
    _mm512_storeu_si512((void *)pidx, _mm512_maskz_compress_epi32((__mmask16)m, ix));
    _mm512_storeu_ps(pval, _mm512_maskz_compress_ps((__mmask16)m, x));
}

#include "kernels/cpu/select_tmpl.c"

DS_DECL_SEL_GATHER(ds_sel_gather_avx512)
{
    size_t j = 0;
    for (; j + 16 <= count; j += 16) {
        const __m512i ix = _mm512_loadu_si512((const void *)(idx + j));
        const __m512i lo = _mm512_cvtepu32_epi64(_mm512_castsi512_si256(ix));
        const __m512i hi = _mm512_cvtepu32_epi64(_mm512_extracti64x4_epi64(ix, 1));
        _mm256_storeu_ps(out + j, _mm512_i64gather_ps(lo, v, 4));
        _mm256_storeu_ps(out + j + 8, _mm512_i64gather_ps(hi, v, 4));
    }
    for (; j < count; j++)
        out[j] = v[idx[j]];
}

DS_DECL_SEL_SCATTER_ADD(ds_sel_scatter_add_avx512)
{
    /* Indices are unique, so the gathered lanes and the scattered lanes
     * never overlap within a vector or across vectors. */
    const __m256 wv = _mm256_set1_ps(w);
    size_t j = 0;
    for (; j + 16 <= count; j += 16) {
        const __m512i ix = _mm512_loadu_si512((const void *)(idx + j));
        const __m512i lo = _mm512_cvtepu32_epi64(_mm512_castsi512_si256(ix));
        const __m512i hi = _mm512_cvtepu32_epi64(_mm512_extracti64x4_epi64(ix, 1));
        const __m256 ylo = _mm512_i64gather_ps(lo, y, 4);
        const __m256 yhi = _mm512_i64gather_ps(hi, y, 4);
        const __m256 plo = _mm256_mul_ps(wv, _mm256_loadu_ps(val + j));
        const __m256 phi = _mm256_mul_ps(wv, _mm256_loadu_ps(val + j + 8));
        _mm512_i64scatter_ps(y, lo, _mm256_add_ps(ylo, plo), 4);
        _mm512_i64scatter_ps(y, hi, _mm256_add_ps(yhi, phi), 4);
    }
    for (; j < count; j++) {
        const float p = w * val[j];
        y[idx[j]] = y[idx[j]] + p;
    }
}
