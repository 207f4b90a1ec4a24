/*
 * tests/test_wire.c: the wire format. The header's, the member record's
 * and the handshake payloads' bytes at their pinned offsets, golden ids
 * (computed independently with Python's hashlib), a round trip of every
 * message type, every sparse encoding on seeded index sets of odd sizes
 * (and the exact-size choice), each malformed class asserted by its drop
 * reason and counted, every truncation of every message type, and seeded
 * garbage (ASan catches any out-of-bounds read). Value formats (f16, bf16):
 * the conversion kernels against their references and independent
 * oracles, the residual's exactness, and frames in each format.
 * Run: meson test -C build wire --verbose
 */
#include <criterion/criterion.h>
#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "node/wire/wire.h"
#include "testutil.h"

#define CAP (1u << 16)

static ds_wire_limits lim;
static uint32_t idxbuf[CAP];
static float valbuf[CAP];
static ds_wire_member membuf[64];
static ds_wire_bufs bufs;
static ds_drop_counters drops;

static void setup(void)
{
    ds_log_setup("test", DS_LOG_ERROR, NULL);
    ds_wire_limits_default(&lim);
    lim.max_count = CAP;
    lim.max_members = 64;
    bufs = (ds_wire_bufs){idxbuf, CAP, valbuf, CAP, membuf, 64};
    memset(&drops, 0, sizeof(drops));
}

TestSuite(wire, .init = setup);

static void hdr_fill(ds_wire_msg *m, uint8_t type)
{
    memset(m, 0, sizeof(*m));
    m->h.type = type;
    m->h.cluster = 0x1122334455667788ull;
    m->h.sender = 0xa1a2a3a4a5a6a7a8ull;
    m->h.receiver = 0xb1b2b3b4b5b6b7b8ull;
    m->h.round = 0xc1c2c3c4c5c6c7c8ull;
    m->h.epoch = 0xd1d2d3d4u;
    m->h.segment = 0xe1e2e3e4u;
}

/* Decode and expect `want`; checks the counter moved by one for a drop. */
static enum ds_drop_reason dec(const uint8_t *f, size_t len, ds_wire_msg *out)
{
    uint64_t before = ds_drop_total(&drops);
    enum ds_drop_reason r = ds_wire_decode(f, len, &lim, &bufs, out, &drops);
    cr_assert_eq(ds_drop_total(&drops), before + (r != DS_DROP_NONE), "drop counted once");
    return r;
}

#define EXPECT_DROP(f, len, want) \
    do { \
        ds_wire_msg m_; \
        uint64_t c_ = ds_drop_get(&drops, want); \
        enum ds_drop_reason r_ = dec((f), (len), &m_); \
        cr_assert_eq(r_, want, "line %d: got %s, want %s", __LINE__, ds_drop_name(r_), \
                     ds_drop_name(want)); \
        cr_assert_eq(ds_drop_get(&drops, want), c_ + 1); \
    } while (0)

/* ---- header --------------------------------------------------------------------- */

Test(wire, header_bytes_at_pinned_offsets)
{
    ds_wire_hdr h = {.type = DS_MSG_GOSSIP_REQ, .flags = 0x0106, .cluster = 0x0102030405060708ull,
                     .sender = 0x1112131415161718ull, .receiver = 0x2122232425262728ull,
                     .round = 0x3132333435363738ull, .epoch = 0x41424344u,
                     .segment = 0x51525354u, .count = 0x61626364u,
                     .payload_len = 0x71727374u, .seq = 0x8182838485868788ull};
    uint8_t b[DS_WIRE_HDR_SIZE];
    ds_wire_hdr_encode(&h, b);
    static const uint8_t want[DS_WIRE_HDR_SIZE] = {
        'd', 's', 'n', 'w', 3, 16, 0x06, 0x01,
        0x08, 0x07, 0x06, 0x05, 0x04, 0x03, 0x02, 0x01,
        0x18, 0x17, 0x16, 0x15, 0x14, 0x13, 0x12, 0x11,
        0x28, 0x27, 0x26, 0x25, 0x24, 0x23, 0x22, 0x21,
        0x38, 0x37, 0x36, 0x35, 0x34, 0x33, 0x32, 0x31,
        0x44, 0x43, 0x42, 0x41, 0x54, 0x53, 0x52, 0x51,
        0x64, 0x63, 0x62, 0x61, 0x74, 0x73, 0x72, 0x71,
        0x88, 0x87, 0x86, 0x85, 0x84, 0x83, 0x82, 0x81,
    };
    for (unsigned i = 0; i < DS_WIRE_HDR_SIZE; i++)
        cr_expect_eq(b[i], want[i], "byte %u: %02x want %02x", i, b[i], want[i]);
}

/* ---- record layouts ------------------------------------------------------------- */

/* The offsets below are the ones docs/protocol.md draws, written out as
 * numbers rather than taken from member.h and hello.h, so a change to a
 * pinned layout fails here as well as in its static_asserts. */

static void expect_at(const uint8_t *p, unsigned off, const void *want, size_t n, const char *what)
{
    cr_expect_eq(memcmp(p + off, want, n), 0, "%s at %u", what, off);
}

/* A string field: its bytes, then zeros to the end of the field. */
static void expect_str_at(const uint8_t *p, unsigned off, const char *s, unsigned field,
                          const char *what)
{
    size_t n = strlen(s);
    expect_at(p, off, s, n, what);
    for (unsigned i = (unsigned)n; i < field; i++)
        cr_expect_eq(p[off + i], 0, "%s padding at %u", what, off + i);
}

Test(wire, member_record_bytes_at_pinned_offsets)
{
    static uint8_t f[DS_WIRE_HDR_SIZE + 272 + DS_WIRE_TAG_SIZE];
    ds_wire_msg m;
    size_t len = 0;
    hdr_fill(&m, DS_MSG_JOIN);
    for (int k = 0; k < 32; k++)
        m.u.join.pk[k] = (uint8_t)(0xa0 + k);
    m.u.join.incarnation = 0x11223344u;
    m.u.join.state = DS_MEMBER_SUSPECT;
    m.u.join.effective_round = 0x0102030405060708ull;
    snprintf(m.u.join.name, sizeof(m.u.join.name), "node-7");
    snprintf(m.u.join.addr, sizeof(m.u.join.addr), "10.0.0.7:4100");
    snprintf(m.u.join.group, sizeof(m.u.join.group), "rack2");
    cr_assert_eq(ds_wire_encode(f, sizeof(f), &m, &len), 0);
    cr_assert_eq(len, DS_WIRE_HDR_SIZE + 272);
    const uint8_t *p = f + DS_WIRE_HDR_SIZE;
    expect_at(p, 0, m.u.join.pk, 32, "pk");
    static const uint8_t inc[4] = {0x44, 0x33, 0x22, 0x11};
    expect_at(p, 32, inc, 4, "incarnation");
    cr_expect_eq(p[36], DS_MEMBER_SUSPECT, "state");
    cr_expect_eq(p[37], 6, "name_len");
    cr_expect_eq(p[38], 13, "addr_len");
    cr_expect_eq(p[39], 5, "group_len");
    static const uint8_t round[8] = {0x08, 0x07, 0x06, 0x05, 0x04, 0x03, 0x02, 0x01};
    expect_at(p, 40, round, 8, "effective_round");
    expect_str_at(p, 48, "node-7", 64, "name");
    expect_str_at(p, 112, "10.0.0.7:4100", 128, "addr");
    expect_str_at(p, 240, "rack2", 32, "group");
}

static void hello_fill(ds_wire_hello *b)
{
    memset(b, 0, sizeof(*b));
    b->mode = 2;
    b->aeads = 3;
    b->admission = 1;
    for (int k = 0; k < 32; k++) {
        b->pk[k] = (uint8_t)(0x10 + k);
        b->eph[k] = (uint8_t)(0x50 + k);
        b->echo[k] = (uint8_t)(0x90 + k);
        b->mac[k] = (uint8_t)(0xd0 + k);
    }
    for (int k = 0; k < 64; k++)
        b->sig[k] = (uint8_t)(0x20 + k);
    snprintf(b->name, sizeof(b->name), "alpha");
    snprintf(b->addr, sizeof(b->addr), "10.0.0.1:4000");
}

Test(wire, handshake_payload_bytes_at_pinned_offsets)
{
    static uint8_t f[DS_WIRE_HDR_SIZE + 392 + DS_WIRE_TAG_SIZE];
    ds_wire_msg m;
    size_t len = 0;
    const uint8_t *p = f + DS_WIRE_HDR_SIZE;

    /* HELLO_ACK: the body, then echo, sig, mac. */
    hdr_fill(&m, DS_MSG_HELLO_ACK);
    hello_fill(&m.u.hello);
    m.u.hello.aeads = 1;
    cr_assert_eq(ds_wire_encode(f, sizeof(f), &m, &len), 0);
    cr_assert_eq(len, DS_WIRE_HDR_SIZE + 392);
    cr_expect_eq(p[0], 2, "mode");
    cr_expect_eq(p[1], 1, "aeads");
    cr_expect_eq(p[2], 1, "admission");
    cr_expect_eq(p[3], 5, "name_len");
    cr_expect_eq(p[4], 13, "addr_len");
    cr_expect(p[5] == 0 && p[6] == 0 && p[7] == 0, "reserved");
    expect_at(p, 8, m.u.hello.pk, 32, "pk");
    expect_at(p, 40, m.u.hello.eph, 32, "eph");
    expect_str_at(p, 72, "alpha", 64, "name");
    expect_str_at(p, 136, "10.0.0.1:4000", 128, "addr");
    expect_at(p, 264, m.u.hello.echo, 32, "echo");
    expect_at(p, 296, m.u.hello.sig, 64, "sig");
    expect_at(p, 360, m.u.hello.mac, 32, "mac");

    /* HELLO: the body, then sig, mac (no echo). */
    hdr_fill(&m, DS_MSG_HELLO);
    hello_fill(&m.u.hello);
    cr_assert_eq(ds_wire_encode(f, sizeof(f), &m, &len), 0);
    cr_assert_eq(len, DS_WIRE_HDR_SIZE + 360);
    cr_expect_eq(p[1], 3, "aeads offered");
    expect_at(p, 264, m.u.hello.sig, 64, "sig");
    expect_at(p, 328, m.u.hello.mac, 32, "mac");

    /* HELLO_FIN: echo, sig, mac. */
    hdr_fill(&m, DS_MSG_HELLO_FIN);
    for (int k = 0; k < 32; k++) {
        m.u.fin.echo[k] = (uint8_t)(0x30 + k);
        m.u.fin.mac[k] = (uint8_t)(0x70 + k);
    }
    for (int k = 0; k < 64; k++)
        m.u.fin.sig[k] = (uint8_t)(0xb0 + k);
    cr_assert_eq(ds_wire_encode(f, sizeof(f), &m, &len), 0);
    cr_assert_eq(len, DS_WIRE_HDR_SIZE + 128);
    expect_at(p, 0, m.u.fin.echo, 32, "echo");
    expect_at(p, 32, m.u.fin.sig, 64, "sig");
    expect_at(p, 96, m.u.fin.mac, 32, "mac");

    /* HELLO_REJECT: echo, reason, seven zeros. */
    hdr_fill(&m, DS_MSG_HELLO_REJECT);
    for (int k = 0; k < 32; k++)
        m.u.reject.echo[k] = (uint8_t)(0xc0 + k);
    m.u.reject.reason = DS_DROP_NOT_ALLOWED;
    memset(f, 0xee, sizeof(f));
    cr_assert_eq(ds_wire_encode(f, sizeof(f), &m, &len), 0);
    cr_assert_eq(len, DS_WIRE_HDR_SIZE + 40);
    expect_at(p, 0, m.u.reject.echo, 32, "echo");
    cr_expect_eq(p[32], DS_DROP_NOT_ALLOWED, "reason");
    for (unsigned i = 33; i < 40; i++)
        cr_expect_eq(p[i], 0, "zero at %u", i);
}

Test(wire, golden_ids)
{
    /* hashlib.blake2b(label + data, digest_size=16).digest()[:8], LE. */
    cr_expect_eq(ds_wire_cluster_id("test-cluster"), 0x0285825fc8526388ull);
    cr_expect_eq(ds_wire_cluster_id(""), 0x5adebb11674449b9ull);
    uint8_t pk[32];
    for (int i = 0; i < 32; i++)
        pk[i] = (uint8_t)i;
    cr_expect_eq(ds_wire_node_id(pk), 0x8694d5f3cdb313f0ull);
}

Test(wire, names_and_format)
{
    cr_expect_str_eq(ds_drop_name(DS_DROP_BAD_TAG), "bad_tag");
    cr_expect_str_eq(ds_drop_name((enum ds_drop_reason)999), "?");
    cr_expect_str_eq(ds_msg_type_name(DS_MSG_GOSSIP_REQ), "GOSSIP_REQ");
    cr_expect_str_eq(ds_msg_type_name(200), "?");
    for (int r = 0; r < DS_DROP__COUNT; r++)
        cr_expect(strlen(ds_drop_str((enum ds_drop_reason)r)) > 0);

    char buf[4096];
    cr_expect_eq(ds_drop_format(&drops, DS_DROP_FMT_KV, buf, sizeof(buf)), 4);
    cr_expect_str_eq(buf, "none");
    ds_drop_inc(&drops, DS_DROP_BAD_TAG);
    ds_drop_inc(&drops, DS_DROP_BAD_TAG);
    ds_drop_inc(&drops, DS_DROP_REPLAY);
    ds_drop_inc(NULL, DS_DROP_REPLAY);
    cr_expect_eq(ds_drop_total(&drops), 3);
    cr_assert_gt(ds_drop_format(&drops, DS_DROP_FMT_KV, buf, sizeof(buf)), 0);
    cr_expect_str_eq(buf, "bad_tag=2 replay=1");
    cr_expect_eq(ds_drop_format(&drops, DS_DROP_FMT_KV, buf, 10), -ENOSPC);
    cr_expect_eq(ds_drop_format(&drops, (enum ds_drop_fmt)7, buf, sizeof(buf)), -EINVAL);
}

/* ---- round trips ----------------------------------------------------------------- */

static void member_fill(ds_wire_member *m, int i)
{
    memset(m, 0, sizeof(*m));
    for (int k = 0; k < 32; k++)
        m->pk[k] = (uint8_t)(i * 7 + k);
    m->incarnation = 100u + (uint32_t)i;
    m->state = (uint8_t)(i % 4);
    m->effective_round = 1000ull + (uint64_t)i;
    snprintf(m->name, sizeof(m->name), "node-%d", i);
    snprintf(m->addr, sizeof(m->addr), "127.0.0.1:%d", 4000 + i);
    if (i % 2)
        snprintf(m->group, sizeof(m->group), "rack%d", i);
}

static void member_eq(const ds_wire_member *a, const ds_wire_member *b)
{
    cr_expect_eq(memcmp(a->pk, b->pk, 32), 0);
    cr_expect_eq(b->id, ds_wire_node_id(a->pk));
    cr_expect_eq(a->incarnation, b->incarnation);
    cr_expect_eq(a->state, b->state);
    cr_expect_eq(a->effective_round, b->effective_round);
    cr_expect_str_eq(a->name, b->name);
    cr_expect_str_eq(a->addr, b->addr);
    cr_expect_str_eq(a->group, b->group);
}

/* Encode m into f, decode it into out, and check the common header. */
static size_t roundtrip(ds_wire_msg *m, uint8_t *f, size_t cap, ds_wire_msg *out)
{
    size_t len = 0;
    int rc = ds_wire_encode(f, cap, m, &len);
    cr_assert_eq(rc, 0, "encode %s: %d", ds_msg_type_name(m->h.type), rc);
    cr_assert_eq(len, ds_wire_encoded_size(m));
    cr_assert_eq(len, DS_WIRE_HDR_SIZE + m->h.payload_len);
    enum ds_drop_reason r = dec(f, len, out);
    cr_assert_eq(r, DS_DROP_NONE, "decode %s: %s", ds_msg_type_name(m->h.type),
                 ds_drop_name(r));
    cr_expect_eq(out->h.type, m->h.type);
    cr_expect_eq(out->h.cluster, m->h.cluster);
    cr_expect_eq(out->h.sender, m->h.sender);
    cr_expect_eq(out->h.receiver, m->h.receiver);
    cr_expect_eq(out->h.round, m->h.round);
    cr_expect_eq(out->h.epoch, m->h.epoch);
    cr_expect_eq(out->h.segment, m->h.segment);
    cr_expect_eq(out->h.count, m->h.count);
    cr_expect_eq(out->h.seq, 0);
    return len;
}

static uint8_t frame[(1u << 20)];

Test(wire, roundtrip_every_type)
{
    ds_wire_msg m, o;
    float v[37];
    uint32_t ix[37];
    ds_wire_member mem[5];
    ds_t_fill(v, 37, 7, -2.0f, 2.0f);
    for (int i = 0; i < 37; i++)
        ix[i] = (uint32_t)(i * 3 + 1);
    for (int i = 0; i < 5; i++)
        member_fill(&mem[i], i);

    const uint8_t sparse_types[] = {DS_MSG_GOSSIP_REQ, DS_MSG_GOSSIP_PUSH, DS_MSG_GROUP_REDUCE,
                                    DS_MSG_GROUP_BCAST};
    for (int t = 0; t < 4; t++) {
        hdr_fill(&m, sparse_types[t]);
        m.h.count = 37;
        m.u.sparse = (ds_wire_sparse){.seg_len = 200, .aux = 9, .enc = DS_IDX_AUTO,
                                      .idx = ix, .val = v};
        roundtrip(&m, frame, sizeof(frame), &o);
        cr_expect_eq(o.u.sparse.seg_len, 200);
        cr_expect_eq(o.u.sparse.aux, 9);
        cr_expect_eq(o.u.sparse.enc, m.u.sparse.enc);
        cr_expect_eq(memcmp(o.u.sparse.idx, ix, sizeof(ix)), 0);
        cr_expect_eq(memcmp(o.u.sparse.val, v, sizeof(v)), 0);
    }

    hdr_fill(&m, DS_MSG_GOSSIP_RESP);
    m.h.count = 37;
    m.u.values.held_us = 123456789u;
    m.u.values.val = v;
    roundtrip(&m, frame, sizeof(frame), &o);
    cr_expect_eq(o.u.values.held_us, 123456789u);
    cr_expect_eq(memcmp(o.u.values.val, v, sizeof(v)), 0);

    hdr_fill(&m, DS_MSG_GOSSIP_STALE);
    m.u.stale.round_now = 77;
    roundtrip(&m, frame, sizeof(frame), &o);
    cr_expect_eq(o.u.stale.round_now, 77);

    const uint8_t probes[] = {DS_MSG_PING, DS_MSG_ACK, DS_MSG_PING_REQ, DS_MSG_NACK};
    for (int t = 0; t < 4; t++) {
        hdr_fill(&m, probes[t]);
        m.h.count = probes[t] == DS_MSG_NACK ? 0 : 5;
        m.u.probe = (ds_wire_probe){.probe_seq = 55, .target = 66, .updates = mem};
        roundtrip(&m, frame, sizeof(frame), &o);
        cr_expect_eq(o.u.probe.probe_seq, 55);
        cr_expect_eq(o.u.probe.target,
                     probes[t] == DS_MSG_PING_REQ || probes[t] == DS_MSG_NACK ? 66 : 0);
        for (uint32_t i = 0; i < m.h.count; i++)
            member_eq(&mem[i], &o.u.probe.updates[i]);
    }

    hdr_fill(&m, DS_MSG_JOIN);
    m.u.join = mem[3];
    roundtrip(&m, frame, sizeof(frame), &o);
    member_eq(&mem[3], &o.u.join);

    hdr_fill(&m, DS_MSG_MEMBERS);
    m.h.flags = DS_WF_MORE;
    m.h.count = 5;
    m.u.members = (ds_wire_members){.round_now = 9, .total = 12, .first = 5, .members = mem};
    roundtrip(&m, frame, sizeof(frame), &o);
    cr_expect_eq(o.h.flags & DS_WF_MORE, DS_WF_MORE);
    cr_expect_eq(o.u.members.total, 12);
    cr_expect_eq(o.u.members.first, 5);
    cr_expect_eq(o.u.members.round_now, 9);
    for (int i = 0; i < 5; i++)
        member_eq(&mem[i], &o.u.members.members[i]);

    hdr_fill(&m, DS_MSG_LEAVE);
    m.u.leave = (ds_wire_leave){.effective_round = 123, .incarnation = 4};
    roundtrip(&m, frame, sizeof(frame), &o);
    cr_expect_eq(o.u.leave.effective_round, 123);
    cr_expect_eq(o.u.leave.incarnation, 4);

    hdr_fill(&m, DS_MSG_STATE_REQ);
    m.u.state_req = (ds_wire_state_req){.offset = 4096, .length = 8192};
    roundtrip(&m, frame, sizeof(frame), &o);
    cr_expect_eq(o.u.state_req.offset, 4096);
    cr_expect_eq(o.u.state_req.length, 8192);

    uint8_t data[300];
    for (int i = 0; i < 300; i++)
        data[i] = (uint8_t)(i * 13);
    hdr_fill(&m, DS_MSG_STATE_CHUNK);
    m.h.count = 300;
    m.u.chunk = (ds_wire_state_chunk){.total = 1000, .offset = 700, .data = data};
    memset(m.u.chunk.digest, 0xab, 32);
    size_t len = roundtrip(&m, frame, sizeof(frame), &o);
    cr_expect_eq(o.u.chunk.total, 1000);
    cr_expect_eq(o.u.chunk.offset, 700);
    cr_expect_eq(o.u.chunk.digest[31], 0xab);
    cr_expect_eq(memcmp(o.u.chunk.data, data, 300), 0);
    cr_expect(o.u.chunk.data >= frame && o.u.chunk.data + 300 <= frame + len,
              "chunk data borrows the frame");

    hdr_fill(&m, DS_MSG_ALLREDUCE);
    m.h.count = 37;
    m.u.ar = (ds_wire_allreduce){.phase = 1, .step = 3, .elem_offset = 1ull << 33, .val = v};
    roundtrip(&m, frame, sizeof(frame), &o);
    cr_expect_eq(o.u.ar.phase, 1);
    cr_expect_eq(o.u.ar.step, 3);
    cr_expect_eq(o.u.ar.elem_offset, 1ull << 33);
    cr_expect_eq(memcmp(o.u.ar.val, v, sizeof(v)), 0);

    hdr_fill(&m, DS_MSG_HELLO_ACK);
    ds_wire_hello *hb = &m.u.hello;
    hb->mode = 2;
    hb->aeads = 1;
    hb->admission = 3;
    memset(hb->pk, 1, 32);
    memset(hb->eph, 2, 32);
    memset(hb->echo, 3, 32);
    memset(hb->sig, 4, 64);
    memset(hb->mac, 5, 32);
    strcpy(hb->name, "alpha");
    strcpy(hb->addr, "[::1]:4001");
    roundtrip(&m, frame, sizeof(frame), &o);
    cr_expect_eq(memcmp(&o.u.hello.pk, hb->pk, 32), 0);
    cr_expect_eq(memcmp(&o.u.hello.sig, hb->sig, 64), 0);
    cr_expect_eq(memcmp(&o.u.hello.echo, hb->echo, 32), 0);
    cr_expect_str_eq(o.u.hello.name, "alpha");
    cr_expect_str_eq(o.u.hello.addr, "[::1]:4001");
}

/* ---- sparse encodings ------------------------------------------------------------------ */

/* A seeded strictly increasing index set of about density * n entries. */
static uint32_t make_idx(uint32_t *ix, uint32_t n, double density, uint64_t seed)
{
    uint64_t s = seed;
    uint32_t c = 0;
    const uint64_t thr = (uint64_t)(density * 18446744073709551615.0);
    for (uint32_t i = 0; i < n; i++)
        if (ds_t_next(&s) <= thr)
            ix[c++] = i;
    return c;
}

Test(wire, sparse_every_encoding_odd_sizes)
{
    static const uint32_t lens[] = {0, 1, 2, 3, 7, 31, 32, 33, 63, 100, 257, 1000, 4099, 40000};
    static const double dens[] = {0.0, 0.001, 0.01, 0.05, 0.2, 0.5, 0.97, 1.0};
    static uint32_t ix[40000];
    static float v[40000];
    ds_t_fill(v, 40000, 3, -1.0f, 1.0f);
    int cases = 0;
    for (size_t li = 0; li < sizeof(lens) / sizeof(lens[0]); li++) {
        for (size_t di = 0; di < sizeof(dens) / sizeof(dens[0]); di++) {
            const uint32_t n = lens[li];
            const uint64_t seed = 1000 * li + di;
            const uint32_t c = make_idx(ix, n, dens[di], seed);
            size_t sizes[4];
            enum ds_idx_enc best;
            cr_assert_eq(ds_wire_idx_sizes(n, ix, c, sizes, &best), 0);
            size_t min = SIZE_MAX;
            for (int e = 0; e < 4; e++)
                if (sizes[e] < min)
                    min = sizes[e];
            cr_expect_eq(sizes[best], min, "n=%u c=%u: auto picks the smallest", n, c);
            for (int e = 0; e <= 4; e++) {
                const uint8_t enc = e == 4 ? DS_IDX_AUTO : (uint8_t)e;
                if (e < 4 && sizes[e] == SIZE_MAX)
                    continue;
                ds_wire_msg m, o;
                hdr_fill(&m, DS_MSG_GOSSIP_REQ);
                m.h.count = c;
                m.u.sparse = (ds_wire_sparse){.seg_len = n, .enc = enc, .idx = ix, .val = v};
                const size_t len = roundtrip(&m, frame, sizeof(frame), &o);
                const enum ds_idx_enc used = e == 4 ? best : (enum ds_idx_enc)e;
                cr_expect_eq(m.u.sparse.enc, used);
                cr_expect_eq(len, DS_WIRE_HDR_SIZE + DS_WIRE_SPARSE_PREFIX + sizes[used] +
                                      4 * (size_t)c, "exact size n=%u c=%u enc=%d", n, c, used);
                cr_expect_eq(o.u.sparse.enc, used);
                cr_expect_eq(o.u.sparse.seg_len, n);
                cr_assert_eq(memcmp(o.u.sparse.idx, ix, 4 * (size_t)c), 0,
                             "indices n=%u c=%u enc=%d seed=%llu", n, c, used,
                             (unsigned long long)seed);
                cr_assert_eq(memcmp(o.u.sparse.val, v, 4 * (size_t)c), 0);
                cases++;
            }
        }
    }
    cr_expect_gt(cases, 300);
}

Test(wire, sparse_choice_follows_density)
{
    static uint32_t ix[100000];
    size_t sizes[4];
    enum ds_idx_enc best;
    uint32_t c = make_idx(ix, 100000, 0.001, 1);
    cr_assert_eq(ds_wire_idx_sizes(100000, ix, c, sizes, &best), 0);
    cr_expect_eq(best, DS_IDX_VARINT, "0.1%%: gaps of ~1000 take 2 bytes");
    c = make_idx(ix, 100000, 0.5, 2);
    cr_assert_eq(ds_wire_idx_sizes(100000, ix, c, sizes, &best), 0);
    cr_expect_eq(best, DS_IDX_BITMAP);
    cr_assert_eq(ds_wire_idx_sizes(100000, NULL, 100000, sizes, &best), 0);
    cr_expect_eq(best, DS_IDX_DENSE);
    cr_expect_eq(sizes[DS_IDX_DENSE], 0);
    /* A cluster of neighbours at the end of a huge segment: varint wins. */
    ix[0] = 4000000000u;
    for (int i = 1; i < 100; i++)
        ix[i] = ix[0] + (uint32_t)i;
    cr_assert_eq(ds_wire_idx_sizes(4000000100u, ix, 100, sizes, &best), 0);
    cr_expect_eq(best, DS_IDX_VARINT);
    cr_expect_eq(sizes[DS_IDX_VARINT], 104); /* 5 + 99 bytes, padded */
}

/* Gaps of every varint length (1..5 bytes), in the middle of the block
 * (read a word at a time) and at its end (read byte by byte). */
Test(wire, varint_every_gap_length)
{
    static uint32_t ix[3000];
    static float v[3000];
    ds_t_fill(v, 3000, 5, -1, 1);
    uint64_t s = 99;
    for (int trial = 0; trial < 40; trial++) {
        uint32_t c = 0;
        uint64_t x = ds_t_next(&s) % 5;
        while (c < 3000) {
            ix[c++] = (uint32_t)x;
            /* a gap of 1..5 bytes, chosen at random */
            static const uint64_t span[5] = {1ull << 7, 1ull << 14, 1ull << 21, 1ull << 28,
                                             1ull << 32};
            const unsigned k = (unsigned)(ds_t_next(&s) % 5);
            const uint64_t lo = k ? span[k - 1] : 0;
            x += 1 + lo + ds_t_next(&s) % (span[k] - lo);
            if (x >= 0xfffffff0ull)
                break;
        }
        const uint32_t seg_len = ix[c - 1] + 1 + (uint32_t)(ds_t_next(&s) % 3);
        ds_wire_msg m, o;
        hdr_fill(&m, DS_MSG_GOSSIP_REQ);
        m.h.count = c;
        m.u.sparse = (ds_wire_sparse){.seg_len = seg_len, .enc = DS_IDX_VARINT, .idx = ix,
                                      .val = v};
        lim.max_segment = UINT32_MAX;
        roundtrip(&m, frame, sizeof(frame), &o);
        cr_assert_eq(memcmp(o.u.sparse.idx, ix, 4 * (size_t)c), 0, "trial %d c=%u", trial, c);
    }
}

Test(wire, varint_malformed_in_word_path)
{
    /* 3 indices in a 2^31 segment, with a 16-byte index block: the first
     * varint is always read a word at a time. */
    uint8_t f[256];
    const size_t P = DS_WIRE_HDR_SIZE, I = P + DS_WIRE_SPARSE_PREFIX;
    uint32_t ix[3] = {1u << 22, (1u << 22) + (1u << 29), (1u << 30) + 5};
    float v[3] = {1, 2, 3};
    ds_wire_msg m, o;
    hdr_fill(&m, DS_MSG_GOSSIP_REQ);
    m.h.count = 3;
    m.u.sparse = (ds_wire_sparse){.seg_len = 1u << 31, .enc = DS_IDX_VARINT, .idx = ix, .val = v};
    lim.max_segment = UINT32_MAX;
    size_t len;
    cr_assert_eq(ds_wire_encode(f, sizeof(f), &m, &len), 0);
    cr_assert_eq(ds_le32(f + P + 4), 16); /* 4 + 5 + 4 bytes, padded */
    cr_assert_eq(dec(f, len, &o), DS_DROP_NONE);
    cr_assert_eq(o.u.sparse.idx[2], ix[2]);
    uint8_t g[256];
    /* 2^22 = 80 80 80 02: make it overlong, 80 80 80 82 00 */
    memcpy(g, f, len);
    static const uint8_t overlong[5] = {0x80, 0x80, 0x80, 0x82, 0x00};
    memcpy(g + I, overlong, 5);
    /* the rest of the block is now misaligned garbage; the first varint
     * must already be refused */
    EXPECT_DROP(g, len, DS_DROP_BAD_ENCODING);
    static const uint8_t six[6] = {0x80, 0x80, 0x80, 0x80, 0x80, 0x01};
    memcpy(g + I, six, 6);
    EXPECT_DROP(g, len, DS_DROP_BAD_ENCODING);
    static const uint8_t nine[9] = {0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80};
    memcpy(g + I, nine, 9);
    EXPECT_DROP(g, len, DS_DROP_BAD_ENCODING);
    static const uint8_t over32[5] = {0x80, 0x80, 0x80, 0x80, 0x10};
    memcpy(g + I, over32, 5);
    EXPECT_DROP(g, len, DS_DROP_BAD_ENCODING);
    /* a gap that lands exactly on seg_len */
    memcpy(g, f, len);
    ds_put32(g + P, ix[2]); /* seg_len = last index */
    EXPECT_DROP(g, len, DS_DROP_INDEX_RANGE);
}

Test(wire, dense_without_index_buffer)
{
    float v[10];
    ds_t_fill(v, 10, 1, 0, 1);
    ds_wire_msg m, o;
    hdr_fill(&m, DS_MSG_GOSSIP_PUSH);
    m.h.count = 10;
    m.u.sparse = (ds_wire_sparse){.seg_len = 10, .enc = DS_IDX_AUTO, .idx = NULL, .val = v};
    size_t len;
    cr_assert_eq(ds_wire_encode(frame, sizeof(frame), &m, &len), 0);
    cr_expect_eq(m.u.sparse.enc, DS_IDX_DENSE);
    ds_wire_bufs nb = {NULL, 0, valbuf, CAP, NULL, 0};
    cr_assert_eq(ds_wire_decode(frame, len, &lim, &nb, &o, &drops), DS_DROP_NONE);
    cr_expect_null(o.u.sparse.idx);
    cr_expect_eq(memcmp(o.u.sparse.val, v, sizeof(v)), 0);
}

Test(wire, encoder_refuses_bad_input)
{
    uint32_t ix[4] = {1, 5, 5, 9};
    float v[4] = {1, 2, 3, 4};
    ds_wire_msg m;
    size_t len;
    hdr_fill(&m, DS_MSG_GOSSIP_REQ);
    m.h.count = 4;
    m.u.sparse = (ds_wire_sparse){.seg_len = 10, .enc = DS_IDX_AUTO, .idx = ix, .val = v};
    cr_expect_eq(ds_wire_encode(frame, sizeof(frame), &m, &len), -EINVAL, "duplicate index");
    ix[2] = 7;
    ix[3] = 10;
    cr_expect_eq(ds_wire_encode(frame, sizeof(frame), &m, &len), -EINVAL, "index == seg_len");
    ix[3] = 9;
    v[1] = NAN;
    cr_expect_eq(ds_wire_encode(frame, sizeof(frame), &m, &len), -EDOM);
    v[1] = INFINITY;
    cr_expect_eq(ds_wire_encode(frame, sizeof(frame), &m, &len), -EDOM);
    v[1] = 2;
    m.u.sparse.enc = DS_IDX_DENSE;
    cr_expect_eq(ds_wire_encode(frame, sizeof(frame), &m, &len), -EINVAL, "dense needs all");
    m.u.sparse.enc = DS_IDX_AUTO;
    cr_expect_eq(ds_wire_encode(frame, 70, &m, &len), -ENOSPC);
    cr_expect_eq(ds_wire_encode(frame, sizeof(frame), &m, &len), 0);

    hdr_fill(&m, DS_MSG_JOIN);
    member_fill(&m.u.join, 1);
    strcpy(m.u.join.name, "has space");
    cr_expect_eq(ds_wire_encode(frame, sizeof(frame), &m, &len), -EINVAL);
    member_fill(&m.u.join, 1);
    m.u.join.addr[0] = '\0';
    cr_expect_eq(ds_wire_encode(frame, sizeof(frame), &m, &len), -EINVAL, "empty address");

    hdr_fill(&m, DS_MSG_PING);
    m.h.flags = DS_WF_MORE;
    cr_expect_eq(ds_wire_encode(frame, sizeof(frame), &m, &len), -EINVAL, "MORE on PING");
    hdr_fill(&m, DS_MSG_NACK);
    m.u.probe.target = 0;
    cr_expect_eq(ds_wire_encode(frame, sizeof(frame), &m, &len), -EINVAL, "NACK needs target");
    hdr_fill(&m, 200);
    cr_expect_eq(ds_wire_encode(frame, sizeof(frame), &m, &len), -EINVAL);
    cr_expect_eq(ds_wire_encoded_size(&m), 0);
}

/* ---- malformed frames, by reason --------------------------------------------------------- */

/* A valid sparse REQ with raw indices, for mutation. */
static size_t make_req(uint8_t *f, uint8_t enc, uint32_t count, uint32_t seg_len)
{
    static uint32_t ix[1024];
    static float v[1024];
    for (uint32_t i = 0; i < count; i++) {
        ix[i] = i * (seg_len / (count ? count : 1));
        v[i] = (float)i * 0.5f;
    }
    ds_wire_msg m;
    hdr_fill(&m, DS_MSG_GOSSIP_REQ);
    m.h.count = count;
    m.u.sparse = (ds_wire_sparse){.seg_len = seg_len, .enc = enc, .idx = ix, .val = v};
    size_t len;
    cr_assert_eq(ds_wire_encode(f, CAP, &m, &len), 0);
    return len;
}

static void set32(uint8_t *f, size_t off, uint32_t v)
{
    ds_put32(f + off, v);
}

Test(wire, drop_header_classes)
{
    uint8_t f[4096];
    size_t len = make_req(f, DS_IDX_RAW, 8, 64);
    ds_wire_msg m;
    cr_assert_eq(dec(f, len, &m), DS_DROP_NONE);

    EXPECT_DROP(f, 0, DS_DROP_SHORT);
    EXPECT_DROP(f, 63, DS_DROP_SHORT);

    f[0] ^= 1;
    EXPECT_DROP(f, len, DS_DROP_BAD_MAGIC);
    f[0] ^= 1;
    f[DS_WH_VERSION] = 1; /* before GOSSIP_RESP carried held_us */
    EXPECT_DROP(f, len, DS_DROP_BAD_VERSION);
    f[DS_WH_VERSION] = 2; /* before value formats */
    EXPECT_DROP(f, len, DS_DROP_BAD_VERSION);
    f[DS_WH_VERSION] = 4;
    EXPECT_DROP(f, len, DS_DROP_BAD_VERSION);
    f[DS_WH_VERSION] = DS_WIRE_VERSION;
    f[DS_WH_TYPE] = 99;
    EXPECT_DROP(f, len, DS_DROP_UNKNOWN_TYPE);
    f[DS_WH_TYPE] = DS_MSG_GOSSIP_REQ;

    uint16_t fl = ds_le16(f + DS_WH_FLAGS);
    ds_put16(f + DS_WH_FLAGS, fl | 0x0100);
    EXPECT_DROP(f, len, DS_DROP_BAD_FLAGS); /* reserved bit */
    ds_put16(f + DS_WH_FLAGS, fl | DS_WF_MORE);
    EXPECT_DROP(f, len, DS_DROP_BAD_FLAGS); /* MORE on a REQ */
    ds_put16(f + DS_WH_FLAGS, fl | DS_WF_PROT_MASK);
    EXPECT_DROP(f, len, DS_DROP_BAD_FLAGS); /* protection 3 */
    ds_put16(f + DS_WH_FLAGS, fl | DS_WF_VAL_MASK);
    EXPECT_DROP(f, len, DS_DROP_BAD_FLAGS); /* value format 3 */
    ds_put16(f + DS_WH_FLAGS, fl | (DS_VF_F16 << DS_WF_VAL_SHIFT));
    EXPECT_DROP(f, len, DS_DROP_LENGTH_MISMATCH); /* f16: 2 bytes a value, not 4 */
    ds_put16(f + DS_WH_FLAGS, fl);

    EXPECT_DROP(f, len - 1, DS_DROP_LENGTH_MISMATCH);
    EXPECT_DROP(f, len + 1, DS_DROP_LENGTH_MISMATCH);
    /* Protection flagged: a tag must follow. */
    ds_put16(f + DS_WH_FLAGS, fl | (DS_PROT_AUTH << DS_WF_PROT_SHIFT));
    EXPECT_DROP(f, len, DS_DROP_LENGTH_MISMATCH);
    ds_put16(f + DS_WH_FLAGS, fl);

    set32(f, DS_WH_PAYLOAD_LEN, lim.max_payload + 1);
    EXPECT_DROP(f, len, DS_DROP_SIZE_LIMIT);
    set32(f, DS_WH_PAYLOAD_LEN, (uint32_t)(len - DS_WIRE_HDR_SIZE));

    set32(f, DS_WH_COUNT, lim.max_count + 1);
    EXPECT_DROP(f, len, DS_DROP_COUNT_LIMIT);
    set32(f, DS_WH_COUNT, 1000); /* needs at least 16 + 4000 bytes */
    EXPECT_DROP(f, len, DS_DROP_LENGTH_MISMATCH);
    set32(f, DS_WH_COUNT, 8);
    cr_assert_eq(dec(f, len, &m), DS_DROP_NONE);

    /* Fixed-size types: exact lengths, count zero. */
    ds_wire_msg s;
    hdr_fill(&s, DS_MSG_GOSSIP_STALE);
    size_t sl;
    cr_assert_eq(ds_wire_encode(f, sizeof(f), &s, &sl), 0);
    set32(f, DS_WH_COUNT, 1);
    EXPECT_DROP(f, sl, DS_DROP_BAD_FIELD);
    set32(f, DS_WH_COUNT, 0);
    set32(f, DS_WH_PAYLOAD_LEN, 9);
    EXPECT_DROP(f, sl + 1, DS_DROP_LENGTH_MISMATCH);
    /* Handshake frames are never sealed. */
    hdr_fill(&s, DS_MSG_HELLO_FIN);
    cr_assert_eq(ds_wire_encode(f, sizeof(f), &s, &sl), 0);
    ds_put16(f + DS_WH_FLAGS, DS_PROT_ENCRYPT << DS_WF_PROT_SHIFT);
    EXPECT_DROP(f, sl + DS_WIRE_TAG_SIZE, DS_DROP_BAD_FLAGS);
    /* Index-encoding bits only on sparse types. */
    hdr_fill(&s, DS_MSG_GOSSIP_STALE);
    cr_assert_eq(ds_wire_encode(f, sizeof(f), &s, &sl), 0);
    ds_put16(f + DS_WH_FLAGS, DS_IDX_RAW);
    EXPECT_DROP(f, sl, DS_DROP_BAD_FLAGS);
}

Test(wire, drop_sparse_classes)
{
    uint8_t f[8192];
    const size_t P = DS_WIRE_HDR_SIZE; /* payload offset */
    const size_t I = P + DS_WIRE_SPARSE_PREFIX;

    /* raw: order, range, reserved, seg_len limit, count > seg_len, cap. */
    size_t len = make_req(f, DS_IDX_RAW, 8, 64); /* indices 0,8,...,56 */
    set32(f, I + 4 * 3, 16);
    EXPECT_DROP(f, len, DS_DROP_INDEX_ORDER); /* 0,8,16,16 */
    set32(f, I + 4 * 3, 10);
    EXPECT_DROP(f, len, DS_DROP_INDEX_ORDER); /* decreasing */
    set32(f, I + 4 * 3, 24);
    set32(f, I + 4 * 7, 64);
    EXPECT_DROP(f, len, DS_DROP_INDEX_RANGE);
    set32(f, I + 4 * 7, 0xffffffffu);
    EXPECT_DROP(f, len, DS_DROP_INDEX_RANGE);
    set32(f, I + 4 * 7, 56);
    set32(f, P + 12, 1);
    EXPECT_DROP(f, len, DS_DROP_BAD_FIELD);
    set32(f, P + 12, 0);
    set32(f, P, lim.max_segment + 1);
    EXPECT_DROP(f, len, DS_DROP_SIZE_LIMIT);
    set32(f, P, 7);
    EXPECT_DROP(f, len, DS_DROP_COUNT_LIMIT); /* 8 indices in 7 elements */
    set32(f, P, 64);
    set32(f, P + 4, 28); /* idx_bytes disagrees with the payload length */
    EXPECT_DROP(f, len, DS_DROP_LENGTH_MISMATCH);
    set32(f, P + 4, 32);
    ds_wire_bufs small = {idxbuf, 4, valbuf, 4, NULL, 0};
    ds_wire_msg m;
    cr_expect_eq(ds_wire_decode(f, len, &lim, &small, &m, &drops), DS_DROP_COUNT_LIMIT,
                 "caller buffers bound the count");
    cr_assert_eq(dec(f, len, &m), DS_DROP_NONE);

    /* values */
    const size_t V = I + 32;
    uint32_t bits[] = {0x7fc00000u, 0x7f800000u, 0xff800000u, 0x7f800001u};
    for (int k = 0; k < 4; k++) {
        set32(f, V + 4 * 5, bits[k]);
        EXPECT_DROP(f, len, DS_DROP_NON_FINITE);
    }
    set32(f, V + 4 * 5, 0x7f7fffffu); /* FLT_MAX is fine */
    cr_assert_eq(dec(f, len, &m), DS_DROP_NONE);

    /* varint: 4 indices in a 2^20 segment */
    {
        uint32_t ix[4] = {5, 300, 301, 70000};
        float v[4] = {1, 2, 3, 4};
        ds_wire_msg q;
        hdr_fill(&q, DS_MSG_GOSSIP_REQ);
        q.h.count = 4;
        q.u.sparse = (ds_wire_sparse){.seg_len = 1u << 20, .enc = DS_IDX_VARINT, .idx = ix,
                                      .val = v};
        cr_assert_eq(ds_wire_encode(f, sizeof(f), &q, &len), 0);
        /* gaps 5, 294, 0, 69698 -> 1 + 2 + 1 + 3 = 7 bytes, padded to 8 */
        cr_assert_eq(ds_le32(f + P + 4), 8);
        static const uint8_t good[8] = {0x05, 0xa6, 0x02, 0x00, 0xc2, 0xa0, 0x04, 0x00};
        cr_assert_eq(memcmp(f + I, good, 8), 0);
        cr_assert_eq(dec(f, len, &m), DS_DROP_NONE);

        f[I + 7] = 1; /* padding not zero */
        EXPECT_DROP(f, len, DS_DROP_BAD_ENCODING);
        f[I + 7] = 0;
        f[I + 6] = 0x84; /* last varint runs off the block */
        f[I + 7] = 0x80;
        EXPECT_DROP(f, len, DS_DROP_BAD_ENCODING);
        /* overlong: 5 = 0x85 0x00 instead of 0x05 */
        static const uint8_t overlong[8] = {0x85, 0x00, 0xa6, 0x02, 0x00, 0xc2, 0xa0, 0x04};
        memcpy(f + I, overlong, 8);
        EXPECT_DROP(f, len, DS_DROP_BAD_ENCODING);
        /* over 32 bits */
        static const uint8_t big[8] = {0xff, 0xff, 0xff, 0xff, 0x1f, 0x00, 0x00, 0x00};
        memcpy(f + I, big, 8);
        EXPECT_DROP(f, len, DS_DROP_BAD_ENCODING);
        /* range: first gap 2^20 */
        static const uint8_t far[8] = {0x80, 0x80, 0x40, 0x00, 0x00, 0x00, 0x00, 0x00};
        memcpy(f + I, far, 8);
        EXPECT_DROP(f, len, DS_DROP_INDEX_RANGE);
    }

    /* varint with a whole spare padding word */
    {
        uint32_t ix[4] = {0, 1, 2, 3};
        float v[4] = {1, 2, 3, 4};
        uint8_t g[256];
        ds_wire_msg q;
        hdr_fill(&q, DS_MSG_GOSSIP_REQ);
        q.h.count = 4;
        q.u.sparse = (ds_wire_sparse){.seg_len = 100, .enc = DS_IDX_VARINT, .idx = ix, .val = v};
        size_t gl;
        cr_assert_eq(ds_wire_encode(g, sizeof(g), &q, &gl), 0);
        /* Rebuild with idx_bytes 8 (4 varints + 4 zero bytes): too much padding. */
        uint8_t h[256];
        memcpy(h, g, I + 4);
        memset(h + I + 4, 0, 4);
        memcpy(h + I + 8, g + I + 4, 16);
        set32(h, P + 4, 8);
        set32(h, DS_WH_PAYLOAD_LEN, DS_WIRE_SPARSE_PREFIX + 8 + 16);
        EXPECT_DROP(h, DS_WIRE_HDR_SIZE + DS_WIRE_SPARSE_PREFIX + 8 + 16, DS_DROP_BAD_ENCODING);
    }

    /* bitmap: popcount, tail bits */
    {
        len = make_req(f, DS_IDX_BITMAP, 8, 40); /* indices 0,5,...,35; 2 words */
        cr_assert_eq(ds_le32(f + P + 4), 8);
        cr_assert_eq(dec(f, len, &m), DS_DROP_NONE);
        cr_expect_eq(m.u.sparse.idx[7], 35);
        f[I + 0] ^= 0x02; /* one more bit */
        EXPECT_DROP(f, len, DS_DROP_BAD_ENCODING);
        f[I + 0] ^= 0x02;
        f[I + 5] |= 0x01; /* bit 40: beyond seg_len */
        EXPECT_DROP(f, len, DS_DROP_INDEX_RANGE);
        f[I + 5] &= (uint8_t)~0x01;
        set32(f, P, 70); /* bitmap size must follow seg_len */
        EXPECT_DROP(f, len, DS_DROP_LENGTH_MISMATCH);
    }

    /* dense: count must equal seg_len */
    {
        len = make_req(f, DS_IDX_DENSE, 16, 16);
        cr_assert_eq(dec(f, len, &m), DS_DROP_NONE);
        set32(f, P, 17);
        EXPECT_DROP(f, len, DS_DROP_LENGTH_MISMATCH);
    }
}

Test(wire, drop_other_payload_classes)
{
    uint8_t f[8192];
    size_t len;
    ds_wire_msg m;
    ds_wire_member mem[3];
    for (int i = 0; i < 3; i++)
        member_fill(&mem[i], i);
    const size_t P = DS_WIRE_HDR_SIZE;

    /* member strings: space, padding, empty name, bad state */
    hdr_fill(&m, DS_MSG_PING);
    m.h.count = 3;
    m.u.probe = (ds_wire_probe){.probe_seq = 1, .updates = mem};
    cr_assert_eq(ds_wire_encode(f, sizeof(f), &m, &len), 0);
    const size_t R = P + 8 + DS_WIRE_MEMBER_SIZE; /* second record */
    f[R + 48] = ' ';
    EXPECT_DROP(f, len, DS_DROP_BAD_FIELD);
    f[R + 48] = 'n';
    f[R + 48 + 63] = 'x'; /* name padding */
    EXPECT_DROP(f, len, DS_DROP_BAD_FIELD);
    f[R + 48 + 63] = 0;
    f[R + 37] = 0; /* name_len 0 */
    EXPECT_DROP(f, len, DS_DROP_BAD_FIELD);
    f[R + 37] = 64; /* no room for the NUL */
    EXPECT_DROP(f, len, DS_DROP_BAD_FIELD);
    f[R + 37] = 6;
    f[R + 36] = 4;
    EXPECT_DROP(f, len, DS_DROP_BAD_FIELD);
    f[R + 36] = 1;
    cr_assert_eq(dec(f, len, &m), DS_DROP_NONE);
    set32(f, DS_WH_COUNT, lim.max_members + 1);
    EXPECT_DROP(f, len, DS_DROP_COUNT_LIMIT);

    /* MEMBERS: slice inside the table, table within max_cluster */
    hdr_fill(&m, DS_MSG_MEMBERS);
    m.h.count = 3;
    m.u.members = (ds_wire_members){.round_now = 1, .total = 3, .first = 0, .members = mem};
    cr_assert_eq(ds_wire_encode(f, sizeof(f), &m, &len), 0);
    set32(f, P + 12, 1);
    EXPECT_DROP(f, len, DS_DROP_BAD_FIELD);
    set32(f, P + 12, 0);
    set32(f, P + 8, lim.max_cluster + 1);
    EXPECT_DROP(f, len, DS_DROP_SIZE_LIMIT);

    /* NACK target */
    hdr_fill(&m, DS_MSG_NACK);
    m.u.probe = (ds_wire_probe){.probe_seq = 1, .target = 5};
    cr_assert_eq(ds_wire_encode(f, sizeof(f), &m, &len), 0);
    ds_put64(f + P + 8, 0);
    EXPECT_DROP(f, len, DS_DROP_BAD_FIELD);

    /* LEAVE reserved */
    hdr_fill(&m, DS_MSG_LEAVE);
    cr_assert_eq(ds_wire_encode(f, sizeof(f), &m, &len), 0);
    f[P + 12] = 1;
    EXPECT_DROP(f, len, DS_DROP_BAD_FIELD);

    /* STATE_CHUNK: inside the state, state within max_state */
    uint8_t data[16] = {0};
    hdr_fill(&m, DS_MSG_STATE_CHUNK);
    m.h.count = 16;
    m.u.chunk = (ds_wire_state_chunk){.total = 100, .offset = 84, .data = data};
    cr_assert_eq(ds_wire_encode(f, sizeof(f), &m, &len), 0);
    ds_put64(f + P + 8, 85);
    EXPECT_DROP(f, len, DS_DROP_BAD_FIELD);
    ds_put64(f + P + 8, UINT64_MAX - 3); /* offset + count wraps */
    EXPECT_DROP(f, len, DS_DROP_BAD_FIELD);
    ds_put64(f + P, lim.max_state + 1);
    EXPECT_DROP(f, len, DS_DROP_SIZE_LIMIT);

    /* STATE_REQ bounds */
    hdr_fill(&m, DS_MSG_STATE_REQ);
    cr_assert_eq(ds_wire_encode(f, sizeof(f), &m, &len), 0);
    ds_put64(f + P + 8, lim.max_state + 1);
    EXPECT_DROP(f, len, DS_DROP_SIZE_LIMIT);

    /* ALLREDUCE phase, values */
    float v[5] = {1, 2, 3, 4, 5};
    hdr_fill(&m, DS_MSG_ALLREDUCE);
    m.h.count = 5;
    m.u.ar = (ds_wire_allreduce){.phase = 0, .val = v};
    cr_assert_eq(ds_wire_encode(f, sizeof(f), &m, &len), 0);
    set32(f, P, 2);
    EXPECT_DROP(f, len, DS_DROP_BAD_FIELD);
    set32(f, P, 0);
    set32(f, P + 16 + 8, 0xffc00000u);
    EXPECT_DROP(f, len, DS_DROP_NON_FINITE);

    /* RESP values and its exact length */
    hdr_fill(&m, DS_MSG_GOSSIP_RESP);
    m.h.count = 5;
    m.u.values.val = v;
    cr_assert_eq(ds_wire_encode(f, sizeof(f), &m, &len), 0);
    set32(f, P + 4, 1); /* the reserved word after held_us */
    EXPECT_DROP(f, len, DS_DROP_BAD_FIELD);
    set32(f, P + 4, 0);
    set32(f, P + 8 + 4, 0x7f800000u);
    EXPECT_DROP(f, len, DS_DROP_NON_FINITE);
    set32(f, DS_WH_COUNT, 4);
    EXPECT_DROP(f, len, DS_DROP_LENGTH_MISMATCH);

    /* HELLO body fields */
    hdr_fill(&m, DS_MSG_HELLO);
    strcpy(m.u.hello.name, "a");
    m.u.hello.mode = 2;
    m.u.hello.aeads = 3;
    m.u.hello.admission = 1;
    cr_assert_eq(ds_wire_encode(f, sizeof(f), &m, &len), 0);
    cr_assert_eq(dec(f, len, &m), DS_DROP_NONE);
    f[P + 0] = 3; /* mode */
    EXPECT_DROP(f, len, DS_DROP_BAD_FIELD);
    f[P + 0] = 2;
    f[P + 6] = 1; /* reserved */
    EXPECT_DROP(f, len, DS_DROP_BAD_FIELD);
}

/* Every proper prefix of every message type is rejected, never read past. */
Test(wire, every_truncation_rejected)
{
    ds_wire_msg m;
    float v[9] = {1, 2, 3, 4, 5, 6, 7, 8, 9};
    uint32_t ix[9] = {0, 2, 4, 6, 8, 10, 12, 14, 16};
    ds_wire_member mem[2];
    member_fill(&mem[0], 0);
    member_fill(&mem[1], 1);
    uint8_t data[9] = {0};
    static const uint8_t types[] = {
        DS_MSG_HELLO, DS_MSG_HELLO_ACK, DS_MSG_HELLO_FIN, DS_MSG_GOSSIP_REQ, DS_MSG_GOSSIP_RESP,
        DS_MSG_GOSSIP_STALE, DS_MSG_GOSSIP_PUSH, DS_MSG_PING, DS_MSG_ACK, DS_MSG_PING_REQ,
        DS_MSG_NACK, DS_MSG_JOIN, DS_MSG_MEMBERS, DS_MSG_LEAVE, DS_MSG_STATE_REQ,
        DS_MSG_STATE_CHUNK, DS_MSG_GROUP_REDUCE, DS_MSG_GROUP_BCAST, DS_MSG_ALLREDUCE};
    for (size_t t = 0; t < sizeof(types); t++) {
        hdr_fill(&m, types[t]);
        switch (types[t]) {
        case DS_MSG_HELLO:
        case DS_MSG_HELLO_ACK: strcpy(m.u.hello.name, "x"); break;
        case DS_MSG_GOSSIP_RESP: m.h.count = 9; m.u.values.val = v; break;
        case DS_MSG_GOSSIP_REQ:
        case DS_MSG_GOSSIP_PUSH:
        case DS_MSG_GROUP_REDUCE:
        case DS_MSG_GROUP_BCAST:
            m.h.count = 9;
            m.u.sparse = (ds_wire_sparse){.seg_len = 20, .enc = DS_IDX_AUTO, .idx = ix, .val = v};
            break;
        case DS_MSG_PING:
        case DS_MSG_ACK:
        case DS_MSG_PING_REQ:
            m.h.count = 2;
            m.u.probe = (ds_wire_probe){.target = 3, .updates = mem};
            break;
        case DS_MSG_NACK: m.u.probe.target = 3; break;
        case DS_MSG_JOIN: m.u.join = mem[0]; break;
        case DS_MSG_MEMBERS:
            m.h.count = 2;
            m.u.members = (ds_wire_members){.total = 2, .members = mem};
            break;
        case DS_MSG_STATE_CHUNK:
            m.h.count = 9;
            m.u.chunk = (ds_wire_state_chunk){.total = 9, .data = data};
            break;
        case DS_MSG_ALLREDUCE: m.h.count = 9; m.u.ar.val = v; break;
        default: break;
        }
        size_t len;
        cr_assert_eq(ds_wire_encode(frame, sizeof(frame), &m, &len), 0, "type %u", types[t]);
        ds_wire_msg o;
        cr_assert_eq(dec(frame, len, &o), DS_DROP_NONE, "type %u", types[t]);
        for (size_t k = 0; k < len; k++) {
            /* A heap copy of exactly k bytes, so ASan sees any overread. */
            uint8_t *c = malloc(k ? k : 1);
            memcpy(c, frame, k);
            enum ds_drop_reason r = dec(c, k, &o);
            free(c);
            cr_assert(r == (k < DS_WIRE_HDR_SIZE ? DS_DROP_SHORT : DS_DROP_LENGTH_MISMATCH),
                      "type %s cut to %zu: %s", ds_msg_type_name(types[t]), k, ds_drop_name(r));
        }
    }
}

/* Seeded garbage behind a plausible header: every answer is a reason, no
 * crash, no overread (the sanitizer build runs this too). */
Test(wire, seeded_garbage)
{
    uint64_t s = 42;
    static const uint8_t types[] = {1, 2, 3, 16, 17, 18, 19, 32, 33, 34, 35, 36, 37, 38, 48, 49,
                                    64, 65, 66};
    int accepted = 0;
    for (int it = 0; it < 20000; it++) {
        const size_t len = DS_WIRE_HDR_SIZE + ds_t_next(&s) % 600;
        uint8_t *f = malloc(len);
        for (size_t i = 0; i < len; i++)
            f[i] = (uint8_t)ds_t_next(&s);
        ds_put32(f, DS_WIRE_MAGIC);
        f[DS_WH_VERSION] = 1;
        f[DS_WH_TYPE] = types[ds_t_next(&s) % sizeof(types)];
        ds_put16(f + DS_WH_FLAGS, (uint16_t)(ds_t_next(&s) & 3));
        ds_put32(f + DS_WH_COUNT, (uint32_t)(ds_t_next(&s) % 8));
        ds_put32(f + DS_WH_PAYLOAD_LEN, (uint32_t)(len - DS_WIRE_HDR_SIZE));
        ds_wire_msg o;
        enum ds_drop_reason r = ds_wire_decode(f, len, &lim, &bufs, &o, &drops);
        cr_assert((unsigned)r < DS_DROP__COUNT);
        accepted += r == DS_DROP_NONE;
        free(f);
    }
    cr_expect_lt(accepted, 20000);
}

/* HELLO_REJECT: a fixed 40-byte payload, a handshake type (never sealed),
 * the reason byte a real drop reason and the padding zero. */
Test(wire, hello_reject_round_trip_and_malformed)
{
    ds_wire_msg m;
    hdr_fill(&m, DS_MSG_HELLO_REJECT);
    for (int i = 0; i < 32; i++)
        m.u.reject.echo[i] = (uint8_t)(i * 7 + 1);
    m.u.reject.reason = DS_DROP_NOT_ALLOWED;
    uint8_t f[DS_WIRE_HDR_SIZE + DS_WIRE_HELLO_REJECT_SIZE + DS_WIRE_TAG_SIZE];
    size_t len;
    cr_assert_eq(ds_wire_encode(f, sizeof(f), &m, &len), 0);
    cr_assert_eq(len, DS_WIRE_HDR_SIZE + DS_WIRE_HELLO_REJECT_SIZE);
    cr_expect(ds_wire_is_handshake(DS_MSG_HELLO_REJECT));
    ds_wire_msg d;
    cr_assert_eq(dec(f, len, &d), DS_DROP_NONE);
    cr_expect_eq(memcmp(d.u.reject.echo, m.u.reject.echo, 32), 0);
    cr_expect_eq(d.u.reject.reason, DS_DROP_NOT_ALLOWED);
    f[DS_WIRE_HDR_SIZE + 35] = 1; /* padding */
    EXPECT_DROP(f, len, DS_DROP_BAD_FIELD);
    f[DS_WIRE_HDR_SIZE + 35] = 0;
    f[DS_WIRE_HDR_SIZE + 32] = 0; /* "no reason" is not a refusal */
    EXPECT_DROP(f, len, DS_DROP_BAD_FIELD);
    f[DS_WIRE_HDR_SIZE + 32] = 250;
    EXPECT_DROP(f, len, DS_DROP_BAD_FIELD);
}

/* ---- value formats (node/wire/values.h) ----------------------------------------- */

#include "node/wire/values.h"

static uint32_t fbits(float x)
{
    uint32_t u;
    memcpy(&u, &x, 4);
    return u;
}

static float bitsf(uint32_t u)
{
    float x;
    memcpy(&x, &u, 4);
    return x;
}

/* bfloat16 nearest by exact comparison in double (ties to even), saturated:
 * an oracle written apart from the reference's integer trick. */
static uint16_t bf16_oracle(float x)
{
    const uint32_t t = fbits(x) & 0xffff0000u;
    const uint32_t up = t + 0x10000u; /* the next bfloat16 away from zero */
    const double d = fabs((double)x), dt = fabs((double)bitsf(t));
    uint32_t pick = t; /* t the largest finite: saturate */
    if ((up & 0x7f800000u) != 0x7f800000u) {
        const double du = fabs((double)bitsf(up));
        pick = d - dt < du - d ? t : d - dt > du - d ? up : ((t >> 16) & 1u) ? up : t;
    }
    return (uint16_t)(pick >> 16);
}

/* Edge values of each format, by their bits. */
Test(wire, values_scalar_edges)
{
    static const struct {
        float x;
        uint16_t h;
    } f16[] = {
        {0.0f, 0x0000},          {-0.0f, 0x8000},           {1.0f, 0x3c00},
        {-2.0f, 0xc000},         {65504.0f, 0x7bff},        {65519.0f, 0x7bff},
        {65520.0f, 0x7bff},      {1e9f, 0x7bff},            {-1e30f, 0xfbff},
        {0x1p-14f, 0x0400},      {0x1p-24f, 0x0001},        {0x1p-25f, 0x0000},
        {0x1.0002p-25f, 0x0001}, {0x3p-25f, 0x0002},        {0x5p-25f, 0x0002},
        {0x1.ff8p-15f, 0x03ff},  {0x1.ffcp-15f, 0x0400},    {1.0f + 0x1p-11f, 0x3c00},
        {1.0f + 0x3p-11f, 0x3c02}, {0x1p-30f, 0x0000},      {-0x1p-24f, 0x8001},
    };
    for (size_t i = 0; i < sizeof(f16) / sizeof(f16[0]); i++)
        cr_expect_eq(ds_f32_to_f16_ref(f16[i].x), f16[i].h, "f16(%a) = %04x, want %04x", f16[i].x,
                     ds_f32_to_f16_ref(f16[i].x), f16[i].h);
    static const struct {
        float x;
        uint16_t b;
    } bf[] = {
        {0.0f, 0x0000},      {-0.0f, 0x8000},           {1.0f, 0x3f80},
        {3.4028235e38f, 0x7f7f}, {-3.4028235e38f, 0xff7f}, {1.0f + 0x1p-8f, 0x3f80},
        {1.0f + 0x3p-8f, 0x3f82}, {0x1p-149f, 0x0000},    {0x1p-133f, 0x0001},
    };
    for (size_t i = 0; i < sizeof(bf) / sizeof(bf[0]); i++)
        cr_expect_eq(ds_f32_to_bf16_ref(bf[i].x), bf[i].b, "bf16(%a) = %04x, want %04x", bf[i].x,
                     ds_f32_to_bf16_ref(bf[i].x), bf[i].b);
    /* Every binary16 widens exactly and narrows back to itself. */
    for (uint32_t h = 0; h < 0x10000; h++) {
        if ((h & 0x7c00) == 0x7c00)
            continue;
        cr_assert_eq(ds_f32_to_f16_ref(ds_f16_to_f32_ref((uint16_t)h)), h, "f16 %04x", h);
        cr_assert_eq(ds_f32_to_bf16_ref(ds_bf16_to_f32_ref((uint16_t)h)), h, "bf16 %04x", h);
    }
    cr_expect_str_eq(ds_wire_vfmt_name(DS_VF_BF16), "bf16");
    cr_expect_eq(ds_wire_vfmt_width(3), 0);
}

/* Seeded finite binary32 values: a third any bits, a third model-sized,
 * a third around binary16's edges (its top, its subnormals). */
static void fill_values(float *v, size_t n, uint64_t seed)
{
    uint64_t s = seed;
    for (size_t i = 0; i < n; i++) {
        const uint64_t x = ds_t_next(&s);
        float f;
        switch (i % 3) {
        case 0: f = bitsf((uint32_t)x); break;
        case 1: f = (float)((int64_t)(x >> 11) - (1ll << 52)) * 0x1p-52f; break;
        default: f = bitsf((uint32_t)(x >> 32) % 0x00ffffffu + ((x & 1) ? 0x33000000u : 0x47700000u));
        }
        if ((fbits(f) & 0x7f800000u) == 0x7f800000u)
            f = (float)(x & 0xffff);
        v[i] = (x >> 63) ? -f : f;
    }
}

/* The references against independent oracles (the compiler's _Float16
 * where it has one; exact comparison in double for bfloat16), and the
 * kernels (F16C here when the CPU has it) against the references, bit for
 * bit, on seeded inputs of every length mod 8. */
Test(wire, values_kernels_match_reference, .timeout = 60)
{
    enum { N = 1 << 19 };
    float *v = malloc(N * sizeof(float)), *a = malloc(N * sizeof(float)),
          *b = malloc(N * sizeof(float));
    uint8_t *pa = malloc(2 * N), *pb = malloc(2 * N);
    cr_assert(v && a && b && pa && pb);
    fill_values(v, N, 0x17f16);
    for (size_t i = 0; i < N; i++) {
#ifdef __FLT16_MAX__
        if (fabsf(v[i]) < 65520.0f) {
            const _Float16 h = (_Float16)v[i];
            uint16_t hb;
            memcpy(&hb, &h, 2);
            cr_assert_eq(ds_f32_to_f16_ref(v[i]), hb, "f16(%a): %04x, _Float16 %04x", v[i],
                         ds_f32_to_f16_ref(v[i]), hb);
        }
#endif
        cr_assert_eq(ds_f32_to_bf16_ref(v[i]), bf16_oracle(v[i]), "bf16(%a): %04x, want %04x",
                     v[i], ds_f32_to_bf16_ref(v[i]), bf16_oracle(v[i]));
    }
    for (size_t n = N - 9; n <= N; n++) {
        ds_wire_f16_pack(pa, v, n);
        ds_wire_f16_pack_ref(pb, v, n);
        cr_assert_eq(memcmp(pa, pb, 2 * n), 0, "f16 pack, n=%zu (fast=%d)", n, ds_wire_f16_fast());
        ds_wire_f16_unpack(pa, n, a);
        ds_wire_f16_unpack_ref(pb, n, b);
        cr_assert_eq(memcmp(a, b, 4 * n), 0, "f16 unpack, n=%zu", n);
        ds_wire_bf16_pack(pa, v, n);
        ds_wire_bf16_pack_ref(pb, v, n);
        cr_assert_eq(memcmp(pa, pb, 2 * n), 0, "bf16 pack, n=%zu", n);
        ds_wire_bf16_unpack(pa, n, a);
        ds_wire_bf16_unpack_ref(pb, n, b);
        cr_assert_eq(memcmp(a, b, 4 * n), 0, "bf16 unpack, n=%zu", n);
    }
    /* Every binary16 bit pattern, infinities and NaNs included. */
    for (uint32_t h = 0; h < 0x10000; h++)
        ds_put16(pa + 2 * h, (uint16_t)h);
    ds_wire_f16_unpack(pa, 0x10000, a);
    ds_wire_f16_unpack_ref(pa, 0x10000, b);
    for (uint32_t h = 0; h < 0x10000; h++)
        cr_assert(fbits(a[h]) == fbits(b[h]) || (isnan(a[h]) && isnan(b[h])), "f16 %04x", h);
    free(v);
    free(a);
    free(b);
    free(pa);
    free(pb);
}

/* Error feedback's invariant: for every finite x (binary16: |x| < 65520,
 * beyond which it saturates), r = x - round(x) computed in binary32 is
 * exact, so round(x) + r == x, and round(x) is what a peer decodes (put
 * then get). */
Test(wire, values_residual_exact)
{
    enum { N = 1 << 18 };
    float *v = malloc(N * sizeof(float)), *q = malloc(N * sizeof(float)),
          *got = malloc(N * sizeof(float));
    uint8_t *p = malloc(4 * N);
    cr_assert(v && q && got && p);
    fill_values(v, N, 0xef);
    for (unsigned f = DS_VF_F32; f <= DS_VF_BF16; f++) {
        memcpy(q, v, N * sizeof(float));
        ds_wire_values_round(f, q, N);
        cr_assert_eq(ds_wire_values_put(p, f, v, N), 0);
        cr_assert_eq(ds_wire_values_get(p, f, N, got), 1);
        cr_assert_eq(memcmp(q, got, N * sizeof(float)), 0, "%s: round != decode(encode)",
                     ds_wire_vfmt_name(f));
        for (size_t i = 0; i < N; i++) {
            if (f == DS_VF_F16 && fabsf(v[i]) >= 65520.0f) {
                /* Saturated: the statement holds within the format's range only. */
                cr_assert_eq(fabsf(q[i]), 65504.0f, "f16 %a saturates", v[i]);
                continue;
            }
            const float r = v[i] - q[i];
            /* Bit for bit, but for the sign of a zero (-0 - -0 = +0). */
            cr_assert(v[i] == 0.0f ? q[i] + r == 0.0f : fbits(q[i] + r) == fbits(v[i]),
                      "%s: %a = %a + %a", ds_wire_vfmt_name(f), v[i], q[i], r);
            cr_assert_eq((double)q[i] + (double)r, (double)v[i], "%s: %a", ds_wire_vfmt_name(f),
                         v[i]);
        }
    }
    free(v);
    free(q);
    free(got);
    free(p);
}

/* GOSSIP_REQ and GOSSIP_RESP in each format: 2 bytes a value on the wire,
 * the decoded values are the sender's rounded ones; a frame whose bytes
 * disagree with its format, or with a non-finite binary16 / bfloat16, or
 * the format on a type without values, is dropped and counted. */
Test(wire, values_formats_on_the_wire)
{
    enum { N = 300 };
    float v[N], q[N];
    uint32_t ix[N];
    ds_t_fill(v, N, 42, -3.0f, 3.0f);
    for (uint32_t k = 0; k < N; k++)
        ix[k] = 7 * k + 3;
    static uint8_t f[CAP];
    for (unsigned vf = DS_VF_F32; vf <= DS_VF_BF16; vf++) {
        memcpy(q, v, sizeof(q));
        ds_wire_values_round(vf, q, N);
        for (int resp = 0; resp <= 1; resp++) {
            ds_wire_msg m;
            memset(&m, 0, sizeof(m));
            m.h.type = resp ? DS_MSG_GOSSIP_RESP : DS_MSG_GOSSIP_REQ;
            m.h.count = N;
            m.h.flags = (uint16_t)(vf << DS_WF_VAL_SHIFT);
            if (resp)
                m.u.values = (ds_wire_values){.held_us = 5, .val = v};
            else
                m.u.sparse = (ds_wire_sparse){.seg_len = 7 * N + 3, .enc = DS_IDX_RAW, .idx = ix,
                                              .val = v};
            size_t len;
            cr_assert_eq(ds_wire_encode(f, CAP, &m, &len), 0);
            const size_t want = DS_WIRE_HDR_SIZE + (resp ? 8 : 16 + 4 * N) +
                                ds_wire_vfmt_width(vf) * N;
            cr_assert_eq(len, want, "%s %s: %zu bytes, want %zu", ds_wire_vfmt_name(vf),
                         resp ? "RESP" : "REQ", len, want);
            ds_wire_msg out;
            cr_assert_eq(dec(f, len, &out), DS_DROP_NONE);
            const float *got = resp ? out.u.values.val : out.u.sparse.val;
            cr_assert_eq(memcmp(got, q, sizeof(q)), 0, "%s: decoded != rounded",
                         ds_wire_vfmt_name(vf));
            cr_assert_eq((out.h.flags & DS_WF_VAL_MASK) >> DS_WF_VAL_SHIFT, vf);
            if (vf == DS_VF_F32)
                continue;
            /* A non-finite value in the narrow format. */
            const size_t at = len - 2 * 5;
            uint8_t keep[2] = {f[at], f[at + 1]};
            ds_put16(f + at, vf == DS_VF_F16 ? 0x7c00 : 0x7f80);
            EXPECT_DROP(f, len, DS_DROP_NON_FINITE);
            ds_put16(f + at, vf == DS_VF_F16 ? 0xfe01 : 0xffc1);
            EXPECT_DROP(f, len, DS_DROP_NON_FINITE);
            f[at] = keep[0];
            f[at + 1] = keep[1];
            /* The same bytes claimed as f32: lengths disagree. */
            const uint16_t fl = ds_le16(f + DS_WH_FLAGS);
            ds_put16(f + DS_WH_FLAGS, (uint16_t)(fl & ~DS_WF_VAL_MASK));
            EXPECT_DROP(f, len, DS_DROP_LENGTH_MISMATCH);
            ds_put16(f + DS_WH_FLAGS, (uint16_t)(fl | DS_WF_VAL_MASK));
            EXPECT_DROP(f, len, DS_DROP_BAD_FLAGS);
            ds_put16(f + DS_WH_FLAGS, fl);
            cr_assert_eq(dec(f, len, &out), DS_DROP_NONE);
        }
    }
    /* Formats only where there are model values; the encoder refuses
     * what the decoder would drop. */
    ds_wire_msg s;
    memset(&s, 0, sizeof(s));
    s.h.type = DS_MSG_GOSSIP_STALE;
    s.h.flags = DS_VF_F16 << DS_WF_VAL_SHIFT;
    size_t len;
    cr_assert_eq(ds_wire_encode(f, CAP, &s, &len), -EINVAL);
    s.h.flags = 0;
    cr_assert_eq(ds_wire_encode(f, CAP, &s, &len), 0);
    ds_put16(f + DS_WH_FLAGS, DS_VF_BF16 << DS_WF_VAL_SHIFT);
    EXPECT_DROP(f, len, DS_DROP_BAD_FLAGS);
}
