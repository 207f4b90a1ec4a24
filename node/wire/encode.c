/*
 * node/wire/encode.c: typed messages into frames.
 *
 * The payload's exact length is computed first, from the type's length
 * rule (header.c) and, for sparse payloads, the exact size of each index
 * encoding (index.c), and checked against the caller's buffer; only then
 * is anything written. So a short buffer is -ENOSPC with nothing written,
 * and the bytes written are exactly what ds_wire_encoded_size promised.
 *
 * A message that breaks its own rules (indices out of order, a count over
 * its slice, a bad string, a non-finite value) is refused rather than
 * repaired: the encoder is also the sender's last check that it is not
 * about to send something its peers would drop.
 */
#include "config.h"

#include "node/wire/codec.h"
#include "node/wire/values.h"

/* Payload length of m; resolves DS_IDX_AUTO into *enc. 0 + -errno in *err on
 * failure. */
static size_t payload_size(const ds_wire_msg *m, enum ds_idx_enc *enc, int *err)
{
    ds_wire_rule r;
    *err = 0;
    if (!ds_wire_rule_of(m->h.type, &r)) {
        *err = -EINVAL;
        return 0;
    }
    const int vf = ds_wire_rule_vfmt(&r, m->h.flags);
    if ((r.cnt == DS_WC_ZERO && m->h.count != 0) || ((m->h.flags & DS_WF_MORE) && !r.more_ok) ||
        vf < 0) {
        *err = -EINVAL;
        return 0;
    }
    if (r.vals)
        r.unit = (uint32_t)ds_wire_vfmt_width((unsigned)vf);
    if (r.kind != DS_WR_SPARSE)
        return (size_t)r.base + (size_t)r.unit * m->h.count;

    const ds_wire_sparse *s = &m->u.sparse;
    size_t sizes[4];
    enum ds_idx_enc best;
    if (ds_wire_idx_sizes(s->seg_len, s->idx, m->h.count, sizes, &best) < 0) {
        *err = -EINVAL;
        return 0;
    }
    enum ds_idx_enc e = s->enc == DS_IDX_AUTO ? best : (enum ds_idx_enc)s->enc;
    if (e > DS_IDX_BITMAP || sizes[e] == SIZE_MAX) {
        *err = -EINVAL;
        return 0;
    }
    *enc = e;
    return DS_WIRE_SPARSE_PREFIX + sizes[e] + (size_t)m->h.count * r.unit;
}

size_t ds_wire_encoded_size(const ds_wire_msg *m)
{
    enum ds_idx_enc enc = DS_IDX_DENSE;
    int err;
    size_t p = payload_size(m, &enc, &err);
    if (err || p > UINT32_MAX)
        return 0;
    return DS_WIRE_HDR_SIZE + p;
}

/* ---- payloads, per type ---------------------------------------------------------------- */

/* Sparse: prefix, index block, values. Records the encoding used in the
 * message and in the header's flags. */
static int sparse_write(uint8_t *p, ds_wire_msg *m, size_t plen, enum ds_idx_enc enc)
{
    ds_wire_sparse *s = &m->u.sparse;
    const uint32_t n = m->h.count;
    const unsigned vf = (m->h.flags & DS_WF_VAL_MASK) >> DS_WF_VAL_SHIFT;
    const size_t vb = (size_t)n * ds_wire_vfmt_width(vf);
    const size_t ib = plen - DS_WIRE_SPARSE_PREFIX - vb;
    ds_put32(p, s->seg_len);
    ds_put32(p + 4, (uint32_t)ib);
    ds_put32(p + 8, s->aux);
    ds_put32(p + 12, 0);
    ds_wire_idx_write(p + DS_WIRE_SPARSE_PREFIX, ib, ib + vb, enc, s->seg_len, s->idx, n);
    int rc = n ? ds_wire_values_put(p + DS_WIRE_SPARSE_PREFIX + ib, vf, s->val, n) : 0;
    s->enc = (uint8_t)enc;
    m->h.flags |= (uint16_t)enc;
    return rc;
}

/* PING, ACK, PING_REQ, NACK: probe_seq, the target (PING_REQ, NACK), the
 * piggybacked records. */
static int probe_write(uint8_t *p, const ds_wire_msg *m)
{
    const ds_wire_probe *pr = &m->u.probe;
    const uint32_t n = m->h.count;
    int rc = 0;
    ds_put64(p, pr->probe_seq);
    size_t o = 8;
    if (m->h.type == DS_MSG_PING_REQ || m->h.type == DS_MSG_NACK) {
        if (!pr->target)
            return -EINVAL;
        ds_put64(p + 8, pr->target);
        o = 16;
    }
    for (uint32_t i = 0; i < n && !rc; i++)
        rc = ds_wire_member_write(p + o + (size_t)i * DS_WIRE_MEMBER_SIZE, &pr->updates[i]);
    return rc;
}

static int members_write(uint8_t *p, const ds_wire_msg *m)
{
    const ds_wire_members *ms = &m->u.members;
    const uint32_t n = m->h.count;
    int rc = 0;
    if ((uint64_t)ms->first + n > ms->total)
        return -EINVAL;
    ds_put64(p, ms->round_now);
    ds_put32(p + 8, ms->total);
    ds_put32(p + 12, ms->first);
    for (uint32_t i = 0; i < n && !rc; i++)
        rc = ds_wire_member_write(p + 16 + (size_t)i * DS_WIRE_MEMBER_SIZE, &ms->members[i]);
    return rc;
}

/* split: the prefix only, the data stays where it is (encode_head). */
static int chunk_write(uint8_t *p, const ds_wire_msg *m, int split)
{
    const ds_wire_state_chunk *c = &m->u.chunk;
    const uint32_t n = m->h.count;
    if (c->offset > c->total || n > c->total - c->offset)
        return -EINVAL;
    ds_put64(p, c->total);
    ds_put64(p + 8, c->offset);
    memcpy(p + 16, c->digest, 32);
    if (n && !c->data)
        return -EINVAL;
    if (n && !split)
        memcpy(p + DS_WIRE_CHUNK_PREFIX, c->data, n);
    return 0;
}

static int allreduce_write(uint8_t *p, const ds_wire_msg *m)
{
    const ds_wire_allreduce *a = &m->u.ar;
    const uint32_t n = m->h.count;
    if (a->phase > 1)
        return -EINVAL;
    ds_put32(p, a->phase);
    ds_put32(p + 4, a->step);
    ds_put64(p + 8, a->elem_offset);
    return n ? ds_wire_values_write(p + 16, a->val, n) : 0;
}

/* The payload of m at p, plen bytes (the prefix only for a split chunk).
 * 0 or -errno; on an error part of p may have been written. */
static int payload_write(uint8_t *p, ds_wire_msg *m, size_t plen, enum ds_idx_enc enc, int split)
{
    const ds_wire_hdr *h = &m->h;
    switch (h->type) {
    case DS_MSG_HELLO:
    case DS_MSG_HELLO_ACK:
        return ds_wire_hello_write(p, &m->u.hello, h->type == DS_MSG_HELLO_ACK);
    case DS_MSG_HELLO_FIN:
        ds_wire_fin_write(p, &m->u.fin);
        return 0;
    case DS_MSG_HELLO_REJECT:
        ds_wire_reject_write(p, &m->u.reject);
        return 0;
    case DS_MSG_GOSSIP_REQ:
    case DS_MSG_GOSSIP_PUSH:
    case DS_MSG_GROUP_REDUCE:
    case DS_MSG_GROUP_BCAST:
        return sparse_write(p, m, plen, enc);
    case DS_MSG_GOSSIP_RESP:
        ds_put32(p, m->u.values.held_us);
        ds_put32(p + 4, 0);
        return h->count ? ds_wire_values_put(p + 8, (h->flags & DS_WF_VAL_MASK) >> DS_WF_VAL_SHIFT,
                                             m->u.values.val, h->count)
                        : 0;
    case DS_MSG_GOSSIP_STALE:
        ds_put64(p, m->u.stale.round_now);
        return 0;
    case DS_MSG_PING:
    case DS_MSG_ACK:
    case DS_MSG_PING_REQ:
    case DS_MSG_NACK:
        return probe_write(p, m);
    case DS_MSG_JOIN:
        return ds_wire_member_write(p, &m->u.join);
    case DS_MSG_MEMBERS:
        return members_write(p, m);
    case DS_MSG_LEAVE:
        ds_put64(p, m->u.leave.effective_round);
        ds_put32(p + 8, m->u.leave.incarnation);
        ds_put32(p + 12, 0);
        return 0;
    case DS_MSG_STATE_REQ:
        ds_put64(p, m->u.state_req.offset);
        ds_put64(p + 8, m->u.state_req.length);
        return 0;
    case DS_MSG_STATE_CHUNK:
        return chunk_write(p, m, split);
    case DS_MSG_ALLREDUCE:
        return allreduce_write(p, m);
    default:
        return -EINVAL;
    }
}

/* ---- frames ------------------------------------------------------------------------- */

/* ds_wire_encode, or with split (STATE_CHUNK only) everything but the
 * chunk's data: *len then counts the header and the prefix. */
static int encode(uint8_t *out, size_t cap, ds_wire_msg *m, size_t *len, int split)
{
    enum ds_idx_enc enc = DS_IDX_DENSE;
    int err;
    if (split && m->h.type != DS_MSG_STATE_CHUNK)
        return -EINVAL;
    size_t plen = payload_size(m, &enc, &err);
    if (err)
        return err;
    if (plen > UINT32_MAX)
        return -EINVAL;
    const size_t written = split ? DS_WIRE_CHUNK_PREFIX : plen;
    if (cap < DS_WIRE_HDR_SIZE + written)
        return -ENOSPC;

    ds_wire_hdr *h = &m->h;
    h->version = DS_WIRE_VERSION;
    h->payload_len = (uint32_t)plen;
    h->seq = 0;
    h->flags &= (uint16_t)(DS_WF_MORE | DS_WF_VAL_MASK);
    int rc = payload_write(out + DS_WIRE_HDR_SIZE, m, plen, enc, split);
    if (rc)
        return rc;
    ds_wire_hdr_encode(h, out);
    *len = DS_WIRE_HDR_SIZE + written;
    return 0;
}

int ds_wire_encode(uint8_t *out, size_t cap, ds_wire_msg *m, size_t *len)
{
    return encode(out, cap, m, len, 0);
}

int ds_wire_encode_head(uint8_t *out, size_t cap, ds_wire_msg *m, size_t *len)
{
    return encode(out, cap, m, len, 1);
}
