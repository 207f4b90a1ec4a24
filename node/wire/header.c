/*
 * node/wire/header.c: the frame header (node/wire/header.h) and the length
 * rule of each message type: gates 1 and 2 of the decoder.
 *
 * A received frame is checked here before any payload byte is read:
 *
 *   1. the header: frame length >= 64, magic, version, a known type, flags
 *      valid for that type, payload_len within the limit, and the frame
 *      length equal to header + payload_len (+ tag);
 *   2. the type's length rule, computed from the header alone in 64-bit
 *      arithmetic: fixed, or base + unit * count with count bounded first.
 *
 * The rule table is shared with the encoder (encode.c sizes payloads from
 * it), so what one node writes is exactly what another accepts.
 */
#include "config.h"

#include "node/wire/codec.h"
#include "node/wire/values.h"

#include <inttypes.h>

#include "base/log.h"

#define COMP "wire"

/* ---- type rules --------------------------------------------------------------- */

int ds_wire_rule_of(unsigned type, ds_wire_rule *r)
{
#define RULE(kind, cnt, more_ok, handshake, base, unit) \
    (*r = (ds_wire_rule){DS_WR_##kind, DS_WC_##cnt, more_ok, handshake, 0, base, unit}, 1)
#define VALS(kind, base) \
    (*r = (ds_wire_rule){DS_WR_##kind, DS_WC_ELEMS, 0, 0, 1, base, 4}, 1)
    switch (type) {
    case DS_MSG_HELLO: return RULE(FIXED, ZERO, 0, 1, DS_WIRE_HELLO_SIZE, 0);
    case DS_MSG_HELLO_ACK: return RULE(FIXED, ZERO, 0, 1, DS_WIRE_HELLO_ACK_SIZE, 0);
    case DS_MSG_HELLO_FIN: return RULE(FIXED, ZERO, 0, 1, DS_WIRE_HELLO_FIN_SIZE, 0);
    case DS_MSG_HELLO_REJECT: return RULE(FIXED, ZERO, 0, 1, DS_WIRE_HELLO_REJECT_SIZE, 0);
    case DS_MSG_GOSSIP_REQ:
    case DS_MSG_GOSSIP_PUSH:
    case DS_MSG_GROUP_REDUCE:
    case DS_MSG_GROUP_BCAST: return VALS(SPARSE, DS_WIRE_SPARSE_PREFIX);
    case DS_MSG_GOSSIP_RESP: return VALS(COUNT, 8);
    case DS_MSG_GOSSIP_STALE: return RULE(FIXED, ZERO, 0, 0, 8, 0);
    case DS_MSG_PING:
    case DS_MSG_ACK: return RULE(COUNT, RECORDS, 0, 0, 8, DS_WIRE_MEMBER_SIZE);
    case DS_MSG_PING_REQ: return RULE(COUNT, RECORDS, 0, 0, 16, DS_WIRE_MEMBER_SIZE);
    case DS_MSG_NACK: return RULE(FIXED, ZERO, 0, 0, 16, 0);
    case DS_MSG_JOIN: return RULE(FIXED, ZERO, 0, 0, DS_WIRE_MEMBER_SIZE, 0);
    case DS_MSG_MEMBERS: return RULE(COUNT, RECORDS, 1, 0, 16, DS_WIRE_MEMBER_SIZE);
    case DS_MSG_LEAVE: return RULE(FIXED, ZERO, 0, 0, 16, 0);
    case DS_MSG_STATE_REQ: return RULE(FIXED, ZERO, 0, 0, 16, 0);
    case DS_MSG_STATE_CHUNK: return RULE(COUNT, BYTES, 1, 0, DS_WIRE_CHUNK_PREFIX, 1);
    case DS_MSG_ALLREDUCE: return RULE(COUNT, ELEMS, 0, 0, 16, 4);
    default: return 0;
    }
#undef RULE
#undef VALS
}

/* ---- header ------------------------------------------------------------------- */

void ds_wire_hdr_encode(const ds_wire_hdr *h, uint8_t out[DS_WIRE_HDR_SIZE])
{
    ds_put32(out + DS_WH_MAGIC, DS_WIRE_MAGIC);
    out[DS_WH_VERSION] = h->version ? h->version : DS_WIRE_VERSION;
    out[DS_WH_TYPE] = h->type;
    ds_put16(out + DS_WH_FLAGS, h->flags);
    ds_put64(out + DS_WH_CLUSTER, h->cluster);
    ds_put64(out + DS_WH_SENDER, h->sender);
    ds_put64(out + DS_WH_RECEIVER, h->receiver);
    ds_put64(out + DS_WH_ROUND, h->round);
    ds_put32(out + DS_WH_EPOCH, h->epoch);
    ds_put32(out + DS_WH_SEGMENT, h->segment);
    ds_put32(out + DS_WH_COUNT, h->count);
    ds_put32(out + DS_WH_PAYLOAD_LEN, h->payload_len);
    ds_put64(out + DS_WH_SEQ, h->seq);
}

static void hdr_read(const uint8_t *p, ds_wire_hdr *h)
{
    h->version = p[DS_WH_VERSION];
    h->type = p[DS_WH_TYPE];
    h->flags = ds_le16(p + DS_WH_FLAGS);
    h->cluster = ds_le64(p + DS_WH_CLUSTER);
    h->sender = ds_le64(p + DS_WH_SENDER);
    h->receiver = ds_le64(p + DS_WH_RECEIVER);
    h->round = ds_le64(p + DS_WH_ROUND);
    h->epoch = ds_le32(p + DS_WH_EPOCH);
    h->segment = ds_le32(p + DS_WH_SEGMENT);
    h->count = ds_le32(p + DS_WH_COUNT);
    h->payload_len = ds_le32(p + DS_WH_PAYLOAD_LEN);
    h->seq = ds_le64(p + DS_WH_SEQ);
}

int ds_wire_is_handshake(unsigned type)
{
    return type == DS_MSG_HELLO || type == DS_MSG_HELLO_ACK || type == DS_MSG_HELLO_FIN ||
           type == DS_MSG_HELLO_REJECT;
}

/* Gates 1 and 2. No logging here: the public callers log once. */
static enum ds_drop_reason hdr_check(const uint8_t *f, size_t len, const ds_wire_limits *lim,
                                     ds_wire_hdr *h)
{
    ds_wire_rule r;
    if (len < DS_WIRE_HDR_SIZE)
        return DS_DROP_SHORT;
    if (ds_le32(f + DS_WH_MAGIC) != DS_WIRE_MAGIC)
        return DS_DROP_BAD_MAGIC;
    hdr_read(f, h);
    if (h->version != DS_WIRE_VERSION)
        return DS_DROP_BAD_VERSION;
    if (!ds_wire_rule_of(h->type, &r))
        return DS_DROP_UNKNOWN_TYPE;

    const unsigned prot = ds_wire_prot(h);
    if ((h->flags & ~DS_WF_KNOWN) || prot > DS_PROT_ENCRYPT ||
        ((h->flags & DS_WF_IDX_MASK) && r.kind != DS_WR_SPARSE) ||
        ((h->flags & DS_WF_MORE) && !r.more_ok) || (r.handshake && prot != DS_PROT_NONE))
        return DS_DROP_BAD_FLAGS;
    const int vf = ds_wire_rule_vfmt(&r, h->flags);
    if (vf < 0)
        return DS_DROP_BAD_FLAGS;
    if (r.vals)
        r.unit = (uint32_t)ds_wire_vfmt_width((unsigned)vf);

    if (h->payload_len > lim->max_payload)
        return DS_DROP_SIZE_LIMIT;
    const uint64_t want = (uint64_t)DS_WIRE_HDR_SIZE + h->payload_len +
                          (prot != DS_PROT_NONE ? DS_WIRE_TAG_SIZE : 0);
    if ((uint64_t)len != want)
        return DS_DROP_LENGTH_MISMATCH;

    switch (r.cnt) {
    case DS_WC_ZERO:
        if (h->count != 0)
            return DS_DROP_BAD_FIELD;
        break;
    case DS_WC_ELEMS:
        if (h->count > lim->max_count)
            return DS_DROP_COUNT_LIMIT;
        break;
    case DS_WC_RECORDS:
        if (h->count > lim->max_members)
            return DS_DROP_COUNT_LIMIT;
        break;
    case DS_WC_BYTES:
        if (h->count > lim->max_payload)
            return DS_DROP_COUNT_LIMIT;
        break;
    }

    const uint64_t need = (uint64_t)r.base + (uint64_t)r.unit * h->count;
    switch (r.kind) {
    case DS_WR_FIXED:
    case DS_WR_COUNT:
        if (h->payload_len != need)
            return DS_DROP_LENGTH_MISMATCH;
        break;
    case DS_WR_SPARSE:
        /* The index block's size is in the payload; its exact rule is gate 3. */
        if (h->payload_len < need)
            return DS_DROP_LENGTH_MISMATCH;
        break;
    }
    return DS_DROP_NONE;
}

enum ds_drop_reason ds_wire_hdr_check(const uint8_t *frame, size_t len,
                                      const ds_wire_limits *lim, ds_wire_hdr *h)
{
    return hdr_check(frame, len, lim, h);
}

enum ds_drop_reason ds_wire_hdr_decode(const uint8_t *frame, size_t len,
                                       const ds_wire_limits *lim, ds_wire_hdr *h,
                                       ds_drop_counters *drops)
{
    enum ds_drop_reason r = hdr_check(frame, len, lim, h);
    if (r != DS_DROP_NONE)
        ds_drop_note(drops, r, COMP, "len=%zu type=%s sender=%016" PRIx64, len,
                     len >= DS_WIRE_HDR_SIZE ? ds_msg_type_name(frame[DS_WH_TYPE]) : "-",
                     len >= DS_WIRE_HDR_SIZE ? ds_le64(frame + DS_WH_SENDER) : 0);
    return r;
}
