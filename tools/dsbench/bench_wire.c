/*
 * tools/dsbench/bench_wire.c: `dsbench wire`: what the wire format and the
 * security layer cost on one core (node/wire/wire.h, node/sec/crypto.h).
 *
 * Table 1, sparse payloads: a GOSSIP_REQ over a segment of 2^20 floats at
 * densities 0.1% .. 50% (seeded uniform index sets), in each index encoding
 * (raw u32, LEB128 gaps, bitmap): the index block's size, whether the
 * exact-size rule picks it, and encode / decode time per element, beside a
 * memcpy of the same frame measured in the same run as the baseline.
 *
 * Table 2, sealing: seal and open of one frame with a 1 KiB, 64 KiB and
 * 1 MiB payload for none, auth and encrypt, with AES-256-GCM and with
 * XChaCha20-Poly1305, each run by libsodium and by OpenSSL's EVP
 * (ds_aead_lib; `lib`, with ratios against libsodium's row), beside memcpy
 * of the frame; and the frame's data sealed from another buffer, copied in
 * then sealed (copy_seal_us) or by ds_session_seal_from (seal_from_us).
 * Open is measured as
 * (seal + open) minus seal, since opening decrypts in place and a frame
 * can be opened only once. Mode none costs the same at every size (it
 * only writes and checks the header), so its MB/s columns are null.
 *
 * Table 3: one whole handshake (both sides, three frames) per admission.
 *
 * Every figure is the best of --reps blocks (alternating with the
 * baseline's blocks), so all see the same machine load.
 *
 *   dsbench wire [--reps R] [--quick] [--json]
 */
#include "config.h"

#include <errno.h>
#include <getopt.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/splitmix.h"
#include "base/log.h"
#include "node/sec/crypto.h"
#include "node/train/train.h"
#include "node/wire/wire.h"
#include "tools/dsbench/bench.h"

static volatile uint64_t sink;

static uint64_t next(uint64_t *s)
{
    return ds_splitmix64_step(s);
}

/* Best time of `reps` blocks of `iters` calls of fn. */
typedef void (*work_fn)(void *ctx);
static double best_of(int reps, uint64_t iters, work_fn fn, void *ctx)
{
    double best = 1e30;
    for (int r = 0; r < reps; r++) {
        double t0 = ds_bench_now();
        for (uint64_t i = 0; i < iters; i++)
            fn(ctx);
        double t = ds_bench_now() - t0;
        if (t < best)
            best = t;
    }
    return best / (double)iters;
}

/* ---- table 1 ------------------------------------------------------------------ */

typedef struct sparse_ctx {
    ds_wire_msg m;
    uint8_t *frame, *copy;
    size_t cap, len;
    ds_wire_limits lim;
    ds_wire_bufs bufs;
} sparse_ctx;

static void do_encode(void *p)
{
    sparse_ctx *c = p;
    size_t len;
    if (ds_wire_encode(c->frame, c->cap, &c->m, &len) == 0)
        sink += len;
}

static void do_decode(void *p)
{
    sparse_ctx *c = p;
    ds_wire_msg o;
    sink += ds_wire_decode(c->frame, c->len, &c->lim, &c->bufs, &o, NULL);
}

static void do_memcpy(void *p)
{
    sparse_ctx *c = p;
    memcpy(c->copy, c->frame, c->len);
    sink += c->copy[c->len / 2];
}

static int table_sparse(int json, int reps, int quick)
{
    const uint32_t n = quick ? 1u << 16 : 1u << 20;
    static const double dens[] = {0.001, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5};
    static const char *const encname[4] = {"dense", "raw", "varint", "bitmap"};
    sparse_ctx c;
    memset(&c, 0, sizeof(c));
    uint32_t *idx = malloc((size_t)n * 4);
    float *val = malloc((size_t)n * 4);
    c.cap = 64 + 16 + (size_t)n * 9 + 4096;
    c.frame = malloc(c.cap);
    c.copy = malloc(c.cap);
    c.bufs.idx = malloc((size_t)n * 4);
    c.bufs.val = malloc((size_t)n * 4);
    c.bufs.idx_cap = c.bufs.val_cap = n;
    ds_wire_limits_default(&c.lim);
    int rc = 0;
    if (!idx || !val || !c.frame || !c.copy || !c.bufs.idx || !c.bufs.val) {
        fprintf(stderr, "dsbench wire: out of memory\n");
        rc = 1;
        goto out_free;
    }
    uint64_t s = 12345;
    for (uint32_t i = 0; i < n; i++)
        val[i] = (float)((double)(next(&s) >> 40) / 16777216.0 - 0.5);

    ds_row row;
    ds_row_table(&row, json);
    for (size_t di = 0; di < sizeof(dens) / sizeof(dens[0]); di++) {
        const uint64_t thr = (uint64_t)(dens[di] * 18446744073709551615.0);
        uint32_t count = 0;
        for (uint32_t i = 0; i < n; i++)
            if (next(&s) <= thr)
                idx[count++] = i;
        size_t sizes[4];
        enum ds_idx_enc best;
        if (ds_wire_idx_sizes(n, idx, count, sizes, &best) != 0) {
            rc = 1;
            goto out_free;
        }
        for (int e = DS_IDX_RAW; e <= DS_IDX_BITMAP; e++) {
            memset(&c.m, 0, sizeof(c.m));
            c.m.h.type = DS_MSG_GOSSIP_REQ;
            c.m.h.count = count;
            c.m.u.sparse = (ds_wire_sparse){.seg_len = n, .enc = (uint8_t)e, .idx = idx, .val = val};
            if (ds_wire_encode(c.frame, c.cap, &c.m, &c.len) != 0) {
                rc = 1;
                goto out_free;
            }
            /* ~50 ms a block at ~1 ns per element. */
            uint64_t iters = 50000000ull / ((uint64_t)count + 1000) + 1;
            if (quick)
                iters = iters / 10 + 1;
            double t_mem = 1e30, t_enc = 1e30, t_dec = 1e30;
            for (int r = 0; r < reps; r++) {
                double t = best_of(1, iters, do_memcpy, &c);
                t_mem = t < t_mem ? t : t_mem;
                t = best_of(1, iters, do_encode, &c);
                t_enc = t < t_enc ? t : t_enc;
                t = best_of(1, iters, do_decode, &c);
                t_dec = t < t_dec ? t : t_dec;
            }
            ds_row_num(&row, "density_pct", dens[di] * 100, 1);
            ds_row_int(&row, "count", count);
            ds_row_str(&row, "enc", encname[e]);
            ds_row_int(&row, "idx_bytes", (int64_t)sizes[e]);
            ds_row_num(&row, "bytes_per_idx", count ? (double)sizes[e] / count : 0, 2);
            ds_row_str(&row, "chosen", e == (int)best ? "yes" : "");
            ds_row_int(&row, "frame_bytes", (int64_t)c.len);
            ds_row_num(&row, "enc_ns_per_elem", t_enc * 1e9 / (count ? count : 1), 2);
            ds_row_num(&row, "dec_ns_per_elem", t_dec * 1e9 / (count ? count : 1), 2);
            ds_row_num(&row, "memcpy_ns_per_elem", t_mem * 1e9 / (count ? count : 1), 2);
            ds_row_num(&row, "dec_vs_memcpy", t_dec / t_mem, 1);
            ds_row_end(&row);
        }
    }
out_free:
    free(idx);
    free(val);
    free(c.frame);
    free(c.copy);
    free(c.bufs.idx);
    free(c.bufs.val);
    return rc;
}

/* ---- table 2 ------------------------------------------------------------------ */

/* Two libraries run the AEAD (ds_aead_lib); rows put them side by side,
 * their reps interleaved so both see the same load. */
static const enum ds_aead_lib libs[] = {DS_AEAD_LIB_SODIUM, DS_AEAD_LIB_OPENSSL};
#define NLIBS (sizeof(libs) / sizeof(libs[0]))

typedef struct seal_ctx {
    ds_session txs[NLIBS], rxs[NLIBS];
    ds_session *tx, *rx; /* the library being timed */
    uint8_t *frame, *copy;
    size_t len, cap, sealed;
    int failed;
} seal_ctx;

static void do_seal(void *p)
{
    seal_ctx *c = p;
    ds_put16(c->frame + DS_WH_FLAGS, 0); /* unsealed again (payload bytes don't matter) */
    if (ds_session_seal(c->tx, c->frame, c->len, c->cap, &c->sealed) != 0)
        c->failed = 1;
}

static void do_seal_open(void *p)
{
    seal_ctx *c = p;
    do_seal(c);
    if (ds_session_open(c->rx, c->frame, c->sealed) != DS_DROP_NONE)
        c->failed = 1;
}

static void do_copy(void *p)
{
    seal_ctx *c = p;
    memcpy(c->copy, c->frame, c->len);
    sink += c->copy[c->len - 1];
}

/* A STATE_CHUNK's data sealed from elsewhere (c->copy's bytes): copied
 * into the frame then sealed in place, as the copying send path does, or
 * sealed from where it is (ds_session_seal_from, the encrypt send path). */
#define CHUNK_HEAD (DS_WIRE_HDR_SIZE + DS_WIRE_CHUNK_PREFIX)

static void do_copy_seal(void *p)
{
    seal_ctx *c = p;
    memcpy(c->frame + CHUNK_HEAD, c->copy, c->len - CHUNK_HEAD);
    do_seal(c);
}

static void do_seal_from(void *p)
{
    seal_ctx *c = p;
    ds_put16(c->frame + DS_WH_FLAGS, 0);
    if (ds_session_seal_from(c->tx, c->frame, CHUNK_HEAD, c->copy, c->len - CHUNK_HEAD, c->cap,
                             &c->sealed) != 0)
        c->failed = 1;
}

static int table_seal(int json, int reps, int quick)
{
    static const size_t sizes[] = {1024, 65536, 1 << 20};
    static const struct {
        enum ds_sec_mode mode;
        unsigned aead;
    } cases[] = {
        {DS_SEC_NONE, 0},
        {DS_SEC_AUTH, DS_AEAD_AES256GCM},
        {DS_SEC_AUTH, DS_AEAD_XCHACHA20},
        {DS_SEC_ENCRYPT, DS_AEAD_AES256GCM},
        {DS_SEC_ENCRYPT, DS_AEAD_XCHACHA20},
    };
    seal_ctx *c = calloc(1, sizeof(*c));
    if (!c)
        return 1;
    c->cap = (1 << 20) + 4096;
    c->frame = malloc(c->cap);
    c->copy = malloc(c->cap);
    if (!c->frame || !c->copy) {
        free(c->frame);
        free(c->copy);
        free(c);
        return 1;
    }
    ds_row row;
    ds_row_table(&row, json);
    int rc = 0;
    for (size_t si = 0; si < sizeof(sizes) / sizeof(sizes[0]); si++) {
        /* A STATE_CHUNK carries raw bytes: its payload is 48 + count. */
        ds_wire_msg m;
        memset(&m, 0, sizeof(m));
        m.h.type = DS_MSG_STATE_CHUNK;
        m.h.count = (uint32_t)(sizes[si] - DS_WIRE_CHUNK_PREFIX);
        uint8_t *data = malloc(sizes[si]);
        if (!data) {
            rc = 1;
            break;
        }
        memset(data, 0x5c, sizes[si]);
        m.u.chunk = (ds_wire_state_chunk){.total = m.h.count, .data = data};
        int bad = ds_wire_encode(c->frame, c->cap, &m, &c->len) != 0;
        free(data);
        if (bad) {
            rc = 1;
            break;
        }
        /* ~40 ms a block at ~1 GB/s. */
        uint64_t iters = 40000000ull / sizes[si] + 1;
        if (quick)
            iters = iters / 10 + 1;
        double t_copy = 1e30;
        for (int r = 0; r < reps; r++) {
            double t = best_of(1, iters, do_copy, c);
            t_copy = t < t_copy ? t : t_copy;
        }
        for (size_t k = 0; k < sizeof(cases) / sizeof(cases[0]); k++) {
            if (cases[k].aead && !(ds_aead_available() & cases[k].aead))
                continue;
            ds_session_params p;
            memset(&p, 0, sizeof(p));
            p.mode = cases[k].mode;
            p.aead = cases[k].aead;
            memset(p.tx_key, 1, 32);
            memset(p.rx_key, 1, 32);
            p.cluster_id = p.self_id = p.peer_id = 7;
            /* Mode none has no AEAD: one row. */
            const size_t nl = cases[k].mode == DS_SEC_NONE ? 1 : NLIBS;
            size_t made = 0;
            for (; made < nl; made++) {
                ds_aead_lib_set(libs[made]);
                if (ds_session_init(&c->txs[made], &p, NULL, NULL))
                    break;
                if (ds_session_init(&c->rxs[made], &p, NULL, NULL)) {
                    ds_session_wipe(&c->txs[made]);
                    break;
                }
            }
            ds_aead_lib_set(DS_AEAD_LIB_OPENSSL);
            if (made < nl)
                rc = 1;
            c->failed = 0;
            double t_seal[NLIBS], t_both[NLIBS], t_cs[NLIBS], t_sf[NLIBS];
            for (size_t l = 0; l < nl; l++)
                t_seal[l] = t_both[l] = t_cs[l] = t_sf[l] = 1e30;
            for (int r = 0; !rc && r < reps; r++)
                for (size_t l = 0; l < nl; l++) {
                    c->tx = &c->txs[l];
                    c->rx = &c->rxs[l];
                    double t = best_of(1, iters, do_seal, c);
                    t_seal[l] = t < t_seal[l] ? t : t_seal[l];
                    t = best_of(1, iters, do_seal_open, c);
                    t_both[l] = t < t_both[l] ? t : t_both[l];
                    t = best_of(1, iters, do_copy_seal, c);
                    t_cs[l] = t < t_cs[l] ? t : t_cs[l];
                    t = best_of(1, iters, do_seal_from, c);
                    t_sf[l] = t < t_sf[l] ? t : t_sf[l];
                }
            if (!rc && c->failed) {
                fprintf(stderr, "dsbench wire: seal/open failed (%s %s)\n",
                        ds_sec_mode_name(cases[k].mode), ds_aead_name(cases[k].aead));
                rc = 1;
            }
            for (size_t l = 0; !rc && l < nl; l++) {
                double t_open = t_both[l] - t_seal[l];
                if (t_open < 0)
                    t_open = 0;
                double t_open0 = t_both[0] - t_seal[0];
                /* Mode none touches only the header: its cost does not
                 * grow with the payload, so MB/s would be meaningless. */
                const double mb =
                    cases[k].mode == DS_SEC_NONE ? NAN : (double)c->len / 1e6;
                ds_row_int(&row, "payload_bytes", (int64_t)(c->len - DS_WIRE_HDR_SIZE));
                ds_row_str(&row, "mode", ds_sec_mode_name(cases[k].mode));
                ds_row_str(&row, "aead", ds_aead_name(cases[k].aead));
                ds_row_str(&row, "lib", cases[k].mode == DS_SEC_NONE ? "-"
                                                                      : ds_aead_lib_name(libs[l]));
                ds_row_num(&row, "seal_mb_per_s", mb / t_seal[l], 0);
                ds_row_num(&row, "open_mb_per_s", mb / t_open, 0);
                ds_row_num(&row, "seal_us", t_seal[l] * 1e6, 2);
                ds_row_num(&row, "open_us", t_open * 1e6, 2);
                /* Against libsodium's row of the same case and size. */
                ds_row_num(&row, "seal_vs_libsodium",
                           cases[k].mode == DS_SEC_NONE ? NAN : t_seal[0] / t_seal[l], 2);
                ds_row_num(&row, "open_vs_libsodium",
                           cases[k].mode == DS_SEC_NONE || t_open <= 0 ? NAN : t_open0 / t_open,
                           2);
                ds_row_num(&row, "memcpy_mb_per_s", (double)c->len / 1e6 / t_copy, 0);
                ds_row_num(&row, "copy_seal_us", t_cs[l] * 1e6, 2);
                ds_row_num(&row, "seal_from_us", t_sf[l] * 1e6, 2);
                ds_row_end(&row);
            }
            for (size_t l = 0; l < made; l++) {
                ds_session_wipe(&c->txs[l]);
                ds_session_wipe(&c->rxs[l]);
            }
            if (rc)
                break;
        }
        if (rc)
            break;
    }
    free(c->frame);
    free(c->copy);
    free(c);
    return rc;
}

/* ---- table 3 ------------------------------------------------------------------ */

static int table_handshake(int json, int reps, int quick)
{
    ds_identity a, b;
    ds_cluster_key k;
    ds_allowlist *al = NULL;
    char text[200], ha[65], hb[65];
    if (ds_identity_generate(&a) || ds_identity_generate(&b) || ds_cluster_key_generate(&k))
        return 1;
    ds_pk_to_hex(a.pk, ha);
    ds_pk_to_hex(b.pk, hb);
    snprintf(text, sizeof(text), "%s a\n%s b\n", ha, hb);
    if (ds_allowlist_parse(&al, text, strlen(text), "bench", NULL, 0))
        return 1;
    ds_row row;
    ds_row_table(&row, json);
    int rc = 0;
    const int iters = quick ? 20 : 200;
    for (int key = 0; key <= 1; key++) {
        ds_hs_config ca = {.identity = &a, .name = "a", .cluster_id = 1,
                           .cluster_key = key ? &k : NULL, .allow = key ? NULL : al,
                           .mode = DS_SEC_ENCRYPT};
        ds_hs_config cb = ca;
        cb.identity = &b;
        cb.name = "b";
        double best = 1e30;
        for (int r = 0; r < reps && !rc; r++) {
            double t0 = ds_bench_now();
            for (int it = 0; it < iters && !rc; it++) {
                ds_hs i, s;
                uint8_t f[DS_WIRE_MAX_HS_FRAME];
                size_t len;
                ds_session si, ss;
                rc |= ds_hs_init_initiator(&i, &ca, 0) | ds_hs_init_responder(&s, &cb);
                ds_hs *w[3] = {&i, &s, &i}, *rd[3] = {&s, &i, &s};
                for (int step = 0; step < 3 && !rc; step++)
                    rc |= ds_hs_write(w[step], f, sizeof(f), &len) ||
                          ds_hs_read(rd[step], f, len) != DS_DROP_NONE;
                rc |= ds_hs_session(&i, &si, NULL) | ds_hs_session(&s, &ss, NULL);
                ds_hs_wipe(&i);
                ds_hs_wipe(&s);
            }
            double t = (ds_bench_now() - t0) / iters;
            best = t < best ? t : best;
        }
        if (rc) {
            fprintf(stderr, "dsbench wire: handshake failed\n");
            break;
        }
        ds_row_str(&row, "admission", key ? "cluster key" : "allow-list");
        ds_row_num(&row, "handshake_us", best * 1e6, 1);
        ds_row_int(&row, "bytes_on_wire", 3 * DS_WIRE_HDR_SIZE + DS_WIRE_HELLO_SIZE +
                                              DS_WIRE_HELLO_ACK_SIZE + DS_WIRE_HELLO_FIN_SIZE);
        ds_row_end(&row);
    }
    ds_allowlist_free(&al);
    ds_identity_wipe(&a);
    ds_identity_wipe(&b);
    ds_cluster_key_wipe(&k);
    return rc;
}

int ds_bench_wire(int argc, char **argv)
{
    static const struct option options[] = {
        {"json", no_argument, NULL, 'j'},
        {"reps", required_argument, NULL, 'r'},
        {"quick", no_argument, NULL, 'q'},
        {NULL, 0, NULL, 0},
    };
    int json = 0, reps = 5, quick = 0, bad = 0, opt;
    optind = 0; /* start afresh on this argv; messages are ours */
    opterr = 0;
    while (!bad && (opt = getopt_long(argc, argv, "+:", options, NULL)) != -1) {
        switch (opt) {
        case 'j': json = 1; break;
        case 'r': reps = atoi(optarg); break;
        case 'q': quick = 1; break;
        default: bad = 1; /* an unknown option or a missing value */
        }
    }
    if (bad || optind < argc) {
        fprintf(stderr, "usage: dsbench wire [--reps R] [--quick] [--json]\n");
        return 2;
    }
    if (reps < 1) {
        fprintf(stderr, "dsbench wire: --reps must be >= 1\n");
        return 2;
    }
    if (ds_crypto_init() != 0) {
        fprintf(stderr, "dsbench wire: libsodium failed to initialise\n");
        return 1;
    }
    ds_log_setup("dsbench", DS_LOG_ERROR, NULL);
    int rc = table_sparse(json, reps, quick);
    if (!json)
        puts("");
    if (!rc)
        rc = table_seal(json, reps, quick);
    if (!json)
        puts("");
    if (!rc)
        rc = table_handshake(json, reps, quick);
    return rc;
}
