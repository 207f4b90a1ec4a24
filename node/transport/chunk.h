/*
 * node/transport/chunk.h: the transport's chunk header, pinned like
 * node/wire/wire.h pins the frame header.
 *
 * Every libfabric message the transport sends is one chunk: a fixed 40-byte
 * little-endian header, the sender's own address (name_len bytes: what
 * fi_getname returns, or the advertised address), then at most chunk_bytes
 * of payload. This is a second wire format beside node/wire's frames (which
 * travel inside chunk payloads), so it is written down here once, with
 * named offsets and compile-time checks, and read and written only through
 * base/le.h, never by casting a struct onto received bytes.
 *
 * Header (all integers little-endian; offsets in bytes):
 *
 *    0       4    5     6        8                16               24
 *    +-------+----+-----+--------+----------------+----------------+
 *    | magic |ver |flags|name_len|    stream      |      seq       |
 *    +-------+----+-----+--------+-------+--------+----------------+
 *    |   total_len (u64)         | chunk_idx     | chunk_size     |
 *    +---------------------------+---------------+----------------+
 *    24                          32              36               40
 *    | name (name_len bytes: the sender's raw libfabric address) | payload
 *
 *    magic      u32  0x50545344, the bytes "DSTP"
 *    ver        u8   TP_CHUNK_VERSION (1)
 *    flags      u8   bit 0 ABORT: no payload, the sender abandoned message
 *                    `seq`; bit 1 CONTROL: grant traffic, seq 0, never
 *                    delivered; other bits zero
 *    name_len   u16  1..TP_NAME_MAX
 *    stream     u64  random per sender endpoint incarnation and peer slot,
 *                    never 0
 *    seq        u64  1, 2, ... per stream, assigned when chunk 0 is accepted
 *                    by libfabric; 0 exactly in CONTROL chunks
 *    total_len  u64  length of the whole message
 *    chunk_idx  u32  index of this chunk in the message
 *    chunk_size u32  payload bytes of every chunk but the last
 *
 * CONTROL payloads (one chunk each, total_len = payload length):
 *
 *    0     1         4        8                16
 *    +-----+---------+--------+----------------+----------------+---
 *    |kind | 0 0 0   |  n     |     epoch      |     ids[0]     | ...
 *    +-----+---------+--------+----------------+----------------+---
 *
 *    REQ     (1)  kind, n = grants wanted; 8 bytes in all
 *    GRANT   (2)  kind, n ids, epoch = the sender stream they are for, ids
 *    RELEASE (3)  kind, n ids, epoch = 0, ids
 *    VOID    (4)  kind, n = 0 (8 bytes; the receiver accepts 8 and more)
 *
 * docs/transport.md has the same tables; tests/test_transport.c writes
 * chunks by hand from them (not from this header) and checks every
 * receive-side drop reason, so a change here that is not also a change of
 * the documented format fails there.
 */
#ifndef DS_NODE_TRANSPORT_CHUNK_H
#define DS_NODE_TRANSPORT_CHUNK_H

#include <assert.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "base/le.h"

#define TP_CHUNK_MAGIC 0x50545344u /* bytes "DSTP" */
#define TP_CHUNK_VERSION 1u
#define TP_HDR_FIXED 40u
#define TP_NAME_MAX 128u
#define TP_HDR_MAX (TP_HDR_FIXED + TP_NAME_MAX)

/* Flags. */
#define TP_F_ABORT 0x01u
#define TP_F_CTRL 0x02u /* transport control: grant traffic, never delivered */

/* Field offsets and sizes in the fixed header. */
enum {
    TP_CH_MAGIC = 0, TP_CH_MAGIC_SIZE = 4,
    TP_CH_VERSION = 4, TP_CH_VERSION_SIZE = 1,
    TP_CH_FLAGS = 5, TP_CH_FLAGS_SIZE = 1,
    TP_CH_NAME_LEN = 6, TP_CH_NAME_LEN_SIZE = 2,
    TP_CH_STREAM = 8, TP_CH_STREAM_SIZE = 8,
    TP_CH_SEQ = 16, TP_CH_SEQ_SIZE = 8,
    TP_CH_TOTAL = 24, TP_CH_TOTAL_SIZE = 8,
    TP_CH_CHUNK_IDX = 32, TP_CH_CHUNK_IDX_SIZE = 4,
    TP_CH_CHUNK_SIZE = 36, TP_CH_CHUNK_SIZE_SIZE = 4,
    TP_CH_NAME = 40, /* the sender's address, name_len bytes */
};

/* A mirror of the layout for static_assert only: never cast wire bytes to it. */
struct __attribute__((packed)) tp_chunk_layout {
    uint32_t magic;
    uint8_t version;
    uint8_t flags;
    uint16_t name_len;
    uint64_t stream, seq, total;
    uint32_t chunk_idx, chunk_size;
};
#define TP_CH_PIN(field, OFF) \
    static_assert(offsetof(struct tp_chunk_layout, field) == OFF, #field " offset"); \
    static_assert(sizeof(((struct tp_chunk_layout *)0)->field) == OFF##_SIZE, #field " size")
TP_CH_PIN(magic, TP_CH_MAGIC);
TP_CH_PIN(version, TP_CH_VERSION);
TP_CH_PIN(flags, TP_CH_FLAGS);
TP_CH_PIN(name_len, TP_CH_NAME_LEN);
TP_CH_PIN(stream, TP_CH_STREAM);
TP_CH_PIN(seq, TP_CH_SEQ);
TP_CH_PIN(total, TP_CH_TOTAL);
TP_CH_PIN(chunk_idx, TP_CH_CHUNK_IDX);
TP_CH_PIN(chunk_size, TP_CH_CHUNK_SIZE);
#undef TP_CH_PIN
static_assert(sizeof(struct tp_chunk_layout) == TP_HDR_FIXED, "chunk header size");
static_assert(TP_CH_CHUNK_SIZE + TP_CH_CHUNK_SIZE_SIZE == TP_HDR_FIXED, "no tail gap");
static_assert(TP_CH_NAME == TP_HDR_FIXED, "the name follows the fixed header");
static_assert(TP_NAME_MAX <= UINT16_MAX, "name_len fits its field");

/* Control payloads. */
enum tp_ctrl_kind { TP_CTRL_REQ = 1, TP_CTRL_GRANT = 2, TP_CTRL_RELEASE = 3, TP_CTRL_VOID = 4 };
enum {
    TP_CTRL_KIND = 0,   /* u8, then three zero bytes */
    TP_CTRL_N = 4,      /* u32 */
    TP_CTRL_EPOCH = 8,  /* u64 (GRANT, RELEASE) */
    TP_CTRL_IDS = 16,   /* u64 each (GRANT, RELEASE) */
};
#define TP_CTRL_HEAD 8u /* kind, padding and n: REQ and VOID are this long */
static_assert(TP_CTRL_N + 4 == TP_CTRL_HEAD, "n ends the short control head");
static_assert(TP_CTRL_EPOCH + 8 == TP_CTRL_IDS, "ids follow the epoch");

/* The fixed header's fields, decoded. */
typedef struct tp_chunk_hdr {
    uint8_t flags;
    uint16_t name_len;
    uint64_t stream, seq, total;
    uint32_t chunk_idx, chunk_size;
} tp_chunk_hdr;

/* Write the fixed header (TP_HDR_FIXED bytes at h) and the sender's name
 * after it (c->name_len bytes of name). */
static inline void tp_chunk_hdr_put(uint8_t *h, const tp_chunk_hdr *c, const uint8_t *name)
{
    ds_put32(h + TP_CH_MAGIC, TP_CHUNK_MAGIC);
    h[TP_CH_VERSION] = TP_CHUNK_VERSION;
    h[TP_CH_FLAGS] = c->flags;
    ds_put16(h + TP_CH_NAME_LEN, c->name_len);
    ds_put64(h + TP_CH_STREAM, c->stream);
    ds_put64(h + TP_CH_SEQ, c->seq);
    ds_put64(h + TP_CH_TOTAL, c->total);
    ds_put32(h + TP_CH_CHUNK_IDX, c->chunk_idx);
    ds_put32(h + TP_CH_CHUNK_SIZE, c->chunk_size);
    memcpy(h + TP_CH_NAME, name, c->name_len);
}

/* Read the fixed header of a received chunk of len bytes. Returns 0, or -1
 * when it is too short for the fixed header or the magic or version is not
 * ours. The fields are not otherwise checked. */
static inline int tp_chunk_hdr_get(const uint8_t *h, size_t len, tp_chunk_hdr *c)
{
    if (len < TP_HDR_FIXED || ds_le32(h + TP_CH_MAGIC) != TP_CHUNK_MAGIC ||
        h[TP_CH_VERSION] != TP_CHUNK_VERSION)
        return -1;
    c->flags = h[TP_CH_FLAGS];
    c->name_len = ds_le16(h + TP_CH_NAME_LEN);
    c->stream = ds_le64(h + TP_CH_STREAM);
    c->seq = ds_le64(h + TP_CH_SEQ);
    c->total = ds_le64(h + TP_CH_TOTAL);
    c->chunk_idx = ds_le32(h + TP_CH_CHUNK_IDX);
    c->chunk_size = ds_le32(h + TP_CH_CHUNK_SIZE);
    return 0;
}

/* Write the head of a control payload: kind, three zero bytes, n. */
static inline void tp_ctrl_put_head(uint8_t *p, uint8_t kind, uint32_t n)
{
    p[TP_CTRL_KIND] = kind;
    p[1] = p[2] = p[3] = 0;
    ds_put32(p + TP_CTRL_N, n);
}

#endif
