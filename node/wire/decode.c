/*
 * node/wire/decode.c: frames into typed messages, written for a hostile
 * peer.
 *
 * The decoder works in three gates, and a later gate never runs before an
 * earlier one has passed:
 *
 *   1. the header (header.c): frame length >= 64, magic, version, a known
 *      type, flags valid for that type, payload_len within the limit, and
 *      the frame length equal to header + payload_len (+ tag);
 *   2. the type's length rule (header.c), computed from the header alone in
 *      64-bit arithmetic: fixed, or base + unit * count with count bounded
 *      first;
 *   3. the payload fields (here), each read at an offset the rule has
 *      proven to be inside the frame, into caller buffers whose capacity is
 *      checked against the count before the first write.
 *
 * So no field is read before the length that covers it has been checked,
 * nothing is allocated, and every rejection is one ds_drop_reason, counted
 * and logged once, in ds_wire_decode.
 */
#include "config.h"

#include "node/wire/codec.h"
#include "node/wire/values.h"

#include <inttypes.h>

#include "base/log.h"

#define COMP "wire"

static enum ds_drop_reason sparse_read(const uint8_t *p, const ds_wire_hdr *h,
                                       const ds_wire_limits *lim, const ds_wire_bufs *b,
                                       ds_wire_sparse *s)
{
    const uint32_t n = h->count;
    const uint32_t seg_len = ds_le32(p);
    const uint32_t ib = ds_le32(p + 4);
    const enum ds_idx_enc enc = (enum ds_idx_enc)(h->flags & DS_WF_IDX_MASK);
    const unsigned vf = (h->flags & DS_WF_VAL_MASK) >> DS_WF_VAL_SHIFT; /* checked: gate 1 */
    const uint64_t vb = (uint64_t)n * ds_wire_vfmt_width(vf);
    if (ds_le32(p + 12) != 0)
        return DS_DROP_BAD_FIELD;
    if (seg_len > lim->max_segment)
        return DS_DROP_SIZE_LIMIT;
    if (n > seg_len || n > b->val_cap || (b->idx_cap < n && (enc != DS_IDX_DENSE || b->idx)))
        return DS_DROP_COUNT_LIMIT;
    if ((uint64_t)DS_WIRE_SPARSE_PREFIX + ib + vb != h->payload_len)
        return DS_DROP_LENGTH_MISMATCH;
    int ok;
    switch (enc) {
    case DS_IDX_DENSE: ok = ib == 0 && n == seg_len; break;
    case DS_IDX_RAW: ok = (uint64_t)ib == (uint64_t)n * 4; break;
    case DS_IDX_VARINT:
        ok = ib % 4 == 0 && ib >= n && (uint64_t)ib <= ds_wire_pad4((size_t)n * 5);
        break;
    case DS_IDX_BITMAP: ok = (uint64_t)ib == ds_wire_bitmap_bytes(seg_len); break;
    default: ok = 0; break;
    }
    if (!ok)
        return DS_DROP_LENGTH_MISMATCH;
    enum ds_drop_reason r =
        ds_wire_idx_read(p + DS_WIRE_SPARSE_PREFIX, ib, enc, seg_len, n, b->idx);
    if (r != DS_DROP_NONE)
        return r;
    if (!ds_wire_values_get(p + DS_WIRE_SPARSE_PREFIX + ib, vf, n, b->val))
        return DS_DROP_NON_FINITE;
    s->seg_len = seg_len;
    s->aux = ds_le32(p + 8);
    s->enc = (uint8_t)enc;
    s->idx = b->idx;
    s->val = b->val;
    return DS_DROP_NONE;
}

/* n member records at p into the caller's buffer. */
static enum ds_drop_reason records_read(const uint8_t *p, uint32_t n, const ds_wire_bufs *b,
                                        const ds_wire_member **out)
{
    if (n > b->members_cap)
        return DS_DROP_COUNT_LIMIT;
    for (uint32_t i = 0; i < n; i++) {
        enum ds_drop_reason r =
            ds_wire_member_read(p + (size_t)i * DS_WIRE_MEMBER_SIZE, &b->members[i]);
        if (r != DS_DROP_NONE)
            return r;
    }
    *out = b->members;
    return DS_DROP_NONE;
}

/* PING, ACK, PING_REQ, NACK. */
static enum ds_drop_reason probe_read(const uint8_t *p, const ds_wire_hdr *h,
                                      const ds_wire_bufs *b, ds_wire_probe *pr)
{
    pr->probe_seq = ds_le64(p);
    if (h->type == DS_MSG_PING || h->type == DS_MSG_ACK) {
        pr->target = 0;
        return records_read(p + 8, h->count, b, &pr->updates);
    }
    pr->target = ds_le64(p + 8);
    pr->updates = NULL;
    if (pr->target == 0)
        return DS_DROP_BAD_FIELD;
    return h->type == DS_MSG_NACK ? DS_DROP_NONE : records_read(p + 16, h->count, b, &pr->updates);
}

static enum ds_drop_reason members_read(const uint8_t *p, const ds_wire_hdr *h,
                                        const ds_wire_limits *lim, const ds_wire_bufs *b,
                                        ds_wire_members *ms)
{
    ms->round_now = ds_le64(p);
    ms->total = ds_le32(p + 8);
    ms->first = ds_le32(p + 12);
    if (ms->total > lim->max_cluster)
        return DS_DROP_SIZE_LIMIT;
    if ((uint64_t)ms->first + h->count > ms->total)
        return DS_DROP_BAD_FIELD;
    return records_read(p + 16, h->count, b, &ms->members);
}

/* The data is not copied: it points into the frame. */
static enum ds_drop_reason chunk_read(const uint8_t *p, const ds_wire_hdr *h,
                                      const ds_wire_limits *lim, ds_wire_state_chunk *c)
{
    c->total = ds_le64(p);
    c->offset = ds_le64(p + 8);
    if (c->total > lim->max_state)
        return DS_DROP_SIZE_LIMIT;
    if (c->offset > c->total || h->count > c->total - c->offset)
        return DS_DROP_BAD_FIELD;
    memcpy(c->digest, p + 16, 32);
    c->data = p + DS_WIRE_CHUNK_PREFIX;
    return DS_DROP_NONE;
}

static enum ds_drop_reason allreduce_read(const uint8_t *p, const ds_wire_hdr *h,
                                          const ds_wire_bufs *b, ds_wire_allreduce *a)
{
    a->phase = ds_le32(p);
    a->step = ds_le32(p + 4);
    a->elem_offset = ds_le64(p + 8);
    if (a->phase > 1)
        return DS_DROP_BAD_FIELD;
    if (h->count > b->val_cap)
        return DS_DROP_COUNT_LIMIT;
    if (!ds_wire_values_read(p + 16, h->count, b->val))
        return DS_DROP_NON_FINITE;
    a->val = b->val;
    return DS_DROP_NONE;
}

/* Gate 3: the payload of a frame whose header passed gates 1 and 2. */
static enum ds_drop_reason payload_read(const uint8_t *f, const ds_wire_limits *lim,
                                        const ds_wire_bufs *b, ds_wire_msg *m)
{
    const uint8_t *p = f + DS_WIRE_HDR_SIZE;
    const ds_wire_hdr *h = &m->h;
    const uint32_t n = h->count;
    switch (h->type) {
    case DS_MSG_HELLO:
    case DS_MSG_HELLO_ACK:
        return ds_wire_hello_read(p, &m->u.hello, h->type == DS_MSG_HELLO_ACK);
    case DS_MSG_HELLO_FIN:
        ds_wire_fin_read(p, &m->u.fin);
        return DS_DROP_NONE;
    case DS_MSG_HELLO_REJECT:
        return ds_wire_reject_read(p, &m->u.reject);
    case DS_MSG_GOSSIP_REQ:
    case DS_MSG_GOSSIP_PUSH:
    case DS_MSG_GROUP_REDUCE:
    case DS_MSG_GROUP_BCAST:
        return sparse_read(p, h, lim, b, &m->u.sparse);
    case DS_MSG_GOSSIP_RESP:
        if (n > b->val_cap)
            return DS_DROP_COUNT_LIMIT;
        m->u.values.held_us = ds_le32(p);
        if (ds_le32(p + 4) != 0)
            return DS_DROP_BAD_FIELD;
        if (!ds_wire_values_get(p + 8, (h->flags & DS_WF_VAL_MASK) >> DS_WF_VAL_SHIFT, n, b->val))
            return DS_DROP_NON_FINITE;
        m->u.values.val = b->val;
        return DS_DROP_NONE;
    case DS_MSG_GOSSIP_STALE:
        m->u.stale.round_now = ds_le64(p);
        return DS_DROP_NONE;
    case DS_MSG_PING:
    case DS_MSG_ACK:
    case DS_MSG_PING_REQ:
    case DS_MSG_NACK:
        return probe_read(p, h, b, &m->u.probe);
    case DS_MSG_JOIN:
        return ds_wire_member_read(p, &m->u.join);
    case DS_MSG_MEMBERS:
        return members_read(p, h, lim, b, &m->u.members);
    case DS_MSG_LEAVE:
        if (ds_le32(p + 12) != 0)
            return DS_DROP_BAD_FIELD;
        m->u.leave.effective_round = ds_le64(p);
        m->u.leave.incarnation = ds_le32(p + 8);
        return DS_DROP_NONE;
    case DS_MSG_STATE_REQ:
        m->u.state_req.offset = ds_le64(p);
        m->u.state_req.length = ds_le64(p + 8);
        if (m->u.state_req.offset > lim->max_state || m->u.state_req.length > lim->max_state)
            return DS_DROP_SIZE_LIMIT;
        return DS_DROP_NONE;
    case DS_MSG_STATE_CHUNK:
        return chunk_read(p, h, lim, &m->u.chunk);
    case DS_MSG_ALLREDUCE:
        return allreduce_read(p, h, b, &m->u.ar);
    default:
        return DS_DROP_UNKNOWN_TYPE;
    }
}

enum ds_drop_reason ds_wire_decode(const uint8_t *frame, size_t len, const ds_wire_limits *lim,
                                   const ds_wire_bufs *bufs, ds_wire_msg *out,
                                   ds_drop_counters *drops)
{
    static const ds_wire_bufs no_bufs;
    enum ds_drop_reason r = ds_wire_hdr_check(frame, len, lim, &out->h);
    if (r == DS_DROP_NONE)
        r = payload_read(frame, lim, bufs ? bufs : &no_bufs, out);
    if (r != DS_DROP_NONE)
        ds_drop_note(drops, r, COMP, "len=%zu type=%s sender=%016" PRIx64 " count=%" PRIu32, len,
                     len >= DS_WIRE_HDR_SIZE ? ds_msg_type_name(frame[DS_WH_TYPE]) : "-",
                     len >= DS_WIRE_HDR_SIZE ? ds_le64(frame + DS_WH_SENDER) : 0,
                     len >= DS_WIRE_HDR_SIZE ? ds_le32(frame + DS_WH_COUNT) : 0);
    return r;
}
