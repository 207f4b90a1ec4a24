/*
 * node/wire/values.h: model values in the formats of the wire (flags bits
 * 5-6, enum ds_wire_vfmt in header.h): binary32, binary16 and bfloat16,
 * little-endian.
 *
 * Narrowing rounds to nearest, ties to even, and saturates: a finite value
 * beyond the format's largest finite one becomes that one (binary16:
 * +-65504; bfloat16: +-3.3895e38), so a finite input never becomes an
 * infinity. Widening is exact. ds_wire_values_round(f, v) leaves in v
 * exactly what a peer decodes from v sent in format f. For every finite x
 * inside the format's range (binary16: |x| < 65520, where it does not
 * saturate; bfloat16: all), r = x - round(x) is exact in binary32 (x and
 * round(x) are multiples of x's ulp and |r| <= |x|), so round(x) + r == x
 * (bit for bit but for the sign of a zero): what a sender keeps of a value
 * and what it sent add up to the value.
 *
 * Each array kernel has a plain C reference (*_ref) beside it; the fast
 * ones (F16C for binary16 where the CPU has it; bfloat16 is integer work
 * the compiler vectorises) are checked against them on seeded inputs in
 * tests/test_wire.c. Threads: pure functions.
 */
#ifndef DS_NODE_WIRE_VALUES_H
#define DS_NODE_WIRE_VALUES_H

#include <stddef.h>
#include <stdint.h>

#include "node/wire/header.h"

/* Bytes per value: 4, 2, 2; 0 for a format not in enum ds_wire_vfmt. */
static inline size_t ds_wire_vfmt_width(unsigned f)
{
    return f == DS_VF_F32 ? 4 : f == DS_VF_F16 || f == DS_VF_BF16 ? 2 : 0;
}
/* "f32", "f16", "bf16", or "?". */
const char *ds_wire_vfmt_name(unsigned f);

/* Scalars, plain C: the references. */
uint16_t ds_f32_to_f16_ref(float x);
float ds_f16_to_f32_ref(uint16_t h);
uint16_t ds_f32_to_bf16_ref(float x);
float ds_bf16_to_f32_ref(uint16_t b);

/* v[0..n) in place -> what format f carries of them (f32: unchanged).
 * Inputs must be finite. */
void ds_wire_values_round(unsigned f, float *v, size_t n);

/* Write n values at p in format f (width * n bytes). 0, or -EDOM when a
 * value is not finite (p then partly written), -EINVAL for an unknown f. */
int ds_wire_values_put(uint8_t *p, unsigned f, const float *v, size_t n);
/* Read n values at p in format f into out; 1 when all are finite, 0 when
 * one is not (or f is unknown). */
int ds_wire_values_get(const uint8_t *p, unsigned f, size_t n, float *out);

/* The array kernels behind put/get for the narrow formats, and their plain
 * C references (no finiteness check: callers check the inputs). */
void ds_wire_f16_pack(uint8_t *p, const float *v, size_t n);
void ds_wire_f16_pack_ref(uint8_t *p, const float *v, size_t n);
void ds_wire_f16_unpack(const uint8_t *p, size_t n, float *out);
void ds_wire_f16_unpack_ref(const uint8_t *p, size_t n, float *out);
void ds_wire_bf16_pack(uint8_t *p, const float *v, size_t n);
void ds_wire_bf16_pack_ref(uint8_t *p, const float *v, size_t n);
void ds_wire_bf16_unpack(const uint8_t *p, size_t n, float *out);
void ds_wire_bf16_unpack_ref(const uint8_t *p, size_t n, float *out);
/* 1 when ds_wire_f16_pack/unpack run F16C code on this CPU. */
int ds_wire_f16_fast(void);

#endif
