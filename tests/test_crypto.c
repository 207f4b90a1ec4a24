/*
 * tests/test_crypto.c: identities, key files, admission, the handshake and
 * sealed sessions (design §7).
 *
 * The attacks of issue 4 each get a test asserting the drop reason and its
 * counter, followed by a genuine frame that still goes through: a flipped
 * byte at every position of every handshake frame (both admission modes)
 * and of sealed frames (every mode and cipher), replayed and too-old
 * frames, a wrong cluster key, a key not on the allow-list, a forged sender
 * field, a replayed handshake. Key files: good, wrong mode, truncated,
 * garbage, missing; keygen end to end.
 * Run: meson test -C build crypto --verbose
 */
#include <criterion/criterion.h>
#include <dirent.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "node/sec/crypto.h"
#include "node/sec/keygen.h"
#include "testutil.h"

#define HSCAP DS_WIRE_MAX_HS_FRAME

static ds_identity id_a, id_b, id_c;
static ds_cluster_key ck, ck_other;
static ds_drop_counters drops_a, drops_b;
static const uint64_t CLUSTER = 0x1234abcd5678ef00ull;

static void mkid(ds_identity *id, uint8_t seedbyte)
{
    uint8_t seed[32];
    memset(seed, seedbyte, sizeof(seed));
    cr_assert_eq(crypto_sign_seed_keypair(id->pk, id->sk, seed), 0);
    id->id = ds_wire_node_id(id->pk);
}

static void setup(void)
{
    ds_log_setup("test", DS_LOG_ERROR, NULL);
    cr_assert_eq(ds_crypto_init(), 0);
    mkid(&id_a, 1);
    mkid(&id_b, 2);
    mkid(&id_c, 3);
    memset(ck.k, 0x5a, sizeof(ck.k));
    memset(ck_other.k, 0x5b, sizeof(ck_other.k));
    memset(&drops_a, 0, sizeof(drops_a));
    memset(&drops_b, 0, sizeof(drops_b));
}

TestSuite(crypto, .init = setup);

/* An allow-list of the given identities; names[i] may be NULL. */
static ds_allowlist *mkallow(int n, const ds_identity *const *ids, const char *const *names)
{
    char text[4096] = "# test allow-list\n\n";
    for (int i = 0; i < n; i++) {
        char hex[65];
        ds_pk_to_hex(ids[i]->pk, hex);
        strcat(text, hex);
        if (names && names[i]) {
            strcat(text, "   ");
            strcat(text, names[i]);
        }
        strcat(text, "  # comment\n");
    }
    ds_allowlist *al = NULL;
    char err[256];
    int rc = ds_allowlist_parse(&al, text, strlen(text), "test", err, sizeof(err));
    cr_assert_eq(rc, 0, "%s", err);
    return al;
}

static ds_hs_config cfgof(const ds_identity *id, const char *name, const ds_cluster_key *k,
                          const ds_allowlist *al, enum ds_sec_mode mode, unsigned aeads,
                          ds_drop_counters *d)
{
    return (ds_hs_config){.identity = id, .name = name, .address = "127.0.0.1:4000",
                          .cluster_id = CLUSTER, .cluster_key = k, .allow = al, .mode = mode,
                          .aeads = aeads, .drops = d};
}

typedef struct hs_run {
    uint8_t f[3][HSCAP];
    size_t len[3];
    int step; /* frame index that was rejected, or 3 */
} hs_run;

/* Drive initiator i and responder r to the end; returns the first drop. */
static enum ds_drop_reason run_hs(ds_hs *i, ds_hs *r, hs_run *out)
{
    ds_hs *writer[3] = {i, r, i}, *reader[3] = {r, i, r};
    for (int k = 0; k < 3; k++) {
        cr_assert_eq(ds_hs_want_write(writer[k]), 1);
        cr_assert_eq(ds_hs_write(writer[k], out->f[k], HSCAP, &out->len[k]), 0);
        enum ds_drop_reason d = ds_hs_read(reader[k], out->f[k], out->len[k]);
        if (d != DS_DROP_NONE) {
            out->step = k;
            return d;
        }
    }
    out->step = 3;
    cr_assert(ds_hs_done(i) && ds_hs_done(r));
    return DS_DROP_NONE;
}

/* A sealed GOSSIP_REQ of `count` values; returns the frame length. */
static size_t seal_req(ds_session *tx, uint8_t *f, size_t cap, uint32_t count, uint64_t seed,
                       float *vals_out)
{
    static uint32_t ix[4096];
    static float v[4096];
    cr_assert(count <= 4096);
    for (uint32_t k = 0; k < count; k++)
        ix[k] = 3 * k + 1;
    ds_t_fill(v, count, seed, -1.0f, 1.0f);
    if (vals_out)
        memcpy(vals_out, v, 4 * (size_t)count);
    ds_wire_msg m;
    memset(&m, 0, sizeof(m));
    m.h.type = DS_MSG_GOSSIP_REQ;
    m.h.round = 7;
    m.h.epoch = 2;
    m.h.segment = 3;
    m.h.count = count;
    m.u.sparse = (ds_wire_sparse){.seg_len = 3 * count + 2, .enc = DS_IDX_AUTO, .idx = ix,
                                  .val = v};
    size_t len, sealed;
    cr_assert_eq(ds_wire_encode(f, cap, &m, &len), 0);
    cr_assert_eq(ds_session_seal(tx, f, len, cap, &sealed), 0);
    cr_assert_eq(sealed, len + ds_session_overhead(tx));
    return sealed;
}

/* Open and decode; on success compare the values with want. */
static enum ds_drop_reason open_req(ds_session *rx, uint8_t *f, size_t len, const float *want,
                                    uint32_t count)
{
    enum ds_drop_reason r = ds_session_open(rx, f, len);
    if (r != DS_DROP_NONE)
        return r;
    static uint32_t ix[4096];
    static float v[4096];
    ds_wire_bufs b = {ix, 4096, v, 4096, NULL, 0};
    ds_wire_limits lim;
    ds_wire_limits_default(&lim);
    ds_wire_msg m;
    r = ds_wire_decode(f, len, &lim, &b, &m, rx->drops);
    cr_assert_eq(r, DS_DROP_NONE, "opened frame decodes: %s", ds_drop_name(r));
    cr_assert_eq(m.h.count, count);
    if (want)
        cr_assert_eq(memcmp(m.u.sparse.val, want, 4 * (size_t)count), 0);
    cr_assert_eq(m.h.round, 7);
    return r;
}

/* Handshake a <-> b and set up both sessions. */
static void pair(ds_session *sa, ds_session *sb, enum ds_sec_mode mode, unsigned aeads_a,
                 unsigned aeads_b)
{
    ds_hs ha, hb;
    cr_assert_eq(ds_hs_init_initiator(&ha, &(ds_hs_config){.identity = &id_a, .name = "alpha",
                                                          .cluster_id = CLUSTER,
                                                          .cluster_key = &ck, .mode = mode,
                                                          .aeads = aeads_a, .drops = &drops_a},
                                      id_b.id),
                 0);
    cr_assert_eq(ds_hs_init_responder(&hb, &(ds_hs_config){.identity = &id_b, .name = "beta",
                                                          .cluster_id = CLUSTER,
                                                          .cluster_key = &ck, .mode = mode,
                                                          .aeads = aeads_b, .drops = &drops_b}),
                 0);
    hs_run run;
    cr_assert_eq(run_hs(&ha, &hb, &run), DS_DROP_NONE);
    cr_assert_eq(ds_hs_session(&ha, sa, NULL), 0);
    cr_assert_eq(ds_hs_session(&hb, sb, NULL), 0);
    ds_hs_wipe(&ha);
    ds_hs_wipe(&hb);
}

/* ---- handshake: success --------------------------------------------------------------- */

Test(crypto, handshake_every_admission_and_mode)
{
    const ds_identity *both[2] = {&id_a, &id_b};
    const char *names[2] = {"alpha", NULL};
    ds_allowlist *al = mkallow(2, both, names);
    const unsigned have = ds_aead_available();
    for (int adm = 1; adm <= 3; adm++) {
        for (int mode = 0; mode <= 2; mode++) {
            for (int xonly = 0; xonly <= 1; xonly++) {
                const ds_cluster_key *k = adm & 1 ? &ck : NULL;
                const ds_allowlist *a = adm & 2 ? al : NULL;
                ds_hs_config ca = cfgof(&id_a, "alpha", k, a, (enum ds_sec_mode)mode,
                                        xonly ? DS_AEAD_XCHACHA20 : 0, &drops_a);
                ds_hs_config cb = cfgof(&id_b, "beta", k, a, (enum ds_sec_mode)mode, 0, &drops_b);
                cb.address = "[::1]:5001";
                ds_hs hi, hr;
                cr_assert_eq(ds_hs_init_initiator(&hi, &ca, 0), 0);
                cr_assert_eq(ds_hs_init_responder(&hr, &cb), 0);
                hs_run run;
                enum ds_drop_reason d = run_hs(&hi, &hr, &run);
                cr_assert_eq(d, DS_DROP_NONE, "adm=%d mode=%d: %s at frame %d", adm, mode,
                             ds_drop_name(d), run.step);
                cr_assert_eq(run.len[0], DS_WIRE_HDR_SIZE + DS_WIRE_HELLO_SIZE);
                cr_assert_eq(run.len[1], DS_WIRE_HDR_SIZE + DS_WIRE_HELLO_ACK_SIZE);
                cr_assert_eq(run.len[2], DS_WIRE_HDR_SIZE + DS_WIRE_HELLO_FIN_SIZE);

                /* What each side learnt about the other. */
                const ds_peer_info *pi = ds_hs_peer(&hi), *pr = ds_hs_peer(&hr);
                cr_assert_not_null(pi);
                cr_assert_not_null(pr);
                cr_expect_str_eq(pi->name, "beta");
                cr_expect_str_eq(pi->address, "[::1]:5001");
                cr_expect_eq(pi->id, id_b.id);
                cr_expect_eq(memcmp(pi->pk, id_b.pk, 32), 0);
                cr_expect_str_eq(pr->name, "alpha");
                cr_expect_str_eq(pr->address, "127.0.0.1:4000");
                cr_expect_eq(pr->id, id_a.id);
                unsigned want = mode == 0 ? 0
                                : (!xonly && (have & DS_AEAD_AES256GCM)) ? DS_AEAD_AES256GCM
                                                                         : DS_AEAD_XCHACHA20;
                cr_expect_eq(pi->aead, want, "aead %s", ds_aead_name(pi->aead));
                cr_expect_eq(pr->aead, want);

                /* The keys agree both ways. */
                ds_session si, sr;
                cr_assert_eq(ds_hs_session(&hi, &si, NULL), 0);
                cr_assert_eq(ds_hs_session(&hr, &sr, NULL), 0);
                cr_expect_eq(ds_hs_session(&hi, &si, NULL), -EALREADY);
                uint8_t f[4096];
                float v[100];
                size_t len = seal_req(&si, f, sizeof(f), 100, 5, v);
                cr_assert_eq(open_req(&sr, f, len, v, 100), DS_DROP_NONE);
                len = seal_req(&sr, f, sizeof(f), 50, 6, v);
                cr_assert_eq(open_req(&si, f, len, v, 50), DS_DROP_NONE);
                ds_session_wipe(&si);
                ds_session_wipe(&sr);
                ds_hs_wipe(&hi);
                ds_hs_wipe(&hr);
            }
        }
    }
    cr_expect_eq(ds_drop_total(&drops_a) + ds_drop_total(&drops_b), 0);
    ds_allowlist_free(&al);
    cr_expect_null(al);
}

Test(crypto, handshake_api_misuse)
{
    ds_hs h;
    ds_hs_config c = cfgof(&id_a, "alpha", NULL, NULL, DS_SEC_ENCRYPT, 0, NULL);
    cr_expect_eq(ds_hs_init_initiator(&h, &c, 0), -EINVAL, "no admission policy");
    c = cfgof(&id_a, "al pha", &ck, NULL, DS_SEC_ENCRYPT, 0, NULL);
    cr_expect_eq(ds_hs_init_initiator(&h, &c, 0), -EINVAL, "name with a space");
    c = cfgof(&id_a, "", &ck, NULL, DS_SEC_ENCRYPT, 0, NULL);
    cr_expect_eq(ds_hs_init_responder(&h, &c), -EINVAL, "empty name");
    c = cfgof(&id_a, "alpha", &ck, NULL, DS_SEC_ENCRYPT, 0x80, NULL);
    cr_expect_eq(ds_hs_init_responder(&h, &c), -EINVAL, "no runnable AEAD");

    c = cfgof(&id_b, "beta", &ck, NULL, DS_SEC_ENCRYPT, 0, NULL);
    cr_assert_eq(ds_hs_init_responder(&h, &c), 0);
    uint8_t f[HSCAP];
    size_t len;
    ds_session s;
    cr_expect_eq(ds_hs_write(&h, f, sizeof(f), &len), -EAGAIN, "responder waits first");
    cr_expect_eq(ds_hs_session(&h, &s, NULL), -EAGAIN);
    cr_expect_null(ds_hs_peer(&h));
    c = cfgof(&id_a, "alpha", &ck, NULL, DS_SEC_ENCRYPT, 0, NULL);
    cr_assert_eq(ds_hs_init_initiator(&h, &c, 0), 0);
    cr_expect_eq(ds_hs_write(&h, f, 100, &len), -ENOSPC);
    cr_expect_eq(ds_hs_write(&h, f, sizeof(f), &len), 0);
    cr_expect_eq(ds_hs_write(&h, f, sizeof(f), &len), -EAGAIN);
    ds_hs_wipe(&h);
}

/* ---- handshake: attacks ----------------------------------------------------------------- */

Test(crypto, handshake_policy_and_admission_rejections)
{
    const ds_identity *only_b[1] = {&id_b};
    ds_allowlist *al_b = mkallow(1, only_b, NULL);
    const ds_identity *ab[2] = {&id_a, &id_b};
    const char *alice[2] = {"alice", NULL};
    ds_allowlist *al_named = mkallow(2, ab, alice);
    ds_allowlist *al_ab = mkallow(2, ab, NULL);
    struct {
        const char *what;
        ds_hs_config ci, cr;
        uint64_t expect;
        enum ds_drop_reason want;
        int step;
    } cases[] = {
        {"wrong cluster key", cfgof(&id_a, "alpha", &ck, NULL, DS_SEC_ENCRYPT, 0, &drops_a),
         cfgof(&id_b, "beta", &ck_other, NULL, DS_SEC_ENCRYPT, 0, &drops_b), 0, DS_DROP_BAD_MAC,
         0},
        {"initiator not on the allow-list",
         cfgof(&id_a, "alpha", NULL, al_ab, DS_SEC_ENCRYPT, 0, &drops_a),
         cfgof(&id_b, "beta", NULL, al_b, DS_SEC_ENCRYPT, 0, &drops_b), 0, DS_DROP_NOT_ALLOWED,
         0},
        {"responder not on the allow-list",
         cfgof(&id_a, "alpha", NULL, al_ab, DS_SEC_ENCRYPT, 0, &drops_a),
         cfgof(&id_c, "gamma", NULL, al_ab, DS_SEC_ENCRYPT, 0, &drops_b), 0,
         DS_DROP_NOT_ALLOWED, 1},
        {"listed key, other name", cfgof(&id_a, "mallory", NULL, al_named, DS_SEC_ENCRYPT, 0,
                                         &drops_a),
         cfgof(&id_b, "beta", NULL, al_named, DS_SEC_ENCRYPT, 0, &drops_b), 0,
         DS_DROP_NOT_ALLOWED, 0},
        {"mode differs", cfgof(&id_a, "alpha", &ck, NULL, DS_SEC_ENCRYPT, 0, &drops_a),
         cfgof(&id_b, "beta", &ck, NULL, DS_SEC_AUTH, 0, &drops_b), 0,
         DS_DROP_POLICY_MISMATCH, 0},
        {"admission differs", cfgof(&id_a, "alpha", &ck, NULL, DS_SEC_ENCRYPT, 0, &drops_a),
         cfgof(&id_b, "beta", &ck, al_ab, DS_SEC_ENCRYPT, 0, &drops_b), 0,
         DS_DROP_POLICY_MISMATCH, 0},
        {"no common cipher",
         cfgof(&id_a, "alpha", &ck, NULL, DS_SEC_ENCRYPT, DS_AEAD_XCHACHA20, &drops_a),
         cfgof(&id_b, "beta", &ck, NULL, DS_SEC_ENCRYPT, DS_AEAD_AES256GCM, &drops_b), 0,
         DS_DROP_POLICY_MISMATCH, 0},
        {"dialled someone else", cfgof(&id_a, "alpha", &ck, NULL, DS_SEC_ENCRYPT, 0, &drops_a),
         cfgof(&id_b, "beta", &ck, NULL, DS_SEC_ENCRYPT, 0, &drops_b), 0xdead, DS_DROP_WRONG_RECEIVER,
         0},
    };
    /* "dialled someone else": the HELLO names receiver 0xdead, which B is not. */
    for (size_t k = 0; k < sizeof(cases) / sizeof(cases[0]); k++) {
        if (cases[k].ci.aeads == DS_AEAD_XCHACHA20 && !(ds_aead_available() & DS_AEAD_AES256GCM))
            continue; /* responder cannot be made AES-only here */
        memset(&drops_a, 0, sizeof(drops_a));
        memset(&drops_b, 0, sizeof(drops_b));
        ds_hs hi, hr;
        cr_assert_eq(ds_hs_init_initiator(&hi, &cases[k].ci, cases[k].expect), 0, "%s",
                     cases[k].what);
        cr_assert_eq(ds_hs_init_responder(&hr, &cases[k].cr), 0, "%s", cases[k].what);
        hs_run run;
        enum ds_drop_reason d = run_hs(&hi, &hr, &run);
        cr_expect_eq(d, cases[k].want, "%s: got %s want %s", cases[k].what, ds_drop_name(d),
                     ds_drop_name(cases[k].want));
        cr_expect_eq(run.step, cases[k].step, "%s: rejected at frame %d", cases[k].what,
                     run.step);
        ds_drop_counters *c = run.step == 1 ? &drops_a : &drops_b;
        cr_expect_eq(ds_drop_get(c, cases[k].want), 1, "%s counted", cases[k].what);
        cr_expect(!ds_hs_done(&hi) && !ds_hs_done(&hr), "%s: no session", cases[k].what);
        ds_hs_wipe(&hi);
        ds_hs_wipe(&hr);
    }

    /* The initiator rejects a responder missing from its list (frame 1). */
    {
        memset(&drops_a, 0, sizeof(drops_a));
        const ds_identity *only_a[1] = {&id_a};
        ds_allowlist *al_a = mkallow(1, only_a, NULL);
        ds_hs_config ci = cfgof(&id_a, "alpha", NULL, al_a, DS_SEC_ENCRYPT, 0, &drops_a);
        ds_hs_config cr = cfgof(&id_b, "beta", NULL, al_ab, DS_SEC_ENCRYPT, 0, &drops_b);
        ds_hs hi, hr;
        cr_assert_eq(ds_hs_init_initiator(&hi, &ci, 0), 0);
        cr_assert_eq(ds_hs_init_responder(&hr, &cr), 0);
        hs_run run;
        cr_expect_eq(run_hs(&hi, &hr, &run), DS_DROP_NOT_ALLOWED);
        cr_expect_eq(run.step, 1);
        cr_expect_eq(ds_drop_get(&drops_a, DS_DROP_NOT_ALLOWED), 1);
        ds_allowlist_free(&al_a);
    }
    /* The initiator dialled C's id but B answered. */
    {
        memset(&drops_a, 0, sizeof(drops_a));
        ds_hs_config ci = cfgof(&id_a, "alpha", &ck, NULL, DS_SEC_ENCRYPT, 0, &drops_a);
        ds_hs_config cr = cfgof(&id_b, "beta", &ck, NULL, DS_SEC_ENCRYPT, 0, &drops_b);
        ds_hs hi, hr;
        cr_assert_eq(ds_hs_init_initiator(&hi, &ci, id_c.id), 0);
        cr_assert_eq(ds_hs_init_responder(&hr, &cr), 0);
        uint8_t f[HSCAP];
        size_t len;
        cr_assert_eq(ds_hs_write(&hi, f, sizeof(f), &len), 0);
        /* B is not C: B drops the HELLO addressed to C. */
        cr_expect_eq(ds_hs_read(&hr, f, len), DS_DROP_WRONG_RECEIVER);
        ds_put64(f + DS_WH_RECEIVER, 0);
        /* Patched to "anyone", the HELLO's signature no longer verifies. */
        cr_expect_eq(ds_hs_read(&hr, f, len), DS_DROP_BAD_SIGNATURE);
    }
    /* Another cluster. */
    {
        memset(&drops_b, 0, sizeof(drops_b));
        ds_hs_config ci = cfgof(&id_a, "alpha", &ck, NULL, DS_SEC_ENCRYPT, 0, &drops_a);
        ds_hs_config cr = cfgof(&id_b, "beta", &ck, NULL, DS_SEC_ENCRYPT, 0, &drops_b);
        ci.cluster_id = CLUSTER + 1;
        ds_hs hi, hr;
        cr_assert_eq(ds_hs_init_initiator(&hi, &ci, 0), 0);
        cr_assert_eq(ds_hs_init_responder(&hr, &cr), 0);
        hs_run run;
        cr_expect_eq(run_hs(&hi, &hr, &run), DS_DROP_WRONG_CLUSTER);
        cr_expect_eq(ds_drop_get(&drops_b, DS_DROP_WRONG_CLUSTER), 1);
    }
    /* A node's own HELLO reflected back at it. */
    {
        ds_hs_config ca = cfgof(&id_a, "alpha", &ck, NULL, DS_SEC_ENCRYPT, 0, &drops_a);
        ds_hs hi, hr;
        cr_assert_eq(ds_hs_init_initiator(&hi, &ca, 0), 0);
        cr_assert_eq(ds_hs_init_responder(&hr, &ca), 0);
        uint8_t f[HSCAP];
        size_t len;
        cr_assert_eq(ds_hs_write(&hi, f, sizeof(f), &len), 0);
        cr_expect_eq(ds_hs_read(&hr, f, len), DS_DROP_NOT_ALLOWED);
    }
    ds_allowlist_free(&al_b);
    ds_allowlist_free(&al_named);
    ds_allowlist_free(&al_ab);
}

/* Reasons a one-bit flip at byte `off` of a handshake frame may give. */
static uint32_t hs_flip_expect(unsigned type, size_t off, int cluster_key)
{
#define B(r) (1u << DS_DROP_##r)
    if (off < 4)
        return B(BAD_MAGIC);
    if (off == 4)
        return B(BAD_VERSION);
    if (off == 5)
        return B(UNKNOWN_TYPE) | B(LENGTH_MISMATCH) | B(UNEXPECTED) | B(STALE_HANDSHAKE);
    if (off < 8)
        return B(BAD_FLAGS);
    if (off < 16)
        return B(WRONG_CLUSTER);
    if (off < 24)
        return B(WRONG_SENDER);
    if (off < 32)
        return B(WRONG_RECEIVER);
    if (off < 52)
        return B(BAD_FIELD); /* round, epoch, segment must be 0; count too */
    if (off < 56)
        return B(LENGTH_MISMATCH) | B(SIZE_LIMIT);
    if (off < 64)
        return B(BAD_FIELD); /* seq must be 0 */
    const size_t o = off - 64;
    const uint32_t mac = cluster_key ? B(BAD_MAC) : B(BAD_FIELD);
    if (type == DS_MSG_HELLO_FIN)
        return o < 32 ? B(STALE_HANDSHAKE) : o < 96 ? B(BAD_SIGNATURE) : mac;
    if (o == 0 || o == 2)
        return B(BAD_FIELD) | B(POLICY_MISMATCH); /* mode, admission */
    if (o == 1)
        return B(BAD_FIELD) | B(POLICY_MISMATCH) | B(BAD_SIGNATURE); /* AEADs */
    if (o < 8)
        return B(BAD_FIELD); /* string lengths, reserved */
    if (o < 40)
        return B(WRONG_SENDER); /* identity key: the id no longer matches */
    if (o < 72)
        return B(BAD_SIGNATURE); /* ephemeral key */
    if (o < 136)
        return B(BAD_FIELD) | B(NOT_ALLOWED) | B(BAD_SIGNATURE); /* name */
    if (o < 264)
        return B(BAD_FIELD) | B(BAD_SIGNATURE); /* address */
    size_t t = o - 264;
    if (type == DS_MSG_HELLO_ACK) {
        if (t < 32)
            return B(STALE_HANDSHAKE); /* echo */
        t -= 32;
    }
    return t < 64 ? B(BAD_SIGNATURE) : mac;
#undef B
}

/* Flip every bit 0 and bit 7 of every byte of f: each must be dropped by
 * `reader` with an expected reason, counted once, leaving it unchanged. */
static void flip_all(ds_hs *reader, ds_drop_counters *d, const uint8_t *f, size_t len,
                     int cluster_key)
{
    static const uint8_t masks[2] = {0x01, 0x80};
    uint8_t c[HSCAP];
    for (size_t off = 0; off < len; off++) {
        for (int mi = 0; mi < 2; mi++) {
            memcpy(c, f, len);
            c[off] ^= masks[mi];
            const uint64_t before = ds_drop_total(d);
            enum ds_drop_reason r = ds_hs_read(reader, c, len);
            const uint32_t ok = hs_flip_expect(f[DS_WH_TYPE], off, cluster_key);
            cr_assert(r != DS_DROP_NONE && ((ok >> r) & 1),
                      "%s byte %zu ^%02x: got %s", ds_msg_type_name(f[DS_WH_TYPE]), off,
                      masks[mi], ds_drop_name(r));
            cr_assert_eq(ds_drop_total(d), before + 1, "counted once");
        }
    }
}

/* Run one HELLO from `ini` (named `name`) into a responder with allow-list
 * `al`, with the log captured; returns the log's text (caller frees). */
static char *refused_hello_log(const ds_identity *ini, const char *name, const ds_allowlist *al)
{
    FILE *log = tmpfile();
    cr_assert(log);
    ds_log_setup("test", DS_LOG_WARN, log);
    ds_hs_config ci = cfgof(ini, name, NULL, al, DS_SEC_ENCRYPT, 0, &drops_a);
    ds_hs_config cr = cfgof(&id_b, "beta", NULL, al, DS_SEC_ENCRYPT, 0, &drops_b);
    ds_hs hi, hr;
    cr_assert_eq(ds_hs_init_initiator(&hi, &ci, 0), 0);
    cr_assert_eq(ds_hs_init_responder(&hr, &cr), 0);
    hs_run run;
    cr_expect_eq(run_hs(&hi, &hr, &run), DS_DROP_NOT_ALLOWED);
    cr_expect_eq(run.step, 0, "refused at the HELLO");
    cr_expect_eq(ds_drop_get(&drops_b, DS_DROP_NOT_ALLOWED), 1, "counted as not_allowed");
    ds_hs_wipe(&hi);
    ds_hs_wipe(&hr);
    ds_log_setup("test", DS_LOG_ERROR, NULL);
    long n = ftell(log);
    cr_assert(n > 0, "a log line was written");
    char *text = calloc(1, (size_t)n + 1);
    cr_assert(text);
    rewind(log);
    cr_assert_eq(fread(text, 1, (size_t)n, log), (size_t)n);
    fclose(log);
    return text;
}

/* The key a responder refuses is logged as an allow-list line: what
 * follows "add this line: " parses as an allow-list that admits exactly
 * the refused node under its name. */
Test(crypto, refused_key_logged_as_allowlist_line)
{
    const ds_identity *only_c[1] = {&id_c};
    ds_allowlist *al = mkallow(1, only_c, NULL);
    char *log = refused_hello_log(&id_a, "alpha", al);
    const char *mark = "to admit it, add this line: ";
    const char *at = strstr(log, mark);
    cr_assert(at, "log names the key as an allow-list line: %s", log);
    cr_expect(strstr(log, "not_allowed"), "log names the reason: %s", log);
    at += strlen(mark);
    const size_t len = strcspn(at, "\n");
    char hex[65], want[128];
    ds_pk_to_hex(id_a.pk, hex);
    snprintf(want, sizeof(want), "%s alpha", hex);
    cr_expect_eq(len, strlen(want));
    cr_expect(strncmp(at, want, len) == 0, "line '%.*s', want '%s'", (int)len, at, want);
    ds_allowlist *copied = NULL;
    char err[256];
    cr_assert_eq(ds_allowlist_parse(&copied, at, len, "log", err, sizeof(err)), 0, "%s", err);
    cr_expect_eq(ds_allowlist_count(copied), 1);
    cr_expect_eq(ds_allowlist_check(copied, id_a.pk, "alpha"), 0, "the line admits the node");
    ds_allowlist_free(&copied);
    free(log);
    ds_allowlist_free(&al);

    /* Listed under another name: said so, and nothing to add. */
    memset(&drops_b, 0, sizeof(drops_b));
    const ds_identity *a_c[2] = {&id_a, &id_c};
    const char *names[2] = {"other", NULL};
    al = mkallow(2, a_c, names);
    log = refused_hello_log(&id_a, "alpha", al);
    cr_expect(strstr(log, "listed under another name"), "%s", log);
    cr_expect(!strstr(log, "add this line"), "%s", log);
    free(log);
    ds_allowlist_free(&al);
}

Test(crypto, handshake_flip_every_byte_of_every_frame, .timeout = 120)
{
    const ds_identity *ab[2] = {&id_a, &id_b};
    const char *names[2] = {"alpha", "beta"};
    ds_allowlist *al = mkallow(2, ab, names);
    for (int use_key = 0; use_key <= 1; use_key++) {
        memset(&drops_a, 0, sizeof(drops_a));
        memset(&drops_b, 0, sizeof(drops_b));
        ds_hs_config ci = cfgof(&id_a, "alpha", use_key ? &ck : NULL, use_key ? NULL : al,
                                DS_SEC_ENCRYPT, 0, &drops_a);
        ds_hs_config cr = cfgof(&id_b, "beta", use_key ? &ck : NULL, use_key ? NULL : al,
                                DS_SEC_ENCRYPT, 0, &drops_b);
        ds_hs hi, hr;
        cr_assert_eq(ds_hs_init_initiator(&hi, &ci, 0), 0);
        cr_assert_eq(ds_hs_init_responder(&hr, &cr), 0);
        uint8_t f[HSCAP];
        size_t len;

        cr_assert_eq(ds_hs_write(&hi, f, sizeof(f), &len), 0);
        flip_all(&hr, &drops_b, f, len, use_key);
        cr_assert_eq(ds_hs_read(&hr, f, len), DS_DROP_NONE, "genuine HELLO after the flips");

        cr_assert_eq(ds_hs_write(&hr, f, sizeof(f), &len), 0);
        flip_all(&hi, &drops_a, f, len, use_key);
        cr_assert_eq(ds_hs_read(&hi, f, len), DS_DROP_NONE, "genuine HELLO_ACK after the flips");

        cr_assert_eq(ds_hs_write(&hi, f, sizeof(f), &len), 0);
        flip_all(&hr, &drops_b, f, len, use_key);
        cr_assert_eq(ds_hs_read(&hr, f, len), DS_DROP_NONE, "genuine HELLO_FIN after the flips");

        cr_assert(ds_hs_done(&hi) && ds_hs_done(&hr));
        ds_session si, sr;
        cr_assert_eq(ds_hs_session(&hi, &si, NULL), 0);
        cr_assert_eq(ds_hs_session(&hr, &sr, NULL), 0);
        uint8_t g[4096];
        float v[64];
        size_t gl = seal_req(&si, g, sizeof(g), 64, 9, v);
        cr_assert_eq(open_req(&sr, g, gl, v, 64), DS_DROP_NONE);
        /* Exactly one drop per forgery, on the side that read it. */
        cr_expect_eq(ds_drop_total(&drops_a), 2 * (DS_WIRE_HDR_SIZE + DS_WIRE_HELLO_ACK_SIZE));
        cr_expect_eq(ds_drop_total(&drops_b), 2 * (2 * DS_WIRE_HDR_SIZE + DS_WIRE_HELLO_SIZE +
                                                   DS_WIRE_HELLO_FIN_SIZE));
        ds_session_wipe(&si);
        ds_session_wipe(&sr);
        ds_hs_wipe(&hi);
        ds_hs_wipe(&hr);
    }
    ds_allowlist_free(&al);
}

/* H2 as the protocol defines it, computed here independently of handshake.c. */
static void ack_hash(uint8_t out[32], const uint8_t *hello, size_t hl, const uint8_t *ack)
{
    const char *label = "dsnode hs v1 ack";
    crypto_generichash_state st;
    crypto_generichash_init(&st, NULL, 0, 32);
    crypto_generichash_update(&st, (const uint8_t *)label, strlen(label));
    crypto_generichash_update(&st, hello, hl);
    crypto_generichash_update(&st, ack, DS_WIRE_HDR_SIZE + DS_WIRE_HELLO_BODY + 32);
    crypto_generichash_final(&st, out, 32);
}

Test(crypto, replayed_handshake_makes_no_session)
{
    ds_hs_config ci = cfgof(&id_a, "alpha", &ck, NULL, DS_SEC_ENCRYPT, 0, &drops_a);
    ds_hs_config cr = cfgof(&id_b, "beta", &ck, NULL, DS_SEC_ENCRYPT, 0, &drops_b);
    ds_hs i1, r1;
    hs_run old;
    cr_assert_eq(ds_hs_init_initiator(&i1, &ci, 0), 0);
    cr_assert_eq(ds_hs_init_responder(&r1, &cr), 0);
    cr_assert_eq(run_hs(&i1, &r1, &old), DS_DROP_NONE);
    ds_session s1a, s1b;
    cr_assert_eq(ds_hs_session(&i1, &s1a, NULL), 0);
    cr_assert_eq(ds_hs_session(&r1, &s1b, NULL), 0);
    uint8_t oldmsg[4096];
    float v[32];
    size_t oldlen = seal_req(&s1a, oldmsg, sizeof(oldmsg), 32, 1, v);

    /* An attacker replays HELLO and HELLO_FIN to a fresh responder. The
     * HELLO cannot be told from a new one; the answer carries a fresh key. */
    ds_hs r2;
    cr_assert_eq(ds_hs_init_responder(&r2, &cr), 0);
    cr_assert_eq(ds_hs_read(&r2, old.f[0], old.len[0]), DS_DROP_NONE);
    uint8_t ack2[HSCAP];
    size_t ack2len;
    cr_assert_eq(ds_hs_write(&r2, ack2, sizeof(ack2), &ack2len), 0);
    cr_expect_neq(memcmp(ack2 + DS_WIRE_HDR_SIZE + 40, old.f[1] + DS_WIRE_HDR_SIZE + 40, 32), 0,
                  "fresh ephemeral key");
    memset(&drops_b, 0, sizeof(drops_b));
    cr_expect_eq(ds_hs_read(&r2, old.f[2], old.len[2]), DS_DROP_STALE_HANDSHAKE);
    cr_expect_eq(ds_drop_get(&drops_b, DS_DROP_STALE_HANDSHAKE), 1);
    /* Even with its echo patched to the new transcript, the old signature
     * and MAC cover the old one. */
    uint8_t fin[HSCAP];
    memcpy(fin, old.f[2], old.len[2]);
    ack_hash(fin + DS_WIRE_HDR_SIZE, old.f[0], old.len[0], ack2);
    cr_expect_eq(ds_hs_read(&r2, fin, old.len[2]), DS_DROP_BAD_SIGNATURE);
    cr_expect_eq(ds_drop_get(&drops_b, DS_DROP_BAD_SIGNATURE), 1);
    cr_expect(!ds_hs_done(&r2));
    ds_session s;
    cr_expect_eq(ds_hs_session(&r2, &s, NULL), -EAGAIN);

    /* A replayed HELLO_FIN to a responder waiting for a HELLO. */
    ds_hs r3;
    cr_assert_eq(ds_hs_init_responder(&r3, &cr), 0);
    cr_expect_eq(ds_hs_read(&r3, old.f[2], old.len[2]), DS_DROP_STALE_HANDSHAKE);

    /* A replayed HELLO_ACK to a fresh initiator. */
    ds_hs i2;
    uint8_t hello2[HSCAP];
    size_t h2len;
    cr_assert_eq(ds_hs_init_initiator(&i2, &ci, 0), 0);
    cr_assert_eq(ds_hs_write(&i2, hello2, sizeof(hello2), &h2len), 0);
    memset(&drops_a, 0, sizeof(drops_a));
    cr_expect_eq(ds_hs_read(&i2, old.f[1], old.len[1]), DS_DROP_STALE_HANDSHAKE);
    cr_expect_eq(ds_drop_get(&drops_a, DS_DROP_STALE_HANDSHAKE), 1);
    cr_expect(!ds_hs_done(&i2));

    /* A finished handshake takes nothing more. */
    cr_expect_eq(ds_hs_read(&r1, old.f[2], old.len[2]), DS_DROP_STALE_HANDSHAKE);

    /* A new genuine session between the same nodes rejects old traffic. */
    ds_session s2a, s2b;
    pair(&s2a, &s2b, DS_SEC_ENCRYPT, 0, 0);
    memset(&drops_b, 0, sizeof(drops_b));
    cr_expect_eq(ds_session_open(&s2b, oldmsg, oldlen), DS_DROP_BAD_TAG);
    cr_expect_eq(ds_drop_get(&drops_b, DS_DROP_BAD_TAG), 1);
    uint8_t g[4096];
    size_t gl = seal_req(&s2a, g, sizeof(g), 32, 2, v);
    cr_expect_eq(open_req(&s2b, g, gl, v, 32), DS_DROP_NONE, "a good message right after");
    ds_session_wipe(&s1a);
    ds_session_wipe(&s1b);
    ds_session_wipe(&s2a);
    ds_session_wipe(&s2b);
}

/* ---- sealed frames ---------------------------------------------------------------------- */

static uint32_t sealed_flip_expect(size_t off)
{
#define B(r) (1u << DS_DROP_##r)
    if (off < 4)
        return B(BAD_MAGIC);
    if (off == 4)
        return B(BAD_VERSION);
    if (off == 5)
        return B(UNKNOWN_TYPE) | B(LENGTH_MISMATCH) | B(BAD_FLAGS) | B(BAD_TAG);
    if (off < 8)
        return B(BAD_FLAGS) | B(BAD_TAG) | B(POLICY_MISMATCH) | B(LENGTH_MISMATCH);
    if (off < 16)
        return B(WRONG_CLUSTER);
    if (off < 24)
        return B(WRONG_SENDER);
    if (off < 32)
        return B(WRONG_RECEIVER);
    if (off < 48)
        return B(BAD_TAG); /* round, epoch, segment: only the tag covers them */
    if (off < 52)
        return B(BAD_TAG) | B(LENGTH_MISMATCH) | B(COUNT_LIMIT);
    if (off < 56)
        return B(LENGTH_MISMATCH) | B(SIZE_LIMIT);
    if (off < 64)
        return B(BAD_TAG) | B(TOO_OLD) | B(REPLAY);
    return B(BAD_TAG);
#undef B
}

Test(crypto, sealed_flip_every_byte_every_mode, .timeout = 120)
{
    const unsigned have = ds_aead_available();
    for (int mode = DS_SEC_AUTH; mode <= DS_SEC_ENCRYPT; mode++) {
        for (unsigned aead = DS_AEAD_AES256GCM; aead <= DS_AEAD_XCHACHA20; aead <<= 1) {
            if (!(have & aead))
                continue;
            ds_session sa, sb;
            pair(&sa, &sb, (enum ds_sec_mode)mode, aead, aead);
            cr_assert_eq(sa.aead, aead);
            memset(&drops_b, 0, sizeof(drops_b));
            uint8_t f[4096], c[4096];
            float v[40];
            size_t len = 0;
            for (int k = 0; k < 3; k++) /* seq 3: a flip in seq can go back or forward */
                len = seal_req(&sa, f, sizeof(f), 40, 11, v);
            for (size_t off = 0; off < len; off++) {
                for (int mi = 0; mi < 2; mi++) {
                    memcpy(c, f, len);
                    c[off] ^= mi ? 0x80 : 0x01;
                    const uint64_t before = ds_drop_total(&drops_b);
                    enum ds_drop_reason r = ds_session_open(&sb, c, len);
                    cr_assert(r != DS_DROP_NONE && ((sealed_flip_expect(off) >> r) & 1),
                              "mode %s %s byte %zu: got %s", ds_sec_mode_name(mode),
                              ds_aead_name(aead), off, ds_drop_name(r));
                    cr_assert_eq(ds_drop_total(&drops_b), before + 1);
                }
            }
            cr_assert_eq(open_req(&sb, f, len, v, 40), DS_DROP_NONE,
                         "the genuine frame after %zu forgeries", 2 * len);
            ds_session_wipe(&sa);
            ds_session_wipe(&sb);
        }
    }
}

Test(crypto, sealed_payload_visibility_per_mode)
{
    for (int mode = DS_SEC_NONE; mode <= DS_SEC_ENCRYPT; mode++) {
        ds_session sa, sb;
        pair(&sa, &sb, (enum ds_sec_mode)mode, 0, 0);
        uint8_t f[4096], plain[4096];
        float v[20];
        size_t len = seal_req(&sa, f, sizeof(f), 20, 3, v);
        cr_expect_eq(len > 0, 1);
        /* Re-encode the same message unsealed to compare payload bytes. */
        size_t over = ds_session_overhead(&sa);
        cr_expect_eq(over, mode == DS_SEC_NONE ? 0u : DS_WIRE_TAG_SIZE);
        memcpy(plain, f, len);
        cr_assert_eq(ds_session_open(&sb, plain, len), DS_DROP_NONE);
        const int same = memcmp(f + DS_WIRE_HDR_SIZE, plain + DS_WIRE_HDR_SIZE,
                                len - over - DS_WIRE_HDR_SIZE) == 0;
        cr_expect_eq(same, mode != DS_SEC_ENCRYPT, "payload in clear unless encrypt (%s)",
                     ds_sec_mode_name(mode));
        cr_expect_eq(ds_wire_prot(&(ds_wire_hdr){.flags = ds_le16(f + DS_WH_FLAGS)}),
                     (unsigned)mode);
        cr_expect_eq(ds_le64(f + DS_WH_SENDER), id_a.id);
        cr_expect_eq(ds_le64(f + DS_WH_RECEIVER), id_b.id);
        cr_expect_eq(ds_le64(f + DS_WH_CLUSTER), CLUSTER);
        cr_expect_eq(ds_le64(f + DS_WH_SEQ), 1);
        /* A frame of another mode is not accepted. */
        if (mode != DS_SEC_NONE) {
            ds_session na, nb;
            pair(&na, &nb, DS_SEC_NONE, 0, 0);
            uint8_t g[4096];
            size_t gl = seal_req(&na, g, sizeof(g), 20, 3, NULL);
            memset(&drops_b, 0, sizeof(drops_b));
            cr_expect_eq(ds_session_open(&sb, g, gl), DS_DROP_POLICY_MISMATCH);
            cr_expect_eq(ds_drop_get(&drops_b, DS_DROP_POLICY_MISMATCH), 1);
            ds_session_wipe(&na);
            ds_session_wipe(&nb);
        }
        ds_session_wipe(&sa);
        ds_session_wipe(&sb);
    }
}

/* Two sending sessions with the same keys and seq, and the receiving one. */
static void session_trio(ds_session *tx1, ds_session *tx2, ds_session *rx, enum ds_sec_mode mode,
                         unsigned aead, uint64_t seed)
{
    ds_session_params p = {.mode = mode, .aead = aead, .cluster_id = CLUSTER,
                           .self_id = id_a.id, .peer_id = id_b.id};
    uint8_t s32[randombytes_SEEDBYTES] = {0};
    memcpy(s32, &seed, sizeof(seed));
    randombytes_buf_deterministic(p.tx_key, sizeof(p.tx_key), s32);
    s32[31] = 1;
    randombytes_buf_deterministic(p.rx_key, sizeof(p.rx_key), s32);
    cr_assert_eq(ds_session_init(tx1, &p, NULL, NULL), 0);
    cr_assert_eq(ds_session_init(tx2, &p, NULL, NULL), 0);
    ds_session_params q = p;
    memcpy(q.tx_key, p.rx_key, sizeof(q.tx_key));
    memcpy(q.rx_key, p.tx_key, sizeof(q.rx_key));
    q.self_id = id_b.id;
    q.peer_id = id_a.id;
    cr_assert_eq(ds_session_init(rx, &q, NULL, &drops_b), 0);
    sodium_memzero(&p, sizeof(p));
    sodium_memzero(&q, sizeof(q));
}

/* ds_session_seal_ref: a STATE_CHUNK sealed from its header and prefix
 * with the data left where it is gives, byte for byte, the frame
 * ds_session_seal makes of the contiguous copy (same keys, same seq) in
 * mode none, for seeded random data of odd sizes; the receiver opens and
 * decodes it. auth and encrypt say -ENOTSUP without using a seq (the
 * caller then copies). A frame cut anywhere seals the same too. */
Test(crypto, seal_ref_matches_seal_byte_for_byte, .timeout = 120)
{
    static const size_t sizes[] = {0, 1, 15, 16, 17, 63, 64, 1000, 4097, 65535, 65537,
                                   (1u << 20) + 3, (3u << 20) + 11};
    const size_t nsizes = sizeof(sizes) / sizeof(sizes[0]);
    const size_t maxn = (3u << 20) + 11;
    uint8_t *data = malloc(maxn), *whole = malloc(maxn + 256), *joined = malloc(maxn + 256);
    cr_assert(data && whole && joined);
    const unsigned have = ds_aead_available();
    for (int mode = DS_SEC_NONE; mode <= DS_SEC_ENCRYPT; mode++) {
        for (unsigned aead = DS_AEAD_AES256GCM; aead <= DS_AEAD_XCHACHA20; aead <<= 1) {
            if (!(have & aead) || (mode == DS_SEC_NONE && aead != DS_AEAD_AES256GCM &&
                                   (have & DS_AEAD_AES256GCM)))
                continue;
            ds_session t1, t2, rx;
            session_trio(&t1, &t2, &rx, (enum ds_sec_mode)mode, aead, 1000u * (unsigned)mode + aead);
            for (size_t k = 0; k < nsizes; k++) {
                const size_t n = sizes[k];
                uint8_t seed[randombytes_SEEDBYTES] = {(uint8_t)k, (uint8_t)mode, (uint8_t)aead};
                randombytes_buf_deterministic(data, n, seed);
                ds_wire_msg m;
                memset(&m, 0, sizeof(m));
                m.h.type = DS_MSG_STATE_CHUNK;
                m.h.round = 1000 + k;
                m.h.epoch = 3;
                m.h.count = (uint32_t)n;
                if (k & 1)
                    m.h.flags = DS_WF_MORE;
                m.u.chunk.total = (uint64_t)n + 12345;
                m.u.chunk.offset = 12345;
                memset(m.u.chunk.digest, 0xa0 + (int)k, 32);
                m.u.chunk.data = data;
                size_t len = 0, sealed = 0, hl = 0, tl = 99;
                cr_assert_eq(ds_wire_encode(whole, maxn + 256, &m, &len), 0);
                uint8_t head[DS_WIRE_HDR_SIZE + DS_WIRE_CHUNK_PREFIX], tag[DS_WIRE_TAG_SIZE];
                cr_assert_eq(ds_wire_encode_head(head, sizeof(head), &m, &hl), 0);
                cr_assert_eq(hl, sizeof(head));
                cr_assert_eq(hl + n, len);
                cr_assert_eq(memcmp(head, whole, hl), 0, "head differs from the encoded frame");
                cr_assert_eq(ds_session_seal(&t1, whole, len, maxn + 256, &sealed), 0);
                int r = ds_session_seal_ref(&t2, head, hl, data, n, tag, &tl);
                if (mode != DS_SEC_NONE) {
                    cr_assert_eq(r, -ENOTSUP);
                    /* No seq taken: keep the two senders in step. */
                    cr_assert_eq(ds_wire_encode(joined, maxn + 256, &m, &len), 0);
                    cr_assert_eq(ds_session_seal(&t2, joined, len, maxn + 256, &sealed), 0);
                    cr_assert_eq(memcmp(joined, whole, sealed), 0);
                } else {
                    cr_assert_eq(r, 0, "%s %s n=%zu: %d", ds_sec_mode_name(mode),
                                 ds_aead_name(aead), n, r);
                    cr_assert_eq(tl, ds_session_overhead(&t2));
                    cr_assert_eq(hl + n + tl, sealed);
                    memcpy(joined, head, hl);
                    memcpy(joined + hl, data, n);
                    memcpy(joined + hl + n, tag, tl);
                    cr_assert_eq(memcmp(joined, whole, sealed), 0, "%s %s n=%zu: frames differ",
                                 ds_sec_mode_name(mode), ds_aead_name(aead), n);
                }
                cr_assert_eq(ds_session_open(&rx, joined, sealed), DS_DROP_NONE, "n=%zu", n);
                ds_wire_msg got;
                cr_assert_eq(ds_wire_decode(joined, sealed, &rx.lim, &(ds_wire_bufs){0}, &got,
                                            NULL),
                             DS_DROP_NONE);
                cr_assert_eq(got.h.count, n);
                cr_assert_eq(got.u.chunk.offset, 12345);
                cr_assert(n == 0 || memcmp(got.u.chunk.data, data, n) == 0);
            }
            /* Any cut of a frame into head and body (AES-GCM: 16-byte
             * multiples; others: any) seals the same. */
            for (size_t cut = DS_WIRE_HDR_SIZE; cut <= DS_WIRE_HDR_SIZE + 80; cut++) {
                if (mode != DS_SEC_NONE)
                    break;
                const size_t n = 1001;
                ds_wire_msg m;
                memset(&m, 0, sizeof(m));
                m.h.type = DS_MSG_STATE_CHUNK;
                m.h.count = (uint32_t)n;
                m.u.chunk.total = n;
                m.u.chunk.data = data;
                size_t len = 0, sealed = 0, tl = 0;
                cr_assert_eq(ds_wire_encode(whole, maxn + 256, &m, &len), 0);
                memcpy(joined, whole, len);
                uint8_t tag[DS_WIRE_TAG_SIZE];
                int r = ds_session_seal_ref(&t2, joined, cut, joined + cut, len - cut, tag, &tl);
                cr_assert_eq(r, 0, "cut %zu", cut);
                cr_assert_eq(ds_session_seal(&t1, whole, len, maxn + 256, &sealed), 0);
                cr_assert_eq(len + tl, sealed);
                cr_assert_eq(memcmp(joined, whole, len), 0, "cut %zu: header", cut);
                cr_assert_eq(memcmp(tag, whole + len, tl), 0, "cut %zu: tag", cut);
            }
            ds_session_wipe(&t1);
            ds_session_wipe(&t2);
            ds_session_wipe(&rx);
        }
    }
    free(data);
    free(whole);
    free(joined);
}

/* The two libraries that run the AEAD (ds_aead_lib): for seeded random
 * frames of random sizes, in modes auth and encrypt with each AEAD, libsodium
 * and OpenSSL seal the same bytes (same keys, same seq), and so does
 * ds_session_seal_from with the data left where it is (each library), each
 * opens the other's frames, and a frame with one byte flipped where only
 * the tag guards it (round, epoch, segment; payload; tag) fails to open
 * with BAD_TAG on the other library, the genuine frame opening afterwards. */
Test(crypto, libraries_open_each_others_frames, .timeout = 120)
{
    const size_t maxn = (3u << 20) + 11;
    uint8_t *data = malloc(maxn), *fs = malloc(maxn + 256), *fo = malloc(maxn + 256),
            *bad = malloc(maxn + 256);
    cr_assert(data && fs && fo && bad);
    const size_t hl = DS_WIRE_HDR_SIZE + DS_WIRE_CHUNK_PREFIX;
    const unsigned have = ds_aead_available();
    uint64_t rng = 0x17a11b5;
    for (int mode = DS_SEC_AUTH; mode <= DS_SEC_ENCRYPT; mode++) {
        for (unsigned aead = DS_AEAD_AES256GCM; aead <= DS_AEAD_XCHACHA20; aead <<= 1) {
            if (!(have & aead))
                continue;
            ds_session ts, rs, to, ro, ts2, to2; /* *2: seal_from, in step */
            const uint64_t seed = 77u * (unsigned)mode + aead;
            ds_aead_lib_set(DS_AEAD_LIB_SODIUM);
            session_trio(&ts, &ts2, &rs, (enum ds_sec_mode)mode, aead, seed);
            ds_aead_lib_set(DS_AEAD_LIB_OPENSSL);
            session_trio(&to, &to2, &ro, (enum ds_sec_mode)mode, aead, seed);
            cr_assert_eq(ts.lib, DS_AEAD_LIB_SODIUM);
            cr_assert_eq(to.lib, DS_AEAD_LIB_OPENSSL);
            memset(&drops_b, 0, sizeof(drops_b));
            for (int i = 0; i < 40; i++) {
                const uint64_t x = ds_t_next(&rng);
                const size_t n = i % 8 == 7 ? x % maxn : i % 2 ? x % 70000 : x % 300;
                uint8_t s32[randombytes_SEEDBYTES] = {(uint8_t)i, (uint8_t)mode, (uint8_t)aead};
                randombytes_buf_deterministic(data, n, s32);
                ds_wire_msg m;
                memset(&m, 0, sizeof(m));
                m.h.type = DS_MSG_STATE_CHUNK;
                m.h.round = (uint32_t)x;
                m.h.count = (uint32_t)n;
                m.u.chunk.total = n;
                m.u.chunk.data = data;
                size_t len = 0, ls = 0, lo = 0;
                cr_assert_eq(ds_wire_encode(fs, maxn + 256, &m, &len), 0);
                memcpy(fo, fs, len);
                cr_assert_eq(ds_session_seal(&ts, fs, len, maxn + 256, &ls), 0);
                cr_assert_eq(ds_session_seal(&to, fo, len, maxn + 256, &lo), 0);
                cr_assert_eq(ls, lo);
                cr_assert_eq(memcmp(fs, fo, ls), 0, "%s %s n=%zu: the libraries' frames differ",
                             ds_sec_mode_name(mode), ds_aead_name(aead), n);
                /* The data sealed from where it is, by each library. */
                for (int w = 0; w < 2; w++) {
                    size_t h = 0, lf = 0;
                    cr_assert_eq(ds_wire_encode_head(bad, maxn + 256, &m, &h), 0);
                    cr_assert_eq(h, hl);
                    cr_assert_eq(ds_session_seal_from(w ? &to2 : &ts2, bad, h, data, n,
                                                      maxn + 256, &lf),
                                 0);
                    cr_assert_eq(lf, ls);
                    cr_assert_eq(memcmp(bad, fs, ls), 0, "%s %s n=%zu: seal_from (%s) differs",
                                 ds_sec_mode_name(mode), ds_aead_name(aead), n,
                                 w ? "openssl" : "libsodium");
                }
                /* A flip the tag alone catches, opened by the other library. */
                for (int w = 0; w < 2; w++) {
                    const uint8_t *f = w ? fo : fs;
                    ds_session *rx = w ? &rs : &ro;
                    const uint64_t y = ds_t_next(&rng);
                    const size_t span = 16 + (ls - DS_WIRE_HDR_SIZE);
                    size_t off = (size_t)(y % span);
                    off = off < 16 ? 32 + off : DS_WIRE_HDR_SIZE + off - 16;
                    memcpy(bad, f, ls);
                    bad[off] ^= (uint8_t)(1u << (y >> 32) % 8);
                    const uint64_t before = ds_drop_total(&drops_b);
                    cr_assert_eq(ds_session_open(rx, bad, ls), DS_DROP_BAD_TAG,
                                 "%s %s n=%zu byte %zu", ds_sec_mode_name(mode),
                                 ds_aead_name(aead), n, off);
                    cr_assert_eq(ds_drop_total(&drops_b), before + 1);
                }
                /* Each library opens the other's genuine frame. */
                cr_assert_eq(ds_session_open(&ro, fs, ls), DS_DROP_NONE, "openssl opens n=%zu", n);
                cr_assert_eq(ds_session_open(&rs, fo, lo), DS_DROP_NONE, "libsodium opens n=%zu",
                             n);
                for (int w = 0; w < 2; w++) {
                    ds_wire_msg got;
                    cr_assert_eq(ds_wire_decode(w ? fo : fs, ls, &rs.lim, &(ds_wire_bufs){0}, &got,
                                                NULL),
                                 DS_DROP_NONE);
                    cr_assert_eq(got.h.count, n);
                    cr_assert(n == 0 || memcmp(got.u.chunk.data, data, n) == 0);
                }
            }
            ds_session_wipe(&ts);
            ds_session_wipe(&rs);
            ds_session_wipe(&to);
            ds_session_wipe(&ro);
            ds_session_wipe(&ts2);
            ds_session_wipe(&to2);
        }
    }
    free(data);
    free(fs);
    free(fo);
    free(bad);
}

Test(crypto, replayed_and_too_old_sealed_frames)
{
    ds_session sa, sb;
    pair(&sa, &sb, DS_SEC_ENCRYPT, 0, 0);
    enum { N = 1100 };
    static uint8_t f[N][512];
    static size_t len[N];
    static float v[N][8];
    for (int k = 0; k < N; k++)
        len[k] = seal_req(&sa, f[k], sizeof(f[k]), 8, (uint64_t)k, v[k]);
    uint8_t c[512];
    memset(&drops_b, 0, sizeof(drops_b));

    memcpy(c, f[0], len[0]);
    cr_assert_eq(open_req(&sb, c, len[0], v[0], 8), DS_DROP_NONE);
    memcpy(c, f[0], len[0]);
    cr_expect_eq(ds_session_open(&sb, c, len[0]), DS_DROP_REPLAY);
    cr_expect_eq(ds_drop_get(&drops_b, DS_DROP_REPLAY), 1);

    /* Jump ahead: seq 1100 is accepted, seq 2..76 fall out of the window. */
    memcpy(c, f[N - 1], len[N - 1]);
    cr_assert_eq(open_req(&sb, c, len[N - 1], v[N - 1], 8), DS_DROP_NONE);
    memcpy(c, f[1], len[1]);
    cr_expect_eq(ds_session_open(&sb, c, len[1]), DS_DROP_TOO_OLD);
    cr_expect_eq(ds_drop_get(&drops_b, DS_DROP_TOO_OLD), 1);
    memcpy(c, f[75], len[75]); /* seq 76: 1100 - 76 = 1024 behind */
    cr_expect_eq(ds_session_open(&sb, c, len[75]), DS_DROP_TOO_OLD);
    /* Out of order inside the window is fine, once. */
    for (int k = N - 2; k >= 76; k -= 97) {
        memcpy(c, f[k], len[k]);
        cr_assert_eq(open_req(&sb, c, len[k], v[k], 8), DS_DROP_NONE, "seq %d", k + 1);
        memcpy(c, f[k], len[k]);
        cr_expect_eq(ds_session_open(&sb, c, len[k]), DS_DROP_REPLAY);
    }
    /* A forgery with a far-ahead seq does not move the window. */
    memcpy(c, f[80], len[80]);
    ds_put64(c + DS_WH_SEQ, 1000000);
    cr_expect_eq(ds_session_open(&sb, c, len[80]), DS_DROP_BAD_TAG);
    memcpy(c, f[80], len[80]);
    cr_expect_eq(open_req(&sb, c, len[80], v[80], 8), DS_DROP_NONE,
                 "seq 81 still inside the window");
    ds_session_wipe(&sa);
    ds_session_wipe(&sb);
}

Test(crypto, forged_sender_and_third_party_frames)
{
    ds_session ab_a, ab_b;
    pair(&ab_a, &ab_b, DS_SEC_ENCRYPT, 0, 0);
    uint8_t f[4096];
    float v[16];
    size_t len = seal_req(&ab_a, f, sizeof(f), 16, 4, v);

    /* The sender field rewritten to C's id, into B's session with A. */
    memset(&drops_b, 0, sizeof(drops_b));
    uint8_t c[4096];
    memcpy(c, f, len);
    ds_put64(c + DS_WH_SENDER, id_c.id);
    cr_expect_eq(ds_session_open(&ab_b, c, len), DS_DROP_WRONG_SENDER);
    cr_expect_eq(ds_drop_get(&drops_b, DS_DROP_WRONG_SENDER), 1);

    /* C holds its own valid session keys (with B) and claims to be A. */
    ds_session cb_c;
    ds_session_params p = {.mode = DS_SEC_ENCRYPT, .aead = ab_a.aead, .cluster_id = CLUSTER,
                           .self_id = id_c.id, .peer_id = id_b.id};
    memset(p.tx_key, 0x77, 32);
    memset(p.rx_key, 0x78, 32);
    cr_assert_eq(ds_session_init(&cb_c, &p, NULL, NULL), 0);
    uint8_t g[4096];
    size_t gl = seal_req(&cb_c, g, sizeof(g), 16, 4, NULL);
    ds_put64(g + DS_WH_SENDER, id_a.id);
    cr_expect_eq(ds_session_open(&ab_b, g, gl), DS_DROP_BAD_TAG);
    cr_expect_eq(ds_drop_get(&drops_b, DS_DROP_BAD_TAG), 1);

    /* Addressed to someone else. */
    memcpy(c, f, len);
    ds_put64(c + DS_WH_RECEIVER, id_c.id);
    cr_expect_eq(ds_session_open(&ab_b, c, len), DS_DROP_WRONG_RECEIVER);
    /* A handshake frame inside a session. */
    ds_wire_msg m;
    memset(&m, 0, sizeof(m));
    m.h.type = DS_MSG_HELLO_FIN;
    size_t hl;
    cr_assert_eq(ds_wire_encode(c, sizeof(c), &m, &hl), 0);
    cr_expect_eq(ds_session_open(&ab_b, c, hl), DS_DROP_UNEXPECTED);

    cr_expect_eq(open_req(&ab_b, f, len, v, 16), DS_DROP_NONE, "the genuine frame");
    cr_expect_eq(ds_drop_total(&drops_b), 4);
    ds_session_wipe(&ab_a);
    ds_session_wipe(&ab_b);
    ds_session_wipe(&cb_c);
}

Test(crypto, seal_errors_and_key_retirement)
{
    ds_session sa, sb;
    pair(&sa, &sb, DS_SEC_ENCRYPT, 0, 0);
    uint8_t f[1024];
    ds_wire_msg m;
    memset(&m, 0, sizeof(m));
    m.h.type = DS_MSG_GOSSIP_STALE;
    size_t len, out;
    cr_assert_eq(ds_wire_encode(f, sizeof(f), &m, &len), 0);
    cr_expect_eq(ds_session_seal(&sa, f, len, len + 15, &out), -ENOSPC);
    cr_assert_eq(ds_session_seal(&sa, f, len, sizeof(f), &out), 0);
    cr_expect_eq(ds_session_seal(&sa, f, out, sizeof(f), &out), -EINVAL, "already sealed");
    m.h.type = DS_MSG_HELLO_FIN;
    cr_assert_eq(ds_wire_encode(f, sizeof(f), &m, &len), 0);
    cr_expect_eq(ds_session_seal(&sa, f, len, sizeof(f), &out), -EINVAL, "handshake frame");

    if (sa.aead == DS_AEAD_AES256GCM) {
        m.h.type = DS_MSG_GOSSIP_STALE;
        cr_assert_eq(ds_wire_encode(f, sizeof(f), &m, &len), 0);
        cr_expect_eq(ds_session_rekey_due(&sa), 0);
        atomic_store(&sa.tx_bytes, DS_SESSION_AESGCM_MAX_BYTES - 10);
        cr_expect_eq(ds_session_rekey_due(&sa), 1);
        cr_expect_eq(ds_session_seal(&sa, f, len, sizeof(f), &out), -EKEYEXPIRED);
    }

    ds_session_params p = {.mode = 7};
    ds_session s;
    cr_expect_eq(ds_session_init(&s, &p, NULL, NULL), -EINVAL);
    p.mode = DS_SEC_ENCRYPT;
    p.aead = 4;
    cr_expect_eq(ds_session_init(&s, &p, NULL, NULL), -EINVAL);
    ds_session_wipe(&sa);
    ds_session_wipe(&sb);
}

Test(crypto, replay_window_unit)
{
    ds_replay w;
    memset(&w, 0, sizeof(w));
    cr_expect_eq(ds_replay_check(&w, 0), DS_DROP_TOO_OLD);
    cr_expect_eq(ds_replay_check(&w, 1), DS_DROP_NONE);
    ds_replay_mark(&w, 5);
    cr_expect_eq(ds_replay_check(&w, 5), DS_DROP_REPLAY);
    cr_expect_eq(ds_replay_check(&w, 4), DS_DROP_NONE);
    ds_replay_mark(&w, 4);
    ds_replay_mark(&w, 5 + DS_REPLAY_WINDOW); /* 5 is now exactly too old */
    cr_expect_eq(ds_replay_check(&w, 5), DS_DROP_TOO_OLD);
    cr_expect_eq(ds_replay_check(&w, 6), DS_DROP_NONE, "the slot of 6 was cleared");
    cr_expect_eq(ds_replay_check(&w, 5 + DS_REPLAY_WINDOW), DS_DROP_REPLAY);
    ds_replay_mark(&w, 100000); /* a jump past the whole window */
    for (uint64_t s = 100000 - DS_REPLAY_WINDOW + 1; s < 100000; s++)
        cr_assert_eq(ds_replay_check(&w, s), DS_DROP_NONE, "seq %llu", (unsigned long long)s);
    cr_expect_eq(ds_replay_check(&w, 100000 - DS_REPLAY_WINDOW), DS_DROP_TOO_OLD);
}

/* ---- key files ---------------------------------------------------------------------------- */

static char tmpdir[64];

static void mktmp(void)
{
    strcpy(tmpdir, "/tmp/ds-crypto-XXXXXX");
    cr_assert_not_null(mkdtemp(tmpdir));
}

static void rmtmp(void)
{
    DIR *d = opendir(tmpdir);
    if (!d)
        return;
    struct dirent *e;
    char p[512];
    while ((e = readdir(d)))
        if (strcmp(e->d_name, ".") && strcmp(e->d_name, "..")) {
            snprintf(p, sizeof(p), "%s/%s", tmpdir, e->d_name);
            unlink(p);
        }
    closedir(d);
    rmdir(tmpdir);
}

static void put_file(const char *path, const char *text, mode_t mode)
{
    FILE *f = fopen(path, "w");
    cr_assert_not_null(f);
    fputs(text, f);
    fclose(f);
    cr_assert_eq(chmod(path, mode), 0);
}

static mode_t mode_of(const char *path)
{
    struct stat st;
    cr_assert_eq(stat(path, &st), 0, "%s exists", path);
    return st.st_mode & 07777;
}

static char *slurp(const char *path, char *buf, size_t cap)
{
    FILE *f = fopen(path, "r");
    cr_assert_not_null(f);
    size_t n = fread(buf, 1, cap - 1, f);
    buf[n] = '\0';
    fclose(f);
    return buf;
}

Test(crypto, identity_files, .init = setup, .fini = rmtmp)
{
    mktmp();
    char path[256], pub[256], err[512], text[4096];
    snprintf(path, sizeof(path), "%s/id", tmpdir);
    snprintf(pub, sizeof(pub), "%s/id.pub", tmpdir);
    umask(022);

    /* good */
    cr_assert_eq(ds_identity_save(&id_a, path, "alpha", 0, err, sizeof(err)), 0, "%s", err);
    cr_expect_eq(mode_of(path), 0600);
    cr_expect_eq(mode_of(pub), 0644);
    ds_identity got;
    cr_assert_eq(ds_identity_load(&got, path, err, sizeof(err)), 0, "%s", err);
    cr_expect_eq(memcmp(&got, &id_a, sizeof(got)), 0);
    /* The .pub file is an allow-list. */
    ds_allowlist *al = NULL;
    cr_assert_eq(ds_allowlist_load(&al, pub, err, sizeof(err)), 0, "%s", err);
    cr_expect_eq(ds_allowlist_count(al), 1);
    cr_expect_eq(ds_allowlist_check(al, id_a.pk, "alpha"), 0);
    cr_expect_eq(ds_allowlist_check(al, id_a.pk, "beta"), -EPERM);
    cr_expect_eq(ds_allowlist_check(al, id_b.pk, "alpha"), -EACCES);
    ds_allowlist_free(&al);

    /* no overwrite without force; force replaces atomically with the mode */
    cr_expect_eq(ds_identity_save(&id_b, path, NULL, 0, err, sizeof(err)), -EEXIST);
    cr_expect(strstr(err, "--force") != NULL, "%s", err);
    cr_assert_eq(ds_identity_load(&got, path, err, sizeof(err)), 0);
    cr_expect_eq(memcmp(got.pk, id_a.pk, 32), 0, "untouched");
    cr_assert_eq(ds_identity_save(&id_b, path, NULL, 1, err, sizeof(err)), 0, "%s", err);
    cr_expect_eq(mode_of(path), 0600);
    cr_assert_eq(ds_identity_load(&got, path, err, sizeof(err)), 0);
    cr_expect_eq(memcmp(got.pk, id_b.pk, 32), 0);

    /* wrong mode */
    chmod(path, 0640);
    cr_expect_eq(ds_identity_load(&got, path, err, sizeof(err)), -EPERM);
    cr_expect(strstr(err, "chmod 600") != NULL && strstr(err, "0640") != NULL, "%s", err);
    chmod(path, 0604);
    cr_expect_eq(ds_identity_load(&got, path, err, sizeof(err)), -EPERM);
    chmod(path, 0400);
    cr_expect_eq(ds_identity_load(&got, path, err, sizeof(err)), 0, "read-only owner is fine");
    chmod(path, 0600);

    /* truncated */
    slurp(path, text, sizeof(text));
    char *nl = strrchr(text, '\n');
    cr_assert_not_null(nl);
    nl[-20] = '\n';
    nl[-19] = '\0';
    put_file(path, text, 0600);
    cr_expect_eq(ds_identity_load(&got, path, err, sizeof(err)), -EINVAL);
    cr_expect(strstr(err, "truncated") != NULL && strstr(err, "108 hex digits") != NULL, "%s",
              err);
    for (size_t k = 0; k < sizeof(got); k++)
        cr_assert_eq(((uint8_t *)&got)[k], 0, "wiped on error");

    /* garbage */
    put_file(path, "\x01\x02garbage \xff\xfe\n", 0600);
    cr_expect_eq(ds_identity_load(&got, path, err, sizeof(err)), -EINVAL);
    cr_expect(strstr(err, "not a dsnode identity") != NULL, "%s", err);
    put_file(path, "dsnode-identity-v1 zz", 0600);
    cr_expect_eq(ds_identity_load(&got, path, err, sizeof(err)), -EINVAL);
    cr_expect(strstr(err, "bad character") != NULL, "%s", err);
    put_file(path, "# only a comment\n\n", 0600);
    cr_expect_eq(ds_identity_load(&got, path, err, sizeof(err)), -EINVAL);
    cr_expect(strstr(err, "no key") != NULL, "%s", err);

    /* damaged: public half not derived from the seed */
    {
        char hex[129];
        uint8_t sk[64];
        memcpy(sk, id_a.sk, 64);
        sk[63] ^= 1;
        sodium_bin2hex(hex, sizeof(hex), sk, 64);
        snprintf(text, sizeof(text), "dsnode-identity-v1 %s\n", hex);
        put_file(path, text, 0600);
        cr_expect_eq(ds_identity_load(&got, path, err, sizeof(err)), -EINVAL);
        cr_expect(strstr(err, "damaged") != NULL, "%s", err);
        snprintf(text, sizeof(text), "dsnode-identity-v1 %s extra\n", hex);
        put_file(path, text, 0600);
        cr_expect_eq(ds_identity_load(&got, path, err, sizeof(err)), -EINVAL);
        snprintf(text, sizeof(text), "dsnode-identity-v1 %s\ndsnode-identity-v1 %s\n", hex, hex);
        put_file(path, text, 0600);
        cr_expect_eq(ds_identity_load(&got, path, err, sizeof(err)), -EINVAL);
    }

    /* a cluster key is not an identity */
    ds_cluster_key k;
    char kp[256];
    snprintf(kp, sizeof(kp), "%s/cluster.key", tmpdir);
    cr_assert_eq(ds_cluster_key_save(&ck, kp, 0, err, sizeof(err)), 0, "%s", err);
    cr_expect_eq(ds_identity_load(&got, kp, err, sizeof(err)), -EINVAL);
    cr_assert_eq(ds_cluster_key_load(&k, kp, err, sizeof(err)), 0, "%s", err);
    cr_expect_eq(memcmp(k.k, ck.k, 32), 0);
    cr_expect_eq(ds_cluster_key_save(&ck, kp, 0, err, sizeof(err)), -EEXIST);
    chmod(kp, 0644);
    cr_expect_eq(ds_cluster_key_load(&k, kp, err, sizeof(err)), -EPERM);
    put_file(kp, "dsnode-cluster-key-v1 0123\n", 0600);
    cr_expect_eq(ds_cluster_key_load(&k, kp, err, sizeof(err)), -EINVAL);
    cr_expect(strstr(err, "truncated") != NULL, "%s", err);

    /* missing; a directory */
    snprintf(kp, sizeof(kp), "%s/nope", tmpdir);
    cr_expect_eq(ds_identity_load(&got, kp, err, sizeof(err)), -ENOENT);
    cr_expect(strstr(err, "nope") != NULL, "%s", err);
    cr_expect_eq(ds_cluster_key_load(&k, kp, err, sizeof(err)), -ENOENT);
    cr_expect_eq(ds_identity_load(&got, tmpdir, err, sizeof(err)), -EISDIR);

    /* a FIFO, refused without blocking (issue 16): alarm() makes an open
     * that waits for a writer a crash instead of a hang */
    snprintf(kp, sizeof(kp), "%s/fifo", tmpdir);
    cr_assert_eq(mkfifo(kp, 0600), 0, "mkfifo: %s", strerror(errno));
    alarm(10);
    cr_expect_eq(ds_identity_load(&got, kp, err, sizeof(err)), -EINVAL);
    cr_expect(strstr(err, "fifo: not a regular file (a FIFO)") != NULL, "%s", err);
    cr_expect_eq(ds_cluster_key_load(&k, kp, err, sizeof(err)), -EINVAL);
    al = NULL;
    cr_expect_eq(ds_allowlist_load(&al, kp, err, sizeof(err)), -EINVAL);
    cr_expect(strstr(err, "fifo: not a regular file (a FIFO)") != NULL, "%s", err);
    alarm(0);
}

Test(crypto, allowlist_parsing)
{
    char a[65], b[65], text[1024], err[256];
    ds_pk_to_hex(id_a.pk, a);
    ds_pk_to_hex(id_b.pk, b);
    ds_allowlist *al = NULL;
    snprintf(text, sizeof(text), "  # team\n%s alpha # the first\n\n\t%s\r\n", a, b);
    cr_assert_eq(ds_allowlist_parse(&al, text, strlen(text), "keys", err, sizeof(err)), 0, "%s",
                 err);
    cr_expect_eq(ds_allowlist_count(al), 2);
    cr_expect_eq(ds_allowlist_check(al, id_b.pk, "anything"), 0, "no name: any name");
    cr_expect_eq(ds_allowlist_check(al, id_a.pk, "alpha"), 0);
    cr_expect_eq(ds_allowlist_check(al, id_c.pk, "gamma"), -EACCES);
    ds_allowlist_free(&al);
    ds_allowlist_free(&al); /* NULL is fine */

    static const char *const needle[] = {"duplicate key", "found more", "not 1..63",
                                         "not a public key", "not a public key"};
    for (size_t k = 0; k < 5; k++) {
        switch (k) {
        case 0: snprintf(text, sizeof(text), "%s\n%s\n", a, a); break;
        case 1: snprintf(text, sizeof(text), "%s alpha extra\n", a); break;
        case 2: snprintf(text, sizeof(text), "%s al\x01pha\n", a); break;
        case 3: snprintf(text, sizeof(text), "%.63s\n", a); break;
        default: snprintf(text, sizeof(text), "%.62szz\n", a); break;
        }
        cr_expect_eq(ds_allowlist_parse(&al, text, strlen(text), "keys", err, sizeof(err)),
                     -EINVAL, "case %zu", k);
        cr_expect(strstr(err, needle[k]) != NULL && strstr(err, "keys:") == err,
                  "case %zu: %s", k, err);
    }
    cr_expect_eq(ds_allowlist_load(&al, "/nonexistent/keys", err, sizeof(err)), -ENOENT);
    cr_expect_eq(ds_allowlist_check(NULL, id_a.pk, "x"), -EACCES);
}

Test(crypto, keygen_end_to_end, .init = setup, .fini = rmtmp)
{
    mktmp();
    umask(022);
    char path[256], pub[256], err[512], text[1024];
    snprintf(path, sizeof(path), "%s/node.key", tmpdir);
    snprintf(pub, sizeof(pub), "%s/node.key.pub", tmpdir);

    char *argv1[] = {"keygen", "--out", path, "--name", "node-1", NULL};
    cr_assert_eq(ds_keygen_main(5, argv1), 0);
    cr_expect_eq(mode_of(path), 0600);
    cr_expect_eq(mode_of(pub), 0644);
    ds_identity got;
    cr_assert_eq(ds_identity_load(&got, path, err, sizeof(err)), 0, "%s", err);
    char hex[65];
    ds_pk_to_hex(got.pk, hex);
    slurp(pub, text, sizeof(text));
    cr_expect(strstr(text, hex) != NULL && strstr(text, " node-1\n") != NULL, "%s", text);

    /* refuses to overwrite; --force replaces with a new key */
    cr_expect_eq(ds_keygen_main(5, argv1), 1);
    ds_identity again;
    cr_assert_eq(ds_identity_load(&again, path, err, sizeof(err)), 0);
    cr_expect_eq(memcmp(again.pk, got.pk, 32), 0);
    char *argv2[] = {"keygen", "--force", "--out=", NULL};
    cr_expect_eq(ds_keygen_main(3, argv2), 2, "empty --out=");
    char outopt[300];
    snprintf(outopt, sizeof(outopt), "--out=%s", path);
    char *argv3[] = {"keygen", "--force", outopt, NULL};
    cr_assert_eq(ds_keygen_main(3, argv3), 0);
    cr_assert_eq(ds_identity_load(&again, path, err, sizeof(err)), 0);
    cr_expect_neq(memcmp(again.pk, got.pk, 32), 0, "a new key");
    cr_expect_eq(mode_of(path), 0600);

    /* cluster key */
    char kp[256];
    snprintf(kp, sizeof(kp), "%s/cluster.key", tmpdir);
    char *argv4[] = {"keygen", "--cluster", "--out", kp, NULL};
    cr_assert_eq(ds_keygen_main(4, argv4), 0);
    cr_expect_eq(mode_of(kp), 0600);
    ds_cluster_key k;
    cr_assert_eq(ds_cluster_key_load(&k, kp, err, sizeof(err)), 0, "%s", err);
    cr_expect_eq(ds_keygen_main(4, argv4), 1, "exists");

    /* usage errors */
    char *argv5[] = {"keygen", NULL};
    cr_expect_eq(ds_keygen_main(1, argv5), 2);
    char *argv6[] = {"keygen", "--out", kp, "--bogus", NULL};
    cr_expect_eq(ds_keygen_main(4, argv6), 2);
    char *argv7[] = {"keygen", "--cluster", "--name", "x", "--out", kp, NULL};
    cr_expect_eq(ds_keygen_main(6, argv7), 2);
    char *argv8[] = {"keygen", "--out", NULL};
    cr_expect_eq(ds_keygen_main(2, argv8), 2);
    char bad[256];
    snprintf(bad, sizeof(bad), "%s/no/such/dir/key", tmpdir);
    char *argv9[] = {"keygen", "--out", bad, NULL};
    cr_expect_eq(ds_keygen_main(3, argv9), 1);
}
