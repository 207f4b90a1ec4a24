/*
 * node/wire/header.h: the 64-byte frame header, pinned, and the conventions
 * every payload layout shares (node/wire/member.h, node/wire/hello.h).
 *
 * Why a hand-written codec with explicit shifts instead of packed structs:
 * a struct cast ties the format to one compiler's layout and one CPU's
 * byte order, and it lets a reader touch a field before the length has been
 * checked. Every field is read with ds_le*() (base/le.h) from a byte
 * pointer, and only after the frame length has been checked against the
 * type's rule (docs/protocol.md has the table per type). A packed mirror
 * struct exists solely so static_assert can pin each offset and size at
 * compile time; nothing ever casts wire bytes to it. The member record and
 * the handshake bodies are pinned the same way in their own headers.
 *
 * Header (all integers little-endian; offsets in bytes):
 *
 *    0       4       8               16              24              32
 *    +-------+-+-+---+---------------+---------------+---------------+
 *    | magic |v|t|flg|  cluster id   |    sender     |   receiver    |
 *    +-------+-+-+---+---------------+-------+-------+-------+-------+
 *    |     round     | epoch | segm. | count |pay.len|      seq      |
 *    +---------------+-------+-------+-------+-------+---------------+
 *   32              40      44      48      52      56              64
 *
 *    magic    u32  0x776e7364, the bytes "dsnw"
 *    v        u8   version, DS_WIRE_VERSION
 *    t        u8   message type (enum ds_msg_type)
 *    flg      u16  flags: bits 0-1 index encoding (sparse types only),
 *                  bits 2-3 protection (0 none, 1 auth, 2 encrypt),
 *                  bit 4 MORE (another chunk follows), bits 5-6 value
 *                  format (sparse types and GOSSIP_RESP), bits 7-15 zero
 *    cluster  u64  ds_wire_cluster_id(cluster name)
 *    sender   u64  ds_wire_node_id(sender's Ed25519 public key)
 *    receiver u64  same for the receiver; 0 in a HELLO to an unknown peer
 *    round    u64  gossip round the message belongs to
 *    epoch    u32  membership view epoch
 *    segment  u32  segment (or chunk) number
 *    count    u32  element / record / byte count, per type
 *    pay.len  u32  payload bytes (plaintext length, tag not included)
 *    seq      u64  per-direction sequence number, 1, 2, ...; the AEAD
 *                  nonce counter; 0 in handshake frames
 *
 * Shared conventions: integers are little-endian; values are IEEE-754
 * binary32, little-endian; a string field is a length byte plus a
 * zero-padded array of DS_WIRE_*_MAX + 1 bytes, the bytes printable ASCII
 * 0x21..0x7e (no spaces: they go into log lines).
 *
 * Only constants and static_asserts: no code, no state; safe to include
 * from anywhere below node/wire.
 */
#ifndef DS_NODE_WIRE_HEADER_H
#define DS_NODE_WIRE_HEADER_H

#include <assert.h>
#include <stddef.h>
#include <stdint.h>

#define DS_WIRE_MAGIC 0x776e7364u /* "dsnw" as bytes on the wire */
#define DS_WIRE_VERSION 3u /* 2: GOSSIP_RESP carries held_us; 3: value formats */
#define DS_WIRE_HDR_SIZE 64u
#define DS_WIRE_TAG_SIZE 16u

/* Field offsets and sizes in the header. */
enum {
    DS_WH_MAGIC = 0, DS_WH_MAGIC_SIZE = 4,
    DS_WH_VERSION = 4, DS_WH_VERSION_SIZE = 1,
    DS_WH_TYPE = 5, DS_WH_TYPE_SIZE = 1,
    DS_WH_FLAGS = 6, DS_WH_FLAGS_SIZE = 2,
    DS_WH_CLUSTER = 8, DS_WH_CLUSTER_SIZE = 8,
    DS_WH_SENDER = 16, DS_WH_SENDER_SIZE = 8,
    DS_WH_RECEIVER = 24, DS_WH_RECEIVER_SIZE = 8,
    DS_WH_ROUND = 32, DS_WH_ROUND_SIZE = 8,
    DS_WH_EPOCH = 40, DS_WH_EPOCH_SIZE = 4,
    DS_WH_SEGMENT = 44, DS_WH_SEGMENT_SIZE = 4,
    DS_WH_COUNT = 48, DS_WH_COUNT_SIZE = 4,
    DS_WH_PAYLOAD_LEN = 52, DS_WH_PAYLOAD_LEN_SIZE = 4,
    DS_WH_SEQ = 56, DS_WH_SEQ_SIZE = 8,
};

/* A mirror of the layout for static_assert only: never cast wire bytes to it. */
struct __attribute__((packed)) ds_wire_hdr_layout {
    uint32_t magic;
    uint8_t version;
    uint8_t type;
    uint16_t flags;
    uint64_t cluster, sender, receiver, round;
    uint32_t epoch, segment, count, payload_len;
    uint64_t seq;
};
#define DS_WH_PIN(field, OFF) \
    static_assert(offsetof(struct ds_wire_hdr_layout, field) == OFF, #field " offset"); \
    static_assert(sizeof(((struct ds_wire_hdr_layout *)0)->field) == OFF##_SIZE, #field " size")
DS_WH_PIN(magic, DS_WH_MAGIC);
DS_WH_PIN(version, DS_WH_VERSION);
DS_WH_PIN(type, DS_WH_TYPE);
DS_WH_PIN(flags, DS_WH_FLAGS);
DS_WH_PIN(cluster, DS_WH_CLUSTER);
DS_WH_PIN(sender, DS_WH_SENDER);
DS_WH_PIN(receiver, DS_WH_RECEIVER);
DS_WH_PIN(round, DS_WH_ROUND);
DS_WH_PIN(epoch, DS_WH_EPOCH);
DS_WH_PIN(segment, DS_WH_SEGMENT);
DS_WH_PIN(count, DS_WH_COUNT);
DS_WH_PIN(payload_len, DS_WH_PAYLOAD_LEN);
DS_WH_PIN(seq, DS_WH_SEQ);
static_assert(sizeof(struct ds_wire_hdr_layout) == DS_WIRE_HDR_SIZE, "header size");
static_assert(DS_WH_SEQ + DS_WH_SEQ_SIZE == DS_WIRE_HDR_SIZE, "header has no tail gap");

/* Flags. */
#define DS_WF_IDX_MASK 0x0003u
#define DS_WF_PROT_SHIFT 2
#define DS_WF_PROT_MASK 0x000cu
#define DS_WF_MORE 0x0010u
#define DS_WF_VAL_SHIFT 5
#define DS_WF_VAL_MASK 0x0060u
#define DS_WF_KNOWN 0x007fu

/* Index-set encodings of sparse payloads (flags bits 0-1). */
enum ds_idx_enc {
    DS_IDX_DENSE = 0,  /* no index block: count == seg_len, indices 0..n-1 */
    DS_IDX_RAW = 1,    /* u32 per index */
    DS_IDX_VARINT = 2, /* LEB128 gaps: first index, then idx[i]-idx[i-1]-1 */
    DS_IDX_BITMAP = 3, /* one bit per segment element, u32 words, LSB first */
    DS_IDX_AUTO = 255, /* encode only: pick the smallest by exact size */
};

/* Protection of a frame (flags bits 2-3); the values equal enum ds_sec_mode. */
enum ds_wire_prot {
    DS_PROT_NONE = 0,
    DS_PROT_AUTH = 1,    /* payload in clear, 16-byte tag over header+payload */
    DS_PROT_ENCRYPT = 2, /* payload encrypted, tag over header (AD) + payload */
};

/* How the values of a frame are written (flags bits 5-6; only the types
 * that carry model values: the sparse ones and GOSSIP_RESP; 3 is refused).
 * node/wire/values.h converts; the values equal conf/choices.h's enum
 * ds_value_format (sparsify.value_format). */
enum ds_wire_vfmt {
    DS_VF_F32 = 0,  /* IEEE-754 binary32 */
    DS_VF_F16 = 1,  /* IEEE-754 binary16 */
    DS_VF_BF16 = 2, /* bfloat16: binary32's upper half */
};

/* String fields: a length byte plus a zero-padded array on the wire; the
 * bytes are printable ASCII 0x21..0x7e (no spaces: they go into log lines). */
#define DS_WIRE_NAME_MAX 63  /* node name */
#define DS_WIRE_ADDR_MAX 127 /* "host:port" or a provider address string */
#define DS_WIRE_GROUP_MAX 31 /* node.group */

#endif
