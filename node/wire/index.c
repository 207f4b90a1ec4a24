/*
 * node/wire/index.c: sparse index sets, the index block of GOSSIP_REQ,
 * GOSSIP_PUSH, GROUP_REDUCE and GROUP_BCAST.
 *
 * An index set is sent in whichever of four encodings is smallest for that
 * message, computed exactly (not estimated) before writing: dense (no
 * indices), raw u32, LEB128 gaps, or a bitmap over the segment. Gaps are
 * coded as idx[i] - idx[i-1] - 1 because indices are strictly increasing,
 * so a run of neighbours costs one zero byte each. Every encoding is
 * canonical (minimal varints, zero padding, no stray bitmap bits), so a
 * frame that decodes re-encodes to the same bytes. Measured sizes and
 * speeds per density are in docs/bench/crypto.md.
 *
 * This is the hottest code of the codec (a gossip exchange is mostly index
 * block and values): sizing is one branch-free pass that vectorises, and
 * the varint reader takes the one- and two-byte gaps on predicted branches
 * and longer ones a word at a time.
 */
#include "config.h"

#include "node/wire/codec.h"

static inline unsigned varint_len(uint32_t v)
{
    return 1u + (v >= (1u << 7)) + (v >= (1u << 14)) + (v >= (1u << 21)) + (v >= (1u << 28));
}

/* Inline (no -mpopcnt: the builtin would be a libgcc call per word). */
static inline uint64_t popcount64(uint64_t x)
{
    x = x - ((x >> 1) & 0x5555555555555555ull);
    x = (x & 0x3333333333333333ull) + ((x >> 2) & 0x3333333333333333ull);
    x = (x + (x >> 4)) & 0x0f0f0f0f0f0f0f0full;
    return (x * 0x0101010101010101ull) >> 56;
}

int ds_wire_idx_sizes(uint32_t seg_len, const uint32_t *idx, uint32_t count, size_t sizes[4],
                      enum ds_idx_enc *best)
{
    if (count > seg_len || (count && !idx && count != seg_len))
        return -EINVAL;
    size_t var = count; /* dense 0..n-1: every gap is 0, one byte each */
    if (idx && count) {
        /* Branch-free so it vectorises: strictly increasing and the last
         * index inside the segment implies all are. A wrapped gap (from an
         * index out of order) is counted harmlessly before the -EINVAL. */
        uint32_t bad = 0, extra = 0;
        for (uint32_t i = 1; i < count; i++) {
            const uint32_t gap = idx[i] - idx[i - 1] - 1;
            bad |= (uint32_t)(idx[i] <= idx[i - 1]);
            extra += (gap >= (1u << 7)) + (gap >= (1u << 14)) + (gap >= (1u << 21)) +
                     (gap >= (1u << 28));
        }
        if (bad || idx[count - 1] >= seg_len)
            return -EINVAL;
        var = (size_t)count + extra + varint_len(idx[0]) - 1;
    }
    sizes[DS_IDX_DENSE] = count == seg_len ? 0 : SIZE_MAX;
    sizes[DS_IDX_RAW] = (size_t)count * 4;
    sizes[DS_IDX_VARINT] = ds_wire_pad4(var);
    sizes[DS_IDX_BITMAP] = ds_wire_bitmap_bytes(seg_len);
    if (best) {
        static const enum ds_idx_enc order[4] = {DS_IDX_DENSE, DS_IDX_RAW, DS_IDX_BITMAP,
                                                 DS_IDX_VARINT};
        enum ds_idx_enc b = DS_IDX_RAW;
        for (int k = 0; k < 4; k++)
            if (sizes[order[k]] < sizes[b])
                b = order[k];
        *best = b;
    }
    return 0;
}

/* LEB128 gaps. room: bytes writable from p (the values follow the block
 * and are written afterwards), so a varint can be stored as one u64. */
static void varint_write(uint8_t *p, size_t bytes, size_t room, const uint32_t *idx,
                         uint32_t count)
{
    size_t o = 0;
    int64_t prev = -1;
    for (uint32_t i = 0; i < count; i++) {
        uint32_t cur = idx ? idx[i] : i;
        uint32_t v = (uint32_t)((int64_t)cur - prev - 1);
        prev = cur;
        if (v < 0x80) { /* one byte: the common case */
            p[o++] = (uint8_t)v;
            continue;
        }
        if (v < 0x4000) {
            p[o] = (uint8_t)(v | 0x80);
            p[o + 1] = (uint8_t)(v >> 7);
            o += 2;
            continue;
        }
        if (o + 8 <= room) {
            const unsigned len = varint_len(v);
            const uint64_t x = (uint64_t)(v & 0x7f) | (uint64_t)((v >> 7) & 0x7f) << 8 |
                               (uint64_t)((v >> 14) & 0x7f) << 16 |
                               (uint64_t)((v >> 21) & 0x7f) << 24 | (uint64_t)(v >> 28) << 32;
            const uint64_t cont = 0x8080808080ull & (~0ull >> (64 - 8 * len) >> 8);
            ds_put64(p + o, x | cont);
            o += len;
            continue;
        }
        while (v >= 0x80) {
            p[o++] = (uint8_t)(v | 0x80);
            v >>= 7;
        }
        p[o++] = (uint8_t)v;
    }
    memset(p + o, 0, bytes - o);
}

void ds_wire_idx_write(uint8_t *p, size_t bytes, size_t room, enum ds_idx_enc enc,
                       uint32_t seg_len, const uint32_t *idx, uint32_t count)
{
    switch (enc) {
    case DS_IDX_DENSE:
    case DS_IDX_AUTO:
        break;
    case DS_IDX_RAW:
        for (uint32_t i = 0; i < count; i++)
            ds_put32(p + 4 * (size_t)i, idx ? idx[i] : i);
        break;
    case DS_IDX_VARINT:
        varint_write(p, bytes, room, idx, count);
        break;
    case DS_IDX_BITMAP: {
        (void)seg_len;
        memset(p, 0, bytes);
        for (uint32_t i = 0; i < count; i++) {
            uint32_t x = idx ? idx[i] : i;
            p[x >> 3] |= (uint8_t)(1u << (x & 7));
        }
        break;
    }
    }
}

static enum ds_drop_reason raw_read(const uint8_t *blk, uint32_t seg_len, uint32_t count,
                                    uint32_t *out)
{
    int64_t prev = -1;
    for (uint32_t i = 0; i < count; i++) {
        uint32_t x = ds_le32(blk + 4 * (size_t)i);
        if ((int64_t)x <= prev)
            return DS_DROP_INDEX_ORDER;
        if (x >= seg_len)
            return DS_DROP_INDEX_RANGE;
        out[i] = x;
        prev = x;
    }
    return DS_DROP_NONE;
}

static enum ds_drop_reason varint_read(const uint8_t *blk, size_t bytes, uint32_t seg_len,
                                       uint32_t count, uint32_t *out)
{
    size_t o = 0;
    uint64_t next = 0; /* smallest index the next entry may have */
    for (uint32_t i = 0; i < count; i++) {
        uint32_t v;
        /* One- and two-byte gaps (densities above ~0.01%) take predicted
         * branches, so the next offset never waits for a load; longer
         * ones are read a word at a time. */
        if (o + 2 <= bytes && blk[o] < 0x80) {
            v = blk[o++];
        } else if (o + 2 <= bytes && blk[o + 1] < 0x80) {
            if (blk[o + 1] == 0)
                return DS_DROP_BAD_ENCODING; /* not minimal */
            v = (uint32_t)(blk[o] & 0x7f) | (uint32_t)blk[o + 1] << 7;
            o += 2;
        } else if (o + 8 <= bytes) {
            /* The first byte without its top bit ends the varint. */
            const uint64_t w = ds_le64(blk + o);
            const uint64_t stop = ~w & 0x8080808080808080ull;
            const unsigned len = stop ? ((unsigned)__builtin_ctzll(stop) >> 3) + 1 : 9;
            if (len > 5)
                return DS_DROP_BAD_ENCODING; /* over 32 bits */
            const uint64_t x = w & (~0ull >> (64 - 8 * len));
            if ((len > 1 && (x >> (8 * (len - 1))) == 0) || (len == 5 && (x >> 32) > 0x0f))
                return DS_DROP_BAD_ENCODING; /* not minimal, or over 32 bits */
            v = (uint32_t)((x & 0x7f) | ((x >> 1) & (0x7full << 7)) |
                           ((x >> 2) & (0x7full << 14)) | ((x >> 3) & (0x7full << 21)) |
                           ((x >> 4) & (0x0full << 28)));
            o += len;
        } else {
            /* The last few bytes of the block, one at a time. */
            unsigned shift = 0, n = 0;
            v = 0;
            for (;;) {
                if (o >= bytes || n == 5)
                    return DS_DROP_BAD_ENCODING;
                const uint8_t b = blk[o++];
                n++;
                if (n == 5 && b > 0x0f)
                    return DS_DROP_BAD_ENCODING; /* over 32 bits */
                v |= (uint32_t)(b & 0x7f) << shift;
                shift += 7;
                if (!(b & 0x80)) {
                    if (n > 1 && b == 0)
                        return DS_DROP_BAD_ENCODING; /* not minimal */
                    break;
                }
            }
        }
        const uint64_t x = next + v;
        if (x >= seg_len)
            return DS_DROP_INDEX_RANGE;
        out[i] = (uint32_t)x;
        next = x + 1;
    }
    /* Only the zero padding to the next multiple of 4 may remain. */
    if (bytes - o >= 4)
        return DS_DROP_BAD_ENCODING;
    for (; o < bytes; o++)
        if (blk[o])
            return DS_DROP_BAD_ENCODING;
    return DS_DROP_NONE;
}

/* The block is whole u32 words; walk it as u64 words plus at most one
 * trailing u32 (read as a u64 with a zero top half). */
static enum ds_drop_reason bitmap_read(const uint8_t *blk, size_t bytes, uint32_t seg_len,
                                       uint32_t count, uint32_t *out)
{
    const size_t words = bytes / 4;
    if (seg_len % 32) {
        uint32_t tail = ds_le32(blk + 4 * (words - 1));
        if (tail >> (seg_len % 32))
            return DS_DROP_INDEX_RANGE;
    }
    const size_t w64 = bytes / 8;
    uint64_t pop = 0;
    for (size_t w = 0; w < w64; w++)
        pop += popcount64(ds_le64(blk + 8 * w));
    if (words % 2)
        pop += popcount64(ds_le32(blk + 8 * w64));
    if (pop != count)
        return DS_DROP_BAD_ENCODING;
    uint32_t k = 0;
    for (size_t w = 0; w < w64 + (words % 2); w++) {
        uint64_t bits = w < w64 ? ds_le64(blk + 8 * w) : ds_le32(blk + 8 * w);
        while (bits) {
            out[k++] = (uint32_t)(w * 64 + (size_t)__builtin_ctzll(bits));
            bits &= bits - 1;
        }
    }
    return DS_DROP_NONE;
}

enum ds_drop_reason ds_wire_idx_read(const uint8_t *blk, size_t bytes, enum ds_idx_enc enc,
                                     uint32_t seg_len, uint32_t count, uint32_t *out)
{
    switch (enc) {
    case DS_IDX_DENSE:
        if (out)
            for (uint32_t i = 0; i < count; i++)
                out[i] = i;
        return DS_DROP_NONE;
    case DS_IDX_RAW:
        return raw_read(blk, seg_len, count, out);
    case DS_IDX_VARINT:
        return varint_read(blk, bytes, seg_len, count, out);
    case DS_IDX_BITMAP:
        return bitmap_read(blk, bytes, seg_len, count, out);
    default:
        return DS_DROP_BAD_FLAGS;
    }
}
