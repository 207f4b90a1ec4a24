/*
 * kernels/cpu/select_avx2.c: AVX2 selection kernels (8 lanes); the
 * streaming ones come from select_tmpl.c. AVX2 has no compress instruction:
 * compaction looks up, by the 8-bit lane mask, the lane order that moves the
 * kept lanes to the front and applies it with vpermd to both the index and
 * the value vector. The 256 orders are built at compile time from the 16
 * orders of a 4-lane half (PERM below), 2 KiB of read-only data.
 * Gather and scatter-add use the 64-bit index forms so that indices of 2^31
 * and above stay correct. AVX2 cannot scatter: the sums are stored lane by
 * lane. Built with -mavx2 -mfma; only called when ds_cpu_flags() has
 * DS_CPU_AVX2. Test: meson test -C build select.
 */
#include "config.h"

#include <immintrin.h>
#include <math.h>
#include <string.h>

#include "kernels/select.h"

/* Lane numbers of the set bits of a 4-bit mask, one per byte, lowest first. */
#define HALF(m) \
    ((m) == 0 ? 0x0ull : (m) == 1 ? 0x0ull : (m) == 2 ? 0x01ull : (m) == 3 ? 0x0100ull : \
     (m) == 4 ? 0x02ull : (m) == 5 ? 0x0200ull : (m) == 6 ? 0x0201ull : \
     (m) == 7 ? 0x020100ull : (m) == 8 ? 0x03ull : (m) == 9 ? 0x0300ull : \
     (m) == 10 ? 0x0301ull : (m) == 11 ? 0x030100ull : (m) == 12 ? 0x0302ull : \
     (m) == 13 ? 0x030200ull : (m) == 14 ? 0x030201ull : 0x03020100ull)
#define POP4(m) (((m) & 1) + (((m) >> 1) & 1) + (((m) >> 2) & 1) + (((m) >> 3) & 1))
/* The high half's lanes are 4..7 and follow the low half's kept lanes.
 * Bytes past the kept count hold leftovers; vpermd reads only 3 bits of
 * each, and those lanes are overwritten by the next store anyway. */
#define PERM(m) (HALF((m) & 15) | ((HALF((m) >> 4) + 0x04040404ull) << (8 * POP4((m) & 15))))
#define PERM4(m) PERM(m), PERM((m) + 1), PERM((m) + 2), PERM((m) + 3)
#define PERM16(m) PERM4(m), PERM4((m) + 4), PERM4((m) + 8), PERM4((m) + 12)
#define PERM64(m) PERM16(m), PERM16((m) + 16), PERM16((m) + 32), PERM16((m) + 48)
static const uint64_t perm_table[256] = {
    PERM64(0), PERM64(64), PERM64(128), PERM64(192),
};

#define SFX avx2
#define W 8
typedef __m256 vf;
typedef __m256i vi;
typedef unsigned msk;
#define vload _mm256_loadu_ps
#define vloadi(p) _mm256_loadu_si256((const __m256i *)(p))
#define vstorei(p, a) _mm256_storeu_si256((__m256i *)(p), a)
#define vset1i _mm256_set1_epi32
#define vaddi _mm256_add_epi32
#define viota() _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7)
#define vsrli20(k) _mm256_srli_epi32(k, 20)
#define vkey(x) _mm256_and_si256(_mm256_castps_si256(x), _mm256_set1_epi32(0x7fffffff))
#define vmask(c) ((msk)_mm256_movemask_ps(_mm256_castsi256_ps(c)))
#define vge(a, b) (vmask(_mm256_cmpgt_epi32(b, a)) ^ 0xffu)
typedef __m256i vm;
#define SIGN32 _mm256_set1_epi32((int32_t)0x80000000u)
/* AVX2 compares signed only: flipping the sign bits of both sides makes a
 * signed compare an unsigned one. */
#define vm_inrange(k, lo, span) \
    _mm256_cmpgt_epi32(_mm256_xor_si256(span, SIGN32), _mm256_xor_si256(_mm256_sub_epi32(k, lo), SIGN32))
#define vm_nonfinite(k) _mm256_cmpgt_epi32(k, _mm256_set1_epi32((int32_t)DS_SEL_KEY_INF - 1))
#define vm_bits(m) vmask(m)
#define vcount(c, m) _mm256_sub_epi32(c, m)
#define mpop(m) ((size_t)__builtin_popcount(m))
#define vfinite(x) \
    _mm256_and_ps(x, _mm256_castsi256_ps(_mm256_cmpgt_epi32( \
                         _mm256_set1_epi32((int32_t)DS_SEL_KEY_INF), vkey(x))))
typedef __m256d vd;
#define vd_zero _mm256_setzero_pd
#define vd_fma(a, b, c) _mm256_fmadd_pd(a, b, c)
#define vd_lo(v) _mm256_cvtps_pd(_mm256_castps256_ps128(v))
#define vd_hi(v) _mm256_cvtps_pd(_mm256_extractf128_ps(v, 1))

static inline double vd_hsum(__m256d v)
{
    __m128d s = _mm_add_pd(_mm256_castpd256_pd128(v), _mm256_extractf128_pd(v, 1));
    return _mm_cvtsd_f64(_mm_add_sd(s, _mm_unpackhi_pd(s, s)));
}

static inline size_t vi_hsum(__m256i c)
{
    const __m256i lo = _mm256_cvtepu32_epi64(_mm256_castsi256_si128(c));
    const __m256i hi = _mm256_cvtepu32_epi64(_mm256_extracti128_si256(c, 1));
    uint64_t t[4];
    _mm256_storeu_si256((__m256i *)t, _mm256_add_epi64(lo, hi));
    return (size_t)(t[0] + t[1] + t[2] + t[3]);
}

static inline void compress_store(uint32_t *pidx, float *pval, msk m, vi ix, vf x)
{
    const __m256i p = _mm256_cvtepu8_epi32(_mm_cvtsi64_si128((long long)perm_table[m]));
    _mm256_storeu_si256((__m256i *)pidx, _mm256_permutevar8x32_epi32(ix, p));
    _mm256_storeu_ps(pval, _mm256_permutevar8x32_ps(x, p));
}

#include "kernels/cpu/select_tmpl.c"

DS_DECL_SEL_GATHER(ds_sel_gather_avx2)
{
    size_t j = 0;
    for (; j + 8 <= count; j += 8) {
        const __m256i ix = _mm256_loadu_si256((const __m256i *)(idx + j));
        const __m256i lo = _mm256_cvtepu32_epi64(_mm256_castsi256_si128(ix));
        const __m256i hi = _mm256_cvtepu32_epi64(_mm256_extracti128_si256(ix, 1));
        _mm_storeu_ps(out + j, _mm256_i64gather_ps(v, lo, 4));
        _mm_storeu_ps(out + j + 4, _mm256_i64gather_ps(v, hi, 4));
    }
    for (; j < count; j++)
        out[j] = v[idx[j]];
}

DS_DECL_SEL_SCATTER_ADD(ds_sel_scatter_add_avx2)
{
    const __m256 wv = _mm256_set1_ps(w);
    float s[8];
    size_t j = 0;
    for (; j + 8 <= count; j += 8) {
        const __m256i ix = _mm256_loadu_si256((const __m256i *)(idx + j));
        const __m256i lo = _mm256_cvtepu32_epi64(_mm256_castsi256_si128(ix));
        const __m256i hi = _mm256_cvtepu32_epi64(_mm256_extracti128_si256(ix, 1));
        const __m256 yv = _mm256_set_m128(_mm256_i64gather_ps(y, hi, 4), _mm256_i64gather_ps(y, lo, 4));
        _mm256_storeu_ps(s, _mm256_add_ps(yv, _mm256_mul_ps(wv, _mm256_loadu_ps(val + j))));
        for (unsigned l = 0; l < 8; l++)
            y[idx[j + l]] = s[l];
    }
    for (; j < count; j++) {
        const float p = w * val[j];
        y[idx[j]] = y[idx[j]] + p;
    }
}
