/*
 * node/wire/values.c: model values in binary32, binary16 and bfloat16
 * (see values.h).
 *
 * The references convert one value at a time with integer operations; the
 * binary16 kernels use F16C (vcvtps2ph with round to nearest even, after a
 * clamp to +-65504 that gives the references' saturation) where the CPU
 * has it, the bfloat16 ones are the references' arithmetic in a loop
 * without branches, which the compiler vectorises.
 */
#include "config.h"

#include "node/wire/values.h"

#include "node/wire/codec.h"

#include <errno.h>
#include <stdatomic.h>
#include <string.h>

#include "base/le.h"

#if ARCH_X86_64
#include <cpuid.h>
#include <immintrin.h>
#endif

static inline uint32_t bits_of(float x)
{
    uint32_t u;
    memcpy(&u, &x, 4);
    return u;
}

static inline float float_of(uint32_t u)
{
    float x;
    memcpy(&x, &u, 4);
    return x;
}

const char *ds_wire_vfmt_name(unsigned f)
{
    switch (f) {
    case DS_VF_F32: return "f32";
    case DS_VF_F16: return "f16";
    case DS_VF_BF16: return "bf16";
    default: return "?";
    }
}

/* ---- scalars: the references ------------------------------------------------- */

uint16_t ds_f32_to_f16_ref(float x)
{
    const uint32_t u = bits_of(x);
    const uint16_t sign = (uint16_t)((u >> 16) & 0x8000u);
    const uint32_t a = u & 0x7fffffffu;
    if (a >= 0x477ff000u) /* >= 65520: rounds past 65504; saturate */
        return sign | 0x7bffu;
    if (a >= 0x38800000u) { /* >= 2^-14: a normal binary16 */
        uint32_t r = a - (112u << 23); /* exponent bias 127 -> 15 */
        r += 0xfffu + ((r >> 13) & 1u); /* to nearest, ties to even */
        return sign | (uint16_t)(r >> 13);
    }
    if (a <= 0x33000000u) /* <= 2^-25: rounds to zero (2^-25 is a tie to even 0) */
        return sign;
    /* A subnormal binary16: round(|x| / 2^-24), |x| = m * 2^(e - 150). */
    const uint32_t e = a >> 23, m = (a & 0x7fffffu) | 0x800000u;
    const uint32_t shift = 126u - e; /* 14 .. 24 */
    uint32_t q = m >> shift;
    const uint32_t rem = m & ((1u << shift) - 1u), half = 1u << (shift - 1u);
    if (rem > half || (rem == half && (q & 1u)))
        q++; /* may reach 0x400, the smallest normal: the right bits */
    return sign | (uint16_t)q;
}

float ds_f16_to_f32_ref(uint16_t h)
{
    const uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    const uint32_t e = (h >> 10) & 0x1fu, m = h & 0x3ffu;
    if (e == 0x1f)
        return float_of(sign | 0x7f800000u | (m << 13));
    if (e)
        return float_of(sign | ((e + 112u) << 23) | (m << 13));
    return float_of(sign | bits_of((float)m * 0x1p-24f)); /* exact: m < 2^10 */
}

uint16_t ds_f32_to_bf16_ref(float x)
{
    const uint32_t u = bits_of(x);
    const uint32_t r = u + 0x7fffu + ((u >> 16) & 1u); /* to nearest, ties to even */
    if ((r & 0x7f800000u) == 0x7f800000u) /* rounded past the largest finite */
        return (uint16_t)(((u >> 16) & 0x8000u) | 0x7f7fu);
    return (uint16_t)(r >> 16);
}

float ds_bf16_to_f32_ref(uint16_t b)
{
    return float_of((uint32_t)b << 16);
}

/* ---- arrays: references and kernels -------------------------------------------- */

void ds_wire_f16_pack_ref(uint8_t *p, const float *v, size_t n)
{
    for (size_t i = 0; i < n; i++)
        ds_put16(p + 2 * i, ds_f32_to_f16_ref(v[i]));
}

void ds_wire_f16_unpack_ref(const uint8_t *p, size_t n, float *out)
{
    for (size_t i = 0; i < n; i++)
        out[i] = ds_f16_to_f32_ref(ds_le16(p + 2 * i));
}

void ds_wire_bf16_pack_ref(uint8_t *p, const float *v, size_t n)
{
    for (size_t i = 0; i < n; i++)
        ds_put16(p + 2 * i, ds_f32_to_bf16_ref(v[i]));
}

void ds_wire_bf16_unpack_ref(const uint8_t *p, size_t n, float *out)
{
    for (size_t i = 0; i < n; i++)
        out[i] = ds_bf16_to_f32_ref(ds_le16(p + 2 * i));
}

#if ARCH_X86_64 && __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
__attribute__((target("avx,f16c"))) static void f16_pack_f16c(uint8_t *p, const float *v,
                                                               size_t n)
{
    const __m256 hi = _mm256_set1_ps(65504.0f), lo = _mm256_set1_ps(-65504.0f);
    size_t i = 0;
    for (; i + 8 <= n; i += 8) {
        __m256 x = _mm256_loadu_ps(v + i);
        x = _mm256_min_ps(_mm256_max_ps(x, lo), hi);
        _mm_storeu_si128((__m128i *)(void *)(p + 2 * i),
                         _mm256_cvtps_ph(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
    }
    ds_wire_f16_pack_ref(p + 2 * i, v + i, n - i);
}

__attribute__((target("avx,f16c"))) static void f16_unpack_f16c(const uint8_t *p, size_t n,
                                                                 float *out)
{
    size_t i = 0;
    for (; i + 8 <= n; i += 8)
        _mm256_storeu_ps(out + i,
                         _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(const void *)(p + 2 * i))));
    ds_wire_f16_unpack_ref(p + 2 * i, n - i, out + i);
}

int ds_wire_f16_fast(void)
{
    /* Every thread computes the same; atomic, so that the first ones to
     * ask may do it at once without a data race. */
    static _Atomic int have = -1;
    if (atomic_load_explicit(&have, memory_order_relaxed) < 0) {
        /* CPUID.1:ECX: OSXSAVE (27), AVX (28), F16C (29); the OS saves
         * the YMM state (XCR0 bits 1-2). clang 14's __builtin_cpu_supports
         * does not know "f16c". */
        unsigned a, b, c, d;
        int ok = __get_cpuid(1, &a, &b, &c, &d) && (c & (7u << 27)) == (7u << 27);
        if (ok) {
            unsigned lo, hi;
            __asm__("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
            ok = (lo & 6u) == 6u;
        }
        atomic_store_explicit(&have, ok, memory_order_relaxed);
    }
    return atomic_load_explicit(&have, memory_order_relaxed);
}
#else
int ds_wire_f16_fast(void)
{
    return 0;
}
#endif

void ds_wire_f16_pack(uint8_t *p, const float *v, size_t n)
{
#if ARCH_X86_64 && __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
    if (ds_wire_f16_fast()) {
        f16_pack_f16c(p, v, n);
        return;
    }
#endif
    ds_wire_f16_pack_ref(p, v, n);
}

void ds_wire_f16_unpack(const uint8_t *p, size_t n, float *out)
{
#if ARCH_X86_64 && __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
    if (ds_wire_f16_fast()) {
        f16_unpack_f16c(p, n, out);
        return;
    }
#endif
    ds_wire_f16_unpack_ref(p, n, out);
}

void ds_wire_bf16_pack(uint8_t *p, const float *v, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        const uint32_t u = bits_of(v[i]);
        const uint32_t r = u + 0x7fffu + ((u >> 16) & 1u);
        const uint32_t sat = (uint32_t)-(uint32_t)((r & 0x7f800000u) == 0x7f800000u);
        const uint16_t b =
            (uint16_t)((((u >> 16) & 0x8000u) | 0x7f7fu) & sat) | (uint16_t)((r >> 16) & ~sat);
        memcpy(p + 2 * i, &b, 2); /* little-endian hosts; see below */
    }
#if __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
    for (size_t i = 0; i < n; i++) {
        uint16_t b;
        memcpy(&b, p + 2 * i, 2);
        ds_put16(p + 2 * i, b);
    }
#endif
}

void ds_wire_bf16_unpack(const uint8_t *p, size_t n, float *out)
{
    for (size_t i = 0; i < n; i++)
        out[i] = float_of((uint32_t)ds_le16(p + 2 * i) << 16);
}

/* ---- whole arrays, checked -------------------------------------------------------- */

/* 1 when every value of v[0..n) is finite; branch-free so it vectorises. */
static int all_finite(const float *v, size_t n)
{
    uint32_t bad = 0;
    for (size_t i = 0; i < n; i++)
        bad |= (uint32_t)((bits_of(v[i]) & 0x7f800000u) == 0x7f800000u);
    return bad == 0;
}

void ds_wire_values_round(unsigned f, float *v, size_t n)
{
    /* Through the wire's own kernels, a block at a time: what a peer
     * decodes, by construction. */
    uint8_t buf[2 * 256];
    if (f != DS_VF_F16 && f != DS_VF_BF16)
        return;
    for (size_t o = 0; o < n; o += 256) {
        const size_t k = n - o < 256 ? n - o : 256;
        if (f == DS_VF_F16) {
            ds_wire_f16_pack(buf, v + o, k);
            ds_wire_f16_unpack(buf, k, v + o);
        } else {
            ds_wire_bf16_pack(buf, v + o, k);
            ds_wire_bf16_unpack(buf, k, v + o);
        }
    }
}

int ds_wire_values_put(uint8_t *p, unsigned f, const float *v, size_t n)
{
    if (!ds_wire_vfmt_width(f))
        return -EINVAL;
    if (n == 0)
        return 0;
    if (f != DS_VF_F32 && !all_finite(v, n))
        return -EDOM;
    switch (f) {
    case DS_VF_F16: ds_wire_f16_pack(p, v, n); break;
    case DS_VF_BF16: ds_wire_bf16_pack(p, v, n); break;
    default: return ds_wire_values_write(p, v, (uint32_t)n);
    }
    return 0;
}

int ds_wire_values_get(const uint8_t *p, unsigned f, size_t n, float *out)
{
    if (n == 0) /* out may be NULL then */
        return ds_wire_vfmt_width(f) != 0;
    switch (f) {
    case DS_VF_F16: ds_wire_f16_unpack(p, n, out); break;
    case DS_VF_BF16: ds_wire_bf16_unpack(p, n, out); break;
    case DS_VF_F32: return ds_wire_values_read(p, (uint32_t)n, out);
    default: return 0;
    }
    return all_finite(out, n);
}
