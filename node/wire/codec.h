/*
 * node/wire/codec.h: what the files of node/wire share and nobody else
 * uses: the length rule per message type, the field helpers (strings,
 * values), and the record and index codecs that encode.c and decode.c call.
 * Not part of the API: include it only from the .c files of node/wire.
 *
 * Every reader here trusts its caller to have proven the bytes it reads are
 * inside the frame (the decoder's gates 1 and 2, header.c); every writer
 * trusts its caller to have sized the buffer (payload_size in encode.c).
 * That is what lets each of them be a straight run of loads and stores.
 */
#ifndef DS_NODE_WIRE_CODEC_H
#define DS_NODE_WIRE_CODEC_H

#include <errno.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "node/wire/wire.h"

/* ---- the length rule of each type (header.c) ------------------------------------ */

enum ds_wire_rule_kind { DS_WR_FIXED, DS_WR_COUNT, DS_WR_SPARSE };
enum ds_wire_count_kind { DS_WC_ZERO, DS_WC_ELEMS, DS_WC_RECORDS, DS_WC_BYTES };

/* payload_len must be base + unit * count (FIXED: unit 0; SPARSE: at least
 * that, the index block's exact rule is checked with the payload). */
typedef struct ds_wire_rule {
    uint8_t kind, cnt;
    uint8_t more_ok;   /* DS_WF_MORE allowed */
    uint8_t handshake; /* never sealed */
    uint8_t vals;      /* carries model values: flags bits 5-6 pick their
                        * format, and unit is that format's width */
    uint32_t base, unit;
} ds_wire_rule;

/* Fills *r; returns 0 for an unknown type. */
int ds_wire_rule_of(unsigned type, ds_wire_rule *r);
/* The value format of flags under rule r (DS_VF_F32 for a type without
 * model values), or -1 when the flags name one the type cannot carry. */
static inline int ds_wire_rule_vfmt(const ds_wire_rule *r, uint16_t flags)
{
    const unsigned f = (flags & DS_WF_VAL_MASK) >> DS_WF_VAL_SHIFT;
    if (f && (!r->vals || f > DS_VF_BF16))
        return -1;
    return (int)f;
}

/* ---- fields ---------------------------------------------------------------------- */

static inline int ds_wire_printable(uint8_t c)
{
    return c >= 0x21 && c <= 0x7e;
}

/* A string field on the wire: `len` bytes of printable ASCII, then zeros up
 * to `field` bytes. Copies it NUL-terminated into out[field]. */
static inline int ds_wire_str_read(const uint8_t *p, unsigned len, unsigned field, unsigned min,
                                   char *out)
{
    if (len < min || len >= field)
        return -1;
    for (unsigned i = 0; i < len; i++)
        if (!ds_wire_printable(p[i]))
            return -1;
    for (unsigned i = len; i < field; i++)
        if (p[i] != 0)
            return -1;
    memcpy(out, p, len);
    out[len] = '\0';
    return 0;
}

/* Length of a string the encoder accepts, or -1. */
static inline int ds_wire_str_len_ok(const char *s, unsigned field, unsigned min)
{
    size_t n = strnlen(s, field);
    if (n < min || n >= field)
        return -1;
    for (size_t i = 0; i < n; i++)
        if (!ds_wire_printable((uint8_t)s[i]))
            return -1;
    return (int)n;
}

static inline void ds_wire_str_write(uint8_t *p, const char *s, unsigned len, unsigned field)
{
    memcpy(p, s, len);
    memset(p + len, 0, field - len);
}

static inline int ds_wire_finite_bits(uint32_t u)
{
    return (u & 0x7f800000u) != 0x7f800000u;
}

/* Values: IEEE-754 binary32, little-endian. Copies n values from p into
 * out and reports whether all were finite; branch-free so it vectorises. */
static inline int ds_wire_values_read(const uint8_t *p, uint32_t n, float *out)
{
    uint32_t bad = 0;
    if (n == 0)
        return 1;
#if __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
    memcpy(out, p, (size_t)n * 4);
    const uint32_t *u = (const uint32_t *)(const void *)out;
    for (uint32_t i = 0; i < n; i++)
        bad |= (uint32_t)((u[i] & 0x7f800000u) == 0x7f800000u);
#else
    for (uint32_t i = 0; i < n; i++) {
        uint32_t u = ds_le32(p + 4 * (size_t)i);
        bad |= (uint32_t)!ds_wire_finite_bits(u);
        memcpy(&out[i], &u, 4);
    }
#endif
    return bad == 0;
}

/* Returns 0, or -EDOM if a value is not finite (out is then partly written). */
static inline int ds_wire_values_write(uint8_t *p, const float *v, uint32_t n)
{
    uint32_t bad = 0;
#if __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
    memcpy(p, v, (size_t)n * 4);
    for (uint32_t i = 0; i < n; i++) {
        uint32_t u;
        memcpy(&u, p + 4 * (size_t)i, 4);
        bad |= (uint32_t)!ds_wire_finite_bits(u);
    }
#else
    for (uint32_t i = 0; i < n; i++) {
        uint32_t u;
        memcpy(&u, &v[i], 4);
        bad |= (uint32_t)!ds_wire_finite_bits(u);
        ds_put32(p + 4 * (size_t)i, u);
    }
#endif
    return bad ? -EDOM : 0;
}

/* ---- member records (member.c) ---------------------------------------------------- */

/* Write one record at p (DS_WIRE_MEMBER_SIZE bytes); -EINVAL for a bad
 * string or state. */
int ds_wire_member_write(uint8_t *p, const ds_wire_member *m);
/* Read one record; DS_DROP_BAD_FIELD for a bad string or state. */
enum ds_drop_reason ds_wire_member_read(const uint8_t *p, ds_wire_member *m);

/* ---- handshake payloads (hello.c) -------------------------------------------------- */

/* HELLO (ack = 0) or HELLO_ACK (ack = 1) payload at p; -EINVAL for a bad
 * string or an out-of-range mode, AEAD set or admission. */
int ds_wire_hello_write(uint8_t *p, const ds_wire_hello *h, int ack);
enum ds_drop_reason ds_wire_hello_read(const uint8_t *p, ds_wire_hello *h, int ack);
void ds_wire_fin_write(uint8_t *p, const ds_wire_fin *f);
void ds_wire_fin_read(const uint8_t *p, ds_wire_fin *f);
void ds_wire_reject_write(uint8_t *p, const ds_wire_reject *r);
/* DS_DROP_BAD_FIELD for nonzero padding or a reason that is not a drop. */
enum ds_drop_reason ds_wire_reject_read(const uint8_t *p, ds_wire_reject *r);

/* ---- sparse index sets (index.c) --------------------------------------------------- */

static inline size_t ds_wire_pad4(size_t n)
{
    return (n + 3) & ~(size_t)3;
}

/* Bytes of a bitmap over a segment: whole u32 words. */
static inline size_t ds_wire_bitmap_bytes(uint32_t seg_len)
{
    return 4 * (((size_t)seg_len + 31) / 32);
}

/* Writes the index block (exactly `bytes` long, zero padding included);
 * `room` bytes from p may be scribbled on (the values follow). idx NULL
 * means 0..count-1. */
void ds_wire_idx_write(uint8_t *p, size_t bytes, size_t room, enum ds_idx_enc enc,
                       uint32_t seg_len, const uint32_t *idx, uint32_t count);

/* Gate 3 for the index block. blk is idx_bytes long (checked by the caller
 * against the encoding's exact rule). Writes count indices into out (which
 * may be NULL only for dense). */
enum ds_drop_reason ds_wire_idx_read(const uint8_t *blk, size_t bytes, enum ds_idx_enc enc,
                                     uint32_t seg_len, uint32_t count, uint32_t *out);

#endif
