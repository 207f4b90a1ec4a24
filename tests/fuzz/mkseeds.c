/*
 * tests/fuzz/mkseeds.c: writes the seed corpus (tests/fuzz/corpus/) the
 * harnesses start from: one valid frame per message type and per sparse
 * encoding (decode), the same frames sealed under the harness's fixed keys
 * for every session variant, plus unsealed ones (session), and a real
 * handshake's three frames in both admission modes (handshake).
 *
 *   build-fuzz/tests/fuzz/fuzz_mkseeds tests/fuzz/corpus
 *
 * The committed corpus was made this way; rerun it after a format change.
 */
#include "config.h"

#include <errno.h>
#include <stdio.h>
#include <sys/stat.h>

#include "fuzz_common.h"

static const char *outdir;

static void put(const char *sub, const char *name, uint8_t prefix, int use_prefix,
                const uint8_t *f, size_t len)
{
    char path[1024];
    snprintf(path, sizeof(path), "%s/%s", outdir, sub);
    if (mkdir(path, 0755) != 0 && errno != EEXIST) {
        perror(path);
        exit(1);
    }
    snprintf(path, sizeof(path), "%s/%s/%s", outdir, sub, name);
    FILE *o = fopen(path, "wb");
    if (!o) {
        perror(path);
        exit(1);
    }
    if (use_prefix)
        fputc(prefix, o);
    fwrite(f, 1, len, o);
    fclose(o);
}

static uint8_t frames[32][8192];
static size_t lens[32];
static const char *names[32];
static int nframes;

static void add(const char *name, ds_wire_msg *m)
{
    if (ds_wire_encode(frames[nframes], sizeof(frames[0]) - 64, m, &lens[nframes]) != 0) {
        fprintf(stderr, "encode %s failed\n", name);
        exit(1);
    }
    names[nframes++] = name;
}

static void hdr(ds_wire_msg *m, uint8_t type, uint32_t count)
{
    memset(m, 0, sizeof(*m));
    m->h.type = type;
    m->h.cluster = FZ_CLUSTER;
    m->h.round = 5;
    m->h.epoch = 1;
    m->h.segment = 2;
    m->h.count = count;
}

int main(int argc, char **argv)
{
    if (argc != 2) {
        fprintf(stderr, "usage: %s CORPUS_DIR\n", argv[0]);
        return 2;
    }
    outdir = argv[1];
    mkdir(outdir, 0755);
    ds_log_setup("mkseeds", DS_LOG_ERROR, NULL);
    if (ds_crypto_init() != 0)
        return 1;

    uint32_t ix[64];
    float v[64];
    for (int i = 0; i < 64; i++) {
        ix[i] = (uint32_t)(i * i + i);
        v[i] = (float)i * 0.25f - 3.0f;
    }
    ds_wire_member mem[2];
    memset(mem, 0, sizeof(mem));
    for (int i = 0; i < 2; i++) {
        memset(mem[i].pk, 0x40 + i, 32);
        mem[i].incarnation = (uint32_t)i + 1;
        mem[i].state = (uint8_t)i;
        mem[i].effective_round = 9;
        snprintf(mem[i].name, sizeof(mem[i].name), "n%d", i);
        snprintf(mem[i].addr, sizeof(mem[i].addr), "127.0.0.1:%d", 7000 + i);
        if (i)
            snprintf(mem[i].group, sizeof(mem[i].group), "g1");
    }
    uint8_t data[48];
    for (int i = 0; i < 48; i++)
        data[i] = (uint8_t)i;

    ds_wire_msg m;
    static const struct {
        const char *name;
        uint8_t enc;
        uint32_t count, seg_len;
    } sp[] = {{"req_dense", DS_IDX_DENSE, 16, 16},
              {"req_raw", DS_IDX_RAW, 12, 4000},
              {"req_varint", DS_IDX_VARINT, 20, 4000},
              {"req_bitmap", DS_IDX_BITMAP, 40, 4000}};
    for (int k = 0; k < 4; k++) {
        hdr(&m, DS_MSG_GOSSIP_REQ, sp[k].count);
        m.u.sparse = (ds_wire_sparse){.seg_len = sp[k].seg_len, .enc = sp[k].enc,
                                      .idx = sp[k].enc == DS_IDX_DENSE ? NULL : ix, .val = v};
        add(sp[k].name, &m);
    }
    /* Gaps of 1..5 varint bytes, so the word-at-a-time path is covered. */
    {
        static uint32_t wide[8];
        for (int i = 0; i < 8; i++)
            wide[i] = (uint32_t)(((uint64_t)1 << (4 * i)) + (uint64_t)i * 3);
        wide[7] = 0xf0000000u;
        hdr(&m, DS_MSG_GOSSIP_REQ, 8);
        m.u.sparse = (ds_wire_sparse){.seg_len = 0xffffffffu, .enc = DS_IDX_VARINT,
                                      .idx = wide, .val = v};
        add("req_varint_wide", &m);
    }
    hdr(&m, DS_MSG_GOSSIP_PUSH, 8);
    m.u.sparse = (ds_wire_sparse){.seg_len = 8, .enc = DS_IDX_AUTO, .val = v};
    add("push", &m);
    hdr(&m, DS_MSG_GROUP_REDUCE, 10);
    m.u.sparse = (ds_wire_sparse){.seg_len = 200, .aux = 3, .enc = DS_IDX_AUTO, .idx = ix, .val = v};
    add("group_reduce", &m);
    hdr(&m, DS_MSG_GROUP_BCAST, 10);
    m.u.sparse = (ds_wire_sparse){.seg_len = 200, .enc = DS_IDX_AUTO, .idx = ix, .val = v};
    add("group_bcast", &m);
    hdr(&m, DS_MSG_GOSSIP_RESP, 12);
    m.u.values.val = v;
    add("resp", &m);
    /* Values in binary16 and bfloat16 (flags bits 5-6). */
    hdr(&m, DS_MSG_GOSSIP_REQ, 20);
    m.h.flags = DS_VF_F16 << DS_WF_VAL_SHIFT;
    m.u.sparse = (ds_wire_sparse){.seg_len = 4000, .enc = DS_IDX_VARINT, .idx = ix, .val = v};
    add("req_f16", &m);
    hdr(&m, DS_MSG_GOSSIP_PUSH, 8);
    m.h.flags = DS_VF_BF16 << DS_WF_VAL_SHIFT;
    m.u.sparse = (ds_wire_sparse){.seg_len = 8, .enc = DS_IDX_AUTO, .val = v};
    add("push_bf16", &m);
    hdr(&m, DS_MSG_GOSSIP_RESP, 12);
    m.h.flags = DS_VF_F16 << DS_WF_VAL_SHIFT;
    m.u.values.val = v;
    add("resp_f16", &m);
    hdr(&m, DS_MSG_GOSSIP_RESP, 13);
    m.h.flags = DS_VF_BF16 << DS_WF_VAL_SHIFT;
    m.u.values.val = v;
    add("resp_bf16", &m);
    hdr(&m, DS_MSG_GOSSIP_STALE, 0);
    m.u.stale.round_now = 6;
    add("stale", &m);
    hdr(&m, DS_MSG_PING, 2);
    m.u.probe = (ds_wire_probe){.probe_seq = 1, .updates = mem};
    add("ping", &m);
    hdr(&m, DS_MSG_ACK, 1);
    m.u.probe = (ds_wire_probe){.probe_seq = 1, .updates = mem};
    add("ack", &m);
    hdr(&m, DS_MSG_PING_REQ, 1);
    m.u.probe = (ds_wire_probe){.probe_seq = 2, .target = 77, .updates = mem};
    add("ping_req", &m);
    hdr(&m, DS_MSG_NACK, 0);
    m.u.probe = (ds_wire_probe){.probe_seq = 2, .target = 77};
    add("nack", &m);
    hdr(&m, DS_MSG_JOIN, 0);
    m.u.join = mem[1];
    add("join", &m);
    hdr(&m, DS_MSG_MEMBERS, 2);
    m.h.flags = DS_WF_MORE;
    m.u.members = (ds_wire_members){.round_now = 5, .total = 3, .first = 0, .members = mem};
    add("members", &m);
    hdr(&m, DS_MSG_LEAVE, 0);
    m.u.leave = (ds_wire_leave){.effective_round = 10, .incarnation = 2};
    add("leave", &m);
    hdr(&m, DS_MSG_STATE_REQ, 0);
    m.u.state_req = (ds_wire_state_req){.offset = 0, .length = 0};
    add("state_req", &m);
    hdr(&m, DS_MSG_STATE_CHUNK, 48);
    m.h.flags = DS_WF_MORE;
    m.u.chunk = (ds_wire_state_chunk){.total = 100, .offset = 0, .data = data};
    add("state_chunk", &m);
    hdr(&m, DS_MSG_ALLREDUCE, 9);
    m.u.ar = (ds_wire_allreduce){.phase = 1, .step = 2, .elem_offset = 90, .val = v};
    add("allreduce", &m);

    /* decode: plain frames */
    for (int k = 0; k < nframes; k++)
        put("decode", names[k], 0, 0, frames[k], lens[k]);

    /* session: sealed under each variant (for open), and plain (for seal) */
    for (unsigned var = 0; var < 4; var++) {
        ds_session tx;
        memset(&tx, 0, sizeof(tx)); /* fz_session wipes what it was given */
        fz_session(&tx, var, 1);
        for (int k = 0; k < nframes; k += (var == 0 ? 1 : 5)) {
            uint8_t s[8192];
            size_t sl;
            memcpy(s, frames[k], lens[k]);
            if (ds_session_seal(&tx, s, lens[k], sizeof(s), &sl) != 0)
                return 1;
            char name[64];
            snprintf(name, sizeof(name), "sealed%u_%s", var, names[k]);
            put("session", name, (uint8_t)var, 1, s, sl);
        }
        ds_session_wipe(&tx);
    }
    for (int k = 0; k < nframes; k += 6) {
        char name[64];
        snprintf(name, sizeof(name), "plain_%s", names[k]);
        put("session", name, 1, 1, frames[k], lens[k]);
    }

    /* handshake: a real exchange per admission mode */
    ds_identity a, b;
    fz_identity(&a, 0xa1);
    fz_identity(&b, 0xb2);
    ds_cluster_key ck;
    memset(ck.k, 0x33, sizeof(ck.k));
    char text[200], ha[65], hb[65];
    ds_pk_to_hex(a.pk, ha);
    ds_pk_to_hex(b.pk, hb);
    snprintf(text, sizeof(text), "%s alpha\n%s beta\n", ha, hb);
    ds_allowlist *al = NULL;
    if (ds_allowlist_parse(&al, text, strlen(text), "seeds", NULL, 0) != 0)
        return 1;
    for (int key = 0; key < 2; key++) {
        ds_hs_config ca = {.identity = &a, .name = "alpha", .address = "127.0.0.1:7000",
                           .cluster_id = FZ_CLUSTER, .cluster_key = key ? &ck : NULL,
                           .allow = key ? NULL : al, .mode = DS_SEC_ENCRYPT};
        ds_hs_config cb = ca;
        cb.identity = &b;
        cb.name = "beta";
        ds_hs i, r;
        uint8_t f[DS_WIRE_MAX_HS_FRAME];
        size_t len;
        if (ds_hs_init_initiator(&i, &ca, 0) || ds_hs_init_responder(&r, &cb))
            return 1;
        static const char *const hsn[3] = {"hello", "hello_ack", "hello_fin"};
        ds_hs *w[3] = {&i, &r, &i}, *rd[3] = {&r, &i, &r};
        for (int k = 0; k < 3; k++) {
            if (ds_hs_write(w[k], f, sizeof(f), &len) || ds_hs_read(rd[k], f, len))
                return 1;
            char name[64];
            snprintf(name, sizeof(name), "%s_%s", hsn[k], key ? "key" : "allow");
            put("handshake", name, (uint8_t)(key << 2 | k), 1, f, len);
            if (!key)
                put("decode", hsn[k], 0, 0, f, len);
        }
    }
    ds_allowlist_free(&al);
    return 0;
}
