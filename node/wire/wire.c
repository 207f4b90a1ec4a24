/*
 * node/wire/wire.c: encode and decode dsnode frames (see wire.h for the header
 * layout and docs/protocol.md for every payload).
 *
 * The decoder is written for a hostile peer. It works in three gates, and a
 * later gate never runs before an earlier one has passed:
 *
 *   1. the header: frame length >= 64, magic, version, a known type, flags
 *      valid for that type, payload_len within the limit, and the frame
 *      length equal to header + payload_len (+ tag);
 *   2. the type's length rule, computed from the header alone in 64-bit
 *      arithmetic: fixed, or base + unit * count with count bounded first;
 *   3. the payload fields, each read at an offset the rule has proven to be
 *      inside the frame, into caller buffers whose capacity is checked
 *      against the count before the first write.
 *
 * So no field is read before the length that covers it has been checked,
 * nothing is allocated, and every rejection is one ds_drop_reason.
 *
 * Sparse index sets are sent in whichever of four encodings is smallest for
 * that message, computed exactly (not estimated) before writing: dense (no
 * indices), raw u32, LEB128 gaps, or a bitmap over the segment. Gaps are
 * coded as idx[i] - idx[i-1] - 1 because indices are strictly increasing,
 * so a run of neighbours costs one zero byte each. Measured sizes and speeds
 * per density are in docs/bench/crypto.md.
 */
#include "config.h"

#include "node/wire/wire.h"

#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <sodium.h>
#include <stdio.h>
#include <string.h>

#include "base/log.h"

#define COMP "wire"

/* ---- names ------------------------------------------------------------------ */

const char *ds_msg_type_name(unsigned type)
{
    switch (type) {
#define DS_MSG_NAME_(name, val) \
    case val: \
        return #name;
        DS_MSG_LIST(DS_MSG_NAME_)
#undef DS_MSG_NAME_
    default:
        return "?";
    }
}

static const char *const drop_names[] = {
#define DS_DROP_NAME_(e, name, text) name,
    DS_DROP_LIST(DS_DROP_NAME_)
#undef DS_DROP_NAME_
};
static const char *const drop_texts[] = {
#define DS_DROP_TEXT_(e, name, text) text,
    DS_DROP_LIST(DS_DROP_TEXT_)
#undef DS_DROP_TEXT_
};
static_assert(sizeof(drop_names) / sizeof(drop_names[0]) == DS_DROP__COUNT, "drop names");

const char *ds_drop_name(enum ds_drop_reason r)
{
    return (unsigned)r < DS_DROP__COUNT ? drop_names[r] : "?";
}

const char *ds_drop_str(enum ds_drop_reason r)
{
    return (unsigned)r < DS_DROP__COUNT ? drop_texts[r] : "?";
}

/* ---- counters --------------------------------------------------------------- */

void ds_drop_inc(ds_drop_counters *c, enum ds_drop_reason r)
{
    if (c && (unsigned)r < DS_DROP__COUNT)
        atomic_fetch_add_explicit(&c->n[r], 1, memory_order_relaxed);
}

uint64_t ds_drop_get(const ds_drop_counters *c, enum ds_drop_reason r)
{
    if (!c || (unsigned)r >= DS_DROP__COUNT)
        return 0;
    /* atomic_load takes a non-const pointer in C11. */
    return atomic_load_explicit((_Atomic uint64_t *)&c->n[r], memory_order_relaxed);
}

uint64_t ds_drop_total(const ds_drop_counters *c)
{
    uint64_t t = 0;
    for (int r = 1; r < DS_DROP__COUNT; r++)
        t += ds_drop_get(c, (enum ds_drop_reason)r);
    return t;
}

int ds_drop_format(const ds_drop_counters *c, enum ds_drop_fmt fmt, char *buf, size_t cap)
{
    size_t len = 0;
    int any = 0;
    if (!buf || cap == 0)
        return -ENOSPC;
    buf[0] = '\0';
#define APPEND(...) \
    do { \
        int k_ = snprintf(buf + len, cap - len, __VA_ARGS__); \
        if (k_ < 0 || (size_t)k_ >= cap - len) \
            return -ENOSPC; \
        len += (size_t)k_; \
    } while (0)
    if (fmt == DS_DROP_FMT_JSON)
        APPEND("{");
    for (int r = 1; r < DS_DROP__COUNT; r++) {
        uint64_t v = ds_drop_get(c, (enum ds_drop_reason)r);
        switch (fmt) {
        case DS_DROP_FMT_KV:
            if (v)
                APPEND("%s%s=%" PRIu64, any ? " " : "", drop_names[r], v);
            break;
        case DS_DROP_FMT_JSON:
            APPEND("%s\"%s\":%" PRIu64, any ? "," : "", drop_names[r], v);
            break;
        case DS_DROP_FMT_PROM:
            APPEND("ds_drops_total{reason=\"%s\"} %" PRIu64 "\n", drop_names[r], v);
            break;
        }
        any |= fmt != DS_DROP_FMT_KV || v != 0;
    }
    if (fmt == DS_DROP_FMT_JSON)
        APPEND("}");
    if (fmt == DS_DROP_FMT_KV && !any)
        APPEND("none");
#undef APPEND
    return (int)len;
}

/* ---- limits and identifiers --------------------------------------------------- */

void ds_wire_limits_default(ds_wire_limits *lim)
{
    lim->max_payload = (64u << 20) + (64u << 10);
    lim->max_segment = 1u << 26;
    lim->max_count = 1u << 24;
    lim->max_members = 1024;
    lim->max_cluster = 65536;
    lim->max_state = 16ull << 30;
}

static uint64_t labelled_id(const char *label, const void *in, size_t inlen)
{
    crypto_generichash_state st;
    uint8_t out[16];
    crypto_generichash_init(&st, NULL, 0, sizeof(out));
    crypto_generichash_update(&st, (const uint8_t *)label, strlen(label));
    crypto_generichash_update(&st, in, inlen);
    crypto_generichash_final(&st, out, sizeof(out));
    uint64_t id = ds_le64(out);
    return id ? id : 1;
}

uint64_t ds_wire_cluster_id(const char *cluster_name)
{
    return labelled_id("dsnode cluster id v1", cluster_name, strlen(cluster_name));
}

uint64_t ds_wire_node_id(const uint8_t pk[32])
{
    return labelled_id("dsnode node id v1", pk, 32);
}

/* ---- type rules --------------------------------------------------------------- */

enum rule_kind { K_FIXED, K_COUNT, K_SPARSE };
enum count_kind { C_ZERO, C_ELEMS, C_RECORDS, C_BYTES };

typedef struct rule {
    uint8_t kind, cnt;
    uint8_t more_ok;   /* DS_WF_MORE allowed */
    uint8_t handshake; /* never sealed */
    uint32_t base, unit;
} rule;

/* Returns 0 for an unknown type. */
static int rule_of(unsigned type, rule *r)
{
    static const rule fixed_hello = {K_FIXED, C_ZERO, 0, 1, DS_WIRE_HELLO_SIZE, 0};
    static const rule fixed_ack = {K_FIXED, C_ZERO, 0, 1, DS_WIRE_HELLO_ACK_SIZE, 0};
    static const rule fixed_fin = {K_FIXED, C_ZERO, 0, 1, DS_WIRE_HELLO_FIN_SIZE, 0};
    static const rule fixed_reject = {K_FIXED, C_ZERO, 0, 1, DS_WIRE_HELLO_REJECT_SIZE, 0};
    static const rule sparse = {K_SPARSE, C_ELEMS, 0, 0, DS_WIRE_SPARSE_PREFIX, 4};
    switch (type) {
    case DS_MSG_HELLO: *r = fixed_hello; return 1;
    case DS_MSG_HELLO_ACK: *r = fixed_ack; return 1;
    case DS_MSG_HELLO_FIN: *r = fixed_fin; return 1;
    case DS_MSG_HELLO_REJECT: *r = fixed_reject; return 1;
    case DS_MSG_GOSSIP_REQ:
    case DS_MSG_GOSSIP_PUSH:
    case DS_MSG_GROUP_REDUCE:
    case DS_MSG_GROUP_BCAST: *r = sparse; return 1;
    case DS_MSG_GOSSIP_RESP: *r = (rule){K_COUNT, C_ELEMS, 0, 0, 0, 4}; return 1;
    case DS_MSG_GOSSIP_STALE: *r = (rule){K_FIXED, C_ZERO, 0, 0, 8, 0}; return 1;
    case DS_MSG_PING:
    case DS_MSG_ACK: *r = (rule){K_COUNT, C_RECORDS, 0, 0, 8, DS_WIRE_MEMBER_SIZE}; return 1;
    case DS_MSG_PING_REQ: *r = (rule){K_COUNT, C_RECORDS, 0, 0, 16, DS_WIRE_MEMBER_SIZE}; return 1;
    case DS_MSG_NACK: *r = (rule){K_FIXED, C_ZERO, 0, 0, 16, 0}; return 1;
    case DS_MSG_JOIN: *r = (rule){K_FIXED, C_ZERO, 0, 0, DS_WIRE_MEMBER_SIZE, 0}; return 1;
    case DS_MSG_MEMBERS: *r = (rule){K_COUNT, C_RECORDS, 1, 0, 16, DS_WIRE_MEMBER_SIZE}; return 1;
    case DS_MSG_LEAVE: *r = (rule){K_FIXED, C_ZERO, 0, 0, 16, 0}; return 1;
    case DS_MSG_STATE_REQ: *r = (rule){K_FIXED, C_ZERO, 0, 0, 16, 0}; return 1;
    case DS_MSG_STATE_CHUNK: *r = (rule){K_COUNT, C_BYTES, 1, 0, DS_WIRE_CHUNK_PREFIX, 1}; return 1;
    case DS_MSG_ALLREDUCE: *r = (rule){K_COUNT, C_ELEMS, 0, 0, 16, 4}; return 1;
    default: return 0;
    }
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
    rule r;
    if (len < DS_WIRE_HDR_SIZE)
        return DS_DROP_SHORT;
    if (ds_le32(f + DS_WH_MAGIC) != DS_WIRE_MAGIC)
        return DS_DROP_BAD_MAGIC;
    hdr_read(f, h);
    if (h->version != DS_WIRE_VERSION)
        return DS_DROP_BAD_VERSION;
    if (!rule_of(h->type, &r))
        return DS_DROP_UNKNOWN_TYPE;

    const unsigned prot = ds_wire_prot(h);
    if ((h->flags & ~DS_WF_KNOWN) || prot > DS_PROT_ENCRYPT ||
        ((h->flags & DS_WF_IDX_MASK) && r.kind != K_SPARSE) ||
        ((h->flags & DS_WF_MORE) && !r.more_ok) || (r.handshake && prot != DS_PROT_NONE))
        return DS_DROP_BAD_FLAGS;

    if (h->payload_len > lim->max_payload)
        return DS_DROP_SIZE_LIMIT;
    const uint64_t want = (uint64_t)DS_WIRE_HDR_SIZE + h->payload_len +
                          (prot != DS_PROT_NONE ? DS_WIRE_TAG_SIZE : 0);
    if ((uint64_t)len != want)
        return DS_DROP_LENGTH_MISMATCH;

    switch (r.cnt) {
    case C_ZERO:
        if (h->count != 0)
            return DS_DROP_BAD_FIELD;
        break;
    case C_ELEMS:
        if (h->count > lim->max_count)
            return DS_DROP_COUNT_LIMIT;
        break;
    case C_RECORDS:
        if (h->count > lim->max_members)
            return DS_DROP_COUNT_LIMIT;
        break;
    case C_BYTES:
        if (h->count > lim->max_payload)
            return DS_DROP_COUNT_LIMIT;
        break;
    }

    const uint64_t need = (uint64_t)r.base + (uint64_t)r.unit * h->count;
    switch (r.kind) {
    case K_FIXED:
    case K_COUNT:
        if (h->payload_len != need)
            return DS_DROP_LENGTH_MISMATCH;
        break;
    case K_SPARSE:
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

/* ---- fields ------------------------------------------------------------------- */

static int printable(uint8_t c)
{
    return c >= 0x21 && c <= 0x7e;
}

/* A string field on the wire: `len` bytes of printable ASCII, then zeros up
 * to `field` bytes. Copies it NUL-terminated into out[field]. */
static int str_read(const uint8_t *p, unsigned len, unsigned field, unsigned min, char *out)
{
    if (len < min || len >= field)
        return -1;
    for (unsigned i = 0; i < len; i++)
        if (!printable(p[i]))
            return -1;
    for (unsigned i = len; i < field; i++)
        if (p[i] != 0)
            return -1;
    memcpy(out, p, len);
    out[len] = '\0';
    return 0;
}

/* Length of a string the encoder accepts, or -1. */
static int str_len_ok(const char *s, unsigned field, unsigned min)
{
    size_t n = strnlen(s, field);
    if (n < min || n >= field)
        return -1;
    for (size_t i = 0; i < n; i++)
        if (!printable((uint8_t)s[i]))
            return -1;
    return (int)n;
}

static void str_write(uint8_t *p, const char *s, unsigned len, unsigned field)
{
    memcpy(p, s, len);
    memset(p + len, 0, field - len);
}

static int is_finite_bits(uint32_t u)
{
    return (u & 0x7f800000u) != 0x7f800000u;
}

/* Values: IEEE-754 binary32, little-endian. Copies n values from p into
 * out and reports whether all were finite; branch-free so it vectorises. */
static int values_read(const uint8_t *p, uint32_t n, float *out)
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
        bad |= (uint32_t)!is_finite_bits(u);
        memcpy(&out[i], &u, 4);
    }
#endif
    return bad == 0;
}

/* Returns 0, or -EDOM if a value is not finite (out is then partly written). */
static int values_write(uint8_t *p, const float *v, uint32_t n)
{
    uint32_t bad = 0;
#if __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
    memcpy(p, v, (size_t)n * 4);
    for (uint32_t i = 0; i < n; i++) {
        uint32_t u;
        memcpy(&u, p + 4 * (size_t)i, 4);
        bad |= (uint32_t)!is_finite_bits(u);
    }
#else
    for (uint32_t i = 0; i < n; i++) {
        uint32_t u;
        memcpy(&u, &v[i], 4);
        bad |= (uint32_t)!is_finite_bits(u);
        ds_put32(p + 4 * (size_t)i, u);
    }
#endif
    return bad ? -EDOM : 0;
}

/* ---- member records ----------------------------------------------------------- */

/*  0 pk[32] | 32 incarnation u32 | 36 state u8 | 37 name_len | 38 addr_len |
 * 39 group_len | 40 effective_round u64 | 48 name[64] | 112 addr[128] |
 * 240 group[32] | 272 */
enum {
    MR_PK = 0, MR_INC = 32, MR_STATE = 36, MR_NAME_LEN = 37, MR_ADDR_LEN = 38,
    MR_GROUP_LEN = 39, MR_ROUND = 40, MR_NAME = 48, MR_ADDR = 112, MR_GROUP = 240,
};
static_assert(MR_GROUP + DS_WIRE_GROUP_MAX + 1 == DS_WIRE_MEMBER_SIZE, "member record size");
static_assert(MR_NAME + DS_WIRE_NAME_MAX + 1 == MR_ADDR, "member name field");
static_assert(MR_ADDR + DS_WIRE_ADDR_MAX + 1 == MR_GROUP, "member addr field");

static int member_write(uint8_t *p, const ds_wire_member *m)
{
    int nl = str_len_ok(m->name, DS_WIRE_NAME_MAX + 1, 1);
    int al = str_len_ok(m->addr, DS_WIRE_ADDR_MAX + 1, 1);
    int gl = str_len_ok(m->group, DS_WIRE_GROUP_MAX + 1, 0);
    if (nl < 0 || al < 0 || gl < 0 || m->state > DS_MEMBER_LEFT)
        return -EINVAL;
    memcpy(p + MR_PK, m->pk, 32);
    ds_put32(p + MR_INC, m->incarnation);
    p[MR_STATE] = m->state;
    p[MR_NAME_LEN] = (uint8_t)nl;
    p[MR_ADDR_LEN] = (uint8_t)al;
    p[MR_GROUP_LEN] = (uint8_t)gl;
    ds_put64(p + MR_ROUND, m->effective_round);
    str_write(p + MR_NAME, m->name, (unsigned)nl, DS_WIRE_NAME_MAX + 1);
    str_write(p + MR_ADDR, m->addr, (unsigned)al, DS_WIRE_ADDR_MAX + 1);
    str_write(p + MR_GROUP, m->group, (unsigned)gl, DS_WIRE_GROUP_MAX + 1);
    return 0;
}

static enum ds_drop_reason member_read(const uint8_t *p, ds_wire_member *m)
{
    if (p[MR_STATE] > DS_MEMBER_LEFT ||
        str_read(p + MR_NAME, p[MR_NAME_LEN], DS_WIRE_NAME_MAX + 1, 1, m->name) ||
        str_read(p + MR_ADDR, p[MR_ADDR_LEN], DS_WIRE_ADDR_MAX + 1, 1, m->addr) ||
        str_read(p + MR_GROUP, p[MR_GROUP_LEN], DS_WIRE_GROUP_MAX + 1, 0, m->group))
        return DS_DROP_BAD_FIELD;
    memcpy(m->pk, p + MR_PK, 32);
    m->id = ds_wire_node_id(m->pk);
    m->incarnation = ds_le32(p + MR_INC);
    m->state = p[MR_STATE];
    m->effective_round = ds_le64(p + MR_ROUND);
    return DS_DROP_NONE;
}

/* ---- handshake bodies ------------------------------------------------------------ */

/*  0 mode | 1 aeads | 2 admission | 3 name_len | 4 addr_len | 5..7 zero |
 *  8 pk[32] | 40 eph[32] | 72 name[64] | 136 addr[128] | 264 */
enum {
    HB_MODE = 0, HB_AEADS = 1, HB_ADMIT = 2, HB_NAME_LEN = 3, HB_ADDR_LEN = 4, HB_RSV = 5,
    HB_PK = 8, HB_EPH = 40, HB_NAME = 72, HB_ADDR = 136,
};
static_assert(HB_ADDR + DS_WIRE_ADDR_MAX + 1 == DS_WIRE_HELLO_BODY, "hello body size");
static_assert(DS_WIRE_HELLO_BODY + 64 + 32 == DS_WIRE_HELLO_SIZE, "hello size");
static_assert(DS_WIRE_HELLO_BODY + 32 + 64 + 32 == DS_WIRE_HELLO_ACK_SIZE, "hello ack size");

static int hello_write(uint8_t *p, const ds_wire_hello *h, int ack)
{
    int nl = str_len_ok(h->name, DS_WIRE_NAME_MAX + 1, 1);
    int al = str_len_ok(h->addr, DS_WIRE_ADDR_MAX + 1, 0);
    if (nl < 0 || al < 0 || h->mode > 2 || h->aeads > 3 || h->admission > 3)
        return -EINVAL;
    p[HB_MODE] = h->mode;
    p[HB_AEADS] = h->aeads;
    p[HB_ADMIT] = h->admission;
    p[HB_NAME_LEN] = (uint8_t)nl;
    p[HB_ADDR_LEN] = (uint8_t)al;
    memset(p + HB_RSV, 0, 3);
    memcpy(p + HB_PK, h->pk, 32);
    memcpy(p + HB_EPH, h->eph, 32);
    str_write(p + HB_NAME, h->name, (unsigned)nl, DS_WIRE_NAME_MAX + 1);
    str_write(p + HB_ADDR, h->addr, (unsigned)al, DS_WIRE_ADDR_MAX + 1);
    uint8_t *t = p + DS_WIRE_HELLO_BODY;
    if (ack) {
        memcpy(t, h->echo, 32);
        t += 32;
    }
    memcpy(t, h->sig, 64);
    memcpy(t + 64, h->mac, 32);
    return 0;
}

static enum ds_drop_reason hello_read(const uint8_t *p, ds_wire_hello *h, int ack)
{
    if (p[HB_MODE] > 2 || p[HB_AEADS] > 3 || p[HB_ADMIT] > 3 || p[HB_RSV] || p[HB_RSV + 1] ||
        p[HB_RSV + 2] ||
        str_read(p + HB_NAME, p[HB_NAME_LEN], DS_WIRE_NAME_MAX + 1, 1, h->name) ||
        str_read(p + HB_ADDR, p[HB_ADDR_LEN], DS_WIRE_ADDR_MAX + 1, 0, h->addr))
        return DS_DROP_BAD_FIELD;
    h->mode = p[HB_MODE];
    h->aeads = p[HB_AEADS];
    h->admission = p[HB_ADMIT];
    memcpy(h->pk, p + HB_PK, 32);
    memcpy(h->eph, p + HB_EPH, 32);
    const uint8_t *t = p + DS_WIRE_HELLO_BODY;
    if (ack) {
        memcpy(h->echo, t, 32);
        t += 32;
    } else {
        memset(h->echo, 0, 32);
    }
    memcpy(h->sig, t, 64);
    memcpy(h->mac, t + 64, 32);
    return DS_DROP_NONE;
}

/* ---- sparse index sets ------------------------------------------------------------ */

static inline unsigned varint_len(uint32_t v)
{
    return 1u + (v >= (1u << 7)) + (v >= (1u << 14)) + (v >= (1u << 21)) + (v >= (1u << 28));
}

static inline size_t pad4(size_t n)
{
    return (n + 3) & ~(size_t)3;
}

/* Inline (no -mpopcnt: the builtin would be a libgcc call per word). */
static inline uint64_t popcount64(uint64_t x)
{
    x = x - ((x >> 1) & 0x5555555555555555ull);
    x = (x & 0x3333333333333333ull) + ((x >> 2) & 0x3333333333333333ull);
    x = (x + (x >> 4)) & 0x0f0f0f0f0f0f0f0full;
    return (x * 0x0101010101010101ull) >> 56;
}

static size_t bitmap_bytes(uint32_t seg_len)
{
    return 4 * (((size_t)seg_len + 31) / 32);
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
    sizes[DS_IDX_VARINT] = pad4(var);
    sizes[DS_IDX_BITMAP] = bitmap_bytes(seg_len);
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

/* Writes the index block (exactly `bytes` long, zero padding included);
 * `room` bytes from p may be scribbled on (the values follow). */
static void idx_write(uint8_t *p, size_t bytes, size_t room, enum ds_idx_enc enc,
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
    case DS_IDX_VARINT: {
        /* room: bytes writable from p (the values follow the block and are
         * written afterwards), so a varint can be stored as one u64. */
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
        break;
    }
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

/* Gate 3 for the index block. blk is idx_bytes long (checked by the caller
 * against the encoding's exact rule). Writes count indices into out (which
 * may be NULL only for dense). */
static enum ds_drop_reason idx_read(const uint8_t *blk, size_t bytes, enum ds_idx_enc enc,
                                    uint32_t seg_len, uint32_t count, uint32_t *out)
{
    switch (enc) {
    case DS_IDX_DENSE:
        if (out)
            for (uint32_t i = 0; i < count; i++)
                out[i] = i;
        return DS_DROP_NONE;
    case DS_IDX_RAW: {
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
    case DS_IDX_VARINT: {
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
    case DS_IDX_BITMAP: {
        /* The block is whole u32 words; walk it as u64 words plus at most
         * one trailing u32 (read as a u64 with a zero top half). */
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
    default:
        return DS_DROP_BAD_FLAGS;
    }
}

/* ---- encode ------------------------------------------------------------------------- */

/* Payload length of m; resolves DS_IDX_AUTO into *enc. 0 + -errno in *err on
 * failure. */
static size_t payload_size(const ds_wire_msg *m, enum ds_idx_enc *enc, int *err)
{
    rule r;
    *err = 0;
    if (!rule_of(m->h.type, &r)) {
        *err = -EINVAL;
        return 0;
    }
    if ((r.cnt == C_ZERO && m->h.count != 0) || ((m->h.flags & DS_WF_MORE) && !r.more_ok)) {
        *err = -EINVAL;
        return 0;
    }
    if (r.kind != K_SPARSE)
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
    return DS_WIRE_SPARSE_PREFIX + sizes[e] + (size_t)m->h.count * 4;
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
    h->flags &= (uint16_t)DS_WF_MORE;
    uint8_t *p = out + DS_WIRE_HDR_SIZE;
    const uint32_t n = h->count;
    int rc = 0;

    switch (h->type) {
    case DS_MSG_HELLO:
    case DS_MSG_HELLO_ACK:
        rc = hello_write(p, &m->u.hello, h->type == DS_MSG_HELLO_ACK);
        break;
    case DS_MSG_HELLO_FIN:
        memcpy(p, m->u.fin.echo, 32);
        memcpy(p + 32, m->u.fin.sig, 64);
        memcpy(p + 96, m->u.fin.mac, 32);
        break;
    case DS_MSG_HELLO_REJECT:
        memcpy(p, m->u.reject.echo, 32);
        p[32] = m->u.reject.reason;
        memset(p + 33, 0, 7);
        break;
    case DS_MSG_GOSSIP_REQ:
    case DS_MSG_GOSSIP_PUSH:
    case DS_MSG_GROUP_REDUCE:
    case DS_MSG_GROUP_BCAST: {
        ds_wire_sparse *s = &m->u.sparse;
        const size_t ib = plen - DS_WIRE_SPARSE_PREFIX - (size_t)n * 4;
        ds_put32(p, s->seg_len);
        ds_put32(p + 4, (uint32_t)ib);
        ds_put32(p + 8, s->aux);
        ds_put32(p + 12, 0);
        idx_write(p + DS_WIRE_SPARSE_PREFIX, ib, ib + (size_t)n * 4, enc, s->seg_len, s->idx, n);
        rc = n ? values_write(p + DS_WIRE_SPARSE_PREFIX + ib, s->val, n) : 0;
        s->enc = (uint8_t)enc;
        h->flags |= (uint16_t)enc;
        break;
    }
    case DS_MSG_GOSSIP_RESP:
        rc = n ? values_write(p, m->u.values.val, n) : 0;
        break;
    case DS_MSG_GOSSIP_STALE:
        ds_put64(p, m->u.stale.round_now);
        break;
    case DS_MSG_PING:
    case DS_MSG_ACK:
    case DS_MSG_PING_REQ:
    case DS_MSG_NACK: {
        const ds_wire_probe *pr = &m->u.probe;
        ds_put64(p, pr->probe_seq);
        size_t o = 8;
        if (h->type == DS_MSG_PING_REQ || h->type == DS_MSG_NACK) {
            if (!pr->target)
                return -EINVAL;
            ds_put64(p + 8, pr->target);
            o = 16;
        }
        for (uint32_t i = 0; i < n && !rc; i++)
            rc = member_write(p + o + (size_t)i * DS_WIRE_MEMBER_SIZE, &pr->updates[i]);
        break;
    }
    case DS_MSG_JOIN:
        rc = member_write(p, &m->u.join);
        break;
    case DS_MSG_MEMBERS: {
        const ds_wire_members *ms = &m->u.members;
        if ((uint64_t)ms->first + n > ms->total)
            return -EINVAL;
        ds_put64(p, ms->round_now);
        ds_put32(p + 8, ms->total);
        ds_put32(p + 12, ms->first);
        for (uint32_t i = 0; i < n && !rc; i++)
            rc = member_write(p + 16 + (size_t)i * DS_WIRE_MEMBER_SIZE, &ms->members[i]);
        break;
    }
    case DS_MSG_LEAVE:
        ds_put64(p, m->u.leave.effective_round);
        ds_put32(p + 8, m->u.leave.incarnation);
        ds_put32(p + 12, 0);
        break;
    case DS_MSG_STATE_REQ:
        ds_put64(p, m->u.state_req.offset);
        ds_put64(p + 8, m->u.state_req.length);
        break;
    case DS_MSG_STATE_CHUNK: {
        const ds_wire_state_chunk *c = &m->u.chunk;
        if (c->offset > c->total || n > c->total - c->offset)
            return -EINVAL;
        ds_put64(p, c->total);
        ds_put64(p + 8, c->offset);
        memcpy(p + 16, c->digest, 32);
        if (n && !c->data)
            return -EINVAL;
        if (n && !split)
            memcpy(p + DS_WIRE_CHUNK_PREFIX, c->data, n);
        break;
    }
    case DS_MSG_ALLREDUCE: {
        const ds_wire_allreduce *a = &m->u.ar;
        if (a->phase > 1)
            return -EINVAL;
        ds_put32(p, a->phase);
        ds_put32(p + 4, a->step);
        ds_put64(p + 8, a->elem_offset);
        rc = n ? values_write(p + 16, a->val, n) : 0;
        break;
    }
    default:
        return -EINVAL;
    }
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

/* ---- decode ------------------------------------------------------------------------- */

static enum ds_drop_reason sparse_read(const uint8_t *p, const ds_wire_hdr *h,
                                       const ds_wire_limits *lim, const ds_wire_bufs *b,
                                       ds_wire_sparse *s)
{
    const uint32_t n = h->count;
    const uint32_t seg_len = ds_le32(p);
    const uint32_t ib = ds_le32(p + 4);
    const enum ds_idx_enc enc = (enum ds_idx_enc)(h->flags & DS_WF_IDX_MASK);
    if (ds_le32(p + 12) != 0)
        return DS_DROP_BAD_FIELD;
    if (seg_len > lim->max_segment)
        return DS_DROP_SIZE_LIMIT;
    if (n > seg_len || n > b->val_cap || (b->idx_cap < n && (enc != DS_IDX_DENSE || b->idx)))
        return DS_DROP_COUNT_LIMIT;
    if ((uint64_t)DS_WIRE_SPARSE_PREFIX + ib + (uint64_t)n * 4 != h->payload_len)
        return DS_DROP_LENGTH_MISMATCH;
    int ok;
    switch (enc) {
    case DS_IDX_DENSE: ok = ib == 0 && n == seg_len; break;
    case DS_IDX_RAW: ok = (uint64_t)ib == (uint64_t)n * 4; break;
    case DS_IDX_VARINT: ok = ib % 4 == 0 && ib >= n && (uint64_t)ib <= pad4((size_t)n * 5); break;
    case DS_IDX_BITMAP: ok = (uint64_t)ib == bitmap_bytes(seg_len); break;
    default: ok = 0; break;
    }
    if (!ok)
        return DS_DROP_LENGTH_MISMATCH;
    enum ds_drop_reason r = idx_read(p + DS_WIRE_SPARSE_PREFIX, ib, enc, seg_len, n, b->idx);
    if (r != DS_DROP_NONE)
        return r;
    if (!values_read(p + DS_WIRE_SPARSE_PREFIX + ib, n, b->val))
        return DS_DROP_NON_FINITE;
    s->seg_len = seg_len;
    s->aux = ds_le32(p + 8);
    s->enc = (uint8_t)enc;
    s->idx = b->idx;
    s->val = b->val;
    return DS_DROP_NONE;
}

static enum ds_drop_reason members_read(const uint8_t *p, uint32_t n, const ds_wire_bufs *b,
                                        const ds_wire_member **out)
{
    if (n > b->members_cap)
        return DS_DROP_COUNT_LIMIT;
    for (uint32_t i = 0; i < n; i++) {
        enum ds_drop_reason r = member_read(p + (size_t)i * DS_WIRE_MEMBER_SIZE, &b->members[i]);
        if (r != DS_DROP_NONE)
            return r;
    }
    *out = b->members;
    return DS_DROP_NONE;
}

static enum ds_drop_reason payload_read(const uint8_t *f, const ds_wire_limits *lim,
                                        const ds_wire_bufs *b, ds_wire_msg *m)
{
    const uint8_t *p = f + DS_WIRE_HDR_SIZE;
    const ds_wire_hdr *h = &m->h;
    const uint32_t n = h->count;
    switch (h->type) {
    case DS_MSG_HELLO:
    case DS_MSG_HELLO_ACK:
        return hello_read(p, &m->u.hello, h->type == DS_MSG_HELLO_ACK);
    case DS_MSG_HELLO_FIN:
        memcpy(m->u.fin.echo, p, 32);
        memcpy(m->u.fin.sig, p + 32, 64);
        memcpy(m->u.fin.mac, p + 96, 32);
        return DS_DROP_NONE;
    case DS_MSG_HELLO_REJECT:
        for (int i = 33; i < 40; i++)
            if (p[i])
                return DS_DROP_BAD_FIELD;
        if (p[32] == DS_DROP_NONE || p[32] >= DS_DROP__COUNT)
            return DS_DROP_BAD_FIELD;
        memcpy(m->u.reject.echo, p, 32);
        m->u.reject.reason = p[32];
        return DS_DROP_NONE;
    case DS_MSG_GOSSIP_REQ:
    case DS_MSG_GOSSIP_PUSH:
    case DS_MSG_GROUP_REDUCE:
    case DS_MSG_GROUP_BCAST:
        return sparse_read(p, h, lim, b, &m->u.sparse);
    case DS_MSG_GOSSIP_RESP:
        if (n > b->val_cap)
            return DS_DROP_COUNT_LIMIT;
        if (!values_read(p, n, b->val))
            return DS_DROP_NON_FINITE;
        m->u.values.val = b->val;
        return DS_DROP_NONE;
    case DS_MSG_GOSSIP_STALE:
        m->u.stale.round_now = ds_le64(p);
        return DS_DROP_NONE;
    case DS_MSG_PING:
    case DS_MSG_ACK:
        m->u.probe.probe_seq = ds_le64(p);
        m->u.probe.target = 0;
        return members_read(p + 8, n, b, &m->u.probe.updates);
    case DS_MSG_PING_REQ:
    case DS_MSG_NACK:
        m->u.probe.probe_seq = ds_le64(p);
        m->u.probe.target = ds_le64(p + 8);
        m->u.probe.updates = NULL;
        if (m->u.probe.target == 0)
            return DS_DROP_BAD_FIELD;
        return h->type == DS_MSG_NACK ? DS_DROP_NONE
                                      : members_read(p + 16, n, b, &m->u.probe.updates);
    case DS_MSG_JOIN:
        return member_read(p, &m->u.join);
    case DS_MSG_MEMBERS: {
        ds_wire_members *ms = &m->u.members;
        ms->round_now = ds_le64(p);
        ms->total = ds_le32(p + 8);
        ms->first = ds_le32(p + 12);
        if (ms->total > lim->max_cluster)
            return DS_DROP_SIZE_LIMIT;
        if ((uint64_t)ms->first + n > ms->total)
            return DS_DROP_BAD_FIELD;
        return members_read(p + 16, n, b, &ms->members);
    }
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
    case DS_MSG_STATE_CHUNK: {
        ds_wire_state_chunk *c = &m->u.chunk;
        c->total = ds_le64(p);
        c->offset = ds_le64(p + 8);
        if (c->total > lim->max_state)
            return DS_DROP_SIZE_LIMIT;
        if (c->offset > c->total || n > c->total - c->offset)
            return DS_DROP_BAD_FIELD;
        memcpy(c->digest, p + 16, 32);
        c->data = p + DS_WIRE_CHUNK_PREFIX;
        return DS_DROP_NONE;
    }
    case DS_MSG_ALLREDUCE: {
        ds_wire_allreduce *a = &m->u.ar;
        a->phase = ds_le32(p);
        a->step = ds_le32(p + 4);
        a->elem_offset = ds_le64(p + 8);
        if (a->phase > 1)
            return DS_DROP_BAD_FIELD;
        if (n > b->val_cap)
            return DS_DROP_COUNT_LIMIT;
        if (!values_read(p + 16, n, b->val))
            return DS_DROP_NON_FINITE;
        a->val = b->val;
        return DS_DROP_NONE;
    }
    default:
        return DS_DROP_UNKNOWN_TYPE;
    }
}

enum ds_drop_reason ds_wire_decode(const uint8_t *frame, size_t len, const ds_wire_limits *lim,
                                   const ds_wire_bufs *bufs, ds_wire_msg *out,
                                   ds_drop_counters *drops)
{
    static const ds_wire_bufs no_bufs;
    enum ds_drop_reason r = hdr_check(frame, len, lim, &out->h);
    if (r == DS_DROP_NONE)
        r = payload_read(frame, lim, bufs ? bufs : &no_bufs, out);
    if (r != DS_DROP_NONE)
        ds_drop_note(drops, r, COMP, "len=%zu type=%s sender=%016" PRIx64 " count=%" PRIu32, len,
                     len >= DS_WIRE_HDR_SIZE ? ds_msg_type_name(frame[DS_WH_TYPE]) : "-",
                     len >= DS_WIRE_HDR_SIZE ? ds_le64(frame + DS_WH_SENDER) : 0,
                     len >= DS_WIRE_HDR_SIZE ? ds_le32(frame + DS_WH_COUNT) : 0);
    return r;
}
