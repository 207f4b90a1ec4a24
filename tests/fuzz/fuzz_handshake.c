/*
 * tests/fuzz/fuzz_handshake.c: libFuzzer harness for ds_hs_read. The first
 * byte picks the state that receives the frame: a responder waiting for a
 * HELLO, an initiator waiting for a HELLO_ACK, or a responder waiting for a
 * HELLO_FIN (both reached by a real handshake once at start-up, then copied
 * per input). Admission by allow-list or cluster key, also by that byte.
 *
 * Property: no crash, and a frame that is dropped leaves the state byte for
 * byte as it was (the handshake is all-or-nothing per frame).
 */
#include "config.h"

#include <stdio.h>

#include "fuzz_common.h"

int LLVMFuzzerInitialize(int *argc, char ***argv);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static ds_identity ida, idb;
static ds_cluster_key ck;
static ds_allowlist *allow;
/* [admission][0 wait-hello, 1 wait-ack, 2 wait-fin] */
static ds_hs start[2][3];

static ds_hs_config cfg(int key, int a)
{
    return (ds_hs_config){.identity = a ? &ida : &idb, .name = a ? "alpha" : "beta",
                          .address = "127.0.0.1:7000", .cluster_id = FZ_CLUSTER,
                          .cluster_key = key ? &ck : NULL, .allow = key ? NULL : allow,
                          .mode = DS_SEC_ENCRYPT};
}

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    (void)argc;
    (void)argv;
    ds_log_setup("fuzz", DS_LOG_ERROR, NULL);
    if (ds_crypto_init() != 0)
        abort();
    fz_identity(&ida, 0xa1);
    fz_identity(&idb, 0xb2);
    memset(ck.k, 0x33, sizeof(ck.k));
    char text[200], ha[65], hb[65];
    ds_pk_to_hex(ida.pk, ha);
    ds_pk_to_hex(idb.pk, hb);
    snprintf(text, sizeof(text), "%s alpha\n%s beta\n", ha, hb);
    if (ds_allowlist_parse(&allow, text, strlen(text), "fuzz", NULL, 0) != 0)
        abort();
    for (int key = 0; key < 2; key++) {
        ds_hs_config ca = cfg(key, 1), cb = cfg(key, 0);
        ds_hs i, r;
        uint8_t f[DS_WIRE_MAX_HS_FRAME];
        size_t len;
        if (ds_hs_init_responder(&start[key][0], &cb) || ds_hs_init_initiator(&i, &ca, 0) ||
            ds_hs_init_responder(&r, &cb) || ds_hs_write(&i, f, sizeof(f), &len) ||
            ds_hs_read(&r, f, len) != DS_DROP_NONE)
            abort();
        memcpy(&start[key][1], &i, sizeof(i)); /* waits for the ACK */
        if (ds_hs_write(&r, f, sizeof(f), &len) || ds_hs_read(&i, f, len) != DS_DROP_NONE)
            abort();
        memcpy(&start[key][2], &r, sizeof(r)); /* waits for the FIN */
    }
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 1)
        return 0;
    const int key = (data[0] >> 2) & 1;
    const int st = (data[0] & 3) % 3;
    static ds_hs hs, before;
    memcpy(&hs, &start[key][st], sizeof(hs));
    memcpy(&before, &hs, sizeof(hs));
    uint8_t *f = malloc(size - 1 ? size - 1 : 1);
    if (!f)
        return 0;
    memcpy(f, data + 1, size - 1);
    enum ds_drop_reason r = ds_hs_read(&hs, f, size - 1);
    if ((unsigned)r >= DS_DROP__COUNT)
        abort();
    if (r != DS_DROP_NONE && memcmp(&hs, &before, sizeof(hs)) != 0) {
        fprintf(stderr, "dropped frame (%s) changed the handshake state\n", ds_drop_name(r));
        abort();
    }
    free(f);
    ds_hs_wipe(&hs);
    return 0;
}
